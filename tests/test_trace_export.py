"Every encoding's encoder under `torch.jit.trace` and `torch.export`: traced at one length, run at another, equal to eager (issue 26)."
import warnings
import pytest
import torch
from posenc_lit.core import list_encodings
from posenc_lit.model import ModelConfig, Encoder

NAMES = sorted(list_encodings())


class Hidden(torch.nn.Module):  # the encoder's hidden states alone: traced functions return tensors, not the context
    def __init__(self, enc):
        super().__init__()
        self.enc = enc

    def forward(self, ids, mask=None):
        return self.enc(ids, attention_mask=mask)['hidden_states']


def _model(name):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_position_embeddings=64, pe=name,
                      dropout=0.0, attn_dropout=0.0)
    model = Hidden(Encoder(cfg)).eval()
    with torch.no_grad():
        for p in model.enc.pe.parameters():
            p.normal_()                     # position parameters that weigh, so that a frozen length would show
    return model


SHORT, LONG = (torch.randint(1, 50, (2, n), generator=torch.Generator().manual_seed(n)) for n in (8, 40))


def _padding(n, n_real):  # (2, n) bool: row 0 all real, row 1 padded after n_real tokens
    m = torch.ones(2, n, dtype=torch.bool)
    m[1, n_real:] = False
    return m


def test_every_encoding_is_covered():
    assert {'learned', 'sinusoidal', 'none', 'shaw', 'huang4', 't5', 'tupe-a', 'tupe-r', 'deberta', 'rope', 'alibi',
            'fire'} <= set(NAMES)


@pytest.mark.parametrize('name', NAMES)
def test_jit_trace_at_one_length_runs_at_another(name):
    model = _model(name)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')     # torch.jit.trace is deprecated in favour of torch.export (tested below)
        traced = torch.jit.trace(model, (SHORT,), check_trace=False)
    with torch.no_grad():
        for ids in (SHORT, LONG):
            assert (traced(ids) - model(ids)).abs().max().item() <= 1e-5, (name, ids.shape)
@pytest.mark.parametrize('name', NAMES)
def test_export_with_a_dynamic_length(name):
    "Exported with a padding mask at 8 tokens; at 40 tokens (another padding) equal to eager."
    model = _model(name)
    n = torch.export.Dim('n', min=2, max=63)
    ep = torch.export.export(model, (SHORT, _padding(8, 5)), dynamic_shapes=({1: n}, {1: n}))
    with torch.no_grad():
        for ids, mask in ((SHORT, _padding(8, 5)), (LONG, _padding(40, 30))):
            assert (ep.module()(ids, mask) - model(ids, mask)).abs().max().item() <= 1e-5, (name, ids.shape)
