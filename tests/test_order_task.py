"""Tests of the `order` task (`posenc_lit.tasks.load_order`): which of two versions of a sentence is the
original.

Bag-of-words and an encoder without positions must be at chance by construction: each sentence gives the pair
in both orders, with opposite labels and the same words; the splits are drawn per source sentence.

The task is fine-tuned with a paired scorer (`posenc_lit.heads`, kind 'paired'): each text of a pair is scored
alone by the same encoder and head, logits (s(y), s(x)). Tested here: the vectorized split of
`[CLS] x [SEP] y [SEP]` equals running the two texts one at a time, swapping the texts swaps the logits, `none`
ties (accuracy exactly 1/2), and a smoke fine-tune writes a summary and a model that loads and predicts the same.
"""
import os
os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('HF_DATASETS_OFFLINE', '1')  # before datasets is imported

import collections, gzip, json

import datasets
import numpy as np
import pytest
import torch
from sklearn.feature_extraction.text import CountVectorizer

from posenc_lit.data import load_tokenizer
from posenc_lit.finetune import (EncoderForTask, collate, encode_texts, finetune, load_task_model, make_finetune_config,
                                 predict, save_task_model, score)
from posenc_lit.heads import _special, split_pairs
from posenc_lit.model import Encoder, EncoderForMLM, ModelConfig, save_model
from posenc_lit.tasks import (TASK_SPLITS, TASKS, TaskError, _texts, bow_baseline, get_task, load_order,
                              majority_baseline, read_rt_sentences, word_swap)


@pytest.fixture(scope='module')
def order():
    return load_order()


def as_set(d):
    "The examples of a split as a set of (text, text_pair, label)."
    return set(zip(d['text'], d['text_pair'], d['label']))


def test_registered():
    spec = get_task('order')
    assert 'order' in TASKS and spec.kind == 'paired' and spec.n_labels == 2
    assert spec.main_metric == 'accuracy'


def test_balanced_labels(order):
    for s in TASK_SPLITS:
        assert order[s].num_rows > 0
        assert np.mean(order[s]['label']) == 0.5, s


def test_each_pair_in_both_orders_same_words(order):
    for s in TASK_SPLITS:
        d = order[s]
        x, y, label = d['text'], d['text_pair'], d['label']
        for m in range(0, d.num_rows, 2):   # rows 2m and 2m+1: one sentence in its two orders
            assert (x[m], y[m]) == (y[m + 1], x[m + 1]) and (label[m], label[m + 1]) == (1, 0)
            assert d['id'][m] == d['id'][m + 1]
            assert collections.Counter(x[m].split()) == collections.Counter(y[m].split())
            assert sum(a != b for a, b in zip(x[m].split(), y[m].split())) == 2


def test_same_token_multiset(order):
    tok = load_tokenizer()
    for s in TASK_SPLITS:
        xs, ys = tok.encode_batch(order[s]['text']), tok.encode_batch(order[s]['text_pair'])
        assert all(collections.Counter(a.ids) == collections.Counter(b.ids) for a, b in zip(xs, ys))
        assert all(a.ids != b.ids for a, b in zip(xs, ys))   # never two copies of one text


def test_splits_disjoint_by_sentence(order):
    ids = {s: set(order[s]['id']) for s in TASK_SPLITS}
    originals = {s: {x for x, y, lab in as_set(order[s]) if lab == 1} for s in TASK_SPLITS}
    for a, b in (('train', 'validation'), ('train', 'test'), ('validation', 'test')):
        assert not ids[a] & ids[b] and not originals[a] & originals[b]
    assert sum(map(len, ids.values())) == sum(order[s].num_rows for s in TASK_SPLITS) // 2


def test_deterministic_and_independent_of_file_order(order, tmp_path):
    again = load_order()
    for s in TASK_SPLITS:
        assert again[s]['text'] == order[s]['text'] and again[s]['text_pair'] == order[s]['text_pair']
    rows = read_rt_sentences()[::-1]
    f = tmp_path / 'reversed.jsonl.gz'
    f.write_bytes(gzip.compress(''.join(json.dumps(r) + '\n' for r in rows).encode(), mtime=0))
    rev = load_order({'all': f})
    for s in TASK_SPLITS:
        assert as_set(rev[s]) == as_set(order[s])
    other = load_order(seed=1)
    assert as_set(other['test']) != as_set(order['test'])


