"Tests of `posenc_lit.data` that need files on disk: error paths of `load_corpus`, local folders, the embedded corpus."
import os
os.environ.setdefault('HF_HUB_OFFLINE', '1'); os.environ.setdefault('HF_DATASETS_OFFLINE', '1')  # before datasets is imported

import gzip, json, re
from pathlib import Path

import datasets, pytest, torch
from posenc_lit.data import (CorpusError, SPECIAL_TOKENS, corpus_dir, load_corpus, load_tokenizer, mask_tokens,
                             tokenize_blocks)


def write_jsonl(path: Path, texts, gz=False):
    data = ''.join(json.dumps({'text': t}) + '\n' for t in texts).encode()
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


@pytest.fixture
def offline(monkeypatch):
    "Offline mode even if `datasets` / `huggingface_hub` were imported before the environment was set."
    import huggingface_hub.constants as hc
    monkeypatch.setenv('HF_HUB_OFFLINE', '1'); monkeypatch.setenv('HF_DATASETS_OFFLINE', '1')
    monkeypatch.setattr(datasets.config, 'HF_HUB_OFFLINE', True)
    monkeypatch.setattr(hc, 'HF_HUB_OFFLINE', True)


# ---------------------------------------------------------------- errors

def test_missing_validation_file(tmp_path):
    write_jsonl(tmp_path / 'train.jsonl', ['some text'])
    with pytest.raises(CorpusError, match=r'no validation file.*expected files named validation\.\*'):
        load_corpus(tmp_path)


def test_missing_file_in_mapping(tmp_path):
    train = write_jsonl(tmp_path / 'train.jsonl', ['some text'])
    with pytest.raises(CorpusError, match=r'valid\.jsonl: file not found'):
        load_corpus({'train': train, 'validation': tmp_path / 'valid.jsonl'})


def test_missing_folder(tmp_path):
    with pytest.raises(CorpusError, match='no such folder or file'):
        load_corpus(tmp_path / 'absent')


def test_corrupt_gzip(tmp_path):
    write_jsonl(tmp_path / 'train.jsonl.gz', ['some text'] * 100, gz=True)
    good = write_jsonl(tmp_path / 'validation.jsonl.gz', ['other text'] * 100, gz=True)
    good.write_bytes(good.read_bytes()[:-12])  # truncated: the gzip trailer is gone
    with pytest.raises(CorpusError, match=r'validation\.jsonl\.gz: corrupt or truncated gzip'):
        load_corpus(tmp_path)


def test_not_gzip_at_all(tmp_path):
    write_jsonl(tmp_path / 'train.jsonl.gz', ['some text'], gz=True)
    (tmp_path / 'validation.jsonl.gz').write_bytes(b'{"text": "plain, not gzip"}\n')
    with pytest.raises(CorpusError, match='corrupt or truncated gzip'):
        load_corpus(tmp_path)


@pytest.mark.parametrize('content', [b'', b'\n \n'])
def test_empty_split(tmp_path, content):
    write_jsonl(tmp_path / 'train.jsonl', ['some text'])
    (tmp_path / 'validation.jsonl').write_bytes(content)
    with pytest.raises(CorpusError, match=r'validation\.jsonl: empty file'):
        load_corpus(tmp_path)


def test_empty_gzip_split(tmp_path):
    write_jsonl(tmp_path / 'train.jsonl.gz', ['some text'], gz=True)
    write_jsonl(tmp_path / 'validation.jsonl.gz', [], gz=True)
    with pytest.raises(CorpusError, match='empty file'):
        load_corpus(tmp_path)


def test_no_text_column(tmp_path):
    for s in ('train', 'validation'): (tmp_path / f'{s}.jsonl').write_text('{"body": "x"}\n')
    with pytest.raises(CorpusError, match='expected a `text` column'):
        load_corpus(tmp_path, cache_dir=tmp_path / 'cache')


def test_unknown_hub_name_offline(offline):
    with pytest.raises(CorpusError) as e:
        load_corpus('posenc-lit-no-such-dataset:some-config')
    msg = str(e.value)
    assert 'posenc-lit-no-such-dataset' in msg and 'offline mode is on' in msg and 'expected "default"' in msg.lower()


def test_tokenizer_errors(tmp_path):
    with pytest.raises(CorpusError, match='tokenizer file not found'):
        load_tokenizer(tmp_path / 'tokenizer.json')
    (tmp_path / 'bad.json').write_text('{"model": ')
    with pytest.raises(CorpusError, match='not a valid tokenizers JSON'):
        load_tokenizer(tmp_path / 'bad.json')


