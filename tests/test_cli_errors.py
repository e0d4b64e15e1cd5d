"""Bad command lines (issue 8): every one prints the usage line and an error, exits with status 2, and writes nothing."""
import os
os.environ.setdefault('HF_HUB_OFFLINE', '1'); os.environ.setdefault('HF_DATASETS_OFFLINE', '1')

import shutil, subprocess, sys
import pytest

from posenc_lit.cli import main

ENV = {**os.environ, 'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1', 'OMP_NUM_THREADS': '1'}

PRETRAIN = ['pretrain', '--pe', 'none', '--preset', 'smoke']
BAD = {   # id: (arguments after `posenc_lit`, text the error must contain)
    'no-subcommand-args': (['pretrain'], 'the following arguments are required: --pe, --out'),
    'unknown-subcommand': (['pretrian'], "invalid choice: 'pretrian'"),
    'unknown-flag': ([*PRETRAIN, '--stepz', '3'], 'unrecognized arguments: --stepz 3'),
    'not-an-int': ([*PRETRAIN, '--steps', 'ten'], "argument --steps: invalid int value: 'ten'"),
    'zero-steps': ([*PRETRAIN, '--steps', '0'], 'steps must be ≥ 1; got 0'),
    'negative-lr': ([*PRETRAIN, '--lr', '-1'], 'lr must be > 0; got -1.0'),
    'unknown-pe': (['pretrain', '--pe', 'bogus'], "unknown position encoding 'bogus'; valid names:"),
    'unknown-preset': ([*PRETRAIN[:3], '--preset', 'huge'], "unknown preset 'huge'; valid: quick, reference, study, smoke"),
    'bad-precision': ([*PRETRAIN, '--mixed-precision', 'fp8'], "argument --mixed-precision: invalid choice: 'fp8'"),
    'bad-json': ([*PRETRAIN, '--pe-kwargs', '{base: 1}'], 'argument --pe-kwargs: not valid JSON'),
    'json-not-object': ([*PRETRAIN, '--pe-kwargs', '[1]'], 'must be a JSON object'),
    'unknown-pe-option': ([*PRETRAIN, '--pe-kwargs', '{"bas": 1}'], "pe_kwargs {'bas': 1} are not accepted by pe='none'"),
    'resume-and-overwrite': ([*PRETRAIN, '--resume', '--overwrite'], 'argument --overwrite: not allowed with argument --resume'),
    'stop-at-zero': ([*PRETRAIN, '--stop-at', '0'], 'argument --stop-at: must be an integer ≥ 1; got 0'),
    'heads': ([*PRETRAIN, '--d-model', '30', '--n-heads', '4'], 'd_model=30 must be divisible by n_heads=4'),
    'lengths-zero': (['lengths', '--lengths', '128', '0'], 'argument --lengths: must be an integer ≥ 1; got 0'),
    'max-tokens': (['lengths', '--max-tokens', '-5'], 'argument --max-tokens: must be an integer ≥ 1; got -5'),
    'encodings-flag': (['encodings', '--all'], 'unrecognized arguments: --all'),
    'empty-data': ([*PRETRAIN, '--data', ''], 'argument --data: must not be empty'),
    'rope-factor-overflow': (['pretrain', '--pe', 'rope', '--preset', 'smoke', '--pe-kwargs', '{"scaling": "ntk", "factor": 1e300}'],
                             'underflow or overflow float32'),
}


@pytest.mark.parametrize('case', BAD)
def test_bad_arguments_print_usage_exit_2_write_nothing(case, tmp_path, capsys, monkeypatch):
    argv, msg = BAD[case]
    monkeypatch.chdir(tmp_path)
    if argv[0] == 'pretrain' and '--pe' in argv: argv = [*argv, '--out', str(tmp_path / 'run')]
    if argv[0] == 'lengths': argv = [*argv, '--run', str(tmp_path / 'run')]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith('usage: posenc_lit'), err
    assert msg in err and 'Traceback' not in err, err
    assert list(tmp_path.iterdir()) == []                      # nothing written, not even the run folder


def test_no_arguments_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert 'usage: posenc_lit' in capsys.readouterr().err


def test_console_script_exit_status(tmp_path):
    "The installed `posenc_lit` script itself: usage, status 2, no traceback, no folder."
    exe = shutil.which('posenc_lit')
    if exe is None: pytest.skip('the posenc_lit console script is not installed')
    r = subprocess.run([exe, 'pretrain', '--pe', 'none', '--steps', '0', '--out', str(tmp_path / 'run')],
                       capture_output=True, text=True, env=ENV)
    assert r.returncode == 2 and r.stderr.startswith('usage: posenc_lit pretrain') and 'Traceback' not in r.stderr
    assert 'posenc_lit: error: steps must be ≥ 1; got 0' in r.stderr
    assert not (tmp_path / 'run').exists()


