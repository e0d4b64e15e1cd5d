"""End-to-end pretraining: resume equals an uninterrupted run; a 2-process data-parallel run on CPU; bad input."""
import json, os, shutil, subprocess, sys
from pathlib import Path
import pytest
from conftest import free_port, write_small_corpus
import torch

from posenc_lit.training import make_train_config, pretrain
from posenc_lit.model import load_model, CheckpointError

ENV = {**os.environ, 'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1', 'TOKENIZERS_PARALLELISM': 'false'}


@pytest.fixture(scope='module')
def small_corpus(tmp_path_factory):
    "A small local corpus (the first records of the embedded splits), in the local-folder schema."
    return write_small_corpus(tmp_path_factory.mktemp('corpus'), train=400, validation=60)


def _records(run, split='train'):
    return [json.loads(l) for l in (Path(run) / 'metrics.jsonl').read_text().splitlines() if json.loads(l)['split'] == split]


def test_resume_matches_uninterrupted(tmp_path, small_corpus):
    cfg = make_train_config('smoke', data=small_corpus, steps=20, save_every=10, log_every=1, eval_every=10)
    full = pretrain(cfg, tmp_path / 'full', progress=False)
    assert pretrain(cfg, tmp_path / 'cut', stop_at=10, progress=False) == {'stopped_at_step': 10, 'steps': 20}
    assert (tmp_path / 'cut' / 'checkpoint' / 'model.safetensors').is_file()
    assert not (tmp_path / 'cut' / 'summary.json').exists()
    resumed = pretrain(cfg, tmp_path / 'cut', resume=True, progress=False)
    a, b = _records(tmp_path / 'full'), _records(tmp_path / 'cut')
    assert [r['step'] for r in a] == [r['step'] for r in b] == list(range(1, 21))
    for ra, rb in zip(a, b):
        assert ra['loss'] == pytest.approx(rb['loss'], rel=1e-6, abs=1e-7), ra['step']
        assert ra['lr'] == pytest.approx(rb['lr'])
    assert resumed['eval_loss'] == pytest.approx(full['eval_loss'], rel=1e-6)
    # the checkpoint is a loadable model folder
    m = load_model(tmp_path / 'cut' / 'checkpoint')
    assert m.cfg.pe == cfg.pe
    # a finished run is left as it is
    assert pretrain(cfg, tmp_path / 'cut', resume=True, progress=False) == resumed


def test_stop_at_saves_a_checkpoint_between_saves(tmp_path, small_corpus):
    "`stop_at` off the `save_every` grid still saves (as a signal would), so `--resume` continues from that very step."
    cfg = make_train_config('smoke', data=small_corpus, steps=8, save_every=5, log_every=1, eval_every=4)
    full = pretrain(cfg, tmp_path / 'full', progress=False)
    assert pretrain(cfg, tmp_path / 'cut', stop_at=3, progress=False) == {'stopped_at_step': 3, 'steps': 8}
    assert json.loads((tmp_path / 'cut' / 'checkpoint' / 'trainer_state.json').read_text())['step'] == 3
    assert pretrain(cfg, tmp_path / 'cut', resume=True, progress=False)['eval_loss'] == pytest.approx(full['eval_loss'], rel=1e-6)
    assert [r['loss'] for r in _records(tmp_path / 'cut')] == pytest.approx([r['loss'] for r in _records(tmp_path / 'full')], rel=1e-6)


def test_run_dir_protection(tmp_path, small_corpus):
    cfg = make_train_config('smoke', data=small_corpus, steps=4, save_every=2, eval_every=2)
    pretrain(cfg, tmp_path / 'r', stop_at=2, progress=False)
    with pytest.raises(ValueError, match='pass --resume'):
        pretrain(cfg, tmp_path / 'r', progress=False)
    with pytest.raises(ValueError, match='another configuration'):
        pretrain(make_train_config('smoke', data=small_corpus, steps=4, lr=1e-4), tmp_path / 'r', resume=True, progress=False)
    (tmp_path / 'r' / 'checkpoint' / 'model.safetensors').write_bytes(b'garbage')
    with pytest.raises(CheckpointError, match='cannot resume'):
        pretrain(cfg, tmp_path / 'r', resume=True, progress=False)


def test_bad_data_writes_nothing(tmp_path):
    out = tmp_path / 'never'
    cfg = make_train_config('smoke', data=str(tmp_path / 'no-such-corpus'))
    with pytest.raises(ValueError):
        pretrain(cfg, out, progress=False)
    assert not out.exists()


def test_cli_errors(tmp_path):
    r = subprocess.run([sys.executable, '-c', 'from posenc_lit.cli import main; raise SystemExit(main())',
                        'pretrain', '--pe', 'rope-ish', '--out', str(tmp_path / 'x')], capture_output=True, text=True, env=ENV)
    assert r.returncode == 2 and 'valid names:' in r.stderr and 'Traceback' not in r.stderr
    assert not (tmp_path / 'x').exists()


