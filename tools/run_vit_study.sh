#!/usr/bin/env bash
# The ViT reference study (40_vit_study): one run per study entry and seed, `reference` preset, resumable.
#
# Usage: bash tools/run_vit_study.sh [NAME ...]   (default: seed 0 of every study entry, in the order below)
#   NAME is a study entry (below), optionally with a seed: `learned` (seed 0), `learned-s1` (`--seed 1`).
#   Every name is checked before the first run starts. Start one lane per core with its own names, e.g.
#     OMP_NUM_THREADS=1 bash tools/run_vit_study.sh rope-mixed rope-mixed-s1 rope-mixed-s2 &
#     OMP_NUM_THREADS=1 bash tools/run_vit_study.sh rope2d-s1 rope2d-s2 &
# A run trains in runs/vit/NAME and resumes from its checkpoint when started again; a NAME whose
# results/vit/NAME/summary.json is committed is skipped. Every run is tested at 28×28, 56×56 and 28×56 with
# the table interpolated bicubically, bilinearly or re-initialised (`none`). `learned` also fine-tunes at
# 56×56 three times from the trained model (table bicubic, bilinear, re-initialised), `sincos2d` once.
# `quick` is the quick preset (learned, 1,000 steps on the embedded subset), the notebook's quick run.
# When a run finishes, its config.json, metrics.jsonl and summary.json are copied to results/vit/NAME/, with
# its trained position table (pos_embed.safetensors, tools/vit_pos_table.py), and committed (COMMIT=0 to
# skip); 40_vit_study and the ViT rows of the claims pages (41_claims, 42_decoder_study) read every seed.
# PRESET=smoke runs every entry with the tiny smoke preset instead (seconds; for tests).
# Run it with OMP_NUM_THREADS set to the threads you can spare (the numbers depend on it in the last digits).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/lane_lib.sh"   # commit_result, check_names, split_name
# STUDY_ROOT: the checkout to write into (the code may be a frozen copy)
cd "${STUDY_ROOT:-$(dirname "$0")/..}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

FT="--finetune-res 56 --finetune-steps 100 --finetune-eval-sizes 56"
# study entry -> vit options
args_for() {
  case "$1" in
    learned)    echo "--pe learned $FT --finetune-init bicubic,bilinear,none" ;; # 1D; three fine-tunes
    sincos2d)   echo "--pe sincos2d $FT" ;;                              # no table: one fine-tune
    hybrid)     echo "--pe learned --stem hybrid" ;;                     # 1D on the ResNet stem (§3.1)
    quick)      echo "--pe learned --preset quick" ;;                    # the quick-run claim
    rope-mixed) echo "--pe rope-mixed" ;;  # Heo et al. 2024, like rope2d: its claim is zero-shot at 56×56
    *)          echo "--pe $1" ;;                                        # none learned2d rope2d rel2d
  esac
}

study=(learned none sincos2d learned2d hybrid rope2d rel2d rope-mixed quick)
names=("${@:-${study[@]}}")
check_names run_vit_study.sh "${study[*]}" "${names[@]}" || exit 2
# the reference preset reads `auto`: the full Fashion-MNIST where it is found, else the embedded subset. A run
# on the subset would not be a seed of the committed runs, so none starts without the full data set
full=0
for name in "${names[@]}"; do split_name "$name"; [ -n "${PRESET:-}" ] || [ "$entry" = quick ] || full=1; done
if [ "$full" = 1 ] && ! python -c 'import sys
from posenc_lit.vision import VisionDataError, resolve_source
try:
    resolve_source("fashion-mnist-full")
except VisionDataError as e:
    sys.exit(f"run_vit_study.sh: {e}; nothing was run (the reference runs train on the full Fashion-MNIST)")'
then
  exit 2
fi

for name in "${names[@]}"; do
  split_name "$name"
  run=runs/vit/$name dest=results/vit/$name
  if [ -f "$dest/summary.json" ]; then echo "done already: $name"; continue; fi
  # shellcheck disable=SC2046
  posenc_lit vit --preset reference $(args_for "$entry") --seed "$seed" ${PRESET:+--preset "$PRESET"} \
    --out "$run" --resume --quiet   # a later --preset wins
  mkdir -p "$dest"
  cp "$run/config.json" "$run/metrics.jsonl" "$run/summary.json" "$dest/"
  python "$HERE/vit_pos_table.py" "$run" "$dest"
  commit_result "vit study: $name finished (tools/run_vit_study.sh)" "$dest"
  echo "finished $name: $(python -c 'import json, sys; s = json.load(open(sys.argv[1]))
print(s["test_accuracy"], s["eval"]["56x56"], s["wall_s"])' "$dest/summary.json")"
done
