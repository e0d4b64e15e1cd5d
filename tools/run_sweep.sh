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
# (kept apart: the rule reads results/sweep only), e.g. SWEEP_STEPS=12000 for the check of a rate on the full
# schedule (study.rate_check). There a seed other than 0 may be named as the study names it, ENTRY-sK@LR, which
# runs in ENTRY-sK-lrLR (the sweep itself is seed 0 only).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
cd "${STUDY_ROOT:-$(dirname "$0")/..}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
source "$HERE/study_entries.sh"
source "$HERE/lane_lib.sh"   # split_name
STEPS=${SWEEP_STEPS:-3000}
SUB=sweep
if [ "$STEPS" != 3000 ]; then SUB=sweep-$STEPS; fi

if [ $# -eq 0 ]; then echo "usage: bash tools/run_sweep.sh ENTRY@LR [ENTRY@LR ...]" >&2; exit 2; fi
for item in "$@"; do
  # the rate as the study's tools write it (posenc_lit.study.lr_text): 1e-3, 1.5e-3
  if [[ ! $item =~ ^([a-z0-9-]+)@([1-9](\.[0-9]+)?e-[0-9]+)$ ]]; then
    echo "run_sweep.sh: '$item' is not ENTRY@LR (e.g. learned@2e-3); nothing was run" >&2; exit 2
  fi
  split_name "${item%@*}"
  if [ "$seed" != 0 ] && [ "$SUB" = sweep ]; then
    echo "run_sweep.sh: '$item' names seed $seed, but the sweep runs seed 0 only (seeds go with SWEEP_STEPS);" \
      "nothing was run" >&2; exit 2
  fi
done
for item in "$@"; do
  name=${item%@*} lr=${item#*@}
  split_name "$name"
  run=runs/$SUB/$name-lr$lr dest=results/$SUB/$name-lr$lr
  if [ -f "$dest/summary.json" ]; then echo "done already: $name-lr$lr"; continue; fi
  # shellcheck disable=SC2046
  posenc_lit pretrain $(args_for "$entry") --preset study --steps "$STEPS" --lr "$lr" --seed "$seed" \
    --out "$run" --resume --quiet
  mkdir -p "$dest"
  cp "$run/config.json" "$run/metrics.jsonl" "$run/summary.json" "$dest/"
  echo "finished $name-lr$lr: $(tr -d '\n ' < "$dest/summary.json")"
done
