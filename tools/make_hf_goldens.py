"""Golden outputs of Hugging Face BERT's `relative_key` (Shaw keys) and `relative_key_query` (Huang et al. method 4).

Both were removed from `transformers` 5.x (PR #41170), so the goldens are made once, in a throwaway environment with
`transformers` 4.57.6, and committed as `tests/fixtures/hf_bert_relative.safetensors`; `tests/test_relative.py`
loads the same weights and inputs into posenc_lit and compares. To regenerate (torch comes from the project venv):

    pip install --target /tmp/hf4lib "transformers==4.57.6" "huggingface_hub<1.0" "tokenizers<0.23"
    PYTHONPATH=/tmp/hf4lib python tools/make_hf_goldens.py

Each case runs `BertSelfAttention` (float64, no dropout) on random hidden states with a key-padding mask, as
self-attention (query length = key length = 12) and with separate key states (query length 5, key length 9).
"""
import json, sys
from pathlib import Path
import torch
import transformers
from transformers import BertConfig
from transformers.models.bert.modeling_bert import BertSelfAttention
from safetensors.torch import save_file

assert transformers.__version__.startswith('4.'), f'needs transformers 4.x (relative_key was removed in 5.x); got {transformers.__version__}'
out = Path(__file__).resolve().parent.parent / 'tests' / 'fixtures' / 'hf_bert_relative.safetensors'
tensors, H, D, L = {}, 4, 32, 16
for kind in ('relative_key', 'relative_key_query'):
    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=D, num_attention_heads=H, max_position_embeddings=L, attention_probs_dropout_prob=0.0,
                     position_embedding_type=kind, attn_implementation='eager')
    att = BertSelfAttention(cfg).double().eval()
    for p in att.parameters(): torch.nn.init.normal_(p, std=0.5)       # large enough that every term matters
    for p in ('query', 'key', 'value'):
        tensors[f'{kind}.{p}.weight'], tensors[f'{kind}.{p}.bias'] = getattr(att, p).weight.detach(), getattr(att, p).bias.detach()
    tensors[f'{kind}.distance_embedding.weight'] = att.distance_embedding.weight.detach()
    for case, (i, j) in (('self', (12, 12)), ('cross', (5, 9))):
        x = torch.randn(2, i, D, dtype=torch.float64)
        kv = x if case == 'self' else torch.randn(2, j, D, dtype=torch.float64)
        keep = torch.ones(2, j, dtype=torch.bool); keep[1, -2:] = False       # the second example's last two keys are padding
        additive = torch.zeros(2, 1, 1, j, dtype=torch.float64).masked_fill(~keep[:, None, None, :], torch.finfo(torch.float64).min)
        with torch.no_grad():
            ctx, probs = att(x, attention_mask=additive, encoder_hidden_states=None if case == 'self' else kv,
                             output_attentions=True)[:2]
        p = f'{kind}.{case}'
        tensors |= {f'{p}.hidden_states': x, f'{p}.key_states': kv, f'{p}.key_mask': keep.to(torch.uint8),
                    f'{p}.context': ctx, f'{p}.probs': probs}
save_file({k: v.clone().contiguous() for k, v in tensors.items()}, str(out),
          metadata={'transformers': transformers.__version__, 'torch': torch.__version__, 'script': 'tools/make_hf_goldens.py',
                    'config': json.dumps({'hidden_size': D, 'num_attention_heads': H, 'max_position_embeddings': L})})
print(f'wrote {out} ({out.stat().st_size} bytes) with transformers {transformers.__version__}')
