"""The top-level API (posenc_lit/__init__.py): every name of `__all__` is the object of its home module, every
encoding the registry builds is exported (a new encoding whose class is not fails here), the names for type
checkers agree with the ones loaded, and `import posenc_lit` alone imports no module of the package and no heavy
library (the names load lazily, on first use)."""
import ast, importlib, json, subprocess, sys
from pathlib import Path

import pytest

import posenc_lit

INIT = Path(posenc_lit.__file__)
HEAVY = {'transformers', 'datasets', 'accelerate', 'matplotlib', 'timm', 'safetensors', 'tokenizers', 'torch'}


def test_version_is_the_first_statement():
    "nbdev's `update_version` rewrites the `__version__ = ...` line: it stays the first statement, set once."
    tree = ast.parse(INIT.read_text(encoding='utf-8'))
    first = tree.body[0]
    assert isinstance(first, ast.Assign) and first.targets[0].id == '__version__', ast.dump(first)[:200]
    assert posenc_lit.__version__ == ast.literal_eval(first.value)
    assert sum(isinstance(n, ast.Assign) and getattr(n.targets[0], 'id', '') == '__version__' for n in tree.body) == 1


def test_every_name_is_its_home_modules_object():
    assert len(posenc_lit.__all__) == len(set(posenc_lit.__all__)) > 40
    for name in posenc_lit.__all__:
        home = f'posenc_lit.{posenc_lit._HOME[name]}'
        obj = getattr(posenc_lit, name)
        assert obj is getattr(importlib.import_module(home), name), name
        assert getattr(obj, '__module__', home) == home, f'{name} is defined in {obj.__module__}, not {home}'
        assert name in importlib.import_module(home).__all__, f'{name} is not public in {home}'
    assert set(posenc_lit.__all__) <= set(dir(posenc_lit))


def test_star_import_gives_all():
    ns = {}
    exec('from posenc_lit import *', ns)
    assert set(ns) - {'__builtins__'} == set(posenc_lit.__all__)


def test_other_names_are_attribute_errors():
    "A name outside `__all__` is an AttributeError (so `hasattr` works), the internals stay in their modules."
    for name in ('no_such_name', 'pretrain', 'format_results', '_check_rope'):  # not submodules' names
        assert not hasattr(posenc_lit, name), name
    with pytest.raises(AttributeError, match="no attribute 'pretrain'"):
        posenc_lit.pretrain


def built_encodings() -> dict:
    "{(modality, name): the encoding module the registry's factory builds} for every registered encoding."
    from posenc_lit.core import list_encodings
    from posenc_lit.model import ModelConfig, build_encoding
    from posenc_lit.vit import ViTConfig
    small = dict(d_model=32, n_heads=4, n_layers=2)
    out = {('text', n): build_encoding(ModelConfig(pe=n, d_ff=64, max_position_embeddings=64, **small))
           for n in list_encodings('text')}
    out |= {('image', n): s.factory(ViTConfig(pe=n, **small)) for n, s in list_encodings('image').items()}
    return out


def unexported(built: dict) -> list[str]:
    "'modality/name: module.Class' for each built encoding whose class is not a name of the top-level API."
    api = {id(getattr(posenc_lit, n)) for n in posenc_lit.__all__}
    return [f'{m}/{n}: {type(pe).__module__}.{type(pe).__qualname__}' for (m, n), pe in built.items()
            if id(type(pe)) not in api]


def test_every_registered_encoding_is_exported():
    built = built_encodings()
    assert {m for m, _ in built} == {'text', 'image'} and len(built) >= 20, sorted(built)
    bad = unexported(built)
    assert not bad, f'add these encodings to _API in posenc_lit/__init__.py (and its TYPE_CHECKING block): {bad}'


def test_an_unexported_encoding_is_found():
    "The check can fail: an encoding registered with a class of its own is named."
    from posenc_lit.core import PositionEncoding, _REGISTRY, register_encoding

    class Mine(PositionEncoding):
        pass

    register_encoding('zz-not-exported', 'none', 'a test encoding')(lambda cfg: Mine())
    try:
        assert unexported(built_encodings()) == [f'text/zz-not-exported: {__name__}.{Mine.__qualname__}']
    finally:
        del _REGISTRY['text', 'zz-not-exported']


def test_type_checking_imports_agree():
    "The `if TYPE_CHECKING:` imports, what editors and type checkers read, are the names `__getattr__` loads."
    tree = ast.parse(INIT.read_text(encoding='utf-8'))
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, 'id', '') == 'TYPE_CHECKING')
    static = {a.name: n.module for n in block.body if isinstance(n, ast.ImportFrom) and n.level == 1
              for a in n.names}
    assert all(isinstance(n, ast.ImportFrom) and n.level == 1 for n in block.body)
    assert static == posenc_lit._HOME


def test_import_loads_nothing_heavy():
    "In a fresh interpreter `import posenc_lit` imports no module of the package and none of `HEAVY`."
    code = ('import sys, json, posenc_lit; print(json.dumps(sorted(m for m in sys.modules '
            'if m.startswith("posenc_lit.") or m.split(".")[0] in %r)))' % (HEAVY,))
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120,
                       cwd=INIT.parent.parent)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout) == [], r.stdout


def test_modules_on_first_use_and_near_names():
    "`posenc_lit.hf.from_hf` as the README writes it, in a fresh interpreter; a misspelt name gets the near one."
    code = 'import posenc_lit; print(posenc_lit.hf.from_hf is posenc_lit.from_hf)'
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120,
                       cwd=INIT.parent.parent)
    assert r.returncode == 0 and r.stdout.strip() == 'True', r.stderr[-2000:]
    with pytest.raises(AttributeError, match="no attribute 'Rope'; did you mean 'RoPE'"):
        posenc_lit.Rope
    with pytest.raises(AttributeError, match="no attribute 'zzz'$"):
        posenc_lit.zzz
