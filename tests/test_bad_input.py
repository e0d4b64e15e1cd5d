"""Bad input and damaged files from the command line (issue 27): each is refused with a clear error that names what
was wrong (status 2, no traceback), or reported as n/a with the reason; nothing is computed on bad data.

- Damaged checkpoints: one set of checks (`model.check_state_dict`) for every command that reads weights.
- Memory: a table or a forward pass too large for memory is a `MemoryLimitError`, like the other memory checks.
- Positions past the documented bound of `rel_pos` (|p| < 2**62) are refused at the model's boundary.
- `lengths` prints its results before it writes them, and says so when the write fails.

The errors a user can reach (issue 25 item 3) are collected here as parametrized tables: `API_BAD` (the public
constructors, forwards and loaders: the error type, what was wrong, what would be right) and `CLI_BAD` (bad
command lines: usage, status 2, the message, nothing written). `test_vision_cli.BAD` holds the `vit` command's.
"""
import os
os.environ.setdefault('HF_HUB_OFFLINE', '1'); os.environ.setdefault('HF_DATASETS_OFFLINE', '1')

import gzip, json, shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import posenc_lit.core
import posenc_lit.files
from posenc_lit.cli import main
from posenc_lit.checks import POSITION_LIMIT
from posenc_lit.core import list_encodings
from posenc_lit.files import write_json
from posenc_lit.model import CheckpointError, ModelConfig, EncoderForMLM, load_model, save_model
from posenc_lit.checks import PositionRangeError
from posenc_lit.core import register_encoding, rel_pos
from posenc_lit.attention import PositionEncoding, default_positions, position_attention
from posenc_lit.relative import Shaw
from posenc_lit.t5 import T5RelativeBias
from posenc_lit.compare import compare_plan
from posenc_lit.vit import ViT, ViTConfig, load_vit, save_vit


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


# ----------------------------------------------------------------------------------------------------
# The public API: each bad input is one row (issue 25 item 3)

def _mlm(pe='learned'):
    torch.manual_seed(0)
    return EncoderForMLM(ModelConfig(vocab_size=50, d_model=32, n_heads=4, d_ff=64, n_layers=1, max_position_embeddings=16, pe=pe)).eval()


def _vit():
    torch.manual_seed(0)
    return ViT(ViTConfig(image_size=28, patch_size=4, d_model=32, n_heads=4, n_layers=1, d_ff=64, n_classes=10)).eval()


def _damaged_model(tmp, damage):
    "A saved model folder with `damage(folder)` done to it."
    d = save_model(_mlm(), tmp / 'model')
    damage(d)
    return d


def _other_factory(config):
    return None


def _registered(name, factory, call, modality='text'):
    "`call()` with `factory` registered as `name` (removed again afterwards)"
    register_encoding(name, 'none', 'a test entry', modality=modality)(factory)
    try:
        return call()
    finally:
        del posenc_lit.core._REGISTRY[modality, name]


def _own_type_error(config):
    return PositionEncoding() + 1   # the factory's own bug, not an option it refuses


