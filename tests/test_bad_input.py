"""Bad input and damaged files from the command line (issue 27): each is refused with a clear error that names what
was wrong (status 2, no traceback), or reported as n/a with the reason; nothing is computed on bad data.

- Damaged checkpoints: one set of checks (`model.check_state_dict`) for every command that reads weights.
- Memory: a table or a forward pass too large for memory is a `MemoryLimitError`, like the other memory checks.
- Positions past the documented bound of `rel_pos` (|p| < 2**62) are refused at the model's boundary.
- `lengths` prints its results before it writes them, and says so when the write fails.
"""
import os
os.environ.setdefault('HF_HUB_OFFLINE', '1'); os.environ.setdefault('HF_DATASETS_OFFLINE', '1')

import gzip, json, shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import posenc_lit.core
from posenc_lit.cli import main
from posenc_lit.core import list_encodings, POSITION_LIMIT, write_json
from posenc_lit.model import ModelConfig, EncoderForMLM


def _overcommit_always():
    try:
        return open('/proc/sys/vm/overcommit_memory').read().strip() == '1'
    except OSError:
        return True


needs_refused_allocations = pytest.mark.skipif(
    _overcommit_always(), reason='with overcommit_memory=1 a huge allocation succeeds and the OOM killer ends the test')


def _pretrain(out, pe, *extra):
    assert main(['pretrain', '--pe', pe, '--preset', 'smoke', '--out', str(out), '--quiet', *extra]) == 0


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    "Smoke pretraining runs: 'stopped' (learned, checkpoint at step 10 of 20) and 't5' (finished)."
    root = tmp_path_factory.mktemp('runs')
    _pretrain(root / 'stopped', 'learned', '--stop-at', '10')
    _pretrain(root / 't5', 't5')
    return root


def _set_header_dtype(f, name, dtype):
    "Change one tensor's dtype in a safetensors header (F32 -> I32 keeps the size: the bits are read as integers)."
    raw = Path(f).read_bytes()
    n = int.from_bytes(raw[:8], 'little')
    head = json.loads(raw[8:8 + n])
    head[name]['dtype'] = dtype
    Path(f).write_bytes(raw[:8] + json.dumps(head, separators=(',', ':')).encode().ljust(n) + raw[8 + n:])


def _set_value(f, name, value):
    sd = load_file(f)
    sd[name][0] = value
    save_file(sd, f)


DAMAGE = {   # id: (damage the checkpoint's model.safetensors, text the error must contain)
    'dtype-f32-to-i32': (lambda f: _set_header_dtype(f, 'decoder_bias', 'I32'),
                         'decoder_bias must be a float tensor (loading would cast it silently); got torch.int32'),
    'nan-weight': (lambda f: _set_value(f, 'decoder_bias', float('nan')),
                   'decoder_bias holds 1 non-finite values (NaN or ±inf)'),
    'inf-weight': (lambda f: _set_value(f, 'encoder.embeddings.word.weight', float('inf')),
                   'encoder.embeddings.word.weight holds 32 non-finite values'),
}
COMMANDS = {   # id: arguments after `posenc_lit`, given the run directory
    'lengths': lambda run: ['lengths', '--run', str(run), '--lengths', '32', '--max-tokens', '200'],
    'pretrain-resume': lambda run: ['pretrain', '--pe', 'learned', '--preset', 'smoke', '--out', str(run), '--resume', '--quiet'],
}


@pytest.mark.parametrize('command', COMMANDS)
@pytest.mark.parametrize('damage', DAMAGE)
def test_damaged_weights_are_refused_by_every_command(damage, command, runs, tmp_path, capsys):
    "One set of checks: a re-typed or non-finite tensor is refused by `lengths` and by `pretrain --resume` alike."
    run = tmp_path / 'run'
    shutil.copytree(runs / 'stopped', run)
    f = run / 'checkpoint' / 'model.safetensors'
    DAMAGE[damage][0](f)
    before = f.read_bytes()
    assert main(COMMANDS[command](run)) == 2
    err = capsys.readouterr().err
    assert DAMAGE[damage][1] in err and 'Traceback' not in err, err
    assert f.read_bytes() == before                              # the checkpoint is left as it was
    assert not (run / 'lengths.json').exists() and not (run / 'summary.json').exists()


@needs_refused_allocations
@pytest.mark.parametrize('pe', ['learned', 'huang4', 'deberta'])
def test_position_table_too_large_for_memory(pe, tmp_path, capsys):
    "The config check builds the encoding: a table that does not fit is the memory check's error, before anything is written."
    out = tmp_path / 'run'
    assert main(['pretrain', '--pe', pe, '--preset', 'smoke', '--max-position-embeddings', '1000000000', '--out', str(out)]) == 2
    err = capsys.readouterr().err
    assert f"the position encoding '{pe}' (max_position_embeddings=1000000000, d_model=32) does not fit in cpu memory" in err, err
    assert 'Traceback' not in err and not out.exists()


