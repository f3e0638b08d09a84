"""CUDA paths: flex and sdpa against the reference path, forward and backward. Skipped without a GPU."""

import pytest
import torch

from relbench import positions
from relbench.attention import attention, choose

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
SPECS = ["xl", "t5", "alibi", "shaw", "rope", "none"]


def setup(spec, length=256, batch=2, heads=4, head_dim=32):
    enc = positions.build_spec(spec, n_heads=heads, head_dim=head_dim, train_length=length).cuda()
    enc.reset_parameters(torch.Generator().manual_seed(0))
    with torch.no_grad():
        for p in enc.parameters():
            p.normal_(0, 0.5)
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(batch, heads, length, head_dim, device="cuda", generator=g) for _ in range(3))
    return enc, q, k, v


@cuda
@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("backend", ["sdpa", "chunked", "flex"])
def test_cuda_forward_matches_reference(spec, backend):
    enc, q, k, v = setup(spec)
    q, k = enc.rotate(q, k)
    with torch.no_grad():
        ref = attention(q, k, v, position=enc, backend="reference")
        torch.testing.assert_close(attention(q, k, v, position=enc, backend=backend), ref, rtol=2e-3, atol=2e-3)


@cuda
@pytest.mark.parametrize("spec", ["xl", "t5", "alibi", "shaw"])
def test_cuda_flex_gradients_match_reference(spec):
    grads = {}
    for backend in ("reference", "flex"):
        enc, q, k, v = setup(spec)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        out = attention(q, k, v, position=enc, backend=backend)
        (out * torch.linspace(-1, 1, out.numel(), device="cuda").view_as(out)).sum().backward()
        grads[backend] = [q.grad, k.grad, v.grad] + [p.grad for p in enc.parameters()]
    for got, want in zip(grads["flex"], grads["reference"]):
        torch.testing.assert_close(got, want, rtol=5e-3, atol=5e-3)


@cuda
def test_auto_uses_flex_for_biases_on_cuda():
    enc, q, k, v = setup("xl")
    assert choose(enc.plan(256, 256), q, 256, grad=True) == "flex"
