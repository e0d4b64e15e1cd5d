"""The shared training loop (`posenc_lit.loop`): the reliability promises of issue 27 that live in the loop.

Each test failed on the trainers before the loop: a save that renamed `checkpoint.tmp` before the other process had
written into it, a missing `trainer_state.json` read as "no checkpoint yet", NaN losses run to the end and written as
`NaN` into JSON, a full disk reported as a `RuntimeError` traceback, a temporary file of a killed write that blocked
`--overwrite`, and the "interrupted" line printed once per process."""
import itertools, json, os, shutil, subprocess, sys, textwrap
from pathlib import Path
from unittest import mock
import pytest
from conftest import free_port, write_small_corpus

from posenc_lit.model import CheckpointError
from posenc_lit.training import make_train_config, pretrain

ENV = {**os.environ, 'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1', 'TOKENIZERS_PARALLELISM': 'false'}


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
    "A small local corpus (the first records of the embedded splits)."
    return write_small_corpus(tmp_path_factory.mktemp('corpus'), train=300, validation=40)


def _cfg(corpus, **kw):
    return make_train_config('smoke', **{'data': corpus, 'steps': 8, 'log_every': 1, 'eval_every': 4,
                                         'save_every': 4, **kw})


def _files(out):
    return {p: p.read_bytes() for p in Path(out).rglob('*') if p.is_file()}


def _strict_json(text):
    "Parse `text` as standard JSON: `NaN` and `Infinity` are errors."
    def refuse(c):
        raise ValueError(f'{c} is not standard JSON')
    return json.loads(text, parse_constant=refuse)


def test_missing_trainer_state_is_a_checkpoint_error(corpus, tmp_path):
    "Without trainer_state.json (written last) nothing is known of the checkpoint: refused, nothing changed."
    out = tmp_path / 'run'
    pretrain(_cfg(corpus), out, stop_at=4, progress=False)
    (out / 'checkpoint' / 'trainer_state.json').unlink()
    before = _files(out)
    with pytest.raises(CheckpointError, match='has no trainer_state.json'):
        pretrain(_cfg(corpus), out, resume=True, progress=False)
    assert _files(out) == before


def test_non_finite_loss_stops_with_the_checkpoint_before(corpus, tmp_path):
    "An absurd learning rate: the first NaN loss stops the run; the checkpoint of the step before it is there."
    out = tmp_path / 'run'
    with pytest.raises(ValueError, match='not finite') as e:            # `loop.NonFiniteLossError`
        pretrain(_cfg(corpus, lr=1e30, steps=20, save_every=100, eval_every=100), out, progress=False)
    bad = int(str(e.value).split('at step ')[1].split(':')[0])
    assert ('a lower learning rate usually helps (--lr; in Python also a smaller max_grad_norm): start the run again '
            'with it, with --overwrite in the same --out or in another --out') in str(e.value)  # the way on
    state = json.loads((out / 'checkpoint' / 'trainer_state.json').read_text())
    assert state['step'] == bad - 1
    recs = [_strict_json(l) for l in (out / 'metrics.jsonl').read_text().splitlines()]
    assert [r['step'] for r in recs if r['split'] == 'train'] == list(range(1, bad))
    assert not (out / 'summary.json').exists()


def test_full_disk_during_save_says_so_and_loses_nothing(corpus, tmp_path, monkeypatch):
    "torch's writer on a full disk raises RuntimeError('… unexpected pos …'): an OSError that says the disk is full."
    out = tmp_path / 'run'
    pretrain(_cfg(corpus), out, stop_at=4, progress=False)
    good = {p.name: p.read_bytes() for p in (out / 'checkpoint').iterdir()}
    from accelerate import Accelerator
    def full_disk(self, output_dir, **kw):
        (Path(output_dir) / 'model.safetensors').write_bytes(b'\0' * 100)
        raise RuntimeError('[enforce fail at inline_container.cc:626] . unexpected pos 8448 vs 8340')
    monkeypatch.setattr(Accelerator, 'save_state', full_disk)
    with pytest.raises(OSError, match='the disk is full'):
        pretrain(_cfg(corpus), out, resume=True, progress=False)
    assert {p.name: p.read_bytes() for p in (out / 'checkpoint').iterdir()} == good
    assert not (out / 'checkpoint.tmp').exists()


def test_temporary_file_of_a_killed_write_does_not_block_overwrite(corpus, tmp_path):
    "A SIGKILL during an atomic write leaves `.metrics.jsonl.XXXX`: the run's own file, not the user's."
    out = tmp_path / 'run'
    pretrain(_cfg(corpus), out, stop_at=2, progress=False)
    (out / '.metrics.jsonl.q8w3z1').write_text('{"step": 1')
    s = pretrain(_cfg(corpus, steps=4), out, overwrite=True, progress=False)
    assert s['steps'] == 4 and not (out / '.metrics.jsonl.q8w3z1').exists()


WRAPPER = '''
import os, signal, sys, time
import accelerate.accelerator as A
save = A.save_accelerator_state
def slow_save(*args, **kwargs):            # rank 1 writes its part of every checkpoint one second late
    if os.environ.get('RANK') == '1':
        time.sleep(1.0)
    return save(*args, **kwargs)
A.save_accelerator_state = slow_save
from posenc_lit import training
try:
    from posenc_lit import loop as where
    name = 'log_record'
except ImportError:                          # the trainers before the shared loop
    where, name = training, '_log'
log = getattr(where, name)
def log_and_interrupt(out, rec, main=True):  # Ctrl-C on every process after the record of step 2
    log(out, rec, main)
    if rec['split'] == 'train' and rec['step'] == 2:
        signal.raise_signal(signal.SIGINT)
setattr(where, name, log_and_interrupt)
from posenc_lit.cli import main
sys.exit(main())
'''