def test_word_swap_keeps_the_ends():
    s = 'The comedy is , sadly , quite nonexistent .'
    w, v = s.split(), word_swap(s).split()
    assert (v[0], v[-2], v[-1]) == (w[0], w[-2], w[-1])   # '.' holds no BOW token: the anchor is w[-2]
    assert word_swap('too tepid') is None and word_swap('a film a film') is None


def test_missing_file():
    with pytest.raises(TaskError, match='nothing.jsonl.gz: file not found'):
        load_order({'all': 'nothing.jsonl.gz'})


def test_bag_of_words_at_chance(order):
    X = CountVectorizer(ngram_range=(1, 2), binary=True).fit_transform(_texts(order['test']))
    assert (X[0::2] != X[1::2]).nnz == 0   # the two orders of a sentence: the same features
    spec = get_task('order')
    bow, maj = bow_baseline(order, spec, grid=(1.0,)), majority_baseline(order, spec)
    for s in ('validation', 'test'):
        assert abs(bow[s]['accuracy'] - 0.5) <= 0.02 and abs(maj[s]['accuracy'] - 0.5) <= 0.02


@pytest.mark.parametrize('pe, same', [('none', True), ('rope', False), ('learned', False)])
def test_no_positions_gives_both_orders_one_answer(order, pe, same):
    "Without positions an encoder sees a multiset of tokens: both orders get one answer; with positions, two."
    tok = load_tokenizer()
    d = order['test'].select(range(32))
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), d_model=32, n_heads=2, n_layers=2, d_ff=64, pe=pe)
    enc = Encoder(cfg)
    model = EncoderForTask(enc, 'classification', 2).eval()
    ids, mask = collate(encode_texts(d, tok)['input_ids'])
    with torch.no_grad():
        logits = model(ids, mask)['logits'].double()   # (32, 2)
    gap = (logits[0::2] - logits[1::2]).abs().max().item()
    assert (gap < 1e-4) == same, gap


# ---------------------------------------------------------------- the paired scorer

C, S, P = 1, 2, 0   # [CLS], [SEP], [PAD] of the toy vocabulary


def toy_model(pe, vocab=50, special=(C, S, P)):
    "A random 2-layer encoder (D = 32) with a paired head, in eval mode."
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=vocab, d_model=32, n_heads=2, n_layers=2, d_ff=64, pe=pe, max_position_embeddings=64)
    return EncoderForTask(Encoder(cfg), 'paired', special=special).eval()


@pytest.mark.parametrize('pe', ['learned', 'rope', 't5', 'deberta'])
def test_paired_split_is_exact(pe):
    "Each logit of a right-padded batch equals the score of its text run alone: `[CLS] t [SEP]`, no padding."
    model = toy_model(pe)
    g = torch.Generator().manual_seed(1)
    text = lambda: torch.randint(5, 50, (int(torch.randint(1, 13, (1,), generator=g)),), generator=g).tolist()
    xy = [(text(), text()) for _ in range(9)]
    ids, am = collate([[C, *x, S, *y, S] for x, y in xy], pad_id=P)
    assert not am.all()                                                   # the batch is padded
    alone = lambda t: model.head(model.encoder(torch.tensor([[C, *t, S]]))['hidden_states'])[0, 0]
    with torch.no_grad():
        logits = model(ids, am)['logits']                                 # (9, 2) = (s(y), s(x))
        ref = torch.stack([torch.stack([alone(y), alone(x)]) for x, y in xy])
    assert logits.dtype == torch.float32 and logits.shape == (9, 2)
    assert (logits - ref).abs().max().item() <= 1e-5


