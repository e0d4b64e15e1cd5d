"""Tests of the `order` task (`posenc_lit.tasks.load_order`): which of two versions of a sentence is the
original.

Bag-of-words and an encoder without positions must be at chance by construction: each sentence gives the pair
in both orders, with opposite labels and the same words; the splits are drawn per source sentence.
"""
import os
os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('HF_DATASETS_OFFLINE', '1')  # before datasets is imported

import collections, gzip, json

import numpy as np
import pytest
import torch
from sklearn.feature_extraction.text import CountVectorizer

from posenc_lit.data import load_tokenizer
from posenc_lit.finetune import EncoderForTask, collate, encode_texts
from posenc_lit.model import Encoder, ModelConfig
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
    assert 'order' in TASKS and spec.kind == 'classification' and spec.n_labels == 2
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
