"""How far fine-tuning moved the added relative tables of drop-in runs (`posenc_lit finetune --add-relative ...`).

Usage: python tools/dropin_tables.py RUN_DIR [RUN_DIR ...] --out FILE.json
  RUN_DIR: a fine-tuning output folder (its seed*/checkpoint/model.safetensors are read).
Writes, per seed and per added table, the RMS and max |value| of the table and, for scale, the RMS of the same
layer's query projection weights. The checkpoints themselves are large and not committed; this summary is.
"""
import argparse, json
from pathlib import Path
from safetensors.torch import load_file


def table_stats(ckpt: Path) -> dict:
    sd = load_file(str(ckpt))
    added = sorted(k for k in sd if '.pe.members.1.' in k)
    if not added: raise SystemExit(f'{ckpt}: no added relative tables (pe.members.1.*): not a drop-in run')
    out = {}
    for k in added:
        layer = k.rsplit('.', 1)[-1]
        q = sd.get(f'encoder.layers.{layer}.attn.q_proj.weight')
        out[k] = {'shape': list(sd[k].shape), 'rms': sd[k].pow(2).mean().sqrt().item(), 'max_abs': sd[k].abs().max().item(),
                  'q_proj_rms': None if q is None else q.pow(2).mean().sqrt().item()}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('runs', nargs='+', type=Path); ap.add_argument('--out', type=Path, required=True)
    a = ap.parse_args(argv)
    res = {str(r): {s.name: table_stats(s / 'checkpoint' / 'model.safetensors') for s in sorted(r.glob('seed*'))} for r in a.runs}
    a.out.write_text(json.dumps(res, indent=1) + '\n')
    for r, seeds in res.items():
        for s, t in seeds.items():
            print(r, s, 'table RMS', ' '.join(f"{v['rms']:.1e}" for v in t.values()), '| q_proj RMS', f"{next(iter(t.values()))['q_proj_rms']:.3f}")


if __name__ == '__main__':
    main()
