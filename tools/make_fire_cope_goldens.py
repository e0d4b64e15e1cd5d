"""Golden outputs of reference FIRE and CoPE modules for tests/test_fire.py and tests/test_cope.py, committed
as `tests/fixtures/fire_reference.safetensors` and `tests/fixtures/cope_reference.safetensors`.

No reference code is copied here: each module is loaded from a file of the reference repository that the
caller names (`--fire PATH`, `--cope PATH`, or the environment variables `POSENC_FIRE_REF`, `POSENC_COPE_REF`,
which the live tests read too). To regenerate (torch comes from the project venv):

    git clone https://github.com/facebookresearch/RAM /tmp/RAM
    git clone https://github.com/mcleish7/arithmetic /tmp/ar
    mkdir -p /tmp/ref
    git -C /tmp/RAM show e6f051fb:projects/cope/src/cope/context_position.py > /tmp/ref/context_position.py
    git -C /tmp/ar show 86022a57:cramming/architectures/embeddings.py > /tmp/ref/arithmetic_embeddings.py
    python tools/make_fire_cope_goldens.py --fire /tmp/ref/arithmetic_embeddings.py \
        --cope /tmp/ref/context_position.py

**CoPE**: the authors' code, facebookresearch/RAM at e6f051fb (the file last changed in eff93c70), module
`projects/cope/src/cope/context_position.py`, class `ContextPosSelfAttn` (imports only torch and the standard
library). Its default configuration: gates from the attention keys, `sigmoid(q·k/sqrt(d))` times the 0/1 mask;
positions the reversed cumulative sum of the gates, clamped at `npos - 1`; `pos_emb` of shape `(1, d, npos)`,
one per layer shared by the heads; the position logits added before the division by sqrt(d), or after it with
`cope_nodiv`. Both settings are computed. Inputs are `(b·h, n, d)`; the mask is the one the authors'
transformer builds for a padded causal decoder (padding keys 0, a padding query sees itself, times the causal
triangle), with queries that are the last keys (self-attention, and a cache step: the last 3 queries against
all keys).

**FIRE**: Li et al. 2024 (arXiv 2310.04418) give a PyTorch listing in their appendix but no repository. We use
mcleish7/arithmetic at 86022a57 (the file last changed in 55af9d5e), `cramming/architectures/embeddings.py`,
class `FIRE`: its docstring cites the paper, its parameters and defaults are the listing's (MLP 1 → 32 ReLU →
h, c = 0.1, L = |ℓ|·512 with a learned multiplier ℓ, ε = 1e-6 added to the normalizer), at least one other
public implementation links to this very commit, and its attention adds the bias after the 1/sqrt(d) scaling,
as ours. Its one addition to the listing, randomized positions, is off in eval mode (positions 0 … n-1), where
we call it. The file imports `einops`, which FIRE does not use; without einops a placeholder module stands in
during the import only. The reference is causal in use: its bias for keys after the query (even in i - j) is
masked, ours there is the odd extension, so only j ≤ i is compared."""
import argparse, contextlib, hashlib, importlib.util, os, sys, types
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / 'tests' / 'fixtures'
FIRE_OUT, COPE_OUT = FIXTURES / 'fire_reference.safetensors', FIXTURES / 'cope_reference.safetensors'
FIRE_ENV, COPE_ENV = 'POSENC_FIRE_REF', 'POSENC_COPE_REF'
FIRE_REF = ('mcleish7/arithmetic', 'cramming/architectures/embeddings.py',
            '86022a57d38c0fde46444d62e8dcbebcc0af614c')
COPE_REF = ('facebookresearch/RAM', 'projects/cope/src/cope/context_position.py',
            'e6f051fbcfaef4cab69bf2ea1b25f500f94c0c64')

SEED = 0
FIRE_H, FIRE_W, FIRE_LAYERS, FIRE_LENGTHS = 3, 16, 2, (12, 30)  # heads, MLP width, layers, sequence lengths
# (c, ℓ) of each layer, far from the initial (0.1, 1): L = |ℓ|·512 ≈ 6.7 and 10.2 tokens, which every
# length crosses
FIRE_C_ELL = ((0.37, 0.013), (-0.8, -0.02))  # layer 1: negative c and ℓ (the listing takes |c x|, |ℓ L_0|)
COPE_B, COPE_H, COPE_D, COPE_N, COPE_NPOS, COPE_LAYERS = 2, 3, 8, 9, 5, 2  # counts pass npos - 1 = 4: clamped
COPE_CASES = {'self': COPE_N, 'cache': 3}  # queries: all 9 tokens, and the last 3 against all 9 keys


def git_blob_sha(path) -> str:
    "The git object id of a file's contents (as `git hash-object`): which version of the reference was read."
    data = Path(path).read_bytes()
    return hashlib.sha1(b'blob %d\0' % len(data) + data).hexdigest()


def _absent(what):
    "A stand-in for a name of a module that is not installed: it raises if called."

    def absent(*args, **kwargs):
        raise RuntimeError(f'{what} is a placeholder: install the package to call it')

    return absent


@contextlib.contextmanager
def _placeholder(name, attrs):
    "A module `name` of stand-ins `attrs` while the block runs, if `name` cannot be imported; removed after."
    if name in sys.modules or importlib.util.find_spec(name) is not None:
        yield
        return
    mod = types.ModuleType(name)
    for attr in attrs:  # e.g. `from einops import repeat` gets a stand-in
        setattr(mod, attr, _absent(f'{name}.{attr}'))
    sys.modules[name] = mod
    try:
        yield
    finally:
        del sys.modules[name]