TEXT = dict(vocab_size=50, d_model=32, n_heads=4, d_ff=64)
_QKV = tuple(torch.randn(2, 4, 10, 8) for _ in range(3))  # q, k, v (b, h, n, d)
_POS, _T5 = default_positions(10), T5RelativeBias(4)
API_BAD = {   # id: (call that gets `tmp_path`, error type, what was wrong, what would be right)
    'sequence-longer-than-learned-table': (
        lambda tmp: _mlm()(torch.randint(1, 50, (1, 20))), PositionRangeError,
        'position 19 is outside the learned position table (max_position_embeddings=16, valid positions 0..15)',
        'use sequences of at most 16 tokens, a larger max_position_embeddings, or an encoding without a maximum length'),
    'mask-of-wrong-shape': (
        lambda tmp: _mlm()(torch.randint(1, 50, (2, 8)), attention_mask=torch.ones(2, 7, dtype=torch.long)), ValueError,
        'got torch.int64 tensor of shape (2, 7)', 'attention_mask must be a bool or 0/1 integer tensor of shape (b, n) = (2, 8)'),
    'mask-of-floats': (
        lambda tmp: _mlm()(torch.randint(1, 50, (2, 8)), attention_mask=torch.ones(2, 8)), ValueError,
        'got torch.float32 tensor of shape (2, 8)', 'must be a bool or 0/1 integer tensor'),
    'ids-of-floats': (
        lambda tmp: _mlm()(torch.rand(2, 8)), ValueError,
        'got torch.float32 tensor of shape (2, 8)', 'input_ids must be an integer tensor of shape (b, n)'),
    'ids-outside-vocabulary': (
        lambda tmp: _mlm()(torch.tensor([[1, 60]])), ValueError, 'got values 1..60', 'input_ids must lie in [0, vocab_size=50)'),
    'position-ids-of-wrong-length': (
        lambda tmp: _mlm()(torch.randint(1, 50, (2, 8)), position_ids=torch.arange(7)), ValueError,
        'got torch.int64 tensor of shape (7,)', 'of shape (b, n), (1, n) or (n,) with n=8'),
    'rel-pos-of-floats': (
        lambda tmp: rel_pos(torch.rand(3), torch.arange(3)), TypeError,
        'got torch.float32 tensor of shape (3,)', 'q_pos must be a signed integer tensor of shape (n,) or (b, n)'),
    'heads-do-not-divide-d-model': (
        lambda tmp: ModelConfig(**{**TEXT, 'd_model': 30}), ValueError, 'd_model=30', 'must be divisible by n_heads=4'),
    'unknown-encoding': (
        lambda tmp: ModelConfig(**TEXT, pe='bogus'), ValueError,
        "unknown position encoding 'bogus'", 'valid names: alibi, cope, deberta, fire, huang4, learned, none, rope'),
    'unknown-encoding-option': (
        lambda tmp: ModelConfig(**TEXT, pe='t5', pe_kwargs={'bukets': 3}), ValueError,
        "pe_kwargs {'bukets': 3} are not accepted by pe='t5'", "pe='t5' accepts num_buckets, max_distance, bidirectional"),
    'unknown-shaw-option': (
        lambda tmp: ModelConfig(**TEXT, pe='shaw', pe_kwargs={'foo': 1}), ValueError,
        "pe_kwargs {'foo': 1} are not accepted by pe='shaw'", "pe='shaw' accepts k, clip, values, share_layers, init_std"),
    'unknown-image-encoding-option': (
        lambda tmp: ViTConfig(pe='rope2d', pe_kwargs={'bse': 10}), ValueError,
        "pe_kwargs {'bse': 10} are not accepted by pe='rope2d'", "pe='rope2d' accepts base, pairing"),
    'image-encoding-for-text': (
        lambda tmp: ModelConfig(**TEXT, pe='rope2d'), ValueError,
        "unknown position encoding 'rope2d'", "'rope2d' is an image encoding (modality='image')"),
    'unknown-image-encoding': (
        lambda tmp: ViTConfig(pe='t5'), ValueError,
        "unknown vision position encoding 't5'", "valid names: learned, learned2d, none, rel2d, rope-mixed, rope2d, sincos2d"),
    'image-size-patches-do-not-divide': (
        lambda tmp: ViTConfig(image_size=28, patch_size=5), ValueError,
        'the height 28 is not a multiple of patch_size=5', 'use 25 or 30'),
    'pixels-patches-do-not-divide': (
        lambda tmp: _vit()(torch.rand(2, 1, 30, 30)), ValueError,
        'image height 30 is not a multiple of the patch size 4', 'use 28 or 32 pixels (resize, crop or pad)'),
    'pixels-with-wrong-channels': (
        lambda tmp: _vit()(torch.rand(2, 3, 28, 28)), ValueError,
        'pixel_values have 3 (shape (2, 3, 28, 28)', 'the model takes in_chans=1 channel(s)'),
    'corrupt-weights': (
        lambda tmp: load_model(_damaged_model(tmp, lambda d: (d / 'model.safetensors').write_bytes(b'junk'))), CheckpointError,
        'corrupt weights file', 're-save or re-train'),
    'truncated-weights': (
        lambda tmp: load_model(_damaged_model(tmp, lambda d: (d / 'model.safetensors').write_bytes(
            (d / 'model.safetensors').read_bytes()[:100]))), CheckpointError,
        'model.safetensors (SafetensorError', 're-save or re-train'),
    'config-not-json': (
        lambda tmp: load_model(_damaged_model(tmp, lambda d: (d / 'config.json').write_text('{"pe": '))), CheckpointError,
        'config.json: not JSON', 're-save the model'),
    'no-weights-file': (
        lambda tmp: load_model(_damaged_model(tmp, lambda d: (d / 'model.safetensors').unlink())), CheckpointError,
        'no model.safetensors in', 'a model folder holds config.json and model.safetensors'),
    'not-a-model-folder': (
        lambda tmp: load_model(tmp), CheckpointError, 'no config.json in', 'a model folder holds config.json and model.safetensors'),
    'corrupt-vit-weights': (
        lambda tmp: load_vit(_damaged_vit(tmp)), CheckpointError, 'corrupt weights file', 're-save or re-train'),
    'encoding-name-like-a-flag': (
        lambda tmp: register_encoding('--pe', 'qk', 'x'), ValueError,
        "got '--pe'", "an encoding name is a word of lowercase letters, digits, '-', '_' and '.' that starts with a letter"),
    'encoding-name-with-a-slash': (
        lambda tmp: register_encoding('a/b', 'qk', 'x'), ValueError, "got 'a/b'", "(it is passed as `--pe NAME` and names run folders)"),
    'encoding-name-invisible': (lambda tmp: register_encoding('\u200b', 'qk', 'x'), ValueError, r"got '\u200b'", "e.g. 'my-rope'"),
    'encoding-replace-not-a-bool': (
        lambda tmp: register_encoding('t5', 'score', 'my T5', replace='no'), TypeError, "got 'no'", 'replace must be True or False'),
    'encoding-shadows-an-ablation': (
        lambda tmp: _registered('deberta-noemd', _other_factory, lambda: compare_plan('quick', encodings=['t5'], vit=False)),
        ValueError, "the encoding 'deberta-noemd' registered by test_bad_input._other_factory has the name of an ablation",
        'which compare would run instead: register it under another name'),
    'factory-returns-none': (
        lambda tmp: _registered('nothing', _other_factory, lambda: ModelConfig(**TEXT, pe='nothing')), TypeError,
        "the factory of the text encoding 'nothing' (test_bad_input._other_factory) returned None",
        'a factory registered with register_encoding returns the encoding module (an nn.Module)'),
    'image-factory-returns-none': (
        lambda tmp: _registered('nothing', _other_factory, lambda: ViTConfig(pe='nothing'), 'image'), TypeError,
        "the factory of the image encoding 'nothing' (test_bad_input._other_factory) returned None",
        'returns the encoding module (an nn.Module)'),
    'encoding-option-of-wrong-type': (
        lambda tmp: ModelConfig(**TEXT, pe='learned', pe_kwargs={'init_std': 'a'}), ValueError,
        "init_std must be a finite number ≥ 0", "got 'a'"),
    'json-value-not-serializable': (
        lambda tmp: write_json(tmp / 'r.json', {'runs': [{'acc': torch.tensor(0.5)}]}), TypeError,
        "r.json: obj['runs'][0]['acc']: Object of type Tensor is not JSON serializable",
        'JSON holds dicts with string keys, lists, strings, numbers, booleans and None'),
    'encoding-name-taken': (
        lambda tmp: register_encoding('t5', 'score', 'my T5')(_other_factory), ValueError,
        "the text encoding 't5' is already registered (by posenc_lit.t5._t5)", 'choose another name, or pass replace=True'),
    # position_attention's boundary (new-user trial of the own-attention contract)
    'attention-arguments-out-of-order': (
        lambda tmp: position_attention(*_QKV, _T5, _T5.prepare(_POS, _POS)), TypeError, 'got Tensor',
        'pe must be a PositionEncoding (the first argument: position_attention(pe, q, k, v, ctx, layer, mask'),
    'attention-layer-in-the-place-of-ctx': (
        lambda tmp: position_attention(_T5, *_QKV, 0, _T5.prepare(_POS, _POS)), TypeError,
        'ctx must be a T5Context', 'got int'),
    'attention-ctx-missing': (
        lambda tmp: position_attention(_T5, *_QKV, None, 0), TypeError, 'got NoneType',
        'ctx comes from pe.prepare(q_pos, k_pos) of this encoding (T5RelativeBias)'),
    'attention-ctx-of-another-encoding': (
        lambda tmp: position_attention(Shaw(8, 2, k=4), *_QKV, _T5.prepare(_POS, _POS), 0), TypeError,
        'ctx must be a RelativeContext', 'got T5Context'),
    'attention-qkv-layout-bnhd': (
        lambda tmp: position_attention(_T5, *(t.transpose(1, 2) for t in _QKV), _T5.prepare(_POS, _POS), 0),
        ValueError, 'q (2, 10, 4, 8) has 4 at dim 2', 'q, k, v must be (b, h, n, d)'),
    'attention-ctx-for-other-length': (
        lambda tmp: position_attention(_T5, *_QKV, _T5.prepare(*(default_positions(12),) * 2), 0), ValueError,
        'ctx was prepared for 12 q_pos positions', 'pe.prepare(q_pos, k_pos) for the positions of this call'),
    'attention-encoding-for-other-heads': (
        lambda tmp: position_attention(T5RelativeBias(8), *_QKV, T5RelativeBias(8).prepare(_POS, _POS), 0),
        ValueError, 'score terms of T5RelativeBias do not fit q (2, 4, 10, 8)', "number of heads must be q's h"),
}


