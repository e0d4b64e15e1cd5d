"""Bad command lines (issue 8): every one prints the usage line and an error, exits with status 2, and writes nothing."""
import os
os.environ.setdefault('HF_HUB_OFFLINE', '1'); os.environ.setdefault('HF_DATASETS_OFFLINE', '1')

import json, shutil, subprocess, sys
import pytest

from posenc_lit.cli import main

ENV = {**os.environ, 'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1', 'OMP_NUM_THREADS': '1'}

PRETRAIN = ['pretrain', '--pe', 'none', '--preset', 'smoke']
# The table of bad command lines (BAD) and its test moved to test_bad_input.py (CLI_BAD), with the unusable --out cases.


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


def test_a_file_put_into_the_checkpoint_is_never_deleted(tmp_path, capsys):
    """Breaker finding: --overwrite deleted a file the user put into checkpoint/ (only the top level was checked).
    --overwrite and --resume (whose next save replaces checkpoint/) refuse, naming it; nothing is deleted."""
    out = tmp_path / 'run'
    assert main([*PRETRAIN, '--out', str(out), '--quiet']) == 0
    (out / 'checkpoint' / 'mine.txt').write_text('precious')
    for how in ('--overwrite', '--resume'):
        assert main([*PRETRAIN, '--out', str(out), '--quiet', how]) == 2
        err = capsys.readouterr().err
        assert (f"{out / 'checkpoint'} holds files its save did not write (mine.txt): refusing to delete them "
                f"with {how}; move them out of the folder") in err, err
    assert (out / 'checkpoint' / 'mine.txt').read_text() == 'precious'
    (out / 'checkpoint' / 'mine.txt').unlink()
    assert main([*PRETRAIN, '--out', str(out), '--quiet', '--overwrite']) == 0


def test_a_damaged_summary_of_a_finished_run_is_named_and_written_again(tmp_path, capsys):
    """Breaker finding: --resume on a finished run printed a summary.json that held `[1]` as the summary, and a
    summary cut short failed with a JSON error that named no file. Now both are refused, naming the file; removed,
    the summary is written again from the checkpoint, as it was."""
    out = tmp_path / 'run'
    assert main([*PRETRAIN, '--out', str(out), '--quiet']) == 0
    summary = (out / 'summary.json').read_text()
    capsys.readouterr()
    for damaged in ('[1]', '{"pe": '):
        (out / 'summary.json').write_text(damaged)
        assert main([*PRETRAIN, '--out', str(out), '--quiet', '--resume']) == 2
        err = capsys.readouterr().err
        assert f"{out / 'summary.json'}" in err and 'remove it and pass --resume again' in err, err
    (out / 'summary.json').unlink()
    assert main([*PRETRAIN, '--out', str(out), '--quiet', '--resume']) == 0
    assert json.loads((out / 'summary.json').read_text()) == json.loads(summary)


def test_out_that_is_a_link_to_nothing_is_named(tmp_path, capsys):
    "Breaker finding: a dangling symbolic link as --out failed with a bare '[Errno 17] File exists'."
    link, gone = tmp_path / 'link', tmp_path / 'gone'
    link.symlink_to(gone)
    assert main([*PRETRAIN, '--out', str(link), '--quiet']) == 2
    err = capsys.readouterr().err
    assert err.startswith('usage: posenc_lit pretrain') and 'Traceback' not in err, err
    assert (f'argument --out: cannot create {link}: {link} is a symbolic link to {gone}, which does not exist; '
            'choose another --out, or remove the link') in err, err
    assert list(tmp_path.iterdir()) == [link] and link.is_symlink()


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
    lm = tmp_path / 'lm'; lm.mkdir()   # a causal-LM run has a pretraining run's keys, and its length factors
    (lm / 'config.json').write_text('{"pe": "rope", "seq_len": 64, "data": "default", "factors": [1, 2]}')
    for bad, what in ((vit, ' (a ViT run)'), (lm, ' (a causal-LM run, whose lm command'), (tmp_path, ':')):
        assert main([*args, '--run', str(bad)]) == 2
        err = capsys.readouterr().err
        assert f'{bad} is not a pretraining run{what}' in err and 'Traceback' not in err, err


def test_sigint_stops_compare_even_when_inherited_as_ignored(tmp_path):
    """A background job of a non-interactive shell (`nohup posenc_lit compare ... &` in a script) starts with SIGINT
    ignored; `kill -INT` must still stop it as Ctrl-C does: status 130, the notice naming SIGINT, no traceback."""
    import signal, time
    out = tmp_path / 'cmp'
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1'}
    ignore = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)
    p = subprocess.Popen([sys.executable, '-m', 'posenc_lit.cli', 'compare', '--preset', 'quick', '--encodings', 'none',
                          '--out', str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=ignore)
    t0 = time.time()
    while not (out.is_dir() and any(out.rglob('*'))):  # the command is at work: its folder has a file
        assert p.poll() is None and time.time() - t0 < 600, p.communicate()
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    o, e = p.communicate(timeout=300)
    assert p.returncode == 128 + signal.SIGINT, (p.returncode, o[-2000:], e[-2000:])
    assert 'SIGINT' in o + e and 'Traceback' not in e, (o[-2000:], e[-2000:])


def test_help_shows_what_each_option_takes_when_not_given(capsys):
    "--help names each flag's value when not given: the default preset's, then the other presets' that differ."
    from posenc_lit.training import PRESETS
    from posenc_lit.decoder_study import LM_PRESETS
    assert main(['pretrain', '--help']) == 0
    out = ' '.join(capsys.readouterr().out.split())  # argparse wraps the lines
    assert f"peak learning rate (default: {PRESETS['quick']['lr']}; reference {PRESETS['reference']['lr']})" in out
    assert 'random seed (default: 0)' in out and 'position encoding (see `posenc_lit encodings`) (' not in out
    assert main(['lm', '--help']) == 0  # its default preset is study
    assert f"optimizer steps (default: {LM_PRESETS['study']['steps']}; smoke" in ' '.join(capsys.readouterr().out.split())


def _helps(command: str) -> dict:  # {flag: its help, as --help prints it before wrapping}
    from posenc_lit.cli import build_parser
    sub = build_parser(command)._subparsers._group_actions[0].choices[command]
    return {a.option_strings[0]: a.help.replace('%%', '%') for a in sub._actions if a.option_strings}


def test_help_keeps_what_an_option_says_it_takes_and_shows_values_as_typed():
    """An option whose help already says what it takes when not given is not contradicted by the raw field
    value ('(default: 0)' for --trained-len, whose 0 means the checkpoint's seq_len); a value is shown as the
    flag takes it ('none' for an empty one, sizes as HxW,HxW), not as a Python list."""
    ft, vit = _helps('finetune'), _helps('vit')
    for h in (ft['--trained-len'], ft['--add-relative-lr'], ft['--max-len'], vit['--finetune-eval-sizes'],
              vit['--image-size'], vit['--interpolate'], vit['--finetune-init'], vit['--eval-modes']):
        assert h.lower().count('default') == 1, h
    assert ft['--add-relative'].endswith('(default: none)') and ft['--eval-lengths'].endswith('(default: none)')
    assert vit['--finetune-res'].endswith('(default: none)')
    assert vit['--eval-sizes'].endswith('(default: 28x28,56x56,28x56; smoke 28x28,56x56)'), vit['--eval-sizes']
    assert _helps('pretrain')['--lr'].endswith('(default: 0.002; reference 0.001)')  # as before
    assert "'{\"base\": 500}' (default: {})" in _helps('pretrain')['--pe-kwargs']  # JSON, as typed
