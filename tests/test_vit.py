"""Parity of the ViT (`posenc_lit.vit`) with Hugging Face `transformers` 5.x `models.vit`.

- `interpolate_pos_embed` against `ViTEmbeddings.interpolate_pos_encoding` (bicubic, align_corners=False, no
  antialias, a square old grid as HF assumes): several new grids, square and not, larger and smaller.
- A whole model: our `ViT(pe='learned', pool='cls', stem='patch')` with an HF `ViTModel`'s weights copied in gives HF's
  last hidden state at the training size and, with `interpolate='bicubic'`, at other sizes
  (`interpolate_pos_encoding=True`), non-square included.
The notebook (nbs/13_vit.ipynb) stays free of `transformers`, a dev-only dependency; run with `-s` to print the
relative differences.
"""
import pytest
import torch

from transformers import ViTConfig as HFViTConfig, ViTModel   # a dev dependency (settings.ini): a missing install fails, it does not skip
from transformers.models.vit.modeling_vit import ViTEmbeddings
from posenc_lit.vit import ViT, ViTConfig, interpolate_pos_embed

TOL = 1e-6


def rel_diff(ours, theirs, what=''):
    d = ((ours - theirs).abs().max() / theirs.abs().max()).item()
    print(f'{what}: max relative difference {d:.2e}')
    return d


def hf_config(D=16, layers=2, heads=2, image=28, patch=4, chans=1):
    return HFViTConfig(hidden_size=D, num_hidden_layers=layers, num_attention_heads=heads, intermediate_size=2 * D,
                       image_size=image, patch_size=patch, num_channels=chans, layer_norm_eps=1e-6, hidden_act='gelu',
                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@pytest.mark.parametrize('D,old,new', [(16, 7, (7, 7)), (16, 7, (8, 8)), (16, 7, (9, 12)), (8, 7, (4, 5)),
                                       (32, 14, (24, 24)), (8, 4, (2, 7))])
def test_interpolate_matches_hf(D, old, new):
    torch.manual_seed(0)
    emb = ViTEmbeddings(hf_config(D=D, image=4 * old, patch=4)).eval()
    table = torch.randn(1, 1 + old * old, D)
    with torch.no_grad():
        emb.position_embeddings.copy_(table)
        dummy = torch.zeros(1, 1 + new[0] * new[1], D)                     # HF reads only its shape
        theirs = emb.interpolate_pos_encoding(dummy, 4 * new[0], 4 * new[1])
    ours = interpolate_pos_embed(table, (old, old), new)
    assert ours.shape == theirs.shape == (1, 1 + new[0] * new[1], D)
    assert rel_diff(ours, theirs, f'{old}x{old} -> {new}') < TOL


def copy_hf_weights(hf: ViTModel, ours: ViT):
    "Load HF's ViT weights into our model, every tensor named explicitly (strict)."
    sd = hf.state_dict()
    m = {'cls_token': 'embeddings.cls_token', 'pe.weight': 'embeddings.position_embeddings',
         'stem.weight': 'embeddings.patch_embeddings.projection.weight', 'stem.bias': 'embeddings.patch_embeddings.projection.bias',
         'norm.weight': 'layernorm.weight', 'norm.bias': 'layernorm.bias'}
    for l in range(len(ours.layers)):
        for a in 'qkvo': m[f'layers.{l}.attn.{a}_proj'] = f'layers.{l}.attention.{a}_proj'
        m.update({f'layers.{l}.attn_ln': f'layers.{l}.layernorm_before', f'layers.{l}.ffn_ln': f'layers.{l}.layernorm_after',
                  f'layers.{l}.ffn.0': f'layers.{l}.mlp.fc1', f'layers.{l}.ffn.2': f'layers.{l}.mlp.fc2'})
    new = {}
    for ours_name, theirs_name in m.items():
        if ours_name in ('cls_token', 'pe.weight') or ours_name.endswith(('weight', 'bias')): new[ours_name] = sd[theirs_name]
        else: new.update({f'{ours_name}.{p}': sd[f'{theirs_name}.{p}'] for p in ('weight', 'bias')})
    new.update({k: v for k, v in ours.state_dict().items() if k.startswith('head.')})
    ours.load_state_dict(new, strict=True)
    return ours


@pytest.mark.parametrize('size', [(28, 28), (32, 32), (36, 44), (20, 28)])
def test_model_matches_hf(size):
    torch.manual_seed(0)
    hf = ViTModel(hf_config(), add_pooling_layer=False).eval()
    with torch.no_grad():   # HF initialises cls and positions with a truncated normal; make them distinct and non-trivial
        hf.embeddings.cls_token.normal_(); hf.embeddings.position_embeddings.normal_()
    ours = copy_hf_weights(hf, ViT(ViTConfig(image_size=28, patch_size=4, d_model=16, n_layers=2, n_heads=2, d_ff=32))).eval()
    x = torch.randn(2, 1, *size)
    with torch.no_grad():
        theirs = hf(x, interpolate_pos_encoding=size != (28, 28)).last_hidden_state
        mine = ours.features(x)['hidden_states']
    assert rel_diff(mine, theirs, f'ViT at {size}') < 1e-5

