"""The study's grid of small runs (issue 37) on one GPU: many study runs at once, each as run_study.sh does.

    python3 tools/gpu_study_grid.py OUT [NAME ...] [--workers 6] [--budget-s 480] [--commit HASH]
    python3 tools/gpu_study_grid.py OUT learned-s3 none-s3 --tiny --workers 2 --budget-s 60   # CPU too

NAME: a study entry or ENTRY-sK (seed K), the names tools/run_study.sh takes. Default: every study entry that
a row of the claims compares (posenc_lit.claims.CLAIMS) × seeds 0-2, less those with a committed
results/study/NAME/summary.json (CPU runs) or results/study_gpu/NAME/summary.json (an earlier GPU grid), entry
by entry (an entry's seeds together, so that the claims' ≥ 3 seeds a side fill up entry by entry).

Each name runs in a worker (--workers of them at once, each a process on the one GPU) the steps of
run_study.sh, through the same CLI and tools: `posenc_lit pretrain` with the entry's options
(posenc_lit.study.entry_args), the `study` preset and the entry's learning rate (study_lr); config.json,
metrics.jsonl, summary.json; diagnostics.json (tools/regime_search.py diagnose), inspect.safetensors
(tools/inspect_run.py) and locality.json, each a warning when it fails, as in run_study.sh (--no-extras skips
them); lengths.json (`posenc_lit lengths`, 32 64 128 256); then the order and sentiment fine-tunings
(`posenc_lit finetune --preset quick`, seeds 0 1 2 for seed 0, seed 0 for the others, as run_study.sh /
run_order.sh; --tasks chooses them, `--tasks` alone skips them). Keep these steps in step with
tools/run_study.sh: this script mirrors it (it cannot call it: run_study.sh writes results/study and commits).

--budget-s: wall-clock seconds from the start after which no step starts and the running ones get SIGTERM (the
CLI then finishes its step, saves a checkpoint and exits; SIGKILL after --grace-s more), so the command
returns inside its timeout. Only finished results are packed, stage by stage: a run's pretraining folder once
pretraining, lengths and the extras that did not fail are done; each task's fine-tuning folder once that task
is done (a pretraining whose fine-tunings were stopped comes back without them: its checkpoint does not come
back).

Writes to OUT (at most 8 files come back from the device machine; these are 4):
  study_gpu.tar.gz   the finished results, unpacked at the repository root as
    results/study_gpu/NAME/            config.json metrics.jsonl summary.json lengths.json device.json
                                       diagnostics.json inspect.safetensors locality.json
    results/study_gpu_order/NAME/      as results/study_order/NAME/ (run_order.sh), no checkpoint
    results/study_gpu_sentiment/NAME/  likewise
    results/study_gpu/grids/GRID.json  this grid's manifest (GRID: its UTC start, e.g. 20261206T160000)
  manifest.json      device (torch.cuda.get_device_name), torch and CUDA versions, commit, options, and per
                     name: status (finished / stopped / failed / not started), each step's wall time and exit
                     status, the last pretraining step recorded
  manifest.md        the same as a table
  logs.tar.gz        every step's output (not results: for reading failures)
The device is part of the result: GPU runs differ from the CPU runs in rounding and are kept apart from them
(results/study_gpu, never results/study). The claims page (nbs/41_claims.ipynb) and the study page read
results/study only: they do not read study_gpu yet.

On the device machine (its python3 has torch; fastcore, datasets, dill and multiprocess are carried as wheels,
as for tools/gpu_check.py). Once, here, at the repository root (ignored by .gitignore's `.whl/`):
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d .whl fastcore==1.14.5 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
The `run` call (the device tool; the lead's checkout travels, with .whl carried). One call, timeout_s 600,
carry [".whl"], HASH: `git rev-parse HEAD` of the checkout sent; the budget (counted from the grid's start,
after the wheels' install, the imports and the datasets cache's warm-up, ~20-40 s) leaves ~60 s for the
SIGTERM grace, packing and returning:
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site
    .whl/*.whl && export PYTHONPATH=/tmp/site || exit; export PYTHONUNBUFFERED=1;
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv;
    python3 tools/gpu_study_grid.py $OUT --workers 6 --budget-s 480 --grace-s 20 --commit HASH 2>&1
    | tee $OUT/log.txt
(the lines joined by spaces: one command of ~420 characters; add NAMEs after $OUT to choose the runs, else the
default list above.) A machine's start takes minutes of the session's 15 of device time, so one such call is
all a session has; a smaller first try (--budget-s 240, timeout_s 330) leaves room for a second call, which,
made while the machine is still warm (30 s), resumes every stopped pretraining from its checkpoint (--work
stays on the machine): pass it the names the first did not finish.

Then, here, at the repository root: `tar
-xzf FILES_AT/study_gpu.tar.gz` (FILES_AT: the reply's files_at), read FILES_AT/manifest.md, `git add
results/study_gpu results/study_gpu_order results/study_gpu_sentiment` and commit with the device named in the
message (e.g. "study_gpu: 9 runs on an NVIDIA H100 80GB HBM3 (tools/gpu_study_grid.py)").

How many finish in ~8 minutes is an ESTIMATE, not a measurement: this script has not run on a GPU yet. Numbers
measured here (2-core CPU, torch 2.13 CPU, torch.profiler, one study-sized step: batch 64 × 32 tokens, D =
128, 2 layers, AdamW foreach, gradient clipping): 1.5-1.7 M parameters, ~20 GFLOP a step (6 × parameters ×
2,048 tokens), 510 (learned) to 1,001 (deberta-emd) top-level operators a step. On an H100 the arithmetic is
well under 1 ms (fp32, TF32 off), so a step is bound by launching its ~500-1,000 kernels: ~5-15 ms of one CPU
core a step (host overhead, ~10 µs an operator) and ~1-4 ms of GPU time (~2-4 µs a tiny kernel). A run is
~15,000 such steps: 12,000 of pretraining (+ 13 evaluations), 1,572 of fine-tuning for seed K > 0 (order 1,042
+ sentiment 530, from the committed CPU runs' summaries) or 4,716 for seed 0 (three fine-tuning seeds). So:
alone, ~1.5-4 min a run (CPU-bound); together, the GPU (kernels of different processes take turns, no MPS)
saturates at ~3-5 workers and does ~120,000-480,000 steps in 8 min, i.e. ~8-30 runs if time-slicing costs
nothing and fewer if it does. More workers than that do not add throughput but make each run slower (per-run
wall ≈ workers × 15-60 s of GPU time), and a run that does not finish inside the budget is lost: at 14 workers
a run would take ~3.5-14 min, so perhaps none finishes in 8. Hence the default of 6 workers (~1.5-6 min a run:
1-5 runs per worker; expect ~6-20 finished of today's 23 default names, at most 6 stopped mid-way). No new
run starts when less time is left than the fastest run so far took. The first grid's manifest (per-step wall
times, where each stopped run stood) is what to plan by.
"""

