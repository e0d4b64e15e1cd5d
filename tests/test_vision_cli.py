"""`posenc_lit vit` end to end (issue 5, part 2): a tiny run writes the pretraining run-directory layout with test accuracy
at every evaluation size and interpolation mode; --stop-at/--resume and SIGTERM/--resume give the losses of an uninterrupted
run; a fine-tune at a higher resolution; bad input exits with status 2 and a message that says what to do."""
import os
os.environ.setdefault('HF_HUB_OFFLINE', '1'); os.environ.setdefault('HF_DATASETS_OFFLINE', '1')

import json, signal, subprocess, sys
from pathlib import Path

import numpy as np, pytest, torch

from conftest import cut_with_sigterm
from posenc_lit.cli import main
from posenc_lit.vision import IDX_FILES, write_idx
from posenc_lit.core import list_encodings
from posenc_lit.vit import load_vit

ENV = {**os.environ, 'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1', 'OMP_NUM_THREADS': '1'}
SMOKE = ['vit', '--pe', 'learned', '--preset', 'smoke', '--quiet']


def _losses(run, split='train'):
    return [(r['step'], r['loss']) for r in map(json.loads, (Path(run) / 'metrics.jsonl').read_text().splitlines()) if r['split'] == split]


def _cli(*args):
    return [sys.executable, '-c', 'from posenc_lit.cli import main; raise SystemExit(main())', *map(str, args)]


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    "One finished smoke run through the command line: 20 steps, evaluated at 28x28, 56x56 and 28x56."
    out = tmp_path_factory.mktemp('vit') / 'run'
    assert main([*SMOKE, '--steps', '20', '--log-every', '2', '--eval-sizes', '28,56,28x56', '--out', str(out)]) == 0
    return out


def test_run_directory_and_summary(run, capsys):
    out = run
    assert sorted(p.name for p in out.iterdir()) == ['checkpoint', 'config.json', 'metrics.jsonl', 'summary.json']
    s = json.loads((out / 'summary.json').read_text())
    for k in ('test_accuracy', 'val_accuracy', 'steps', 'wall_s', 'train_images_per_s', 'parameters', 'eval'):
        assert k in s, k
    assert s['steps'] == 20 and 0 <= s['test_accuracy'] <= 1 and s['data'] == 'default'
    assert s['images'] == {'train': 8100, 'validation': 900, 'test': 2000}
    assert set(s['eval']) == {'28x28', '56x56', '28x56'}
    assert all(set(v) == {'bicubic', 'bilinear', 'none'} for v in s['eval'].values())
    assert set(s['eval']['28x28'].values()) == {s['test_accuracy']}           # the training grid: nothing to interpolate
    cfg = json.loads((out / 'config.json').read_text())
    assert cfg['pe'] == 'learned' and cfg['steps'] == 20 and cfg['eval_sizes'] == [[28, 28], [56, 56], [28, 56]]
    assert [st for st, _ in _losses(out)] == list(range(2, 21, 2))
    assert load_vit(out / 'checkpoint' / 'model').cfg.image_size == (28, 28)
    # a finished run is left as it is with --resume; without it the directory is protected
    assert main([*SMOKE, '--steps', '20', '--log-every', '2', '--eval-sizes', '28,56,28x56', '--out', str(out), '--resume']) == 0
    assert json.loads(capsys.readouterr().out)['test_accuracy'] == s['test_accuracy']
    assert main([*SMOKE, '--steps', '20', '--out', str(out)]) == 2
    assert 'pass --resume to continue it, --overwrite to replace it' in capsys.readouterr().err


def test_stop_and_resume_give_the_same_losses(run, tmp_path, capsys):
    ref = run
    args = [*SMOKE, '--steps', '20', '--log-every', '2', '--eval-sizes', '28,56,28x56', '--out', str(tmp_path / 'r')]
    assert main([*args, '--stop-at', '10']) == 0
    assert 'stopped at step 10 of 20; continue with --resume' in capsys.readouterr().out
    assert not (tmp_path / 'r' / 'summary.json').exists()
    assert main([*args, '--resume']) == 0
    assert _losses(tmp_path / 'r') == _losses(ref) and _losses(tmp_path / 'r', 'eval') == _losses(ref, 'eval')
    a, b = (json.loads((d / 'summary.json').read_text()) for d in (tmp_path / 'r', ref))
    assert a['test_accuracy'] == b['test_accuracy'] and a['eval'] == b['eval']
    # a resume with other options is refused
    assert main([*args, '--resume', '--lr', '0.1']) == 2
    assert 'holds a run with another configuration' in capsys.readouterr().err


