"""The fused path (issue 42) on a GPU: gradient parity, then time and peak memory of each term, fused and not.

    python tools/gpu_fused.py OUT_DIR                       # parity + bench, L = 512 … 8192, bf16 and fp32
    python tools/gpu_fused.py OUT_DIR --lengths 512 2048 --dtypes bf16 --budget-s 420
    python tools/gpu_fused.py OUT_DIR --tiny                # seconds, on CPU too: a test of this script

Writes OUT_DIR/fused.json (written again after every measurement: a run stopped by its budget keeps what it
measured) and OUT_DIR/fused.md (the tables, with the device named).

1. Parity: for every fusable registered text encoding and the option sets of tests/test_fused.py, the fused
   path (`fast='fused'`) against the manual one (`fast=False`) at one length, causal: outputs and gradients
   into q, k, v and the encoding's parameters (fp32, TF32 off: 1e-4), and the bf16 outputs (reported). On CPU,
   FlexAttention has no backward: the forward is compared, the gradients are reported as not run.
2. Bench: forward + backward at each length and dtype (b = 1, h = 12, d = 64, bidirectional) of
   `position_attention` for each term: 'fused' (`fast='fused'`), 'sdpa' (the dense terms into
   `F.scaled_dot_product_attention`, the path before the fused one) and 'manual' (`fast=False`); the floor is
   FlexAttention with no position term ('none', fused) and SDPA with none; transformers' DeBERTa-v2
   `DisentangledSelfAttention` and `T5Attention` against our `MultiHeadAttention` with the same configuration,
   fused and sdpa. Ratios to the floor side by side. On CPU (--tiny) only forwards are timed (no backward).
"""

import argparse, json, os, sys, time, traceback, warnings
from pathlib import Path

os.environ.setdefault('HF_HUB_OFFLINE', '1')
import torch
import torch.nn as nn

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
import posenc_lit.attention as A
from posenc_lit.core import LayerRef, list_encodings
from posenc_lit.attention import MultiHeadAttention, default_positions, position_attention
from posenc_lit.model import ModelConfig
from posenc_lit.relative import Shaw, HuangMethod4
from posenc_lit.t5 import T5RelativeBias
from posenc_lit.alibi import ALiBi
from posenc_lit.deberta import DebertaRelative
from posenc_lit.tupe import TUPE
from posenc_lit.bench import hf_deberta_modules, hf_t5_modules

DEV = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
DTYPES = {'bf16': torch.bfloat16, 'fp32': torch.float32, 'fp16': torch.float16}
torch._dynamo.config.cache_size_limit = 64  # one compile per term, length and dtype


def device_name() -> str:
    if DEV.type == 'cuda':
        return f'{torch.cuda.get_device_name()} (torch {torch.__version__}, CUDA {torch.version.cuda})'
    return f'CPU ({os.cpu_count()} cores; torch {torch.__version__}): a test of the script, not a GPU'


# ----------------------------------------------------------------------------- 1. parity
def parity_encodings(L: int, d_model: int, h: int):
    text = dict(vocab_size=40, d_model=d_model, n_heads=h, n_layers=2, d_ff=32, max_position_embeddings=L)
    d = d_model // h
    encs = {n: s.factory(ModelConfig(**text, pe=n)) for n, s in list_encodings().items() if n != 'shaw'}
    encs.update(
        {
            'shaw(values=False)': Shaw(d, 2, k=8, values=False),
            'huang4(k=8)': HuangMethod4(d, 2, k=8),
            't5(causal)': T5RelativeBias(h, bidirectional=False),
            'alibi(causal form)': ALiBi(h, bidirectional=False),
            'deberta(log buckets)': DebertaRelative(d_model, h, 2, k=64, position_buckets=16),
            'deberta(share_att_key)': DebertaRelative(d_model, h, 2, k=32, share_att_key=True),
            'tupe-r(reset)': TUPE(d_model, h, L, relative=True, reset_relative=True),
        }
    )
    return encs


def _run(pe, q, k, v, pos, layer, fast, grad):
    xs = [t.clone().requires_grad_(grad) for t in (q, k, v)]
    pe.zero_grad()
    with torch.set_grad_enabled(grad):
        out = position_attention(pe, *xs, pe.prepare(pos, pos, causal=True), layer, fast=fast, causal=True)
        if not grad:
            return [out]
        out.float().square().sum().backward()
    return [out] + [x.grad for x in xs] + [p.grad for p in pe.parameters() if p.grad is not None]


