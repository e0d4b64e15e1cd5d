#!/usr/bin/env bash
# The block-length × steps runs of the regime page (issue 37; nbs/19b_regime.ipynb, "Block length against steps"):
# `learned` and `none` on blocks of 32 and of 128 tokens, each 12,000 steps of the `study` preset (64 blocks a step,
# peak lr 2e-3), so that block length and schedule length are changed one at a time.
#
# Usage: bash tools/run_regime_grid.sh NAME [NAME ...]   NAME = len<L>-<pe>[-s<k>], e.g. len128-learned len128-none-s1
#   One lane per core: OMP_NUM_THREADS=1 bash tools/run_regime_grid.sh len128-learned len128-none &
# Each run trains in runs/regime/grid/NAME and resumes when started again; a finished one is copied to
# results/regime/grid/NAME/ (config.json, metrics.jsonl, summary.json). Commit them yourself.
set -euo pipefail
cd "${STUDY_ROOT:-$(dirname "$0")/..}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ $# -eq 0 ]; then echo "usage: bash tools/run_regime_grid.sh len32-learned len128-none ..." >&2; exit 2; fi
for name in "$@"; do
  if [[ ! $name =~ ^len(32|128)-(learned|none)(-s([1-9][0-9]*))?$ ]]; then
    echo "run_regime_grid.sh: '$name' is not len<32|128>-<learned|none>[-s<k>]; nothing was run" >&2; exit 2
  fi
done
for name in "$@"; do
  [[ $name =~ ^len(32|128)-(learned|none)(-s([1-9][0-9]*))?$ ]]
  len=${BASH_REMATCH[1]} pe=${BASH_REMATCH[2]} seed=${BASH_REMATCH[4]:-0}
  run=runs/regime/grid/$name dest=results/regime/grid/$name
  if [ -f "$dest/summary.json" ]; then echo "done already: $name"; continue; fi
  posenc_lit pretrain --pe "$pe" --preset study --seq-len "$len" --steps 12000 --seed "$seed" \
    --out "$run" --resume --quiet
  mkdir -p "$dest"
  cp "$run/config.json" "$run/metrics.jsonl" "$run/summary.json" "$dest/"
  echo "finished $name: $(tr -d '\n ' < "$dest/summary.json")"
done
