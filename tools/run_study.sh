#!/usr/bin/env bash
# The study (issue 29): every encoding and the TUPE and DeBERTa ablations pretrained with the `study` preset (12,000 steps
# of 64 × 32 tokens, the regime in which absolute positions are learned; nbs/34_regime.ipynb), resumable, in lanes.
#
# Usage: bash tools/run_study.sh NAME [NAME ...]
#   NAME is a study entry (below), optionally with a seed: `learned` (seed 0), `learned-s1` (seed 1).
#   Start one lane per core with its own names, e.g.
#     OMP_NUM_THREADS=1 bash tools/run_study.sh learned tupe-a deberta &
#     OMP_NUM_THREADS=1 bash tools/run_study.sh none sinusoidal t5 &
# Each run trains in runs/study/NAME and resumes from its checkpoint when started again (a finished run is skipped).
# When it finishes, results/study/NAME/ gets config.json, metrics.jsonl, summary.json, lengths.json (masked-token loss
# at 32, 64, 128, 256 tokens; 37_lengths), diagnostics.json (position sensitivity, table geometry; 34_regime),
# inspect.safetensors (tools/inspect_run.py) and locality.json (38_locality), and is committed (COMMIT=0 to skip).
# Each entry runs at its family's learning rate from the committed sweep (tools/run_sweep.sh; posenc_lit.study.study_lr),
# and every run is fine-tuned on the order and sentiment tasks right after (tools/run_order.sh; FINETUNE=0 skips).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
cd "${STUDY_ROOT:-$(dirname "$0")/..}"   # STUDY_ROOT: the checkout to write into (the code may be a frozen copy)
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

source "$HERE/study_entries.sh"   # args_for: study entry -> pretrain options
source "$HERE/lane_lib.sh"        # commit_result, check_names, split_name

# every name is checked before the first run starts (a run takes most of an hour)
if [ $# -eq 0 ]; then
  echo "usage: bash tools/run_study.sh NAME [NAME ...] (a study entry, or ENTRY-sSEED for seed SEED > 0)" >&2
  exit 2
fi
known=$(python -c 'from posenc_lit.study import ENTRIES; print(*ENTRIES)')
check_names run_study.sh "$known" "$@" || exit 2

# the learning rate of each entry is the sweep's choice for its family (nbs/35_study.ipynb, "Learning rates");
# an entry whose family's sweep has not given one is refused before anything runs
declare -A LR
for name in "$@"; do
  split_name "$name"
  LR[$name]=$(python -c 'import sys; from posenc_lit.study import study_lr; print(study_lr(sys.argv[1]))' "$entry") \
    || { echo "run_study.sh: no learning rate for $name yet (above); nothing was run" >&2; exit 2; }
done

for name in "$@"; do
  split_name "$name"
  run=runs/study/$name dest=results/study/$name
  if [ -f "$dest/summary.json" ] && [ -f "$dest/lengths.json" ]; then echo "done already: $name"; continue; fi
  # shellcheck disable=SC2046
  posenc_lit pretrain $(args_for "$entry") --seed "$seed" --preset study --lr "${LR[$name]}" --out "$run" \
    --resume --quiet
  mkdir -p "$dest"
  cp "$run/config.json" "$run/metrics.jsonl" "$run/summary.json" "$dest/"
  python tools/regime_search.py diagnose "$run" "$dest" || echo "warning: diagnostics of $name failed" >&2
  python tools/inspect_run.py "$run" "$dest" || echo "warning: inspect_run of $name failed" >&2
  python -c 'import sys; from posenc_lit.locality import locality_run; locality_run(sys.argv[1])' "$run" \
    && cp "$run/locality.json" "$dest/" || echo "warning: locality of $name failed" >&2
  posenc_lit lengths --run "$run" --lengths 32 64 128 256
  cp "$run/lengths.json" "$dest/"
  commit_result "study: $name finished (tools/run_study.sh)" "$dest"
  echo "finished $name: $(tr -d '\n ' < "$dest/summary.json")"
  # fine-tuning needs the checkpoint, which does not survive a change of machine: every run is fine-tuned on the
  # order and sentiment tasks in the same lane, right after its pretraining (FINETUNE=0 to skip). The unit of a
  # seed on the claims page is the pretraining run, so each checkpoint counts once: seed 0 with three fine-tuning
  # seeds, the others with one (nbs/41_claims.ipynb, "The rule")
  if [ "${FINETUNE:-1}" = 1 ]; then
    ft_seeds="0 1 2"
    [ "$seed" = 0 ] || ft_seeds="0"
    FT_SEEDS=$ft_seeds TASK=order bash "$HERE/run_order.sh" "$name"
    FT_SEEDS=$ft_seeds TASK=sentiment bash "$HERE/run_order.sh" "$name"
  fi
done