def test_a_factorys_own_type_error_is_raised_as_it_is():
    "A TypeError inside a factory (no pe_kwargs given) is not reported as options it does not accept"
    with pytest.raises(TypeError, match=r'unsupported operand type\(s\) for \+') as e:
        _registered('own-bug', _own_type_error, lambda: ModelConfig(**TEXT, pe='own-bug'))
    assert 'not accepted' not in str(e.value)
    assert e.value.__notes__ == ["raised building pe='own-bug' (factory test_bad_input._own_type_error)"]


def _damaged_vit(tmp):
    d = save_vit(_vit(), tmp / 'vit')
    (d / 'model.safetensors').write_bytes(b'junk')
    return d


@pytest.mark.parametrize('case', API_BAD)
def test_bad_input_to_the_api_says_what_is_wrong_and_what_is_right(case, tmp_path):
    call, error, wrong, right = API_BAD[case]
    with pytest.raises(error) as e:
        call(tmp_path)
    msg = str(e.value)
    assert wrong in msg and right in msg, msg


# ----------------------------------------------------------------------------------------------------
# Bad command lines (issue 8; moved here from test_cli_errors.py): usage, status 2, the message, nothing written

PRETRAIN = ['pretrain', '--pe', 'none', '--preset', 'smoke']
CLI_BAD = {   # id: (arguments after `posenc_lit`, text the error must contain: what was wrong and, where argparse or we
              # say it, what is right[, the usage line's start])
    'no-subcommand-args': (['pretrain'], 'the following arguments are required: --pe, --out'),
    'unknown-subcommand': (['pretrian'], "invalid choice: 'pretrian' (choose from 'encodings', 'pretrain'"),
    'unknown-flag': ([*PRETRAIN, '--stepz', '3'], 'unrecognized arguments: --stepz 3'),
    'not-an-int': ([*PRETRAIN, '--steps', 'ten'], "argument --steps: invalid int value: 'ten'"),
    'zero-steps': ([*PRETRAIN, '--steps', '0'], 'steps must be ≥ 1; got 0'),
    'negative-lr': ([*PRETRAIN, '--lr', '-1'], 'lr must be > 0; got -1.0'),
    'unknown-pe': (['pretrain', '--pe', 'bogus'], "unknown position encoding 'bogus'; valid names:"),
    'unknown-preset': ([*PRETRAIN[:3], '--preset', 'huge'], "unknown preset 'huge'; valid: quick, reference, study, smoke"),
    'bad-precision': ([*PRETRAIN, '--mixed-precision', 'fp8'], "argument --mixed-precision: invalid choice: 'fp8' (choose from 'no', 'bf16', 'fp16')"),
    'bad-json': ([*PRETRAIN, '--pe-kwargs', '{base: 1}'], 'argument --pe-kwargs: not valid JSON'),
    'json-not-object': ([*PRETRAIN, '--pe-kwargs', '[1]'], 'must be a JSON object'),
    'unknown-pe-option': ([*PRETRAIN, '--pe-kwargs', '{"bas": 1}'], "pe_kwargs {'bas': 1} are not accepted by pe='none'"),
    'unknown-pe-option-said': ([*PRETRAIN, '--pe-kwargs', '{"bas": 1}'], "; pe='none' takes no options"),
    'resume-and-overwrite': ([*PRETRAIN, '--resume', '--overwrite'], 'argument --overwrite: not allowed with argument --resume'),
    'stop-at-zero': ([*PRETRAIN, '--stop-at', '0'], 'argument --stop-at: must be an integer ≥ 1; got 0'),
    'heads': ([*PRETRAIN, '--d-model', '30', '--n-heads', '4'], 'd_model=30 must be divisible by n_heads=4'),
    'lengths-zero': (['lengths', '--lengths', '128', '0'], 'argument --lengths: must be an integer ≥ 3 ([CLS], a token, [SEP]); got 0'),
    'lengths-one': (['lengths', '--lengths', '1'], 'argument --lengths: must be an integer ≥ 3 ([CLS], a token, [SEP]); got 1'),
    'max-tokens': (['lengths', '--max-tokens', '-5'], 'argument --max-tokens: must be an integer ≥ 1; got -5'),
    'encodings-flag': (['encodings', '--all'], 'unrecognized arguments: --all'),
    'empty-data': ([*PRETRAIN, '--data', ''], 'argument --data: must not be empty'),
    'rope-factor-overflow': (['pretrain', '--pe', 'rope', '--preset', 'smoke', '--pe-kwargs', '{"scaling": "ntk", "factor": 1e300}'],
                             'underflow or overflow float32'),
    'empty-out': ([*PRETRAIN, '--out', ''], 'argument --out: must not be empty', 'usage: posenc_lit pretrain'),   # read as the current folder
    'out-not-creatable': ([*PRETRAIN, '--out', '/proc/posenc_lit_run'], 'argument --out: cannot create /proc/posenc_lit_run',
                          'usage: posenc_lit pretrain'),
}


