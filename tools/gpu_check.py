"""GPU checks of posenc_lit, one script for a CUDA machine (CI has none; every check here has a CPU twin in tests/).

    python tools/gpu_check.py OUT_DIR        # writes OUT_DIR/gpu_check.json, prints a summary

What it measures, on the GPU against the CPU:
  1. every text encoding (EncoderForMLM) and image encoding (ViT): the same weights give the same logits on CUDA
     (float32, TF32 off) as on the CPU; bf16 autocast gives finite logits; a backward pass gives finite gradients;
  2. host syncs of a forward pass (torch.cuda.set_sync_debug_mode): the file:line of each op that waits for the
     GPU. Checks are meant to happen once per forward at the boundary, never per layer;
  3. attend(): the fused path (SDPA) against the manual path with a padding mask, causal, and score terms;
  4. the training loop on CUDA: pretraining and ViT training stopped half-way and resumed against the same run
     uninterrupted (exact resume), and a bf16 pretraining run.
Without CUDA it runs against the CPU (a test of this script, not of a GPU).
"""

import json, os, sys, tempfile, time, traceback, warnings
from pathlib import Path

os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')
os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('HF_DATASETS_OFFLINE', '1')
import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
from posenc_lit.core import list_encodings
from posenc_lit.model import ModelConfig, EncoderForMLM
from posenc_lit.vit import ViT, ViTConfig
from posenc_lit.attention import attend

GPU = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
REPO = Path(__file__).resolve().parents[1]


def _syncs(f):
    "Run `f()` on the GPU with sync debugging on; the source lines (in posenc_lit) of the syncing ops."
    if GPU.type != 'cuda':
        return f(), []
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        torch.cuda.set_sync_debug_mode('warn')
        try:
            out = f()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    lines = [f'{Path(x.filename).name}:{x.lineno}' for x in w if 'synchroniz' in str(x.message)]
    return out, lines


def _max_diff(a, b) -> float:
    return float((a.detach().float().cpu() - b.detach().float().cpu()).abs().max())


def _text_model(name: str, n_layers: int):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=200, d_model=64, n_layers=n_layers, n_heads=4, d_ff=128, pe=name,
                      dropout=0.0, attn_dropout=0.0, max_position_embeddings=64)
    return EncoderForMLM(cfg).eval()


def check_text(name: str) -> dict:
    cpu = _text_model(name, 2)
    gpu = _text_model(name, 2).to(GPU)
    ids = torch.randint(5, 200, (4, 48))
    am = torch.ones(4, 48, dtype=torch.bool)
    am[1, 40:] = False
    am[3, 20:] = False
    ids_g, am_g = ids.to(GPU), am.to(GPU)
    with torch.no_grad():
        ref = cpu(ids, attention_mask=am)['logits']
        got = gpu(ids_g, attention_mask=am_g)['logits']
        with torch.autocast(GPU.type, dtype=torch.bfloat16):
            half = gpu(ids_g, attention_mask=am_g)['logits']
        syncs = {n: _syncs(lambda: m(ids_g, attention_mask=am_g))[1]
                 for n, m in ((1, _text_model(name, 1).to(GPU)), (3, _text_model(name, 3).to(GPU)))}
    real = am[:, :, None].expand_as(ref)
    labels = torch.where(torch.rand(4, 48) < 0.3, ids, -100).to(GPU)
    gpu.train()
    gpu(ids_g, labels=labels, attention_mask=am_g)['loss'].backward()
    grads_ok = all(torch.isfinite(p.grad).all().item() for p in gpu.parameters() if p.grad is not None)
    return {
        'fp32_max_abs_diff': _max_diff(got[real.to(GPU)], ref[real]),
        'bf16_max_abs_diff': _max_diff(half[real.to(GPU)], ref[real]),
        'bf16_finite': bool(torch.isfinite(half).all()),
        'grads_finite': grads_ok,
        'syncs_1_layer': len(syncs[1]),
        'syncs_3_layers': len(syncs[3]),
        'sync_lines': sorted(set(syncs[3])),
    }