import argparse, json, os, re, shutil, signal, subprocess, sys, tarfile, threading, time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # posenc_lit from this checkout (the device machine has no install of it)
from posenc_lit.study import ENTRIES, SEEDS, entry_args, study_lr

LENGTHS = ('32', '64', '128', '256')  # run_study.sh's `posenc_lit lengths --lengths`
TASKS = ('order', 'sentiment')  # run_study.sh's fine-tunings, in its order
SEED_MAX = 2**32  # the CLI's seeds are below this (lane_lib.sh's check_names)
PACKED = 'study_gpu'  # results/study_gpu/NAME, results/study_gpu_TASK/NAME


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('out', type=Path, help='folder for study_gpu.tar.gz, manifest.json/.md and logs.tar.gz')
    p.add_argument(
        'names', nargs='*', help='study runs (ENTRY or ENTRY-sK); default: the claims\' entries × seeds'
    )
    p.add_argument(
        '--workers', type=int, default=6, help='runs at once on the one GPU (the docstring: why 6)'
    )
    p.add_argument(
        '--budget-s', type=float, default=480, help='seconds after which no step starts, running stop'
    )
    p.add_argument('--grace-s', type=float, default=30, help='seconds from SIGTERM to SIGKILL')
    p.add_argument(
        '--work',
        type=Path,
        default=Path('/tmp/gpu_study_grid'),
        help='folder of the runs and their checkpoints (a later call on the same machine resumes them)',
    )
    p.add_argument(
        '--commit', default=None, help='the commit of the checkout (git rev-parse HEAD if there is .git)'
    )
    p.add_argument('--no-extras', action='store_true', help='skip diagnostics, inspect_run and locality')
    p.add_argument(
        '--tasks',
        nargs='*',
        default=list(TASKS),
        choices=TASKS,
        help='fine-tuning tasks, in order (default: order sentiment, as run_study.sh); none: skip them',
    )
    p.add_argument('--list', action='store_true', help='print the runs and their learning rates; run nothing')
    p.add_argument(
        '--tiny', action='store_true', help='a test of the script: smoke presets, --tiny-steps steps'
    )
    p.add_argument('--tiny-steps', type=int, default=4, help='pretraining steps with --tiny')
    p.add_argument(
        '--data', default=None, help='pretraining corpus (`posenc_lit pretrain --data`; default: embedded)'
    )
    a = p.parse_args(argv)
    if a.workers < 1 or a.budget_s <= 0 or a.grace_s < 0 or a.tiny_steps < 1:
        p.error('--workers and --tiny-steps must be ≥ 1, --budget-s > 0, --grace-s ≥ 0')
    return a