@pytest.mark.parametrize('case', CLI_BAD)
def test_bad_arguments_print_usage_exit_2_write_nothing(case, tmp_path, capsys, monkeypatch):
    argv, msg, usage = (*CLI_BAD[case], 'usage: posenc_lit')[:3]
    monkeypatch.chdir(tmp_path)
    if argv[0] == 'pretrain' and '--pe' in argv and '--out' not in argv: argv = [*argv, '--out', str(tmp_path / 'run')]
    if argv[0] == 'lengths': argv = [*argv, '--run', str(tmp_path / 'run')]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    assert msg in err and 'Traceback' not in err, err
    assert list(tmp_path.iterdir()) == []                      # nothing written, not even the run folder


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
    monkeypatch.setattr(posenc_lit.files, 'atomic_write', refuse)
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


def _gz_rows(path, lines):
    with gzip.open(path, 'wt') as f:
        f.writelines(l + '\n' for l in lines)
    return path


GOOD = [json.dumps({'id': i, 'text': f'a fine film, number {i}', 'rating': 1.5 if i % 2 else -2.0}) for i in range(60)]
BAD_ROWS = {   # id: (row 3 of the file, what the error must say after '<file>, row 3: ')
    'rating-string': ('{"text": "fine", "rating": "2"}', "field 'rating' must be a finite number; got '2'"),
    'null-row': ('null', "expected an object with fields 'text', 'rating'; got null"),
    'text-number': ('{"text": 7, "rating": 1.0}', "field 'text' must be a non-empty string; got 7"),
    'nan-rating': ('{"text": "fine", "rating": NaN}', "field 'rating' must be a finite number; got nan"),
    'null-rating': ('{"text": "fine", "rating": null}', "field 'rating' must be a finite number; got None"),
    'no-text': ('{"rating": 2}', "no field 'text'"),
}


