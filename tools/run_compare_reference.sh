#!/usr/bin/env bash
# The reference `posenc_lit compare` study (issue 6), run in parts: each call adds the encodings it names to those
# already in results/compare/reference/results.json and runs their stages; finished stages of earlier parts are only
# read (their summaries are committed, their model weights are not: see .gitignore). A part must finish its
# encodings within the session: an encoding whose pretraining finished but whose fine-tuning did not needs its
# checkpoint, which a new session no longer has (then delete results/compare/reference/{pretrain,lengths,finetune}/<pe>
# and run it again). The ViT grid of the reference preset is the ViT study (tools/run_vit_study.sh), so --no-vit.
# Usage: bash tools/run_compare_reference.sh ENCODING [ENCODING ...]
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
out=results/compare/reference
earlier=()
if [ -f "$out/results.json" ]; then
  read -r -a earlier <<< "$(python -c "import json, sys; print(' '.join(json.load(open(sys.argv[1]))['encodings']))" "$out/results.json")"
fi
posenc_lit compare --preset reference --encodings "${earlier[@]}" "$@" --no-vit --out "$out" --quiet