def parity(L: int, b: int = 2, h: int = 4, d: int = 32) -> list:
    grad = DEV.type == 'cuda'
    rows = []
    for name, pe in parity_encodings(L, h * d, h).items():
        torch.manual_seed(0)
        for p in pe.parameters():
            nn.init.normal_(p, std=0.5)
        pe = pe.to(DEV).eval()
        pe.lend_projections(1, nn.Linear(h * d, h * d).to(DEV), nn.Linear(h * d, h * d).to(DEV))
        layer = LayerRef(1)
        pos = default_positions(L, DEV)
        g = torch.Generator(DEV).manual_seed(1)
        q, k, v = (torch.randn(b, h, L, d, generator=g, device=DEV) for _ in range(3))
        row = {'encoding': name, 'L': L}
        try:
            fused, manual = (_run(pe, q, k, v, pos, layer, f, grad) for f in ('fused', False))
            diffs = [float((a.float() - c.float()).abs().max()) for a, c in zip(fused, manual, strict=True)]
            row.update(out=diffs[0], grads=max(diffs[1:]) if grad else None, n_grads=len(diffs) - 1)
            bf = [
                _run(
                    pe.to(torch.bfloat16),
                    *(t.bfloat16() for t in (q, k, v)),
                    pos,
                    layer.__class__(1, layer.q_proj.bfloat16(), layer.k_proj.bfloat16()),
                    f,
                    False,
                )[0]
                for f in ('fused', False)
            ]
            pe.float(), layer.q_proj.float(), layer.k_proj.float()
            row['bf16_out'] = float((bf[0].float() - bf[1].float()).abs().max())
            row['ok'] = diffs[0] <= 1e-5 and (not grad or max(diffs[1:]) <= 1e-4)
        except Exception as e:  # noqa: BLE001 — one encoding's failure is a row of the report
            row.update(ok=False, error=f'{type(e).__name__}: {e}'[:400])
        if not grad:
            row['grads_note'] = 'not run: FlexAttention has no backward on CPU'
        rows.append(row)
        print(f"parity {name:24} {row}", flush=True)
    return rows


# ----------------------------------------------------------------------------- 2. bench
def bench_terms(L: int, h: int, d: int):
    D = h * d
    return {
        'none': PositionEncodingNone(),
        'alibi': ALiBi(h),
        't5': T5RelativeBias(h),
        'shaw(values=False)': Shaw(d, 1, k=16, values=False),
        'huang4(k=L-1)': HuangMethod4(d, 1, k=L - 1),
        'deberta(c2p+p2c, k=512)': DebertaRelative(D, h, 1, k=512),
        'deberta(256 buckets)': DebertaRelative(D, h, 1, k=512, position_buckets=256),
        'tupe-a': TUPE(D, h, L),
        'rope': list_encodings()['rope'].factory(
            ModelConfig(
                vocab_size=8, d_model=D, n_heads=h, n_layers=1, d_ff=8, max_position_embeddings=L, pe='rope'
            )
        ),
    }


def context_bytes(ctx) -> int:
    "Bytes of the tensors a context holds (its positions included)."
    from dataclasses import fields

    ts = [getattr(ctx, f.name) for f in fields(ctx)]
    return sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))


def PositionEncodingNone():
    from posenc_lit.core import PositionEncoding

    return PositionEncoding()


def _sync():
    if DEV.type == 'cuda':
        torch.cuda.synchronize()


