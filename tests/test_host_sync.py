"""No host read per layer: the checks of a forward pass read tensors at the boundary, once per forward.

A read of a tensor's value on the host (`int(t)`, `bool(t)`, `.item()`, `.tolist()`, `float(t)`) waits for the
GPU to finish everything queued before it. The CPU twin of `tools/gpu_check.py`'s sync count: here the reads are
counted through a `TorchFunctionMode`, and a model with 3 layers must make as many as a model with 1 (a read
inside a layer would make 3). Each encoding's own count is bounded too, so that a new read at the boundary is
seen. On
CPU, `attend_fast` reads each query block for NaN (`attention._cpu_math_path`, a CPU-only workaround that never
runs on a GPU): the tests leave it out.
"""

import pytest, torch
from torch.overrides import TorchFunctionMode
from posenc_lit import attention
from posenc_lit.core import list_encodings
from posenc_lit.model import ModelConfig, EncoderForMLM
from posenc_lit.vit import ViT, ViTConfig

READS = {'item', 'tolist', '__bool__', '__int__', '__float__', '__index__'}


class CountReads(TorchFunctionMode):
    "Counts host reads of tensor values inside the block, by name."

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, '__name__', '') in READS:
            self.reads.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.fixture(autouse=True)
def no_cpu_workaround(monkeypatch):
    monkeypatch.setattr(attention, '_cpu_math_path', lambda q, score_terms, mask: False)


def reads_of(f) -> list:
    with torch.no_grad(), CountReads() as c:
        f()
    return c.reads


def text_reads(pe: str, n_layers: int, position_ids: bool = False) -> list:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=100, d_model=32, n_layers=n_layers, n_heads=2, d_ff=64, pe=pe,
                      max_position_embeddings=64)
    model = EncoderForMLM(cfg).eval()
    ids = torch.randint(5, 100, (2, 24))
    am = torch.ones(2, 24, dtype=torch.bool)
    am[1, 20:] = False
    kw = {'position_ids': torch.arange(24)[None]} if position_ids else {}
    return reads_of(lambda: model(ids, attention_mask=am, **kw))


@pytest.mark.parametrize('pe', list(list_encodings('text')))
def test_text_reads_do_not_grow_with_layers(pe):
    one, three = text_reads(pe, 1), text_reads(pe, 3)
    assert one == three, f'{pe}: {len(one)} host reads with 1 layer, {len(three)} with 3: a read per layer'
    # the boundary: input ids (1), a learned table's positions (2), the relative rows (1)
    assert len(three) <= 4, f'{pe}: {len(three)} host reads per forward: {three}'


@pytest.mark.parametrize('pe', ['learned', 'rope', 'shaw', 'deberta'])
def test_given_positions_read_once(pe):
    one, three = text_reads(pe, 1, True), text_reads(pe, 3, True)
    assert one == three, f'{pe} with position_ids: {len(one)} host reads with 1 layer, {len(three)} with 3'


def test_counter_sees_a_read_per_layer():
    "The counter can fail: a check inside each layer (`int(x.abs().max())`) is counted once per layer."
    x = torch.randn(3, 4)
    assert len(reads_of(lambda: [int(x.abs().max()) for _ in range(3)])) == 3


@pytest.mark.parametrize('pe', list(list_encodings('image')))
def test_image_reads_do_not_grow_with_layers(pe):
    counts = []
    for n_layers in (1, 3):
        torch.manual_seed(0)
        model = ViT(ViTConfig(pe=pe, d_model=32, n_layers=n_layers, n_heads=2, d_ff=64)).eval()
        counts.append(reads_of(lambda: model(torch.randn(2, 1, 28, 28))))
    assert counts[0] == counts[1], f'{pe}: host reads {len(counts[0])} with 1 layer, {len(counts[1])} with 3'