@needs_refused_allocations
def test_lengths_too_long_for_memory_is_reported_not_raised(runs, capsys):
    "`lengths --lengths 60000` on a T5 run: that length is n/a with the reason, the other lengths are evaluated."
    assert main(['lengths', '--run', str(runs / 't5'), '--lengths', '32', '60000', '--max-tokens', '60000']) == 0
    out = capsys.readouterr().out
    assert 'n=   32: loss' in out, out
    assert 'n=60000: cannot run: the evaluation at n=60000 (1 block(s) of 60,000 tokens per forward pass) does not fit in cpu memory' in out
    res = json.loads((runs / 't5' / 'lengths.json').read_text())
    assert 'loss' in res['results'][0] and 'does not fit' in res['results'][1]['error']


@needs_refused_allocations
def test_finetune_example_too_long_for_memory(runs, tmp_path, capsys):
    "One 60,000-word example and no --max-len: the memory check's error (status 2), not a traceback."
    rows = [{'id': i, 'text': f'a fine film, number {i}', 'rating': 1.0 if i % 2 else -1.0} for i in range(60)]
    rows[0]['text'] = ' '.join(['film'] * 60000)
    src = tmp_path / 'long.jsonl.gz'
    with gzip.open(src, 'wt') as f:
        f.writelines(json.dumps(r) + '\n' for r in rows)
    argv = ['finetune', '--checkpoint', str(runs / 't5'), '--task', 'sentiment', '--data-files', str(src), '--preset', 'smoke',
            '--out', str(tmp_path / 'ft'), '--quiet', '--no-baselines']
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert 'a forward pass over a (b, n) = (1, ' in err and 'batch of token ids does not fit in cpu memory' in err, err
    assert 'Traceback' not in err


def test_lengths_prints_before_a_failed_write(runs, capsys, monkeypatch):
    "A run directory that cannot be written: the results are printed first, then a clear error (status 2)."
    def refuse(path, write):
        raise PermissionError(13, 'Permission denied', str(path))
    monkeypatch.setattr(posenc_lit.core, 'atomic_write', refuse)
    monkeypatch.setattr('posenc_lit.lengths.atomic_write', refuse, raising=False)   # where the write used to be done
    assert main(['lengths', '--run', str(runs / 't5'), '--lengths', '32', '--max-tokens', '200']) == 2
    out, err = capsys.readouterr()
    assert 'n=   32: loss' in out, out
    assert f"cannot write {runs / 't5' / 'lengths.json'} (Permission denied): the results were not saved" in err, err
    assert 'Traceback' not in err


@pytest.mark.parametrize('pe', sorted(list_encodings()))
def test_positions_past_the_int64_bound_are_refused(pe):
    "`rel_pos` is exact for |p| < 2**62; the model refuses larger positions (one check per forward, at its entry)."
    torch.manual_seed(0)
    m = EncoderForMLM(ModelConfig(vocab_size=50, d_model=32, n_heads=4, d_ff=64, max_position_embeddings=16, pe=pe)).eval()
    ids = torch.randint(1, 50, (1, 5))
    for pos in (torch.arange(5) + POSITION_LIMIT - 4, -torch.arange(5) - POSITION_LIMIT):   # one position past each side
        with pytest.raises(ValueError, match=r'position_ids must lie in \(-2\*\*62, 2\*\*62\)'):
            m(ids, position_ids=pos)


def test_relative_encodings_are_exact_up_to_the_bound():
    "Just inside the bound, integer distances do not wrap: a T5 model gives the same states as at positions 0 … n-1."
    torch.manual_seed(0)
    m = EncoderForMLM(ModelConfig(vocab_size=50, d_model=32, n_heads=4, d_ff=64, pe='t5')).eval()
    ids = torch.randint(1, 50, (1, 5))
    with torch.no_grad():
        near = m(ids, position_ids=torch.arange(5) + POSITION_LIMIT - 5)['hidden_states']
        torch.testing.assert_close(near, m(ids)['hidden_states'])


def test_json_written_by_the_package_is_standard_json(tmp_path):
    "NaN and infinities are written as null: `json.loads` with a parser that refuses NaN reads the file."
    def refuse(c):
        raise ValueError(f'non-standard JSON constant {c}')
    write_json(tmp_path / 'r.json', {'pearson': float('nan'), 'loss': [1.5, float('inf')]}, indent=2)
    assert json.loads((tmp_path / 'r.json').read_text(), parse_constant=refuse) == {'pearson': None, 'loss': [1.5, None]}