def measure(fn, grad: bool, repeats: int, warmup: int) -> dict:
    "Median seconds of fn() (+ backward), the first call's seconds (compile), peak memory above the start."

    def step():
        with torch.set_grad_enabled(grad):
            out = fn()
            if grad:
                out.float().sum().backward()
        return out

    t0 = time.perf_counter()
    step()
    _sync()
    first = time.perf_counter() - t0
    for _ in range(warmup):
        step()
    _sync()
    times = []
    if DEV.type == 'cuda':
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        _sync()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() - base if DEV.type == 'cuda' else None
    times.sort()
    return {'s': times[len(times) // 2], 'first_s': first, 'peak_bytes': peak}


def _variants(pe, q, k, v, pos):
    def core(fast, auto=A.FUSED_AUTO):
        def fn():
            saved, A.FUSED_AUTO = A.FUSED_AUTO, auto
            try:
                return position_attention(pe, q, k, v, pe.prepare(pos, pos), 0, fast=fast)
            finally:
                A.FUSED_AUTO = saved

        return fn

    return {'fused': core('fused'), 'sdpa': core(True, ()), 'manual': core(False)}


def _hf_modules(L, h, d, dtype):
    D, pos = h * d, default_positions(L, DEV)
    hf_d, pe_d, mha_d = hf_deberta_modules(D, h)
    hf_t, pe_t, mha_t = hf_t5_modules(h, d, 'sdpa')
    mods = [m.to(DEV, dtype) for m in (hf_d, pe_d, mha_d, hf_t, pe_t, mha_t)]
    hf_d, pe_d, mha_d, hf_t, pe_t, mha_t = mods
    x = torch.randn(1, L, D, device=DEV, dtype=dtype, requires_grad=DEV.type == 'cuda')
    keep = torch.ones(1, 1, 1, L, dtype=torch.bool, device=DEV)

    def ours(mha, pe, fast, auto=A.FUSED_AUTO):
        def fn():
            saved, A.FUSED_AUTO = A.FUSED_AUTO, auto
            try:
                return mha(x, pe=pe, ctx=pe.prepare(pos, pos), fast=fast)
            finally:
                A.FUSED_AUTO = saved

        return fn

    return {
        'hf-deberta-v2': {
            'fused': ours(mha_d, pe_d, 'fused'),
            'sdpa': ours(mha_d, pe_d, True, ()),
            'hf': lambda: hf_d(x, keep, rel_embeddings=pe_d.rel_embeddings)[0],
        },
        'hf-t5': {
            'fused': ours(mha_t, pe_t, 'fused'),
            'sdpa': ours(mha_t, pe_t, True, ()),
            'hf': lambda: hf_t(x)[0],
        },
    }


def bench(lengths, dtypes, res, save, deadline, h=12, d=64, repeats=5, warmup=2):
    grad = DEV.type == 'cuda'
    for L in lengths:
        for dn in dtypes:
            dtype = DTYPES[dn]
            torch.manual_seed(0)
            g = torch.Generator(DEV).manual_seed(0)
            q, k, v = (
                torch.randn(1, h, L, d, generator=g, device=DEV).to(dtype).requires_grad_(grad)
                for _ in range(3)
            )
            pos = default_positions(L, DEV)
            pes = {n: pe.to(DEV, dtype) for n, pe in bench_terms(L, h, d).items()}
            cases = {n: _variants(pe, q, k, v, pos) for n, pe in pes.items()}
            with torch.no_grad():  # what `prepare` holds once per forward (the fused kernel does not read it)
                for n, pe in pes.items():
                    res['ctx_bytes'][f'{n}|{L}|{dn}'] = context_bytes(pe.prepare(pos, pos))
            cases['none']['sdpa-floor'] = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)
            try:
                cases.update(_hf_modules(L, h, d, dtype))
            except Exception as e:  # noqa: BLE001
                res['errors'].append(f'hf modules at L={L} {dn}: {type(e).__name__}: {e}'[:300])
            for case, fns in cases.items():
                for variant, fn in fns.items():
                    if time.time() > deadline:
                        res['stopped'] = f'time budget reached before L={L} {dn} {case} {variant}'
                        return
                    key = f'{case}|{variant}|{L}|{dn}'
                    try:
                        res['bench'][key] = measure(fn, grad, repeats, warmup)
                    except torch.cuda.OutOfMemoryError:
                        res['bench'][key] = {'error': 'out of memory'}
                    except Exception as e:  # noqa: BLE001
                        res['bench'][key] = {'error': f'{type(e).__name__}: {e}'[:300]}
                    finally:
                        if DEV.type == 'cuda':
                            torch.cuda.empty_cache()
                    print(key, res['bench'][key], flush=True)
                    save()


# ----------------------------------------------------------------------------- report
def markdown(res) -> str:
    lines = [
        f"# Fused path (issue 42): {res['device']}",
        '',
        f"Mode: {res['mode']}; {res['shape']}, bidirectional. Each step prepares its context (a one-layer"
        " model); 'ctx MiB': what that context holds. Times: median ms; memory: peak MiB above"
        " the inputs; ratios to the floor (FlexAttention, no position term) of the same length and dtype.",
        '',
    ]
    rows = [r for r in res['parity']]
    if rows:
        lines += [
            '## Parity (fused − manual, max |Δ|)',
            '',
            '| encoding | L | out fp32 | grads fp32 | out bf16 | ok |',
            '|---|---|---|---|---|---|',
        ]
        for r in rows:
            g = r.get('grads') if r.get('grads') is not None else r.get('grads_note', r.get('error', ''))
            g = f'{g:.1e}' if isinstance(g, float) else g
            o, bo = (f'{r[x]:.1e}' if x in r else '' for x in ('out', 'bf16_out'))
            lines.append(f"| {r['encoding']} | {r['L']} | {o} | {g} | {bo} | {r['ok']} |")
        lines.append('')
    b = res['bench']
    groups = sorted({tuple(k.split('|')[2:]) for k in b}, key=lambda t: (int(t[0]), t[1]))
    for L, dn in groups:
        floor = b.get(f'none|fused|{L}|{dn}', {}).get('s')
        lines += [
            f'## L = {L}, {dn}',
            '',
            '| term | variant | ms | × floor | peak MiB | first call s | ctx MiB |',
            '|---|---|---|---|---|---|---|',
        ]
        for k, m in b.items():
            case, variant, L2, dn2 = k.split('|')
            if (L2, dn2) != (L, dn):
                continue
            if 'error' in m:
                lines.append(f'| {case} | {variant} | {m["error"]} | | | | |')
                continue
            ratio = f"{m['s'] / floor:.2f}" if floor else ''
            mem = f"{m['peak_bytes'] / 2**20:.0f}" if m['peak_bytes'] is not None else ''
            cb = res['ctx_bytes'].get(f'{case}|{L}|{dn}')
            cb = f'{cb / 2**20:.1f}' if cb is not None else ''
            lines.append(
                f"| {case} | {variant} | {m['s'] * 1e3:.2f} | {ratio} | {mem} | {m['first_s']:.1f} | {cb} |"
            )
        lines.append('')
    if res.get('stopped'):
        lines.append(f"Stopped: {res['stopped']}.")
    if res['errors']:
        lines += ['Errors:', *[f'- {e}' for e in res['errors']]]
    return '\n'.join(lines) + '\n'


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('out')
    ap.add_argument('--tiny', action='store_true', help='tiny sizes (seconds; CPU too)')
    ap.add_argument('--lengths', type=int, nargs='+', default=[512, 1024, 2048, 4096, 8192])
    ap.add_argument('--dtypes', nargs='+', default=['bf16', 'fp32'], choices=sorted(DTYPES))
    ap.add_argument('--parity-length', type=int, default=256)
    ap.add_argument('--no-parity', action='store_true')
    ap.add_argument('--budget-s', type=float, default=540, help='stop the bench after this many seconds')
    a = ap.parse_args(argv)
    if a.tiny:
        a.lengths, a.parity_length = [32], 16
    start, out = time.time(), Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {
        'device': device_name(),
        'mode': 'forward+backward' if DEV.type == 'cuda' else 'forward only (CPU)',
        'shape': 'b = 1, h = 2, d = 16 (tiny)' if a.tiny else 'b = 1, h = 12, d = 64',
        'argv': sys.argv[1:],
        'parity': [],
        'bench': {},
        'ctx_bytes': {},
        'errors': [],
        'stopped': None,
    }

    def save():
        res['elapsed_s'] = time.time() - start
        (out / 'fused.json').write_text(json.dumps(res, indent=1))
        (out / 'fused.md').write_text(markdown(res))

    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        if not a.no_parity:
            res['parity'] = parity(a.parity_length)
            save()
        bench(
            a.lengths,
            a.dtypes,
            res,
            save,
            start + a.budget_s,
            **({'h': 2, 'd': 16, 'repeats': 1, 'warmup': 0} if a.tiny else {}),
        )
    save()
    print((out / 'fused.md').read_text())
    return 0 if all(r['ok'] for r in res['parity']) else 1


if __name__ == '__main__':
    sys.exit(main())
