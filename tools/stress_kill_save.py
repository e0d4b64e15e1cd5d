"""Issue 27: SIGKILL two-process pretraining runs while they save a checkpoint, resume each, and compare the losses.

    python tools/stress_kill_save.py [--rounds 20] [--work /tmp/stress]

1. One uninterrupted two-process run (`accelerate launch --multi_gpu --num_processes 2`, CPU) of the smoke preset on
   a small local corpus, saving every 2 steps: its `metrics.jsonl` is the reference.
2. Each round starts the same run in a fresh folder, waits until a save is under way (`checkpoint.tmp` appears),
   waits a random 0–0.3 s more and SIGKILLs the whole process group; then `--resume` is run until the run finishes
   (each resume must exit 0 or be killed again by this script; it never is in this version).
3. Every round's records must equal the reference's, step by step (training and evaluation losses).
Prints one line per round and a summary; exits 1 if any round differs or a resume fails.
"""
import argparse, gzip, json, os, random, shutil, signal, subprocess, sys, time
from pathlib import Path

ENV = {**os.environ, 'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1', 'TOKENIZERS_PARALLELISM': 'false',
       'ACCELERATE_USE_CPU': 'true', 'OMP_NUM_THREADS': '1'}


def corpus(work: Path) -> str:
    from posenc_lit.data import corpus_dir
    d = work / 'corpus'
    d.mkdir(parents=True, exist_ok=True)
    for split, n in (('train', 300), ('validation', 40)):
        with gzip.open(corpus_dir() / f'{split}.jsonl.gz', 'rt') as f:
            lines = [next(f) for _ in range(n)]
        (d / f'{split}.jsonl').write_text(''.join(lines))
    return str(d)


def command(data: str, out: Path, resume=False) -> list:
    launch = [shutil.which('accelerate'), 'launch', '--multi_gpu', '--num_processes', '2', '--num_machines', '1',
              '--mixed_precision', 'no', '--dynamo_backend', 'no']
    args = ['pretrain', '--pe', 'learned', '--preset', 'smoke', '--data', data, '--steps', '12', '--log-every', '1',
            '--eval-every', '4', '--save-every', '2', '--out', str(out), '--quiet']
    return [*launch, shutil.which('posenc_lit'), *args] + (['--resume'] if resume else [])


def records(out: Path) -> list:
    recs = [json.loads(l) for l in (out / 'metrics.jsonl').read_text().splitlines() if l.strip()]
    return [(r['step'], r['split'], r['loss']) for r in recs]


def killed_during_save(data: str, out: Path, rng: random.Random) -> bool:
    p = subprocess.Popen(command(data, out), env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    while p.poll() is None:
        if (out / 'checkpoint.tmp').exists():
            time.sleep(rng.uniform(0, 0.3))
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            return True
        time.sleep(0.005)
    return False


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--rounds', type=int, default=20)
    ap.add_argument('--work', type=Path, default=Path('/tmp/stress'))
    a = ap.parse_args(argv)
    shutil.rmtree(a.work, ignore_errors=True)
    data = corpus(a.work)
    ref_out = a.work / 'reference'
    subprocess.run(command(data, ref_out), env=ENV, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ref = records(ref_out)
    rng, bad = random.Random(0), 0
    for i in range(a.rounds):
        out = a.work / f'round{i}'
        killed = killed_during_save(data, out, rng)
        at = json.loads((out / 'checkpoint' / 'trainer_state.json').read_text())['step'] \
            if (out / 'checkpoint' / 'trainer_state.json').is_file() else None
        r = subprocess.run(command(data, out, resume=True), env=ENV, capture_output=True, text=True)
        same = r.returncode == 0 and records(out) == ref
        bad += not same
        print(f'round {i}: killed during save: {killed}, checkpoint step {at}, resume exit {r.returncode}, '
              f'records equal the uninterrupted run: {same}' + ('' if r.returncode == 0 else f'\n{r.stderr[-1500:]}'),
              flush=True)
    print(f'{a.rounds - bad} of {a.rounds} rounds resumed and equal the uninterrupted run ({len(ref)} records)')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
