"""Small artifacts of a finished reference run for the 20_pretraining notebook, written to results/pretraining/<pe>/.

- `inspect.safetensors`: the attention probabilities of every layer on one sentence (`attn.<layer>`: (h, n, n)),
  its `input_ids`, and the learned position parameters of the encoding (`pe.<name>`, without projection matrices;
  tables are cut to the positions and distances seen in training: positions < seq_len, |j - i| < seq_len).
- `four_terms.safetensors` (absolute encodings): the four terms of the first layer's logits (Ke et al. 2021, §3.1).

Usage: python tools/inspect_run.py RUN_DIR DEST_DIR
"""
import json, sys
from pathlib import Path
import torch
from safetensors.torch import save_file
from posenc_lit.model import load_model, four_term_scores
from posenc_lit.data import load_tokenizer, CLS_ID, SEP_ID

run, dest = Path(sys.argv[1]), Path(sys.argv[2])
model = load_model(run / 'checkpoint').eval()
seq_len = json.loads((run / 'config.json').read_text())['seq_len']
tok = load_tokenizer(run / 'checkpoint' / 'tokenizer.json')
text = 'It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.'
ids = torch.tensor([[CLS_ID] + tok.encode(text, add_special_tokens=False).ids + [SEP_ID]])
with torch.no_grad(): attn = model.encoder(ids, output_attentions=True)['attentions']
out = {f'attn.{l}': a[0].contiguous() for l, a in enumerate(attn)} | {'input_ids': ids[0]}
pe, max_pos = model.encoder.pe, model.cfg.max_position_embeddings
span = getattr(pe, 'span', getattr(pe, 'k', None))                    # relative tables: the row of distance 0
for name, p in pe.state_dict().items():
    if any(s in name for s in ('proj', 'u_q', 'u_k')): continue          # projections, not position parameters
    if span and p.ndim == 2 and p.shape[0] in (2 * span, 2 * span + 1) and span >= seq_len:
        p = p[span - (seq_len - 1): span + seq_len]                      # rows of distances -(seq_len-1) … seq_len-1
    elif p.ndim == 2 and p.shape[0] == max_pos > seq_len:
        p = p[:seq_len]                                                  # absolute tables: the positions seen in training
    out[f'pe.{name}'] = p.detach().float().contiguous()
save_file(out, str(dest / 'inspect.safetensors'), metadata={'text': text, 'pe': model.cfg.pe})
if pe.kind == 'absolute':
    with torch.no_grad(): terms = four_term_scores(model, ids)
    save_file({k: v[0].contiguous() for k, v in terms.items()} | {'input_ids': ids[0]}, str(dest / 'four_terms.safetensors'))
print(f'wrote {dest}/inspect.safetensors' + (' and four_terms.safetensors' if pe.kind == 'absolute' else ''))
