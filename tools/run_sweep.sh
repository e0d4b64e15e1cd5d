#!/usr/bin/env bash
# The study's learning-rate sweep (issue 37): one entry per family on a short schedule (the `study` preset cut to
# SWEEP_STEPS = 3,000 steps, a quarter, with the same warm-up fraction and linear decay), seed 0, at each peak
# learning rate named. The rule that picks each family's rate is in nbs/35_study.ipynb ("Learning rates").
#
# Usage: bash tools/run_sweep.sh ENTRY@LR [ENTRY@LR ...]     e.g. learned@1e-3 learned@2e-3 learned@4e-3
#   One lane per core: OMP_NUM_THREADS=1 bash tools/run_sweep.sh ... &
# Each run trains in runs/sweep/ENTRY-lrLR and resumes when started again; a finished one is copied to
# results/sweep/ENTRY-lrLR/ (config.json, metrics.jsonl, summary.json). Commit them yourself (git add results/sweep).
# SWEEP_STEPS=N (N ≠ 3000) runs the study's schedule cut to N steps instead, in runs/sweep-N/ and results/sweep-N/
# (kept apart: the rule reads results/sweep only), e.g. SWEEP_STEPS=12000 for a rate check on the full schedule.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
cd "${STUDY_ROOT:-$(dirname "$0")/..}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
source "$HERE/study_entries.sh"
STEPS=${SWEEP_STEPS:-3000}
SUB=sweep
if [ "$STEPS" != 3000 ]; then SUB=sweep-$STEPS; fi

if [ $# -eq 0 ]; then echo "usage: bash tools/run_sweep.sh ENTRY@LR [ENTRY@LR ...]" >&2; exit 2; fi
for item in "$@"; do
  if [[ ! $item =~ ^([a-z0-9-]+)@([0-9.]+e-[0-9]+)$ ]]; then
    echo "run_sweep.sh: '$item' is not ENTRY@LR (e.g. learned@2e-3); nothing was run" >&2; exit 2
  fi
done
for item in "$@"; do
  entry=${item%@*} lr=${item#*@}
  name=$entry-lr$lr run=runs/$SUB/$entry-lr$lr dest=results/$SUB/$entry-lr$lr
  if [ -f "$dest/summary.json" ]; then echo "done already: $name"; continue; fi
  # shellcheck disable=SC2046
  posenc_lit pretrain $(args_for "$entry") --preset study --steps "$STEPS" --lr "$lr" --seed 0 \
    --out "$run" --resume --quiet
  mkdir -p "$dest"
  cp "$run/config.json" "$run/metrics.jsonl" "$run/summary.json" "$dest/"
  echo "finished $name: $(tr -d '\n ' < "$dest/summary.json")"
done
