#!/usr/bin/env python
"""Add the `pretraining` record (finetune.pretraining_record) to committed fine-tuning summaries written
before fine-tuning kept it (issue 37), where the fine-tuned checkpoint is on disk and provably unchanged.

    python tools/backfill_pretraining.py [--results results] [--runs-root .] [--skip NAME ...] [--write]

For each `RESULTS/study_<task>/<NAME>/summary.json` without the record whose `checkpoint` is
`runs/study/<NAME>`, the record is added (to the summary and to each committed `seed<k>/summary.json`) only if
every check passes:

1. the pretraining run `RUNS_ROOT/runs/study/NAME` is the committed one: its config.json, summary.json and
   metrics.jsonl are byte for byte `RESULTS/study/NAME`'s (metrics.jsonl holds each step's timings: a second
   run at the same settings differs), and its checkpoint's train_config.json says the same settings;
2. the checkpoint is that run's last: its trainer_state.json is at the run's final step and records the
   SHA-256 of model.safetensors that the file has now;
3. the committed fine-tuning is the one in `RUNS_ROOT/runs/study_<task>/NAME` (the summaries byte for byte;
   each seed's config.json and task.json name `runs/study/NAME`), made in RUNS_ROOT;
4. the weights were in place before that fine-tuning started: the inode change times (ctime: set by every
   write and rename, and not settable by `touch`) of checkpoint/, its model.safetensors and trainer_state.json
   are earlier than the birth time of the fine-tuning folder, which `finetune_seeds` makes before any seed
   loads the checkpoint; and that folder was born before its seeds' config.json were written (not a copy).

Then the weights every seed loaded are the bytes on disk now, and the record is computed from them. Without
--write nothing is written: each summary is listed with what it would get or why it is skipped. A name being
trained now belongs in --skip. The record gets `"backfilled": "tools/backfill_pretraining.py"`.
"""

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

from posenc_lit.files import dumps, write_json
from posenc_lit.finetune import pretraining_record

TOOL = 'tools/backfill_pretraining.py'


def _birth(p: Path) -> float | None:
    "The birth time of `p` in seconds (GNU stat's %W), None where the file system does not keep one."
    out = subprocess.run(['stat', '-c', '%.9W', str(p)], capture_output=True, text=True, check=True).stdout
    t = float(out.strip().replace(',', '.'))
    return t if t > 0 else None


def _same_bytes(a: Path, b: Path) -> bool:
    return a.is_file() and b.is_file() and a.read_bytes() == b.read_bytes()


def _sha256(f: Path) -> str:
    return hashlib.sha256(f.read_bytes()).hexdigest()


