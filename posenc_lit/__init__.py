__version__ = "0.1.0"

# The top-level API (written by hand: nbdev only keeps the `__version__` line above, and `nbdev_export` leaves the
# rest as it is). `import posenc_lit` then `posenc_lit.RoPE`, `posenc_lit.position_attention`, or
# `from posenc_lit import RoPE, position_attention`: every encoding of the registry, the contract, attention with
# an encoding and the models. Each name is the very object of its home module (where its page documents it);
# everything else, training, studies and reports included, stays in its module (`posenc_lit.training.pretrain`).
#
# The names load lazily (PEP 562): `import posenc_lit` imports none of the modules, and a name imports its home
# module the first time it is used. So importing the package loads neither torch nor matplotlib, and importing a
# module of it (`import posenc_lit.cli`) runs no other module first: no import cycle through this file.
# `tests/test_api.py` checks these names.
import difflib as _difflib
import importlib as _importlib
import importlib.util as _importlib_util

TYPE_CHECKING = False  # True for type checkers (mypy, pyright); not `typing`'s, to import nothing more

# (home module, names), grouped as a user meets them
_API = (
    # the contract every encoding keeps, and the registry of encodings by name (`pe=` of the configs)
    ('core', ('PositionEncoding', 'Context', 'LayerRef', 'EncodingSpec', 'register_encoding', 'list_encodings',
              'get_encoding', 'rel_pos')),
    # attention with an encoding's position signal: the functions for your own module, and ours
    ('attention', ('position_attention', 'position_scores', 'attend', 'default_positions', 'causal_mask',
                   'MultiHeadAttention', 'KVCache', 'CombinedEncoding')),
    # the language encodings (modality 'text')
    ('absolute', ('SinusoidalEncoding', 'LearnedEncoding')),
    ('relative', ('RelativeVectors', 'Shaw', 'HuangMethod4')),
    ('t5', ('T5RelativeBias',)),
    ('tupe', ('TUPE',)),
    ('deberta', ('DebertaRelative',)),
    ('rope', ('RoPE',)),
    ('alibi', ('ALiBi',)),
    ('fire', ('FIRE',)),
    ('cope', ('CoPE',)),
    # the ViT's encodings (modality 'image')
    ('vit', ('VisionEncoding', 'LearnedPosEmbed', 'Learned2d', 'SinCos2d', 'RoPE2d', 'RelBias2d')),
    ('rope_mixed', ('RoPEMixed',)),
    # the models: the encoder, the causal decoder, the ViT; building an encoding by name; checkpoints
    ('model', ('ModelConfig', 'build_encoding', 'Encoder', 'EncoderForMLM', 'mask_positions', 'save_model',
               'load_model', 'CheckpointError')),
    ('causal_lm', ('CausalLM', 'LMCache')),
    ('vit', ('ViTConfig', 'ViT', 'save_vit', 'load_vit')),
    ('hf', ('from_hf',)),
)
_HOME = {name: module for module, names in _API for name in names}
__all__ = list(_HOME)


def __getattr__(name):
    """A name of `__all__` from its home module, imported on first use (PEP 562); a module of the package
    (`posenc_lit.hf`) imported on first use; AttributeError for another, with the nearest name of `__all__`."""
    module = _HOME.get(name)
    if module is None and _importlib_util.find_spec(f'{__name__}.{name}') is not None:
        return _importlib.import_module(f'{__name__}.{name}')  # a module: `posenc_lit.hf.from_hf` as written
    if module is None:
        lower = {n.lower(): n for n in __all__}  # 'Rope' -> 'RoPE'
        near = _difflib.get_close_matches(name.lower(), lower, n=1, cutoff=0.75)
        hint = f'; did you mean {lower[near[0]]!r}?' if near else ''
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}{hint}')
    value = getattr(_importlib.import_module(f'{__name__}.{module}'), name)
    globals()[name] = value  # later uses read it directly
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # the same names for type checkers and editors (tests/test_api.py checks they agree)
    from .core import (PositionEncoding, Context, LayerRef, EncodingSpec, register_encoding, list_encodings,
                       get_encoding, rel_pos)
    from .attention import (position_attention, position_scores, attend, default_positions, causal_mask,
                            MultiHeadAttention, KVCache, CombinedEncoding)
    from .absolute import SinusoidalEncoding, LearnedEncoding
    from .relative import RelativeVectors, Shaw, HuangMethod4
    from .t5 import T5RelativeBias
    from .tupe import TUPE
    from .deberta import DebertaRelative
    from .rope import RoPE
    from .alibi import ALiBi
    from .fire import FIRE
    from .cope import CoPE
    from .vit import VisionEncoding, LearnedPosEmbed, Learned2d, SinCos2d, RoPE2d, RelBias2d
    from .rope_mixed import RoPEMixed
    from .model import (ModelConfig, build_encoding, Encoder, EncoderForMLM, mask_positions, save_model,
                        load_model, CheckpointError)
    from .causal_lm import CausalLM, LMCache
    from .vit import ViTConfig, ViT, save_vit, load_vit
    from .hf import from_hf
