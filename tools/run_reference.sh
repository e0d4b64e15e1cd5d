#!/usr/bin/env bash
# The reference pretraining study: one run per study entry with the `reference` preset, resumable.
# Each run resumes from runs/reference/<name>/checkpoint if interrupted; a finished run is skipped.
# When a run finishes, its config.json, metrics.jsonl and summary.json are copied to results/pretraining/<name>/, its
# length generalization is measured (lengths.json; 37_lengths) and tools/inspect_run.py saves attention maps and the
# learned position parameters (inspect.safetensors), and the attention mass at each distance is measured (locality.json;
# 38_locality) — all committed; the 36_pretraining and 37_lengths notebooks read them.
# Usage: bash tools/run_reference.sh [name ...]   (default: every entry of the study, in the order below)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

source "$HERE/study_entries.sh"   # args_for: study entry -> pretrain options

study=(learned sinusoidal none t5 huang4 shaw tupe-a tupe-r tupe-a-tiecls deberta deberta-noemd deberta-noc2p deberta-nop2c rope alibi)
names=("${@:-${study[@]}}")
for name in "${names[@]}"; do
  run=runs/reference/$name
  # shellcheck disable=SC2046
  posenc_lit pretrain $(args_for "$name") --preset reference --out "$run" --resume --quiet
  mkdir -p results/pretraining/$name
  cp "$run/config.json" "$run/metrics.jsonl" "$run/summary.json" results/pretraining/$name/
  posenc_lit lengths --run "$run"
  cp "$run/lengths.json" results/pretraining/$name/
  python tools/inspect_run.py "$run" results/pretraining/$name
  python -c 'import sys; from posenc_lit.locality import locality_run; locality_run(sys.argv[1])' "$run"   # 38_locality
  cp "$run/locality.json" results/pretraining/$name/
  echo "finished $name: $(tr -d '\n ' < results/pretraining/$name/summary.json)"
done