def split_name(name: str) -> tuple[str, int]:
    "`(entry, seed)` of a run name as lane_lib.sh's check_names/split_name read it; ValueError if it is none."
    m = re.fullmatch(r'(.+)-s([1-9][0-9]*)', name)
    entry, seed = (m[1], int(m[2])) if m else (name, 0)
    if entry not in ENTRIES or seed >= SEED_MAX or re.search(r'\s', name):
        raise ValueError(
            f'{name!r} is not a study run (ENTRY or ENTRY-sK, K in 1..{SEED_MAX - 1}); '
            f'entries: {" ".join(ENTRIES)}'
        )
    return entry, seed


def compared_entries() -> list[str]:
    "The study entries some row of the claims compares (either side), in the study's order."
    from posenc_lit.claims import CLAIMS

    used = {n for c in CLAIMS for n in (c.ours, c.base)}
    return [e for e in ENTRIES if e in used]


def default_names(root: Path = REPO) -> list[str]:
    "The compared entries × seeds 0..SEEDS-1 with no committed study or study_gpu summary, entry by entry."
    names = [e if k == 0 else f'{e}-s{k}' for e in compared_entries() for k in range(SEEDS)]
    done = lambda n: any((root / 'results' / f / n / 'summary.json').exists() for f in ('study', PACKED))
    return [n for n in names if not done(n)]


class Grid:
    "The runs, their child processes and the budget; `job(name)` runs one name's steps in a worker thread."

    def __init__(self, a, work: Path):
        self.a, self.work, self.t0 = a, work, time.monotonic()
        self.deadline = self.t0 + a.budget_s
        self.stop = threading.Event()
        self.lock, self.procs, self.runs = threading.Lock(), set(), {}
        py = sys.executable
        self.cli = [py, '-m', 'posenc_lit.cli']
        self.py = py
        self.env = {
            **os.environ,
            'PYTHONPATH': os.pathsep.join(filter(None, [str(REPO), os.environ.get('PYTHONPATH')])),
            'OMP_NUM_THREADS': '1',
            'MKL_NUM_THREADS': '1',
            'TOKENIZERS_PARALLELISM': 'false',
            'HF_HUB_OFFLINE': '1',
            'HF_DATASETS_OFFLINE': '1',
            'PYTHONUNBUFFERED': '1',
        }

    def step(self, rec: dict, label: str, cmd: list, log: Path) -> bool:
        "Run one step (own process group, output to `log`) unless the budget is spent; whether it succeeded."
        if self.stop.is_set() or time.monotonic() >= self.deadline:
            rec['steps'].append({'step': label, 'status': 'not started (budget)'})
            return False
        t = time.monotonic()
        with open(log, 'a') as f:
            f.write(f'$ {" ".join(map(str, cmd))}\n')
            f.flush()
            p = subprocess.Popen(
                list(map(str, cmd)),
                stdout=f,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=REPO,
                start_new_session=True,
            )
            with self.lock:
                self.procs.add(p)
            if self.stop.is_set():  # the budget fired between the check and the start
                _signal(p, signal.SIGTERM)
            rc = p.wait()
            with self.lock:
                self.procs.discard(p)
        rec['steps'].append({'step': label, 'rc': rc, 'wall_s': round(time.monotonic() - t, 1)})
        return rc == 0

    def job(self, name: str):
        entry, seed = split_name(name)
        rec = self.runs[name]
        rec.update(status='running', start_s=round(time.monotonic() - self.t0, 1), steps=[])
        a, run, log = self.a, self.work / 'runs' / name, self.work / 'logs' / f'{name}.log'
        dest = self.work / 'stage' / 'results' / PACKED / name
        preset, extra = ('smoke', ['--steps', a.tiny_steps]) if a.tiny else ('study', [])
        extra += ['--data', a.data] if a.data else []
        ok = self.step(
            rec,
            'pretrain',
            [
                *self.cli,
                'pretrain',
                *entry_args(entry),
                '--seed',
                seed,
                '--preset',
                preset,
                '--lr',
                rec['lr'],
                '--out',
                run,
                '--resume',
                '--quiet',
                *extra,
            ],
            log,
        )
        if ok:
            dest.mkdir(parents=True, exist_ok=True)
            for f in ('config.json', 'metrics.jsonl', 'summary.json'):
                shutil.copy2(run / f, dest)
            if not a.no_extras:  # warnings only, as in run_study.sh
                self.step(rec, 'diagnostics', [self.py, 'tools/regime_search.py', 'diagnose', run, dest], log)
                self.step(rec, 'inspect', [self.py, 'tools/inspect_run.py', run, dest], log)
                code = 'import sys; from posenc_lit.locality import locality_run; locality_run(sys.argv[1])'
                if self.step(rec, 'locality', [self.py, '-c', code, run], log):
                    shutil.copy2(run / 'locality.json', dest)
            ok = self.step(rec, 'lengths', [*self.cli, 'lengths', '--run', run, '--lengths', *LENGTHS], log)
            if ok:
                shutil.copy2(run / 'lengths.json', dest)
                rec['packed'].append(f'results/{PACKED}/{name}')
        if ok:
            seeds = ['0', '1', '2'] if seed == 0 else ['0']
            for task in a.tasks:
                ft = self.work / 'runs' / f'{task}_{name}'
                cmd = [
                    *self.cli,
                    'finetune',
                    '--checkpoint',
                    run,
                    '--task',
                    task,
                    '--preset',
                    'smoke' if a.tiny else 'quick',
                    '--seeds',
                    *seeds,
                    '--out',
                    ft,
                    '--overwrite',
                    '--quiet',
                ]
                if not self.step(rec, f'finetune {task}', cmd, log):
                    ok = False
                    break
                tdest = self.work / 'stage' / 'results' / f'{PACKED}_{task}' / name
                shutil.copytree(ft, tdest, ignore=shutil.ignore_patterns('checkpoint'), dirs_exist_ok=True)
                rec['packed'].append(f'results/{PACKED}_{task}/{name}')
        stopped = self.stop.is_set() or time.monotonic() >= self.deadline
        rec['status'] = 'finished' if ok else ('stopped' if stopped else 'failed')
        rec['pretrain_step'] = _last_step(
            run / 'metrics.jsonl'
        )  # where a stopped run stands (--resume goes on)
        rec['wall_s'] = round(time.monotonic() - self.t0 - rec['start_s'], 1)

    def watch(self):
        "At the deadline: no step starts, every running one gets SIGTERM, then SIGKILL after the grace."
        while not self.stop.wait(max(0.0, self.deadline - time.monotonic())):
            if time.monotonic() >= self.deadline:
                break
        self.stop.set()
        with self.lock:
            live = list(self.procs)
        for p in live:
            _signal(p, signal.SIGTERM)
        end = time.monotonic() + self.a.grace_s
        while time.monotonic() < end and any(p.poll() is None for p in live):
            time.sleep(0.2)
        for p in live:
            if p.poll() is None:
                _signal(p, signal.SIGKILL)