@pytest.mark.parametrize('task', ['sentiment', 'rating'])
@pytest.mark.parametrize('bad', BAD_ROWS)
def test_bad_rows_in_data_files_name_file_row_and_field(bad, task, runs, tmp_path, capsys):
    "A badly typed or missing label or text in --data-files: refused when the data is read, naming file, row and field."
    src = _gz_rows(tmp_path / 'mine.jsonl.gz', GOOD[:2] + [BAD_ROWS[bad][0]] + GOOD[2:])
    argv = ['finetune', '--checkpoint', str(runs / 't5'), '--task', task, '--data-files', str(src), '--preset', 'smoke',
            '--out', str(tmp_path / 'ft'), '--quiet', '--no-baselines']
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f'{src}, row 3: {BAD_ROWS[bad][1]}' in err and 'Traceback' not in err, err
    assert not (tmp_path / 'ft').exists()


def test_all_labels_missing_is_refused_not_scored(runs, tmp_path, capsys):
    "All-null sentiment ratings used to become class 0 and score accuracy 1.0: the first row is refused."
    lines = [json.dumps({'text': f'film {i}', 'rating': None}) for i in range(60)]
    src = _gz_rows(tmp_path / 'none.jsonl.gz', lines)
    argv = ['finetune', '--checkpoint', str(runs / 't5'), '--task', 'sentiment', '--data-files', str(src), '--preset', 'smoke',
            '--out', str(tmp_path / 'ft'), '--quiet']
    assert main(argv) == 2
    assert f"{src}, row 1: field 'rating' must be a finite number; got None" in capsys.readouterr().err


