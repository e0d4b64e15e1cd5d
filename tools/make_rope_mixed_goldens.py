"""Golden outputs of timm's `RotaryEmbeddingMixed` (RoPE-Mixed, Heo et al. 2024; timm says it is compatible with the
authors' naver-ai/rope-vit) for tests/test_rope_mixed.py, committed as `tests/fixtures/timm_rope_mixed.safetensors`.

timm is not installed in this project's environment: its wheel requires torchvision, and the only torchvision wheels
the package registry offers here are CUDA builds that fail at import beside the CPU torch (and break `transformers`).
The one module needed, `timm/layers/pos_embed_sincos.py`, imports only torch and three small timm modules, so
`load_timm_sincos` loads it on its own, without running timm's package `__init__` (which imports torchvision). To
regenerate (timm 1.0.31 made the committed file; torch comes from the project venv):

    pip install --no-deps --target /tmp/timm_site timm==1.0.31
    PYTHONPATH=/tmp/timm_site python tools/make_rope_mixed_goldens.py

Each case builds `RotaryEmbeddingMixed(dim=h·d, depth=L, num_heads=h)` after `torch.manual_seed(seed)` (its initial
frequencies: `init`), then sets other frequencies (`trained`: the initial ones plus noise, as after training), and
rotates random queries of the patches of two grids with each layer's embedding (`apply_rot_embed_cat`, interleaved
pairs, as timm's attention applies it).
"""
import importlib, importlib.util, sys, types
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / 'tests' / 'fixtures' / 'timm_rope_mixed.safetensors'
L, H, D, SEED = 3, 2, 8, 0  # layers, heads, head dimension, the seed of timm's initial frequencies
GRIDS = ((3, 4), (5, 6))  # (rows, cols): the training grid and a larger one


def load_timm_sincos():
    "timm's `timm.layers.pos_embed_sincos` module, loaded without timm's package `__init__`; None without timm."
    spec = importlib.util.find_spec('timm')  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(spec.submodule_search_locations[0])
    for name, path in (('timm', root), ('timm.layers', root / 'layers')):
        if name not in sys.modules:  # empty packages: their submodules load, their __init__ does not run
            pkg = types.ModuleType(name)
            pkg.__path__ = [str(path)]
            sys.modules[name] = pkg
    return importlib.import_module('timm.layers.pos_embed_sincos')


def goldens(T) -> dict:
    "The tensors of the golden file, computed with timm's module `T`."
    import torch
    torch.manual_seed(SEED)
    rope = T.RotaryEmbeddingMixed(dim=H * D, depth=L, num_heads=H)
    out = {'init.freqs': rope.freqs.detach().clone()}  # (2, L, h, d/2): θˣ, θʸ
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        rope.freqs.add_(torch.randn(rope.freqs.shape, generator=g) * 0.5)
        out['trained.freqs'] = rope.freqs.detach().clone()
        for gh, gw in GRIDS:
            q = torch.randn(2, H, gh * gw, D, generator=g)  # the patches only, reading order
            emb = rope.get_embed([gh, gw])  # (L, h, N, 2d): sin | cos
            out[f'q.{gh}x{gw}'] = q
            for l in range(L):
                out[f'trained.{gh}x{gw}.layer{l}'] = T.apply_rot_embed_cat(q, emb[l])
    return out


if __name__ == '__main__':
    from safetensors.torch import save_file
    T = load_timm_sincos()
    if T is None:
        sys.exit('timm not found: pip install --no-deps --target /tmp/timm_site timm==1.0.31, then set PYTHONPATH')
    import timm.version
    save_file({k: v.contiguous() for k, v in goldens(T).items()}, str(OUT),
              metadata={'timm': timm.version.__version__, 'layers': str(L), 'heads': str(H), 'd_head': str(D)})
    print(f'wrote {OUT} (timm {timm.version.__version__})')