def load_module(path, name, placeholders=None):
    "The module in file `path` (None when `path` is None or absent), imported as `name` without its package."
    if not path or not Path(path).is_file():
        return None
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    with contextlib.ExitStack() as stack:
        for p, attrs in (placeholders or {}).items():
            stack.enter_context(_placeholder(p, attrs))
        spec.loader.exec_module(mod)
    return mod


def load_fire(path=None):
    "`(module, path)`: the module of the reference `FIRE` from `path` or $POSENC_FIRE_REF (None: no file)."
    path = path or os.environ.get(FIRE_ENV)
    return load_module(path, 'ref_fire_embeddings', placeholders={'einops': ('repeat',)}), path


def load_cope(path=None):
    "`(module, path)`: the module of the authors' `ContextPosSelfAttn` from `path` or $POSENC_COPE_REF."
    path = path or os.environ.get(COPE_ENV)
    return load_module(path, 'ref_cope_context_position'), path


# ---------------------------------------------------------------- FIRE
def fire_goldens(M) -> dict:
    "The tensors of the FIRE golden file, from the reference module `M` (eval mode: positions 0 … n-1)."
    import torch
    torch.manual_seed(SEED)
    init = M.FIRE(num_heads=FIRE_H, mlp_width=FIRE_W)
    out = {f'init.{k}': v.detach().clone() for k, v in init.state_dict().items()}
    g = torch.Generator().manual_seed(1)
    for l, (c, ell) in enumerate(FIRE_C_ELL):
        ref = M.FIRE(num_heads=FIRE_H, mlp_width=FIRE_W).eval()
        with torch.no_grad():
            for p in ref.mlp.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.3)
            ref.c.fill_(c)
            ref.L_multiplier.fill_(ell)
            out.update({f'layer{l}.{k}': v.detach().clone() for k, v in ref.state_dict().items()})
            for n in FIRE_LENGTHS:
                out[f'layer{l}.bias.n{n}'] = ref(n, torch.device('cpu'))  # (1, h, n, n)
    return out


# ---------------------------------------------------------------- CoPE
def cope_config(nodiv: bool):
    "The authors' configuration fields that `ContextPosSelfAttn` reads: CoPE alone, gates from the keys."
    return types.SimpleNamespace(
        drop=0.0, cope_layers=1, pos_emb='cope', cope_npos=COPE_NPOS, block_size=COPE_N, head_dim=COPE_D,
        cope_val_gates=False, cope_sep_key=False, cope_nodiv=nodiv,
    )


def cope_mask(keep, n_q):
    "`(b·h, i, j)` float 0/1: the authors' mask of a padded causal decoder, the queries the last `n_q` keys."
    import torch
    n_k = keep.shape[1]
    allowed = keep[:, None, :].expand(-1, n_q, -1).clone()  # (b, i, j): padding keys 0
    allowed[:, :, n_k - n_q:] |= torch.eye(n_q, dtype=torch.bool)  # a padding query sees itself
    causal = torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)  # (i, j): keys up to the query's own
    return (allowed & causal).float().repeat_interleave(COPE_H, dim=0)  # (b·h, i, j)


def cope_goldens(M) -> dict:
    "The tensors of the CoPE golden file, computed with the authors' module `M` (`(b·h, n, d)` inputs)."
    import torch
    g = torch.Generator().manual_seed(SEED)
    q, k, v = (torch.randn(COPE_B, COPE_H, COPE_N, COPE_D, generator=g) for _ in range(3))
    keep = torch.ones(COPE_B, COPE_N, dtype=torch.bool)
    keep[1, :2] = False  # left padding in row 1
    out = {'q': q, 'k': k, 'v': v, 'keep': keep}
    flat = lambda x: x.reshape(COPE_B * COPE_H, x.shape[2], COPE_D)  # (b, h, n, d) -> (b·h, n, d)
    pos_emb = [torch.randn(1, COPE_D, COPE_NPOS, generator=g) for _ in range(COPE_LAYERS)]  # not zero
    for l in range(COPE_LAYERS):
        out[f'layer{l}.pos_emb'] = pos_emb[l]
    for nodiv in (False, True):
        for l in range(COPE_LAYERS):
            att = M.ContextPosSelfAttn(cope_config(nodiv), l).eval()
            if l == 0 and not nodiv:
                out['init.pos_emb'] = att.pos_emb.detach().clone()
            with torch.no_grad():
                att.pos_emb.copy_(pos_emb[l])
                for case, n_q in COPE_CASES.items():
                    y = att(flat(q[:, :, -n_q:]), flat(k), flat(k), flat(v), attn_mask=cope_mask(keep, n_q))
                    name = f"{'nodiv' if nodiv else 'div'}.{case}.layer{l}"
                    out[f'{name}.out'], out[f'{name}.attn'] = y, att.attn_saved.detach().clone()
    return out


def _write(tensors, path, ref, src):
    from safetensors.torch import save_file
    import torch
    repo, file, commit = ref
    meta = {'repository': repo, 'path': file, 'commit': commit, 'blob': git_blob_sha(src),
            'torch': torch.__version__}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=meta)
    print(f'wrote {path} ({repo} {commit[:8]}:{file}, blob {meta["blob"][:8]})')


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--fire', help=f'the reference FIRE file (default ${FIRE_ENV})')
    ap.add_argument('--cope', help=f"the authors' CoPE file (default ${COPE_ENV})")
    args = ap.parse_args(argv)
    (F, fpath), (C, cpath) = load_fire(args.fire), load_cope(args.cope)
    if F is None and C is None:
        sys.exit(f'no reference file: give --fire/--cope or set {FIRE_ENV}/{COPE_ENV} (see the docstring)')
    if F is not None:
        _write(fire_goldens(F), FIRE_OUT, FIRE_REF, fpath)
    if C is not None:
        _write(cope_goldens(C), COPE_OUT, COPE_REF, cpath)


if __name__ == '__main__':
    main()
