#!/usr/bin/env bash
# Issue 10's fine-tuning comparisons on our own learned-absolute checkpoint (the reference compare study's `learned`
# pretraining run, results/compare/reference/pretrain/learned, which must hold its checkpoint/):
#   drop-in   — Huang et al.'s method 4 added at zero (`--add-relative huang4`, k = 32) and fine-tuned exactly as the
#               compare study fine-tunes (sentiment; reviews cut to 128 and scored to 1,024), 3 seeds; once at the
#               fine-tuning learning rate, once with the added tables at 10× (`--add-relative-lr`). The runs without
#               the drop-in are the compare study's own `learned` records (same seeds, same settings).
#   extension — the reviews fine-tuned cut to 256 tokens, twice the pretraining length: the learned table's rows
#               128–255 as they are (never trained), copied, or interpolated (`--extend-positions`), 3 seeds.
# Each finished comparison's summary goes to results/huang/<name>/summary.json, with added_tables.json (how far the
# added tables moved, tools/dropin_tables.py) for the drop-ins (committed; 39_huang reads them);
# a finished one is skipped. Usage: bash tools/run_huang_finetunes.sh [name ...]
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
ckpt=results/compare/reference/pretrain/learned
reviews=(--task reviews --max-len 128 --epochs 4 --eval-lengths 128 256 512)
args_for() {
  case "$1" in
    dropin-sentiment)      echo "--task sentiment --add-relative huang4 --add-relative-kwargs {\"k\":32}" ;;
    dropin-sentiment-lr10) echo "--task sentiment --add-relative huang4 --add-relative-kwargs {\"k\":32} --add-relative-lr 5e-3" ;;
    dropin-reviews)        echo "${reviews[*]} --add-relative huang4 --add-relative-kwargs {\"k\":32}" ;;
    dropin-reviews-lr10)   echo "${reviews[*]} --add-relative huang4 --add-relative-kwargs {\"k\":32} --add-relative-lr 5e-3" ;;
    extend-none)           echo "--task reviews --max-len 256 --epochs 4" ;;
    extend-copy)           echo "--task reviews --max-len 256 --epochs 4 --extend-positions copy" ;;
    extend-interpolate)    echo "--task reviews --max-len 256 --epochs 4 --extend-positions interpolate" ;;
    *) echo "unknown comparison $1" >&2; exit 2 ;;
  esac
}
all=(dropin-sentiment dropin-reviews dropin-sentiment-lr10 dropin-reviews-lr10 extend-none extend-copy extend-interpolate)
for name in "${@:-${all[@]}}"; do
  res=results/huang/$name
  if [ -f "$res/summary.json" ]; then echo "finished earlier: $name"; continue; fi
  # shellcheck disable=SC2046
  posenc_lit finetune --checkpoint "$ckpt" $(args_for "$name") --preset quick --seeds 0 1 2 --out "runs/huang/$name" --overwrite --quiet --no-baselines
  mkdir -p "$res"
  case "$name" in dropin-*) python tools/dropin_tables.py "runs/huang/$name" --out "$res/added_tables.json" ;; esac
  cp "runs/huang/$name/summary.json" "$res/"
  echo "finished $name"
done