def _last_step(metrics: Path):
    "The last step recorded in a run's metrics.jsonl, or None."
    try:
        return json.loads(metrics.read_text().splitlines()[-1]).get('step')
    except (OSError, IndexError, ValueError, AttributeError):
        return None


def _signal(p, sig):
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def warm_cache(a):
    "Load the corpus and the tasks once, so that the workers do not all build the `datasets` cache at once."
    from posenc_lit.data import load_corpus
    from posenc_lit.tasks import load_task

    try:
        load_corpus(a.data or 'default')
        for task in a.tasks:
            load_task(task)
    except Exception as e:  # the runs report it themselves
        print(f'warning: warming the datasets cache failed: {e!r}', file=sys.stderr)


def device_info() -> dict:
    import torch

    cuda = torch.cuda.is_available()
    return {
        'device': (
            torch.cuda.get_device_name(0)
            if cuda
            else f'CPU ({os.cpu_count()} cores; no CUDA): ' 'a test of the script, not a GPU result'
        ),
        'cuda': cuda,
        'torch': torch.__version__,
        'cuda_version': torch.version.cuda,
    }


def commit_of(given):
    if given:
        return given
    try:
        return subprocess.run(
            ['git', 'rev-parse', 'HEAD'], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return 'unknown (no .git; pass --commit)'


def markdown(m: dict) -> str:
    rows = [
        f"# Study grid {m['grid']} on {m['device']}",
        '',
        f"torch {m['torch']} (CUDA {m['cuda_version']}), commit {m['commit']}, {m['workers']} workers, "
        f"budget {m['budget_s']} s, preset {m['preset']}; wall {m['wall_s']} s; "
        f"{sum(r['status'] == 'finished' for r in m['runs'].values())} of {len(m['runs'])} finished",
        '',
        '| run | lr | status | wall s | steps (s, exit status) | packed |',
        '|---|---|---|---|---|---|',
    ]
    for n, r in m['runs'].items():
        steps = '; '.join(
            f"{s['step']} {s.get('wall_s', '-')} ({s.get('rc', s.get('status'))})" for s in r.get('steps', [])
        )
        rows.append(
            f"| {n} | {r['lr']} | {r['status']} | {r.get('wall_s', '-')} | {steps} | "
            f"{', '.join(r['packed']) or '-'} |"
        )
    return '\n'.join(rows) + '\n'


def pack(grid: Grid, m: dict, out: Path):
    "study_gpu.tar.gz (finished results + this manifest), manifest.json/.md, logs.tar.gz under `out`."
    stage = grid.work / 'stage'
    info = {k: m[k] for k in ('grid', 'device', 'torch', 'cuda_version', 'commit')}
    for r in m['runs'].values():  # the device with each packed pretraining result
        for p in r['packed']:
            if p.startswith(f'results/{PACKED}/'):
                (stage / p / 'device.json').write_text(
                    json.dumps({**info, 'steps': r['steps']}, indent=1) + '\n'
                )
    (stage / 'results' / PACKED / 'grids').mkdir(parents=True, exist_ok=True)
    (stage / 'results' / PACKED / 'grids' / f"{m['grid']}.json").write_text(json.dumps(m, indent=1) + '\n')
    with tarfile.open(out / 'study_gpu.tar.gz', 'w:gz') as t:
        for r in m['runs'].values():
            for p in r['packed']:
                t.add(stage / p, arcname=p)
        t.add(stage / 'results' / PACKED / 'grids', arcname=f'results/{PACKED}/grids')
    with tarfile.open(out / 'logs.tar.gz', 'w:gz') as t:
        t.add(grid.work / 'logs', arcname='logs')
    (out / 'manifest.json').write_text(json.dumps(m, indent=1) + '\n')
    (out / 'manifest.md').write_text(markdown(m))


def main(argv=None) -> int:
    a = parse_args(argv)
    names = a.names or default_names()
    try:
        lrs = {
            n: study_lr(split_name(n)[0], root=REPO / 'results') for n in names
        }  # every name checked first
    except (ValueError, LookupError) as e:
        print(f'gpu_study_grid.py: {e}; nothing was run', file=sys.stderr)
        return 2
    if len(set(names)) < len(names):
        print('gpu_study_grid.py: a name is given twice; nothing was run', file=sys.stderr)
        return 2
    if a.list:
        print('\n'.join(f'{n} {lr}' for n, lr in lrs.items()))
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    warm_cache(a)
    work = a.work.resolve()
    if work.exists():
        shutil.rmtree(work / 'stage', ignore_errors=True)
    (work / 'logs').mkdir(parents=True, exist_ok=True)
    grid = Grid(a, work)
    grid.runs = {n: {'lr': lrs[n], 'status': 'not started', 'packed': []} for n in names}
    m = {
        'grid': datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S'),
        **device_info(),
        'commit': commit_of(a.commit),
        'workers': a.workers,
        'budget_s': a.budget_s,
        'preset': 'smoke (--tiny)' if a.tiny else 'study',
        'tiny_steps': a.tiny_steps if a.tiny else None,
        'extras': not a.no_extras,
        'tasks': a.tasks,
        'script': 'tools/gpu_study_grid.py',
        'runs': grid.runs,
    }
    print(
        f"{m['device']}, torch {m['torch']}: {len(names)} runs, {a.workers} workers, budget {a.budget_s} s",
        flush=True,
    )
    watcher = threading.Thread(target=grid.watch, daemon=True)
    watcher.start()

    def job(n):
        left = grid.deadline - time.monotonic()
        walls = [r['wall_s'] for r in grid.runs.values() if r['status'] == 'finished']
        if grid.stop.is_set() or left <= 0:
            return  # no new run starts after the budget
        if walls and left < min(walls):  # it would not finish: it would only slow the runs in flight
            grid.runs[n][
                'status'
            ] = f'not started ({left:.0f} s left, the fastest run took {min(walls):.0f} s)'
            return
        try:
            grid.job(n)
        except Exception as e:  # a copy failed: the run is reported, the others go on
            grid.runs[n].update(status='failed', error=repr(e))
        print(f"{n}: {grid.runs[n]['status']} ({grid.runs[n].get('wall_s', '-')} s)", flush=True)

    with ThreadPoolExecutor(a.workers) as ex:
        list(ex.map(job, names))
    grid.stop.set()
    m['wall_s'] = round(time.monotonic() - grid.t0, 1)
    pack(grid, m, a.out)
    print(markdown(m), flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