GLUE_BAD = {   # id: (row 3 of a local SST-2 train file, what the error must say after '<file>, row 3: ')
    'label-out-of-range': ('{"sentence": "fine", "label": 3, "idx": 9}', "field 'label' must be a class id in 0..1; got 3"),
    'null-row': ('null', "field 'sentence' must be a non-empty string; got None"),
    'text-number': ('{"sentence": 7, "label": 1, "idx": 9}', "field 'sentence' must be a non-empty string; got 7"),
    'label-fraction': ('{"sentence": "fine", "label": 0.5, "idx": 9}', "field 'label' must be a class id in 0..1; got 0.5"),
}


@pytest.mark.parametrize('bad', GLUE_BAD)
def test_bad_rows_in_glue_files(bad, runs, tmp_path, capsys):
    rows = [json.dumps({'sentence': f'a {"fine" if k % 2 else "dull"} film number {k}', 'label': k % 2, 'idx': k}) for k in range(60)]
    train, val = tmp_path / 'train.jsonl', tmp_path / 'validation.jsonl'
    train.write_text('\n'.join(rows[:2] + [GLUE_BAD[bad][0]] + rows[2:50]) + '\n')
    val.write_text('\n'.join(rows[50:]) + '\n')
    argv = ['finetune', '--checkpoint', str(runs / 't5'), '--task', 'glue:sst2', '--data-files', f'train={train}',
            f'validation={val}', '--preset', 'smoke', '--out', str(tmp_path / 'ft'), '--quiet', '--no-baselines']
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f'{train}, row 3: {GLUE_BAD[bad][1]}' in err and 'Traceback' not in err, err


@pytest.mark.parametrize('metric', ['accuracy', 'f1', 'matthews', 'pearson', 'spearman', 'mse'])
def test_metrics_never_return_nan_silently(metric):
    "A NaN among the predictions or references is an error naming the side and the index, not a NaN metric."
    from posenc_lit.tasks import METRICS
    with pytest.raises(ValueError, match=r'ref holds a non-finite value \(nan\) at index 2'):
        METRICS[metric]([0.0, 1.0, 1.0, 0.0], [0.0, 1.0, float('nan'), 1.0])
    with pytest.raises(ValueError, match=r'pred holds a non-finite value \(nan\) at index 0'):
        METRICS[metric]([float('nan'), 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0])


def test_add_relative_on_a_sinusoidal_checkpoint(runs, tmp_path, capsys):
    "Huang et al. 2020, §4.3 on a sinusoidal model: huang4 does not scale the words, so it combines with sinusoidal's √D."
    _pretrain(tmp_path / 'sin', 'sinusoidal')
    argv = ['finetune', '--checkpoint', str(tmp_path / 'sin'), '--task', 'sentiment', '--preset', 'smoke',
            '--out', str(tmp_path / 'ft'), '--quiet', '--no-baselines', '--add-relative', 'huang4']
    assert main(argv) == 0, capsys.readouterr().err
    from posenc_lit.finetune import load_task_model
    model, _, _ = load_task_model(next((tmp_path / 'ft').glob('seed*')))
    assert model.encoder.cfg.add_relative == 'huang4'
    assert model.encoder.pe.word_scale == pytest.approx(32 ** 0.5)   # the sinusoidal model's scale, d_model=32


def test_fine_tuned_head_with_nan_weights_is_refused(tmp_path):
    "A fine-tuned checkpoint is read through the one checked reader: a NaN in the task head is a CheckpointError."
    import torch
    from safetensors.torch import load_file, save_file
    from posenc_lit.data import load_tokenizer
    from posenc_lit.finetune import EncoderForTask, load_task_model, save_task_model
    from posenc_lit.model import CheckpointError, Encoder, ModelConfig
    tok = load_tokenizer()
    enc = Encoder(ModelConfig(vocab_size=tok.get_vocab_size(), d_model=16, n_layers=1, n_heads=2, d_ff=32))
    d = save_task_model(EncoderForTask(enc, 'classification', 2), tmp_path / 'ft', tok, {})
    load_task_model(d)                                                       # a sound checkpoint loads
    sd = load_file(d / 'model.safetensors')
    head = next(k for k in sd if not k.startswith('encoder.') and sd[k].is_floating_point())
    sd[head][0] = float('nan')
    save_file(sd, d / 'model.safetensors')
    with pytest.raises(CheckpointError, match='non-finite'):
        load_task_model(d)