# ---------------------------------------------------------------- local folders in the wikitext schema

def test_wikitext_parquet_folder(tmp_path):
    "The hub's wikitext layout: one `text` column, blank lines and ` = Heading = ` lines included."
    rows = {'train': ['', ' = Valkyria Chronicles III = ', '', ' Senjō no Valkyria 3 : Unrecorded Chronicles . \n'] * 30,
            'validation': ['', ' = Homarus gammarus = ', ' Homarus gammarus , known as the European lobster . \n'] * 10}
    folder = tmp_path / 'wikitext-2-raw-v1'; folder.mkdir()
    for s, texts in rows.items():
        datasets.Dataset.from_dict({'text': texts}).to_parquet(folder / f'{s}-00000-of-00001.parquet')
    dd = load_corpus(str(folder), cache_dir=tmp_path / 'cache')
    assert {s: dd[s].num_rows for s in dd} == {'train': 120, 'validation': 30}
    assert dd['validation']['text'][:3] == rows['validation'][:3]
    blocks = tokenize_blocks(dd['train'], load_tokenizer(), 16)
    assert blocks.shape[1] == 16 and (blocks[:, 0] == SPECIAL_TOKENS['[CLS]']).all()


@pytest.mark.parametrize('name', ['train.jsonl', 'train.jsonl.gz', 'train.txt', 'train.csv'])
def test_other_file_types(tmp_path, name):
    texts = ['first line of text', 'second line of text']
    for s in ('train', 'validation'):
        p = tmp_path / name.replace('train', s)
        if '.jsonl' in name: write_jsonl(p, texts, gz=name.endswith('.gz'))
        elif name.endswith('.txt'): p.write_text('\n'.join(texts) + '\n')
        else: p.write_text('text\n' + '\n'.join(texts) + '\n')
    dd = load_corpus(tmp_path, cache_dir=tmp_path / 'cache')
    assert dd['train']['text'] == texts and dd['validation']['text'] == texts


# ---------------------------------------------------------------- the embedded corpus

def provenance_counts():
    "The counts table of PROVENANCE.md: {(split, source): {column: int}}."
    text = (corpus_dir() / 'PROVENANCE.md').read_text()
    out = {}
    for m in re.finditer(r'^\| (train|validation) \| (\w+) \| ([\d,]+) \| ([\d,]+) \| ([\d,]+) \| ([\d,]+) \|$', text, re.M):
        out[m[1], m[2]] = dict(zip(('documents', 'paragraphs', 'words', 'characters'), (int(g.replace(',', '')) for g in m.groups()[2:])))
    return out


def test_embedded_corpus_matches_provenance():
    dd, table = load_corpus('default'), provenance_counts()
    manifest = json.loads((corpus_dir() / 'manifest.json').read_text())
    assert len(table) == 8  # 2 splits x (3 sources + total)
    for split in ('train', 'validation'):
        df = dd[split].to_pandas()
        for source, g in [*df.groupby('source'), ('total', df)]:
            got = dict(documents=g.doc.nunique(), paragraphs=len(g), words=int(g.text.str.split().str.len().sum()),
                       characters=int(g.text.str.len().sum()))
            assert got == table[split, source] == manifest['counts'][split][source], (split, source)
    assert not set(dd['train']['doc']) & set(dd['validation']['doc'])  # split by document


def test_embedded_files_match_manifest():
    import hashlib
    manifest = json.loads((corpus_dir() / 'manifest.json').read_text())
    total = 0
    for name, meta in manifest['files'].items():
        data = (corpus_dir() / name).read_bytes(); total += len(data)
        assert len(data) == meta['bytes'] and hashlib.sha256(data).hexdigest() == meta['sha256'], name
    assert total < 10_000_000


def test_embedded_tokenizer():
    tok = load_tokenizer()
    assert tok.get_vocab_size() == 8000
    assert {t: tok.token_to_id(t) for t in SPECIAL_TOKENS} == SPECIAL_TOKENS
    assert tok.encode('Emma Woodhouse', add_special_tokens=False).tokens[0] == 'emma'


def test_masking_determinism_and_specials():
    x = torch.randint(5, 8000, (64, 128)); x[:, 0], x[:, -1], x[:5, 60:] = 2, 3, 0
    a = mask_tokens(x, torch.Generator().manual_seed(3), 8000)
    b = mask_tokens(x, torch.Generator().manual_seed(3), 8000)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    chosen = a[1] != -100
    assert not chosen[:, 0].any() and not chosen[:, -1].any() and not chosen[:5, 60:].any()
