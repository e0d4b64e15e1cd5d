#!/usr/bin/env bash
# Issue 10's clipping-distance study: Huang et al.'s method 4 and Shaw et al.'s relative keys/values with
# k ∈ {2, 8, 32, 128, unclipped}, one pretraining run each (the reference model at 2 layers and 1,200 steps, so that
# ten runs fit on 2 CPU cores), then
#   - the masked-token loss at the training length (128) and longer (`posenc_lit lengths`: 128 … 1024);
#   - the downstream metric: the long reviews fine-tuned cut to 128 tokens, scored cut to 128 … 1024 (3 seeds).
# "unclipped" is k = 1023: every distance of a 1,024-token block has its own row; rows past 127 are never trained.
# Each finished entry's JSON files go to results/kstudy/<entry>/ (committed; 25_kstudy reads them); a finished entry is
# skipped, an interrupted pretraining resumes from runs/kstudy/<entry>/checkpoint.
# Usage: bash tools/run_k_study.sh [entry ...]   (default: every entry, method 4 first)
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

k_of() { case "${1##*-}" in unclipped) echo 1023 ;; k*) echo "${1##*-k}" ;; esac; }
study=()
for pe in huang4 shaw; do for k in k2 k8 k32 k128 unclipped; do study+=("$pe-$k"); done; done
names=("${@:-${study[@]}}")
for name in "${names[@]}"; do
  res=results/kstudy/$name
  if [ -f "$res/finetune.json" ]; then echo "finished earlier: $name"; continue; fi
  pe=${name%%-*}; k=$(k_of "$name"); run=runs/kstudy/$name
  posenc_lit pretrain --pe "$pe" --pe-kwargs "{\"k\": $k}" --preset reference --n-layers 2 --steps 1200 \
    --eval-every 300 --save-every 300 --out "$run" --resume --quiet
  posenc_lit lengths --run "$run" --lengths 128 256 512 1024
  posenc_lit finetune --checkpoint "$run" --task reviews --max-len 128 --eval-lengths 128 256 512 1024 --epochs 4 \
    --seeds 0 1 2 --out "$run-reviews" --overwrite --quiet --no-baselines
  mkdir -p "$res"
  cp "$run/config.json" "$run/metrics.jsonl" "$run/summary.json" "$run/lengths.json" "$res/"
  cp "$run-reviews/summary.json" "$res/finetune.json"
  echo "finished $name: $(tr -d '\n ' < "$res/summary.json")"
done