def _vit(name: str, stem: str, n_layers: int):
    torch.manual_seed(0)
    m = ViT(ViTConfig(pe=name, stem=stem, d_model=64, n_layers=n_layers, n_heads=4, d_ff=128)).eval()
    torch.nn.init.normal_(m.head.weight, std=0.02)  # the head starts at zero: logits 0 would compare nothing
    return m


def check_image(name: str, stem: str = 'patch') -> dict:
    cpu = _vit(name, stem, 2)
    gpu = _vit(name, stem, 2).to(GPU)
    r = {}
    for size in ((28, 28), (56, 56)):
        x = torch.randn(4, 1, *size)
        xg = x.to(GPU)
        with torch.no_grad():
            ref = cpu(x)
            got = gpu(xg)
            with torch.autocast(GPU.type, dtype=torch.bfloat16):
                half = gpu(xg)
            syncs = {n: _syncs(lambda: m(xg))[1] for n, m in ((1, _vit(name, stem, 1).to(GPU)),
                                                              (3, _vit(name, stem, 3).to(GPU)))}
        r[f'{size[0]}x{size[1]}'] = {
            'fp32_max_abs_diff': _max_diff(got, ref), 'bf16_max_abs_diff': _max_diff(half, ref),
            'logits_abs_max': float(ref.abs().max()), 'bf16_finite': bool(torch.isfinite(half).all()),
            'syncs_1_layer': len(syncs[1]), 'syncs_3_layers': len(syncs[3]), 'sync_lines': sorted(set(syncs[3]))}
    return r


def check_attend() -> dict:
    torch.manual_seed(0)
    b, h, i, j, d = 2, 4, 40, 40, 32
    q, k, v = (torch.randn(b, h, n, d, device=GPU) for n in (i, j, j))
    bias = torch.randn(1, h, i, j, device=GPU)
    mask = torch.ones(b, 1, 1, j, dtype=torch.bool, device=GPU)
    mask[1, ..., 30:] = False
    r = {}
    for dtype in (torch.float32, torch.bfloat16):
        for causal in (False, True):
            args = [t.to(dtype) for t in (q, k, v)]
            terms = (bias.to(dtype),)
            fast = attend(*args, terms, mask, causal=causal, fast=True)
            manual = attend(*args, terms, mask, causal=causal, fast=False)
            r[f'{str(dtype)[6:]}_causal={causal}'] = _max_diff(fast, manual)
    return r


def _records(out: Path) -> list:
    rows = [json.loads(l) for l in (out / 'metrics.jsonl').read_text().splitlines() if l.strip()]
    return [{k: v for k, v in r.items() if k not in ('time', 'seconds', 'tokens_per_s', 'images_per_s',
                                                      'wall_s', 'elapsed')} for r in rows]


def _resume_diff(full: list, parts: list) -> dict:
    "Largest difference of a number between the records of the two runs (same steps), and whether steps match."
    def nums(rs):
        return [(r.get('step'), r.get('split'), k, v) for r in rs for k, v in sorted(r.items())
                if isinstance(v, float)]
    a, b = nums(full), nums(parts)
    same_keys = [x[:3] for x in a] == [x[:3] for x in b]
    diff = max((abs(x[3] - y[3]) for x, y in zip(a, b) if x[3] == x[3] and y[3] == y[3]), default=0.0)
    return {'records': len(full), 'same_steps': same_keys, 'max_abs_diff': diff}


