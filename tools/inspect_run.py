"""Small artifacts of a finished reference run for the 36_pretraining notebook, written to results/pretraining/<pe>/.

- `inspect.safetensors`: the attention probabilities of every layer on one sentence (`attn.<layer>`: (h, n, n)),
  its `input_ids`, and the learned position parameters of the encoding (`pe.<name>`, without projection matrices;
  tables are cut to the positions and distances seen in training: positions < seq_len, |j - i| < seq_len).
- `four_terms.safetensors` (absolute encodings): the four terms of the first layer's logits (Ke et al. 2021, §3.1).
- in `inspect.safetensors` too, for encodings of kind `score`: each layer's position terms of the logits on the sentence
  (`terms.<layer>`: (n_terms, h, n, n), already scaled, in the order the encoding returns them — TUPE: its one shared
  term; DeBERTa: c2p then p2c), and their names in the metadata (`terms`); for TUPE also `positional`: (h, seq_len,
  seq_len), its positional correlation (p_i U^Q)(p_j U^K)/sqrt(2d) over the positions seen in training, before the
  [CLS] reset.

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
pe = model.encoder.pe
seen = {}                                          # layer -> (hidden states, ctx) as each attention receives them
def grab(mod, args, kwargs): seen[mod.layer_idx] = (args[0], kwargs['ctx'])
hooks = [layer.attn.register_forward_pre_hook(grab, with_kwargs=True) for layer in model.encoder.layers]
with torch.no_grad(): attn = model.encoder(ids, output_attentions=True)['attentions']
for h in hooks: h.remove()
out = {f'attn.{l}': a[0].contiguous() for l, a in enumerate(attn)} | {'input_ids': ids[0]}
term_names = {'deberta': [t for t in ('c2p', 'p2c') if t in getattr(pe, 'pos_att_type', ())],
              'tupe-a': ['positional'], 'tupe-r': ['positional + relative']}.get(model.cfg.pe)
if pe.kind == 'score':
    for layer in model.encoder.layers:
        mha = layer.attn
        x, ctx = seen[mha.layer_idx]
        with torch.no_grad():
            q, k = pe.transform_qk(mha.split_heads(mha.q_proj(x)), mha.split_heads(mha.k_proj(x)), ctx, mha)
            terms = torch.stack([t.expand(1, mha.n_heads, -1, -1)[0] for t in pe.score_terms(q, k, ctx, mha)])
        out[f'terms.{mha.layer_idx}'] = terms.float().contiguous()                   # (n_terms, h, n, n)
    term_names = term_names or [f'term{t}' for t in range(len(terms))]
max_pos = model.cfg.max_position_embeddings
span = getattr(pe, 'span', getattr(pe, 'k', None))                    # relative tables: the row of distance 0
for name, p in pe.state_dict().items():
    if any(s in name for s in ('proj', 'u_q', 'u_k')): continue          # projections, not position parameters
    if span and p.ndim == 2 and p.shape[0] in (2 * span, 2 * span + 1) and span >= seq_len:
        p = p[span - (seq_len - 1): span + seq_len]                      # rows of distances -(seq_len-1) … seq_len-1
    elif p.ndim == 2 and p.shape[0] == max_pos > seq_len:
        p = p[:seq_len]                                                  # absolute tables: the positions seen in training
    out[f'pe.{name}'] = p.detach().float().contiguous()
if hasattr(pe, 'positional_term'):                   # TUPE: the learned positional correlation over the trained range
    with torch.no_grad(): out['positional'] = pe.positional_term(torch.arange(seq_len), torch.arange(seq_len))[0].float().contiguous()
save_file(out, str(dest / 'inspect.safetensors'), metadata={'text': text, 'pe': model.cfg.pe} | ({'terms': ','.join(term_names)} if term_names else {}))
if pe.kind == 'absolute':
    with torch.no_grad(): terms = four_term_scores(model, ids)
    save_file({k: v[0].contiguous() for k, v in terms.items()} | {'input_ids': ids[0]}, str(dest / 'four_terms.safetensors'))
print(f'wrote {dest}/inspect.safetensors' + (' and four_terms.safetensors' if pe.kind == 'absolute' else ''))