def test_split_pairs_vectorized_and_checked():
    ids = torch.tensor([[C, 5, 6, S, 7, S, P], [C, 8, S, 9, 10, 11, S]])
    halves, mask = split_pairs(ids, ids != P, C, S, P)
    assert halves.tolist() == [[C, 5, 6, S, P], [C, 8, S, P, P], [C, 7, S, P, P], [C, 9, 10, 11, S]]
    assert torch.equal(mask, halves != P)
    with pytest.raises(ValueError, match=r'row 1 is not one'):
        split_pairs(ids[:, :6], None, C, S, P)                            # row 1 keeps one [SEP]
    with pytest.raises(ValueError, match=r"pass special=\(cls, sep, pad\)"):
        EncoderForTask(toy_model('learned').encoder, 'paired')


@pytest.fixture(scope='module')
def order_test(order):
    return order['test'].select(range(64))


def swapped(d):
    return datasets.Dataset.from_dict({'text': d['text_pair'], 'text_pair': d['text'], 'label': [1 - y for y in d['label']]})


@pytest.mark.parametrize('pe', ['learned', 'none'])
def test_paired_antisymmetric(order_test, pe):
    "Swapping text and text_pair swaps the two logits."
    tok = load_tokenizer()
    model = toy_model(pe, tok.get_vocab_size(), _special(tok))
    with torch.no_grad():
        a = model(*collate(encode_texts(order_test, tok)['input_ids']))['logits']
        b = model(*collate(encode_texts(swapped(order_test), tok)['input_ids']))['logits']
    assert (a - b.flip(-1)).abs().max().item() <= 1e-6


@pytest.mark.parametrize('pe, tie', [('none', True), ('learned', False), ('rope', False)])
def test_paired_none_ties_at_chance(order_test, pe, tie):
    "Without positions s(x) = s(y) (the same tokens): a tie on every pair, accuracy exactly 1/2; with positions, not."
    tok = load_tokenizer()
    model = toy_model(pe, tok.get_vocab_size(), _special(tok))
    data = encode_texts(order_test, tok)
    with torch.no_grad():
        logits = model(*collate(data['input_ids']))['logits'].double()
    gap = (logits[:, 0] - logits[:, 1]).abs()
    assert bool((gap <= 1e-5).all()) == tie, gap.max().item()
    acc = score(model, data, get_task('order'))['accuracy']
    assert np.mean(data['labels']) == 0.5
    if tie:
        assert acc == 0.5 and set(predict(model, data)) == {0}             # every pair a tie: class 0


@pytest.fixture(scope='module')
def tiny_checkpoint(tmp_path_factory):
    "A random pretraining checkpoint: learned positions, a table of 128 rows (longer than the longest order pair)."
    tok = load_tokenizer()
    d = tmp_path_factory.mktemp('tiny')
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.get_vocab_size(), d_model=32, n_heads=2, n_layers=1, d_ff=64, pe='learned',
                      max_position_embeddings=128)
    save_model(EncoderForMLM(cfg), d)
    tok.save(str(d / 'tokenizer.json'))
    return d


def test_paired_finetune_end_to_end(tiny_checkpoint, tmp_path):
    "Smoke fine-tune of `order` (4 steps): a summary; the saved paired model loads and predicts the same."
    longest_pair = max(len(ids) for ids in encode_texts(load_order()['train'], load_tokenizer())['input_ids'])
    assert longest_pair > 128                     # runs only because each text is run alone (check_length)
    cfg = make_finetune_config('smoke', task='order', checkpoint=str(tiny_checkpoint), max_train=64)
    s = finetune(cfg, tmp_path / 'ft', progress=False)
    assert json.loads((tmp_path / 'ft' / 'summary.json').read_text())['test'] == s['test']
    assert s['steps'] == 4 and 0 <= s['test']['accuracy'] <= 1 and s['examples']['train'] == 64
    m, tok, info = load_task_model(tmp_path / 'ft')
    assert m.kind == 'paired' and m.special == _special(tok) and info['special'] == list(_special(tok))
    data = encode_texts(load_order()['test'], tok)
    assert score(m, data, get_task('order'))['accuracy'] == s['test']['accuracy']
    again = save_task_model(m, tmp_path / 'copy', tok, info)
    m2, _, _ = load_task_model(again)
    assert predict(m2, data) == predict(m, data)