@pytest.mark.parametrize('out,msg', [('', 'argument --out: must not be empty'),
                                     ('/proc/posenc_lit_run', 'argument --out: cannot create /proc/posenc_lit_run')])
def test_unusable_out_names_out(out, msg, tmp_path, capsys, monkeypatch):
    "An empty --out (read as the current folder) or one that cannot be created: usage, status 2, nothing written."
    monkeypatch.chdir(tmp_path)
    assert main([*PRETRAIN, '--out', out]) == 2
    err = capsys.readouterr().err
    assert err.startswith('usage: posenc_lit pretrain') and msg in err, err
    assert list(tmp_path.iterdir()) == []


def _overcommit_always():
    try: return open('/proc/sys/vm/overcommit_memory').read().strip() == '1'
    except OSError: return True


@pytest.mark.skipif(_overcommit_always(), reason='with overcommit_memory=1 a huge allocation succeeds and the OOM killer ends the test')
def test_step_that_does_not_fit_in_memory_writes_nothing(tmp_path, capsys):
    "--seq-len 100000 asks for hundreds of GiB of attention scores: the probe step fails first, and no run directory is left."
    out = tmp_path / 'run'
    assert main(['pretrain', '--pe', 'rope', '--preset', 'smoke', '--seq-len', '100000', '--eval-blocks', '3', '--quiet', '--out', str(out)]) == 2
    err = capsys.readouterr().err
    assert 'one training step of batch_size=8 blocks of seq_len=100000 tokens does not fit in' in err and 'Traceback' not in err, err
    assert not out.exists()


def test_model_that_does_not_fit_in_memory_writes_nothing(tmp_path, capsys):
    "A d_model of 10^10 asks for hundreds of TiB for the embeddings alone: a clear error, exit 2, no run directory."
    out = tmp_path / 'run'
    assert main([*PRETRAIN, '--d-model', '10000000000', '--quiet', '--out', str(out)]) == 2
    err = capsys.readouterr().err
    assert 'the model (d_model=10000000000,' in err and 'does not fit in cpu memory' in err and 'Traceback' not in err, err
    assert not out.exists()


def test_resume_names_the_kind_of_run_the_folder_holds(tmp_path, capsys):
    import json
    for kind, cfg in (('a ViT training run', {'pe': 'learned', 'patch_size': 4}), ('a fine-tuning run', {'pe': 'learned', 'task': 'sentiment'})):
        d = tmp_path / kind.split()[1]; d.mkdir(); (d / 'config.json').write_text(json.dumps(cfg))
        assert main([*PRETRAIN, '--resume', '--quiet', '--out', str(d)]) == 2
        err = capsys.readouterr().err
        assert f'holds {kind}, not a pretraining run' in err, err
        assert sorted(p.name for p in d.iterdir()) == ['config.json'] and json.loads((d / 'config.json').read_text()) == cfg


def test_eval_blocks_beyond_the_validation_set_are_capped_with_a_notice(tmp_path, capsys):
    assert main([*PRETRAIN, '--eval-blocks', '100000000', '--stop-at', '1', '--quiet', '--out', str(tmp_path / 'run')]) == 0
    assert 'note: eval_blocks=100000000 is more than the' in capsys.readouterr().err


def test_lengths_takes_the_run_or_its_checkpoint_and_names_other_folders(tmp_path, capsys):
    "`lengths --run` accepts the run folder or its checkpoint/ (as `finetune` does); a ViT run or another folder is named as such."
    run = tmp_path / 'run'
    assert main([*PRETRAIN, '--stop-at', '2', '--quiet', '--out', str(run)]) == 0   # --stop-at saves a checkpoint
    assert 'stopped at step 2 of 20; continue with --resume' in capsys.readouterr().out
    args = ['lengths', '--lengths', '16', '32', '--max-tokens', '256']
    assert main([*args, '--run', str(run / 'checkpoint')]) == 0
    first = capsys.readouterr().out
    assert main([*args, '--run', str(run)]) == 0
    assert capsys.readouterr().out == first != ''   # the same evaluation
    vit = tmp_path / 'vit'; vit.mkdir(); (vit / 'config.json').write_text('{"pe": "learned", "patch_size": 4}')
    for bad in (vit, tmp_path):
        assert main([*args, '--run', str(bad)]) == 2
        err = capsys.readouterr().err
        assert f'{bad} is not a pretraining run' in err and 'Traceback' not in err, err