def why_not(results: Path, runs_root: Path, task: str, name: str, s: dict) -> str | None:
    "Why the fine-tuning `s` of `name` on `task` cannot get a record that is certainly right; None if it can."
    ckpt = f'runs/study/{name}'
    if s.get('checkpoint') != ckpt:
        return f'its checkpoint is {s.get("checkpoint")!r}, not {ckpt}'
    run, committed = runs_root / ckpt, results / 'study' / name
    ck, ft = run / 'checkpoint', runs_root / 'runs' / f'study_{task}' / name
    if not (ck / 'model.safetensors').is_file() or not committed.is_dir() or not ft.is_dir():
        return f'{ck}, {committed} or {ft} is missing'
    for f in ('config.json', 'summary.json', 'metrics.jsonl'):  # 1
        if not _same_bytes(run / f, committed / f):
            return f'{run / f} is not the committed {committed / f}'
    cfg = json.loads((run / 'config.json').read_text())
    if json.loads((ck / 'train_config.json').read_text()) != cfg:
        return f"{ck / 'train_config.json'} differs from the run's config.json"
    state = json.loads((ck / 'trainer_state.json').read_text())  # 2
    if state.get('step') != cfg['steps']:
        return f"its checkpoint is at step {state.get('step')}, not the run's last ({cfg['steps']})"
    if state.get('sha256', {}).get('model.safetensors') != _sha256(ck / 'model.safetensors'):
        return f"{ck / 'model.safetensors'} is not the file its last save wrote"
    if not _same_bytes(ft / 'summary.json', results / f'study_{task}' / name / 'summary.json'):  # 3
        return f"{ft / 'summary.json'} is not the committed summary"
    for k in s.get('seeds', []):
        d, mine = ft / f'seed{k}', results / f'study_{task}' / name / f'seed{k}'
        if (mine / 'summary.json').is_file() and not _same_bytes(d / 'summary.json', mine / 'summary.json'):
            return f"{d / 'summary.json'} is not the committed seed {k}"
        named = (
            json.loads((d / 'config.json').read_text()).get('checkpoint'),
            json.loads((d / 'checkpoint' / 'task.json').read_text()).get('from_checkpoint'),
        )
        if named != (ckpt, ckpt):
            return f'seed {k} names checkpoint {named}, not {ckpt}'
    born = _birth(ft)  # 4
    if born is None:
        return f'the file system keeps no birth time for {ft}'
    changed = max(p.stat().st_ctime for p in (ck, ck / 'model.safetensors', ck / 'trainer_state.json'))
    if not changed < born:
        return f'the checkpoint changed at {changed:.3f}, after {ft} was made ({born:.3f})'
    seeds = [(ft / f'seed{k}' / 'config.json').stat().st_mtime for k in s.get('seeds', [])]
    if not seeds or min(seeds) < born:
        return f'{ft} was made after its seeds were written (a copy?): when it started is not known'
    return None


def _add(f: Path, s: dict, rec: dict, write: bool) -> str | None:
    """Add `rec` to summary `f` and its committed seeds' summaries (if `write`); why not, where rewriting them
    would change more than that."""
    files = [
        g for g in [f] + [f.parent / f'seed{k}' / 'summary.json' for k in s.get('seeds', [])] if g.is_file()
    ]
    texts = {g: g.read_text() for g in files}
    if any(dumps(json.loads(t), indent=2, sort_keys=True) != t for t in texts.values()):
        return (
            'a summary is not in the form write_json gives it: rewriting it would change more than the record'
        )
    for g, t in texts.items() if write else ():
        write_json(g, json.loads(t) | {'pretraining': rec}, indent=2, sort_keys=True)
    return None


def backfill(results: Path, runs_root: Path, skip: set, write: bool) -> list:
    "(summary, what happened) for each committed fine-tuning summary without the record."
    done = []
    for f in sorted(results.glob('study_*/*/summary.json')):
        task, name = f.parent.parent.name.removeprefix('study_'), f.parent.name
        s = json.loads(f.read_text())
        if not isinstance(s, dict) or 'checkpoint' not in s or 'pretraining' in s:
            continue
        why = (
            f'skipped on request (--skip {name})'
            if name in skip
            else why_not(results, runs_root, task, name, s)
        )
        if why is None:
            rec = pretraining_record(runs_root / s['checkpoint']) | {
                'run': s['checkpoint'],
                'backfilled': TOOL,
            }
            # checked again: nothing changed while the record was made
            why = why_not(results, runs_root, task, name, s) or _add(f, s, rec, write)
        sha = None if why else rec['sha256']['model.safetensors'][:12]
        done.append((f, why or f"record {'added' if write else 'to add'} (weights {sha}…)"))
    return done


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--results', type=Path, default=Path('results'), help='the committed results folder')
    p.add_argument(
        '--runs-root', type=Path, default=Path('.'), help='the checkout whose runs/ the fine-tuning used'
    )
    p.add_argument(
        '--skip', nargs='*', default=[], help='study names to leave alone (a run being trained now)'
    )
    p.add_argument(
        '--write', action='store_true', help='write the records (default: list what would be done)'
    )
    a = p.parse_args(argv)
    for f, what in backfill(a.results, a.runs_root, set(a.skip), a.write):
        print(f'{f}: {what}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
