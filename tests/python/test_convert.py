"""to_hfnn / to_torch: a reversible, in-place module swap that keeps everything but the kernel."""
import io

import pytest
import torch
from torch import nn

import hfnn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.proj = nn.Linear(16, 16)
        self.inner = nn.Sequential(nn.LayerNorm(16, elementwise_affine=False), nn.ReLU(), nn.LayerNorm([4, 16]))
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x):
        return self.inner[2](self.inner(self.proj(self.norm(x))) * self.scale)


class MyNorm(nn.LayerNorm):
    """A user's subclass: its own forward must survive to_hfnn."""

    def forward(self, x):
        return super().forward(x) * 3


def layer_norms(model):
    return [m for m in model.modules() if isinstance(m, nn.LayerNorm)]


def test_round_trip_keeps_everything():
    model = Block().double()
    model.eval()
    model.norm.weight.requires_grad_(False)
    calls = []
    model.norm.register_forward_hook(lambda *a: calls.append("hook"))
    params = {n: p for n, p in model.named_parameters()}
    buffers = {n: b for n, b in model.named_buffers()}
    before = {k: v.clone() for k, v in model.state_dict().items()}

    assert hfnn.to_hfnn(model) is model
    assert all(type(m) is hfnn.nn.LayerNorm for m in layer_norms(model))
    assert hfnn.to_torch(model) is model
    assert all(type(m) is nn.LayerNorm for m in layer_norms(model))

    for n, p in model.named_parameters():
        assert p is params[n]
    for n, b in model.named_buffers():
        assert b is buffers[n]
    assert not model.training and not model.norm.weight.requires_grad
    assert all(p.dtype == torch.float64 for p in model.parameters())
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    model(torch.randn(4, 16, dtype=torch.float64))
    assert calls == ["hook"]


def test_swapped_model_computes_the_same():
    torch.manual_seed(0)
    model = Block()
    x = torch.randn(4, 16)
    want = model(x)
    assert torch.equal(hfnn.to_hfnn(model)(x), want)


def test_subclasses_are_left_alone():
    model = nn.Sequential(MyNorm(8), nn.LayerNorm(8))
    hfnn.to_hfnn(model)
    assert type(model[0]) is MyNorm
    assert type(model[1]) is hfnn.nn.LayerNorm


def test_top_level_layer_norm_is_swapped():
    m = nn.LayerNorm(8)
    assert type(hfnn.to_hfnn(m)) is hfnn.nn.LayerNorm
    assert type(hfnn.to_torch(m)) is nn.LayerNorm


def test_checkpoints_load_across():
    torch.manual_seed(1)
    src = Block()
    buf = io.BytesIO()
    torch.save(hfnn.to_hfnn(Block()).state_dict(), buf)
    buf.seek(0)
    plain = Block()
    plain.load_state_dict(torch.load(buf))  # hfnn checkpoint -> torch model

    dst = hfnn.to_hfnn(Block())
    dst.load_state_dict(src.state_dict())  # torch checkpoint -> hfnn model
    x = torch.randn(3, 4, 16)
    assert torch.equal(dst(x), src(x))


def test_hfnn_module_is_constructed_like_torchs():
    m = hfnn.nn.LayerNorm((4, 8), eps=1e-3, elementwise_affine=True, bias=False, dtype=torch.float64)
    t = nn.LayerNorm((4, 8), eps=1e-3, elementwise_affine=True, bias=False, dtype=torch.float64)
    assert m.normalized_shape == t.normalized_shape and m.eps == t.eps and m.bias is None
    assert list(m.state_dict()) == list(t.state_dict())
    assert isinstance(m, nn.LayerNorm)


def test_not_a_module_is_a_clear_error():
    with pytest.raises(TypeError, match="expected a torch.nn.Module"):
        hfnn.to_hfnn("model")
