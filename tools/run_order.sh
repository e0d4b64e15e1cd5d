#!/usr/bin/env bash
# A fine-tuning task (default: the order task of issue 29 item 3) from each study checkpoint, three seeds (FT_SEEDS:
# the fine-tuning seeds, default "0 1 2"), the quick fine-tuning preset.
#
# Usage: [TASK=order] bash tools/run_order.sh NAME [NAME ...]   NAME: a study run (runs/study/NAME; results/study/NAME)
# TASK: a task of `posenc_lit tasks` (order, sentiment, rating, reviews).
# Waits until the study run NAME has finished (results/study/NAME/summary.json), fine-tunes it into
# runs/study_TASK/NAME (a stopped fine-tune starts again: fine-tuning runs do not resume), copies the results without
# checkpoints to results/study_TASK/NAME/ and commits them (COMMIT=0 to skip). A finished NAME is skipped.
# STUDY_ROOT: the checkout to read and write (the code may be a frozen copy, as in tools/run_study.sh).
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: bash tools/run_order.sh NAME [NAME ...]   (study runs, e.g. learned tupe-a shaw-s1)" >&2; exit 2; }
source "$(dirname "$0")/lane_lib.sh"   # commit_result
cd "${STUDY_ROOT:-$(dirname "$0")/..}"
task=${TASK:-order}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

for name in "$@"; do
  run=runs/study_$task/$name dest=results/study_$task/$name
  if [ -f "$dest/summary.json" ]; then echo "done already: $name"; continue; fi
  if [ ! -f "results/study/$name/summary.json" ]; then
    [ -d "runs/study/$name" ] || echo "warning: runs/study/$name does not exist yet: is $name a study run?" >&2
    echo "waiting for the study run $name to finish (results/study/$name/summary.json)"
  fi
  until [ -f "results/study/$name/summary.json" ]; do sleep 60; done
  # shellcheck disable=SC2086  # FT_SEEDS is a list of seeds
  posenc_lit finetune --checkpoint "runs/study/$name" --task "$task" --preset quick --seeds ${FT_SEEDS:-0 1 2} \
    --out "$run" --overwrite --quiet
  mkdir -p "$dest"
  tar -C "$run" --exclude=checkpoint -cf - . | tar -C "$dest" -xf -
  commit_result "study $task task: $name finished (tools/run_order.sh)" "$dest"
  echo "finished $name: $(python -c 'import json,sys; print(json.load(open(sys.argv[1]))["test"])' "$dest/summary.json")"
done