def test_sigterm_saves_and_resume_continues(tmp_path):
    "SIGTERM mid-run: a checkpoint at that step, status 143, no traceback; --resume then logs the uninterrupted run's losses."
    args = ['vit', '--pe', 'sincos2d', '--preset', 'smoke', '--quiet', '--steps', '300', '--log-every', '1', '--eval-every', '100',
            '--save-every', '100', '--eval-sizes', '28']
    k = cut_with_sigterm(_cli(*args, '--out', tmp_path / 'cut'), tmp_path / 'cut', ENV, 300)
    assert [s for s, _ in _losses(tmp_path / 'cut')] == list(range(1, k + 1))
    r = subprocess.run(_cli(*args, '--out', tmp_path / 'cut', '--resume'), capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run(_cli(*args, '--out', tmp_path / 'full'), capture_output=True, text=True, env=ENV)   # same threads as the cut run:
    assert r.returncode == 0, r.stderr[-2000:]                                                             # the last digits depend on them
    assert _losses(tmp_path / 'cut') == _losses(tmp_path / 'full')


def test_finetune_at_a_higher_resolution(tmp_path):
    out = tmp_path / 'ft'
    assert main([*SMOKE, '--steps', '8', '--finetune-res', '56', '--finetune-steps', '4', '--eval-sizes', '28,56', '--out', str(out)]) == 0
    s = json.loads((out / 'summary.json').read_text())
    assert s['finetune']['image_size'] == [56, 56] and s['finetune']['steps'] == 4 and 0 <= s['finetune']['test_accuracy'] <= 1
    assert set(s['finetune']['eval']) == {'28x28', '56x56'}
    recs = [json.loads(l) for l in (out / 'metrics.jsonl').read_text().splitlines()]
    assert [r['step'] for r in recs if r['split'] == 'train' and r['phase'] == 'finetune'] == [10, 12]
    assert load_vit(out / 'checkpoint' / 'model').pe.table_grid == (14, 14)


def test_finetunes_from_each_init_and_hybrid_stem(tmp_path):
    "--finetune-init: one fine-tune per entry from the trained model (kept in trained_model/), scored at --finetune-eval-sizes; --stem hybrid."
    out = tmp_path / 'fts'
    assert main([*SMOKE, '--steps', '6', '--finetune-res', '56', '--finetune-steps', '2', '--finetune-init', 'bicubic,none',
                 '--finetune-eval-sizes', '56', '--eval-sizes', '28,56', '--out', str(out)]) == 0
    s = json.loads((out / 'summary.json').read_text())
    assert list(s['finetunes']) == ['bicubic', 'none'] and 'finetune' not in s
    assert all(set(f['eval']) == {'56x56'} and f['steps'] == 2 for f in s['finetunes'].values())
    assert load_vit(out / 'trained_model').pe.table_grid == (7, 7) and load_vit(out / 'checkpoint' / 'model').pe.table_grid == (14, 14)
    h = tmp_path / 'hybrid'
    assert main([*SMOKE, '--steps', '2', '--stem', 'hybrid', '--eval-sizes', '28', '--out', str(h)]) == 0
    assert load_vit(h / 'checkpoint' / 'model').cfg.stem == 'hybrid'


def test_encoding_without_table_and_interpolation_off(tmp_path):
    "sincos2d needs no interpolation: --interpolate none is fine at other sizes, and every mode is the same model."
    out = tmp_path / 's'
    assert main(['vit', '--pe', 'sincos2d', '--preset', 'smoke', '--quiet', '--steps', '6', '--interpolate', 'none',
                 '--eval-sizes', '28,28x56', '--out', str(out)]) == 0
    s = json.loads((out / 'summary.json').read_text())
    assert len(set(s['eval']['28x56'].values())) == 1 and 'not applicable' in s['interpolation']


def test_local_idx_folder_other_size(tmp_path):
    "A folder of IDX files with 20×20 images: resized to the training size (28×28); 5 classes."
    d = tmp_path / 'imgs'; d.mkdir()
    rng = np.random.default_rng(0)
    for s, n in (('train', 120), ('test', 30)):
        write_idx(d / IDX_FILES[s][0], rng.integers(0, 256, (n, 20, 20))); write_idx(d / IDX_FILES[s][1], np.arange(n) % 5)
    out = tmp_path / 'run'
    assert main([*SMOKE, '--steps', '4', '--data', str(d), '--eval-sizes', '28', '--out', str(out)]) == 0
    s = json.loads((out / 'summary.json').read_text())
    assert s['images'] == {'train': 110, 'validation': 10, 'test': 30} and s['data'] == str(d)   # 24 per class, every 10th


def test_help_lists_the_vision_encodings(capsys):
    assert main(['vit', '--help']) == 0
    h = capsys.readouterr().out
    assert 'vision position encodings (--pe):' in h
    for name, spec in list_encodings('image').items(): assert f'  {name}' in h and spec.summary[:40] in h


BAD = {   # id: (arguments after `posenc_lit vit --pe learned --preset smoke`, text the error must contain, usage line printed)
    'patch': (['--image-size', '30'], 'the height 30 is not a multiple of patch_size=4; use 28 or 32', True),
    'patch-size': (['--patch-size', '5'], 'not a multiple of patch_size=5; use 25 or 30', True),
    'image-too-large': (['--image-size', '1024'], 'image_size 1024x1024 makes 65,536 patches of 4x4, more than 16,384', True),
    'table-too-large': (['--d-model', '10000000000', '--n-heads', '2'], "the position encoding 'learned' of a 7×7 patch grid with d_model=10000000000 does not fit in cpu memory", True),
    'eval-size': (['--eval-sizes', '28,42'], 'eval size 42x42 is not a multiple of the patch size 4', True),
    'eval-size-syntax': (['--eval-sizes', '28,x'], "image size 'x' is not N or HxW", True),
    'eval-list': (['--eval-sizes', '28,,56'], 'must be a comma-separated list such as 28,56,28x56', True),
    'eval-mode': (['--eval-modes', 'nearest'], "eval_modes must be a list of distinct entries (at least 1), each one of ('bicubic', 'bilinear', 'none')", True),
    'grid-change-interp-off': (['--interpolate', 'none'], "but interpolation is off (interpolate=None) and pe='learned' has a learned table", True),
    'finetune-interp-off': (['--interpolate', 'none', '--eval-sizes', '28', '--finetune-res', '56', '--finetune-steps', '2'],
                            '56x56 change(s) the patch grid', True),
    'finetune-alone': (['--finetune-res', '56'], 'finetune_res (--finetune-res) only applies with finetune_steps (--finetune-steps)', True),
    'channels': (['--in-chans', '3'], 'have 1 channel (greyscale) but the model takes in_chans=3: use in_chans=1 (--in-chans 1)', False),
    'unknown-pe': (['--pe', 'rope'], "unknown vision position encoding 'rope'; valid names: learned, learned2d, none", True),
    'unknown-preset': (['--preset', 'huge'], "unknown preset 'huge'; valid: quick, reference, smoke", True),
    'zero-steps': (['--steps', '0'], 'steps must be ≥ 1; got 0', True),
    'heads': (['--d-model', '30', '--n-heads', '4'], 'd_model=30 must be divisible by n_heads=4', True),
    'no-data': (['--data', '/no/such/images'], '/no/such/images: no such folder', False),
    'mnist-missing': (['--data', 'mnist'], 'mnist: not found here', False),
    'resume-and-overwrite': (['--resume', '--overwrite'], 'argument --overwrite: not allowed with argument --resume', True),
    'finetune-init-alone': (['--finetune-init', 'none'], 'finetune_init (--finetune-init) only applies with finetune_res (--finetune-res)', True),
    'finetune-init-mode': (['--finetune-res', '56', '--finetune-steps', '2', '--finetune-init', 'bicubic,nearest'],
                           "finetune_init must be None or a list of distinct entries (at least 1), each one of ('bicubic',", True),
    'finetune-init-no-table': (['--pe', 'sincos2d', '--finetune-res', '56', '--finetune-steps', '2', '--finetune-init', 'bicubic,none'],
                               "pe='sincos2d' has no learned table", True),
    'stem': (['--stem', 'resnet'], "stem must be one of ('patch', 'hybrid'); got 'resnet'", True),
}


@pytest.mark.parametrize('case', BAD)
def test_bad_input_exit_2_with_message(case, tmp_path, capsys, monkeypatch):
    argv, msg, usage = BAD[case]
    if case == 'mnist-missing':
        import posenc_lit.vision as v
        monkeypatch.setenv('POSENC_LIT_MNIST', str(tmp_path / 'none.tgz'))
        monkeypatch.setattr(v, 'visiondata_dir', lambda: tmp_path / 'pkg' / 'visiondata')
        monkeypatch.setenv('HOME', str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert main([*SMOKE, *argv, '--out', str(tmp_path / 'run')]) == 2
    err = capsys.readouterr().err
    assert msg in err and 'Traceback' not in err, err
    assert err.startswith('usage: posenc_lit vit') == usage, err
    assert not (tmp_path / 'run').exists()


def test_console_script(tmp_path):
    "The installed console script itself: a bad size exits 2 with usage and message, no traceback, no folder."
    import shutil
    exe = shutil.which('posenc_lit')
    if exe is None: pytest.skip('the posenc_lit console script is not installed')
    r = subprocess.run([exe, 'vit', '--pe', 'learned', '--image-size', '30', '--out', str(tmp_path / 'run')], capture_output=True, text=True, env=ENV)
    assert r.returncode == 2 and r.stderr.startswith('usage: posenc_lit vit') and 'Traceback' not in r.stderr
    assert 'use 28 or 32' in r.stderr and not (tmp_path / 'run').exists()