def test_two_processes_save_waits_for_every_rank(corpus, tmp_path):
    """Two processes, rank 1's save delayed by a second: the checkpoint is swapped in only when both have written
    (both random states are there), the stop is reported once, and `--resume` finishes the run."""
    acc = shutil.which('accelerate')
    if acc is None:
        pytest.skip('the accelerate console script is not installed')
    (tmp_path / 'wrapper.py').write_text(textwrap.dedent(WRAPPER))
    out = tmp_path / 'ddp'
    args = ['pretrain', '--pe', 'sinusoidal', '--preset', 'smoke', '--data', corpus, '--steps', '4', '--log-every', '1',
            '--eval-every', '2', '--save-every', '2', '--out', str(out), '--quiet']
    launch = [acc, 'launch', '--multi_gpu', '--num_processes', '2', '--num_machines', '1',
              '--main_process_port', str(free_port()), '--mixed_precision', 'no',
              '--dynamo_backend', 'no']
    env = {**ENV, 'ACCELERATE_USE_CPU': 'true'}
    r = subprocess.run([*launch, str(tmp_path / 'wrapper.py'), *args], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode != 0, r.stdout[-3000:] + r.stderr[-3000:]     # 130 from rank 0; the launcher reports 1
    assert r.stdout.count('interrupted by SIGINT') == 1, r.stdout
    names = {p.name for p in (out / 'checkpoint').iterdir()}
    assert {'random_states_0.pkl', 'random_states_1.pkl', 'trainer_state.json'} <= names
    assert json.loads((out / 'checkpoint' / 'trainer_state.json').read_text())['step'] == 2
    exe = shutil.which('posenc_lit')
    r = subprocess.run([*launch, exe, *args, '--resume'], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert _strict_json((out / 'summary.json').read_text())['steps'] == 4


def test_overwrite_replaces_only_the_run_folder_itself(corpus, tmp_path, monkeypatch):
    """--overwrite deletes a run, and nothing that merely looks like one (breaker F3, F4, F5): a folder with a
    checkpoint/ and a summary.json but no config.json and no trainer state is refused; a symbolic link `--out` is
    refused naming its target (link and folder kept); `--out .` replaces the run in the current folder; a folder
    holding the current folder is refused."""
    from posenc_lit.loop import RunDirError
    fake = tmp_path / 'fake'
    (fake / 'checkpoint').mkdir(parents=True)
    (fake / 'checkpoint' / 'model.bin').write_bytes(b'precious')
    (fake / 'summary.json').write_text('{}')
    with pytest.raises(RunDirError, match=r'has no config.json and no checkpoint with its trainer_state.json: it '
                                          r'only looks like a pretraining run \(checkpoint, summary.json\)'):
        pretrain(_cfg(corpus, steps=4), fake, overwrite=True, progress=False)
    assert (fake / 'checkpoint' / 'model.bin').read_bytes() == b'precious' and (fake / 'summary.json').is_file()
    run = tmp_path / 'run'
    pretrain(_cfg(corpus, steps=4), run, progress=False)
    link = tmp_path / 'link'
    link.symlink_to(run)
    with pytest.raises(RunDirError, match=f'--out {link} is a symbolic link to {run}: pass the folder itself'):
        pretrain(_cfg(corpus, steps=4), link, overwrite=True, progress=False)
    assert link.is_symlink() and link.resolve() == run and (run / 'summary.json').is_file()
    monkeypatch.chdir(run / 'checkpoint')
    with pytest.raises(RunDirError, match='holds the current folder'):
        pretrain(_cfg(corpus, steps=4), run, overwrite=True, progress=False)
    assert (run / 'checkpoint' / 'trainer_state.json').is_file()
    monkeypatch.chdir(run)
    s = pretrain(_cfg(corpus, steps=4, seed=1), Path('.'), overwrite=True, progress=False)
    assert s['steps'] == 4 and Path.cwd() == run
    assert json.loads((run / 'config.json').read_text())['seed'] == 1 and (run / 'summary.json').is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ['fake', 'link', 'run']   # nothing left aside


def test_throughput_after_resume_counts_the_steps_since(corpus, tmp_path):
    """The first training record after --resume: its loss is the whole window's (2 steps before the stop, 3 after),
    its tokens_per_s counts only the tokens of the 3 steps the clock timed (a clock that reads 0, 1, 2, ...: one
    second from the resume to the record), not the window's 5 (the loop before the fix: 5 × 256 tokens / 1 s)."""
    cfg = _cfg(corpus, steps=5, log_every=5, eval_every=5, save_every=5)
    assert pretrain(cfg, tmp_path / 'r', stop_at=2, progress=False) == {'stopped_at_step': 2, 'steps': 5}
    with mock.patch('time.time', side_effect=itertools.count()):
        pretrain(cfg, tmp_path / 'r', resume=True, progress=False)
    recs = [json.loads(l) for l in (tmp_path / 'r' / 'metrics.jsonl').read_text().splitlines()]
    train = [r for r in recs if r['split'] == 'train']
    assert [r['step'] for r in train] == [5]
    assert train[0]['tokens_per_s'] == 3 * cfg.batch_size * cfg.seq_len
