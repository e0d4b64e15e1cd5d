"""A blind sample of the `order` task for a reader's check (issue 29 item 3; issue 37: say who answered).

    python tools/order_sample.py sample OUT_DIR [--n 40] [--seed 2026]
        writes OUT_DIR/sample.txt (pairs A/B, the original sentence shown first or second at random) and
        OUT_DIR/key.json (which one is the original); read sample.txt without opening key.json.
    python tools/order_sample.py score OUT_DIR ANSWERS --reader WHO
        ANSWERS: one letter per pair, e.g. "A B B A ..."; WHO: who answered (a person, or which model);
        writes OUT_DIR/answers.json (with `reader`: WHO) and prints the accuracy. Name OUT_DIR for the reader
        too: results/study_order/llm-reader/ holds the answers of the project's lead engineer, a language model.
"""
import argparse
import json
import random
from pathlib import Path

from posenc_lit.tasks import load_order


def sample(out: Path, n: int, seed: int):
    "Draw `n` test pairs with the seeded `random.Random(seed)` and write the blind sample and its key."
    rows = [r for r in load_order()['test'] if r['label'] == 1]  # (original, swapped) pairs
    if not 1 <= n <= len(rows):
        raise SystemExit(f'--n must be between 1 and {len(rows)} (the test pairs); got {n}')
    if (out / 'answers.json').exists():
        raise SystemExit(f'{out} already holds answers (answers.json): choose another folder for a new sample')
    rng = random.Random(seed)
    lines, key = [], []
    for i, r in enumerate(rng.sample(rows, n)):
        first_is_original = rng.random() >= 0.5
        a, b = (r['text'], r['text_pair']) if first_is_original else (r['text_pair'], r['text'])
        key.append('A' if first_is_original else 'B')
        lines += [f'{i}', f'A: {a}', f'B: {b}', '']
    out.mkdir(parents=True, exist_ok=True)
    (out / 'sample.txt').write_text('\n'.join(lines), encoding='utf-8')
    (out / 'key.json').write_text(json.dumps({'seed': seed, 'n': n, 'key': key}) + '\n')


def score(out: Path, answers: str, reader: str):
    "Compare the answers of `reader` (who answered: a person, or which model) with the key; write answers.json."
    if not reader.strip():
        raise SystemExit('say who answered: --reader "a person", or --reader "MODEL NAME" for a model')
    if not (out / 'key.json').is_file():
        raise SystemExit(f'{out}/key.json not found: draw a sample first (python tools/order_sample.py sample {out})')
    key = json.loads((out / 'key.json').read_text())['key']
    given = answers.upper().split()
    if len(given) != len(key):
        raise SystemExit(f'{len(given)} answers for {len(key)} pairs: give one letter (A or B) per pair')
    bad = [f'{i}: {g!r}' for i, g in enumerate(given) if g not in ('A', 'B')]
    if bad:
        raise SystemExit(f"answers must be A or B; got {', '.join(bad[:5])}")
    wrong = [i for i, (g, k) in enumerate(zip(given, key)) if g != k]
    result = {'reader': reader, 'n': len(key), 'correct': len(key) - len(wrong),
              'accuracy': 1 - len(wrong) / len(key), 'wrong': wrong, 'answers': given}
    (out / 'answers.json').write_text(json.dumps(result, indent=1) + '\n')
    print(f"{result['correct']} of {result['n']} correct ({result['accuracy']:.3f}); wrong: {wrong}")


if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('action', choices=['sample', 'score'])
    p.add_argument('out', type=Path)
    p.add_argument('answers', nargs='?', default='')
    p.add_argument('--n', type=int, default=40)
    p.add_argument('--seed', type=int, default=2026)
    p.add_argument('--reader', default='', help='score: who answered (a person, or which model); required')
    a = p.parse_args()
    sample(a.out, a.n, a.seed) if a.action == 'sample' else score(a.out, a.answers, a.reader)
