"""Fold the finished encodings of the lanes (tools/run_compare_lane.sh) into the reference compare study.

An encoding of a lane is finished when its pretraining summary, its lengths file and the summary of every task × seed
are there. Its folders move to results/compare/reference (the paths written in its JSON files are rewritten to the new
place), its stage times join the study's, and `posenc_lit compare` is called once on the study with every encoding, so
results.json, the table and the figures are rebuilt from the finished stages (nothing is trained again). Encodings of a
lane that are not finished stay where they are, and the lane's results.json forgets the moved ones, so that
`tools/run_compare_lane.sh NAME` can go on with the rest. A lane of another preset or spec is refused.
Usage: python tools/merge_compare_lanes.py [--dry-run]
"""
import json, shutil, sys
from pathlib import Path

from posenc_lit.compare import compare
from posenc_lit.core import list_ablations, list_encodings

root = Path(__file__).resolve().parent.parent
ref = Path('results/compare/reference')


def finished(lane: Path, res: dict, pe: str) -> bool:
    runs = [lane / 'finetune' / pe / t / f'seed{s}' / 'summary.json' for t in res['tasks'] for s in res['seeds']]
    return all(f.is_file() for f in [lane / 'pretrain' / pe / 'summary.json', lane / 'lengths' / f'{pe}.json', *runs])


def move(lane: Path, pe: str):
    "Move `pe`'s folders from `lane` to the study; rewrite the lane's path in their JSON files."
    for sub in (Path('pretrain') / pe, Path('lengths') / f'{pe}.json', Path('finetune') / pe):
        if (ref / sub).exists(): raise SystemExit(f'{ref / sub} exists already: {pe} is in the study; remove {lane / sub} or the study copy')
        shutil.move(str(lane / sub), str(ref / sub))
        for f in ([ref / sub] if (ref / sub).is_file() else (ref / sub).rglob('*.json')):
            text = f.read_text()
            if str(lane) + '/' in text: f.write_text(text.replace(str(lane) + '/', str(ref) + '/'))


def forget_moved(lane: Path, res: dict, in_study: list):
    "Drop from the lane's results.json the encodings now in the study, so the lane can go on with the others alone."
    gone = [pe for pe in res['encodings'] if pe in in_study and not (lane / 'pretrain' / pe).exists()]
    if not gone: return
    res['encodings'] = [pe for pe in res['encodings'] if pe not in gone]
    res['records'] = [r for r in res.get('records', []) if r.get('pe') not in gone]
    res['stage_wall_s'] = {k: v for k, v in res.get('stage_wall_s', {}).items() if k.split()[1:2] not in [[pe] for pe in gone]}
    for key in ('pretrain', 'lengths'):
        if isinstance(res.get(key), dict): res[key] = {k: v for k, v in res[key].items() if k not in gone}
    (lane / 'results.json').write_text(json.dumps(res, indent=2))
    print(f'{lane}: results.json no longer lists {", ".join(gone)} (in the study now)')


def main(dry: bool):
    import os; os.chdir(root)
    study = json.loads((ref / 'results.json').read_text())
    keys = ('preset', 'spec', 'tasks', 'seeds')
    merged = []
    for lane in sorted(ref.parent.glob('reference.lane-*')):
        if not (lane / 'results.json').is_file(): continue
        res = json.loads((lane / 'results.json').read_text())
        if bad := [k for k in keys if res.get(k) != study.get(k)]:
            raise SystemExit(f'{lane} is a study with another {", ".join(bad)} than {ref}: not merged')
        for pe in res['encodings']:
            if pe in study['encodings']: print(f'{lane}: {pe} is in the study already, skipped'); continue
            if not finished(lane, res, pe): print(f'{lane}: {pe} is not finished, left there'); continue
            print(f'{lane}: {pe} finished, merged' + (' (dry run)' if dry else ''))
            if dry: continue
            move(lane, pe)
            study['stage_wall_s'].update({k: v for k, v in res['stage_wall_s'].items() if k.split()[1:2] == [pe]})
            merged.append(pe)
        if not dry: forget_moved(lane, res, study['encodings'] + merged)
    if not merged: return print('nothing merged' + (' (dry run)' if dry else ''))
    study['encodings'] += merged
    (ref / 'results.json').write_text(json.dumps(study, indent=2))
    order = [pe for pe in [*list_encodings(), *list_ablations()] if pe in study['encodings']]   # the registered encodings, then the ablations
    compare('reference', out=ref, encodings=order, vit=False, bars=False)
    print(f'{ref}: encodings {", ".join(order)}')


if __name__ == '__main__': main('--dry-run' in sys.argv[1:])
