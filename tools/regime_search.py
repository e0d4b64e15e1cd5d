"""The search for a pretraining regime in which absolute positions are learned (issue 29; nbs/34_regime.ipynb).

Each entry of SEARCH is a `posenc_lit pretrain` configuration: the `quick` preset with the overrides given, run for
`learned` and `none` (and `sinusoidal` where listed). A run resumes from its folder, so a search can stop and go on.

    python tools/regime_search.py run NAME [NAME ...] [--pe learned none] [--seed 0] [--runs runs/regime]
    python tools/regime_search.py collect [--runs runs/regime] [--to results/regime/search]
    python tools/regime_search.py diagnose RUN DEST      (one run's diagnostics.json into DEST; tools/run_study.sh)

`collect` copies each run's config.json, metrics.jsonl and summary.json (if it finished) into the results folder and
adds diagnostics.json: the position sensitivity of its latest checkpoint (held-out masked-token loss with the true
and with shuffled position ids) and, for a learned table, its geometry (posenc_lit.regime).
A run of seed 0 is NAME-PE (e.g. len128-12k-learned); `--seed K` (K > 0) runs NAME-PE-sK, the same configuration
with another seed (the page's block-length pairs read every seed).
"""
import argparse, json, shutil, sys
from pathlib import Path

SEARCH = {   # name -> overrides of the quick preset (2 layers, D = 128, 4 heads, 32 × 64 tokens, lr 2e-3)
    'quick-2k': dict(steps=2000, eval_every=250, save_every=1000),
    'len32-drop0': dict(seq_len=32, batch_size=64, steps=2000, dropout=0.0, eval_every=250, save_every=1000),
    'mask40': dict(mlm_probability=0.4, steps=2000, eval_every=250, save_every=1000),
    'batch128': dict(batch_size=128, steps=1500, eval_every=250, save_every=750),
    'batch8-10k': dict(batch_size=8, lr=1e-3, steps=10000, eval_every=1000, save_every=5000, log_every=100),
    'tiny-len32': dict(d_model=64, n_heads=2, d_ff=256, seq_len=32, lr=3e-3, steps=8000, eval_every=500,
                       save_every=4000, log_every=100),
    'tiny-len16': dict(d_model=64, n_heads=2, d_ff=256, seq_len=16, batch_size=64, lr=3e-3, steps=8000,
                       eval_every=500, save_every=4000, log_every=100),
    'init-std0.1': dict(steps=2000, eval_every=250, save_every=1000, pe_kwargs={'init_std': 0.1}),
    'init-std0.3': dict(steps=2000, eval_every=250, save_every=1000, pe_kwargs={'init_std': 0.3}),
    'len32-12k': dict(seq_len=32, batch_size=64, steps=12000, eval_every=1000, save_every=2000, log_every=100),
    # issue 37 item 4: block length isolated from steps: 128-token blocks with len32-12k's tokens per step (16 × 128 =
    # 64 × 32 = 2,048) and steps, so the two differ only in block length
    'len128-12k': dict(seq_len=128, batch_size=16, steps=12000, eval_every=1000, save_every=2000, log_every=100),
}
LEARNED_ONLY = ('pe_kwargs',)   # options of the learned table: `none` runs without them


def overrides(name: str, pe: str) -> dict:
    over = {k: v for k, v in SEARCH[name].items() if pe == 'learned' or k not in LEARNED_ONLY}
    return {**over, 'pe': pe}


def run_name(name: str, pe: str, seed: int = 0) -> str:
    return f'{name}-{pe}' + (f'-s{seed}' if seed else '')


def run(names, pes, runs: Path, seed: int = 0):
    from posenc_lit.training import make_train_config, pretrain
    for name in names:
        for pe in pes:
            if pe != 'learned' and any(k in SEARCH[name] for k in LEARNED_ONLY):
                continue   # an option of the learned table: `none` is the same run as without it
            cfg = make_train_config('quick', **overrides(name, pe), seed=seed)
            out = runs / run_name(name, pe, seed)
            print(name, pe, seed, pretrain(cfg, out, resume=True, progress=False), flush=True)


def diagnostics(run: Path) -> dict:
    import torch
    from posenc_lit.model import load_model
    from posenc_lit.data import load_corpus, load_tokenizer, tokenize_blocks, mask_tokens
    from posenc_lit.regime import position_sensitivity, table_geometry
    cfg = json.loads((run / 'config.json').read_text())
    state = json.loads((run / 'checkpoint' / 'trainer_state.json').read_text())
    tok = load_tokenizer()
    blocks = tokenize_blocks(load_corpus('default')['validation'], tok, cfg['seq_len'])[:512]
    x, y = mask_tokens(blocks, torch.Generator().manual_seed(20_201_130), tok.get_vocab_size(), cfg['mlm_probability'])
    model = load_model(run / 'checkpoint')
    out = {'step': state['step'], 'sensitivity': position_sensitivity(model, x, y)}
    table = getattr(model.encoder.pe, 'weight', None)
    if table is not None:
        w = model.encoder.embeddings.word.weight * model.encoder.pe.word_scale
        out['table'] = table_geometry(table[:cfg['seq_len']], w)
    return out


def collect(runs: Path, to: Path):
    for run in sorted(p for p in runs.iterdir() if (p / 'metrics.jsonl').is_file()):
        dest = to / run.name
        dest.mkdir(parents=True, exist_ok=True)
        for f in ('config.json', 'metrics.jsonl', 'summary.json'):
            if (run / f).is_file():
                shutil.copy(run / f, dest / f)
        if (run / 'checkpoint' / 'trainer_state.json').is_file():
            (dest / 'diagnostics.json').write_text(json.dumps(diagnostics(run), indent=2, allow_nan=False))
        print('collected', run.name, flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    sub = ap.add_subparsers(dest='cmd', required=True)
    r = sub.add_parser('run')
    r.add_argument('names', nargs='+', choices=sorted(SEARCH))
    r.add_argument('--pe', nargs='+', default=['learned', 'none'])
    r.add_argument('--seed', type=int, default=0, help='0: NAME-PE; K > 0: NAME-PE-sK')
    r.add_argument('--runs', type=Path, default=Path('runs/regime'))
    c = sub.add_parser('collect')
    c.add_argument('--runs', type=Path, default=Path('runs/regime'))
    c.add_argument('--to', type=Path, default=Path('results/regime/search'))
    d = sub.add_parser('diagnose')
    d.add_argument('run', type=Path)
    d.add_argument('dest', type=Path)
    a = ap.parse_args(argv)
    if a.cmd == 'run':
        if a.seed < 0:
            ap.error(f'--seed must be ≥ 0; got {a.seed}')
        run(a.names, a.pe, a.runs, a.seed)
    elif a.cmd == 'diagnose':
        a.dest.mkdir(parents=True, exist_ok=True)
        (a.dest / 'diagnostics.json').write_text(json.dumps(diagnostics(a.run), indent=2, allow_nan=False))
    else:
        collect(a.runs, a.to)


if __name__ == '__main__':
    sys.exit(main())