def check_training(tmp: Path) -> dict:
    from posenc_lit.training import make_train_config, pretrain
    from posenc_lit.vit_train import make_vit_config, train_vit

    torch.use_deterministic_algorithms(True, warn_only=True)
    r = {}
    cfg = make_train_config('smoke', pe='t5')
    t = time.time()
    s = pretrain(cfg, tmp / 'pt_full', progress=False)
    r['pretrain_full'] = {'eval_loss': s['eval_loss'], 'wall_s': time.time() - t}
    pretrain(cfg, tmp / 'pt_parts', progress=False, stop_at=10)
    s2 = pretrain(cfg, tmp / 'pt_parts', progress=False, resume=True)
    r['pretrain_resumed'] = {'eval_loss': s2['eval_loss'],
                             **_resume_diff(_records(tmp / 'pt_full'), _records(tmp / 'pt_parts'))}
    s3 = pretrain(make_train_config('smoke', pe='deberta', mixed_precision='bf16'), tmp / 'pt_bf16',
                  progress=False)
    r['pretrain_bf16_deberta'] = {'eval_loss': s3['eval_loss']}
    vcfg = make_vit_config('smoke', pe='learned', finetune_res=[56, 56], finetune_steps=10)
    v1 = train_vit(vcfg, tmp / 'vit_full', progress=False)
    train_vit(vcfg, tmp / 'vit_parts', progress=False, stop_at=25)
    v2 = train_vit(vcfg, tmp / 'vit_parts', progress=False, resume=True)
    r['vit'] = {'test_accuracy': v1['test_accuracy'], 'resumed_test_accuracy': v2['test_accuracy'],
                **_resume_diff(_records(tmp / 'vit_full'), _records(tmp / 'vit_parts'))}
    return r


def main(out: Path):
    out.mkdir(parents=True, exist_ok=True)
    res = {'device': torch.cuda.get_device_name() if GPU.type == 'cuda' else 'cpu', 'torch': torch.__version__}
    steps = [('text', lambda: {n: check_text(n) for n in list_encodings('text')}),
             ('image', lambda: {n: check_image(n) for n in list_encodings('image')} | {
                 'learned+hybrid': check_image('learned', 'hybrid')}),
             ('attend_fast_vs_manual', check_attend)]
    if '--no-training' not in sys.argv:
        steps.append(('training', lambda: check_training(Path(tempfile.mkdtemp()))))
    for key, f in steps:
        t = time.time()
        try:
            res[key] = f()
        except Exception:
            res[key] = {'error': traceback.format_exc()}
        print(f'{key}: {time.time() - t:.1f} s', flush=True)
        (out / 'gpu_check.json').write_text(json.dumps(res, indent=1, sort_keys=True))
    res['verdict'] = verdict(res)
    (out / 'gpu_check.json').write_text(json.dumps(res, indent=1, sort_keys=True))
    print(json.dumps(res['verdict'], indent=1))


def verdict(res: dict) -> dict:
    "Each claim of the docstring, true or false, from the measurements (a missing part counts as false)."
    text, image = res.get('text', {}), res.get('image', {})
    cases = [v for v in text.values() if isinstance(v, dict)]
    cases += [s for v in image.values() if isinstance(v, dict) for s in v.values() if isinstance(s, dict)]
    tr = res.get('training', {})
    att = res.get('attend_fast_vs_manual', {})
    return {
        'all encodings ran': bool(cases) and 'error' not in text and 'error' not in image,
        'fp32 logits as on the CPU (< 1e-4)': all(c.get('fp32_max_abs_diff', 1) < 1e-4 for c in cases),
        'bf16 logits finite': all(c.get('bf16_finite') for c in cases),
        'no sync per layer (3 layers: no more syncs than 1)': all(
            c.get('syncs_3_layers', 99) <= c.get('syncs_1_layer', 0) for c in cases),
        'attend fused = manual (fp32 < 1e-5)': bool(att) and all(
            v < 1e-5 for k, v in att.items() if k.startswith('float32')),
        'exact resume (pretraining, ViT)': all(
            tr.get(k, {}).get('same_steps') and tr[k].get('max_abs_diff') == 0.0
            for k in ('pretrain_resumed', 'vit')),
    }


if __name__ == '__main__':
    main(Path(sys.argv[1]))
