#!/usr/bin/env bash
# The ViT reference study (40_vit_study): one run per study entry with the `reference` preset, resumable.
# Each run resumes from runs/vit/<name>/checkpoint if interrupted; a finished run is skipped. Every run is tested at
# 28×28, 56×56 and 28×56 with the table interpolated bicubically, bilinearly or re-initialised (`none`). `learned` also
# fine-tunes at 56×56 three times from the trained model (table bicubic, bilinear, re-initialised), `sincos2d` once.
# `quick` is the quick preset (learned, 1,000 steps on the embedded subset), the run the notebook's quick-run claim reads.
# When a run finishes, its config.json, metrics.jsonl and summary.json are copied to results/vit/<name>/, with its trained
# position table (pos_embed.safetensors, tools/vit_pos_table.py) — all committed; the 40_vit_study notebook reads them.
# Usage: bash tools/run_vit_study.sh [name ...]   (default: every entry of the study, in the order below)
# Run it with OMP_NUM_THREADS set to the threads you can spare (the numbers depend on it in the last digits).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

FT="--finetune-res 56 --finetune-steps 100 --finetune-eval-sizes 56"
# study entry -> vit options (an encoding name alone runs that encoding with its defaults)
args_for() {
  case "$1" in
    learned)  echo "--pe learned $FT --finetune-init bicubic,bilinear,none" ;;   # the paper's 1D table; three fine-tunes
    sincos2d) echo "--pe sincos2d $FT" ;;                                         # no table: one fine-tune
    hybrid)   echo "--pe learned --stem hybrid" ;;                                # learned 1D on the ResNet stem (§3.1)
    quick)    echo "--pe learned --preset quick" ;;                               # the quick preset: the notebook's quick-run claim
    *)        echo "--pe $1" ;;
  esac
}

study=(learned none sincos2d learned2d hybrid rope2d rel2d quick)
names=("${@:-${study[@]}}")
for name in "${names[@]}"; do
  run=runs/vit/$name
  # shellcheck disable=SC2046
  posenc_lit vit --preset reference $(args_for "$name") --out "$run" --resume --quiet   # a later --preset wins
  mkdir -p results/vit/$name
  cp "$run/config.json" "$run/metrics.jsonl" "$run/summary.json" results/vit/$name/
  python tools/vit_pos_table.py "$run" results/vit/$name
  echo "finished $name: $(python -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s["test_accuracy"], s["eval"]["56x56"], s["wall_s"])' results/vit/$name/summary.json)"
done
