#!/usr/bin/env bash
# The reference pretraining study: one run per encoding with the `reference` preset, resumable.
# Each run resumes from runs/reference/<pe>/checkpoint if interrupted; a finished run is skipped.
# When a run finishes, its config.json, metrics.jsonl and summary.json are copied to results/pretraining/<pe>/, its
# length generalization is measured (lengths.json; 21_lengths) and tools/inspect_run.py saves attention maps and the
# learned position parameters (inspect.safetensors) — all committed; the 20_pretraining and 21_lengths notebooks read them.
# Usage: bash tools/run_reference.sh [pe ...]   (default: every encoding of the study)
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
pes=("${@:-learned sinusoidal none t5 shaw huang4}")
for pe in ${pes[@]}; do
  run=runs/reference/$pe
  posenc_lit pretrain --pe "$pe" --preset reference --out "$run" --resume --quiet
  mkdir -p results/pretraining/$pe
  cp "$run/config.json" "$run/metrics.jsonl" "$run/summary.json" results/pretraining/$pe/
  posenc_lit lengths --run "$run"
  cp "$run/lengths.json" results/pretraining/$pe/
  python tools/inspect_run.py "$run" results/pretraining/$pe
  echo "finished $pe: $(cat results/pretraining/$pe/summary.json | tr -d '\n ')"
done
