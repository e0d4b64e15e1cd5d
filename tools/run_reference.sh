#!/usr/bin/env bash
# The reference pretraining study: one run per encoding with the `reference` preset, resumable.
# Each run resumes from runs/reference/<pe>/checkpoint if interrupted; a finished run is skipped.
# When a run finishes, its config.json, metrics.jsonl and summary.json are copied to results/pretraining/<pe>/
# (committed; the 20_pretraining notebook reads them). Usage: bash tools/run_reference.sh [pe ...]
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
pes=("${@:-learned sinusoidal none}")
for pe in ${pes[@]}; do
  run=runs/reference/$pe
  posenc_lit pretrain --pe "$pe" --preset reference --out "$run" --resume --quiet
  mkdir -p results/pretraining/$pe
  cp "$run/config.json" "$run/metrics.jsonl" "$run/summary.json" results/pretraining/$pe/
  python - "$run" results/pretraining/$pe <<'PY'
import sys, torch
from pathlib import Path
from safetensors.torch import save_file
from posenc_lit.model import load_model, four_term_scores
from posenc_lit.data import load_tokenizer
run, dest = Path(sys.argv[1]), Path(sys.argv[2])
model = load_model(run / 'checkpoint').eval()
if model.encoder.pe.kind != 'absolute': raise SystemExit(0)
tok = load_tokenizer(run / 'checkpoint' / 'tokenizer.json')
text = 'It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.'
ids = torch.tensor([[2] + tok.encode(text, add_special_tokens=False).ids + [3]])
with torch.no_grad(): terms = four_term_scores(model, ids)
save_file({k: v[0].contiguous() for k, v in terms.items()} | {'input_ids': ids[0]}, str(dest / 'four_terms.safetensors'))
PY
  echo "finished $pe: $(cat results/pretraining/$pe/summary.json | tr -d '\n ')"
done
