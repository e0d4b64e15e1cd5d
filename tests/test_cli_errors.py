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
    'unknown-preset': ([*PRETRAIN[:3], '--preset', 'huge'], "unknown preset 'huge'; valid: quick, reference, smoke"),
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