def test_two_process_data_parallel(tmp_path, small_corpus):
    exe = shutil.which('posenc_lit'); acc = shutil.which('accelerate')
    if exe is None or acc is None: pytest.skip('posenc_lit / accelerate console scripts not installed')
    out = tmp_path / 'ddp'
    cmd = [acc, 'launch', '--multi_gpu', '--num_processes', '2', '--num_machines', '1',
           '--main_process_port', str(free_port()), '--mixed_precision', 'no',
           '--dynamo_backend', 'no', exe, 'pretrain', '--pe', 'sinusoidal', '--preset', 'smoke', '--data', small_corpus,
           '--steps', '6', '--eval-every', '3', '--save-every', '3', '--out', str(out), '--quiet']
    r = subprocess.run(cmd, capture_output=True, text=True, env={**ENV, 'ACCELERATE_USE_CPU': 'true'}, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads((out / 'summary.json').read_text())
    assert s['processes'] == 2
    assert s['tokens_per_step'] == 2 * 8 * 32
    assert torch.isfinite(torch.tensor(s['eval_loss']))
    assert [r['step'] for r in _records(out)] == [5, 6]


def test_bf16_mixed_precision(tmp_path, small_corpus):
    cfg = make_train_config('smoke', data=small_corpus, steps=3, eval_every=3, save_every=3, mixed_precision='bf16')
    s = pretrain(cfg, tmp_path / 'bf16', progress=False)
    assert torch.isfinite(torch.tensor(s['eval_loss']))


def test_gradient_accumulation(tmp_path, small_corpus):
    "Two micro-steps per optimizer step: twice the tokens per step, one record per optimizer step, finite loss."
    cfg = make_train_config('smoke', data=small_corpus, steps=4, grad_accum=2, log_every=1, eval_every=4, save_every=4)
    s = pretrain(cfg, tmp_path / 'acc', progress=False)
    assert s['tokens_per_step'] == 2 * cfg.batch_size * cfg.seq_len
    assert [r['step'] for r in _records(tmp_path / 'acc')] == [1, 2, 3, 4]
    st = json.loads((tmp_path / 'acc' / 'checkpoint' / 'trainer_state.json').read_text())
    assert (st['step'], st['micro_step']) == (4, 8)


def test_sequence_longer_than_learned_table_writes_nothing(tmp_path, small_corpus):
    cfg = make_train_config('smoke', data=small_corpus, pe='learned', seq_len=32, max_position_embeddings=16)
    with pytest.raises(ValueError, match='max_position_embeddings=16'):
        pretrain(cfg, tmp_path / 'long', progress=False)
    assert not (tmp_path / 'long').exists()


def test_fp16_on_cpu_is_a_clear_error(tmp_path, small_corpus):
    if torch.cuda.is_available(): pytest.skip('fp16 is valid on a GPU')
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        pretrain(make_train_config('smoke', data=small_corpus, mixed_precision='fp16'), tmp_path / 'fp16', progress=False)
    assert not (tmp_path / 'fp16').exists()


def test_resume_mid_logging_interval_and_damaged_run_dirs(tmp_path, small_corpus):
    "save_every not a multiple of log_every; a torn last metrics line; a crash between the checkpoint renames."
    cfg = make_train_config('smoke', data=small_corpus, steps=8, log_every=3, save_every=4, eval_every=8)
    pretrain(cfg, tmp_path / 'full', progress=False)
    pretrain(cfg, tmp_path / 'cut', stop_at=4, progress=False)
    with open(tmp_path / 'cut' / 'metrics.jsonl', 'a') as f: f.write('{"step": 5, "split": "tr')   # torn append
    (tmp_path / 'cut' / 'checkpoint').rename(tmp_path / 'cut' / 'checkpoint.old')              # crash mid-swap
    pretrain(cfg, tmp_path / 'cut', resume=True, progress=False)
    a, b = _records(tmp_path / 'full'), _records(tmp_path / 'cut')
    assert [r['step'] for r in a] == [r['step'] for r in b] == [3, 6, 8]
    for ra, rb in zip(a, b): assert ra['loss'] == pytest.approx(rb['loss'], rel=1e-6)


def test_bad_options_fail_before_writing(tmp_path, small_corpus):
    for kw, msg in ((dict(batch_size=100000), 'fewer than one global batch'),
                    (dict(eval_blocks=1, seq_len=8), 'no masked token'),
                    (dict(pe_kwargs={'foo': 1}), 'not accepted by')):
        out = tmp_path / 'x'
        with pytest.raises(ValueError, match=msg):
            pretrain(make_train_config('smoke', data=small_corpus, **kw), out, progress=False)
        assert not out.exists(), kw
