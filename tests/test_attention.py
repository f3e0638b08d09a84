"""Every attention backend equals the reference (materialised) path, for every variant."""

import pytest
import torch

from relbench import positions
from relbench.attention import BACKENDS, attention, check, chunked_attention, split_attention
from relbench.errors import UsageError
from relbench.positions.plan import toeplitz

H, D = 4, 8
# small horizons so the far/near decomposition is exercised at short lengths
SPECS = {name: name for name in positions.names()}
SPECS.update({"xl": "xl:k=5", "t5": "t5:num_buckets=8,max_distance=12", "shaw": "shaw:k=3"})


def encoding(spec):
    enc = positions.build_spec(spec, n_heads=H, head_dim=D, train_length=64)
    enc.reset_parameters(torch.Generator().manual_seed(0))
    with torch.no_grad():
        for p in enc.parameters():
            p.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    return enc


def qkv(q_len, k_len, batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, H, q_len, D, generator=g), torch.randn(batch, H, k_len, D, generator=g),
            torch.randn(batch, H, k_len, D, generator=g))


@pytest.mark.parametrize("spec", list(SPECS.values()))
@pytest.mark.parametrize("backend", ["sdpa", "chunked", "split"])
@pytest.mark.parametrize("q_len, k_len", [(37, 37), (9, 37)])
def test_backend_matches_reference(spec, backend, q_len, k_len):
    enc = encoding(spec)
    q, k, v = qkv(q_len, k_len)
    q, k = enc.rotate(q, k)
    with torch.no_grad():  # split is inference-only
        ref = attention(q, k, v, position=enc, backend="reference")
        torch.testing.assert_close(attention(q, k, v, position=enc, backend=backend), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", list(SPECS.values()))
@torch.no_grad()
def test_small_blocks_match_reference(spec):
    """Blocks smaller than the horizon and than the sequence: every merge branch runs."""
    enc = encoding(spec)
    q, k, v = qkv(29, 29)
    q, k = enc.rotate(q, k)
    ref = attention(q, k, v, position=enc, backend="reference")
    plan = enc.plan(29, 29, q)
    torch.testing.assert_close(chunked_attention(q, k, v, plan, block=4), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(split_attention(q, k, v, plan, block=4), ref, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_split_is_exact_for_default_options_at_long_range():
    """Default horizons (xl 128, t5 ~113, shaw 16) and ALiBi at a length well past them."""
    for name in ("xl", "t5", "alibi", "shaw"):
        enc = encoding(name)
        q, k, v = qkv(300, 300, batch=1)
        ref = attention(q, k, v, position=enc, backend="reference")
        torch.testing.assert_close(attention(q, k, v, position=enc, backend="split"), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", ["alibi", "xl:k=5", "shaw:k=3", "rope"])
@torch.no_grad()
def test_flex_matches_reference(spec):
    enc = encoding(spec)
    q, k, v = qkv(64, 64, batch=1)
    q, k = enc.rotate(q, k)
    ref = attention(q, k, v, position=enc, backend="reference")
    torch.testing.assert_close(attention(q, k, v, position=enc, backend="flex"), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("spec", ["xl:k=5", "t5:num_buckets=8,max_distance=12", "shaw:k=3", "alibi"])
def test_chunked_gradients_match_reference(spec):
    enc = encoding(spec)
    grads = {}
    for backend in ("reference", "chunked"):
        enc.zero_grad()
        q, k, v = (t.requires_grad_() for t in qkv(21, 21))
        out = attention(q, k, v, position=enc, backend=backend)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        grads[backend] = [q.grad, k.grad, v.grad] + [p.grad for p in enc.parameters()]
    for got, want in zip(grads["chunked"], grads["reference"]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_toeplitz_gradient_is_the_diagonal_sum():
    values = torch.randn(3, 12, requires_grad=True)
    index = 6 + torch.arange(5)[:, None] - torch.arange(7)[None, :]   # first=6, q=5, k=7: indices 0..10
    weight = torch.randn(3, 5, 7)
    (toeplitz(values, 6, 5, 7) * weight).sum().backward()
    expected = torch.zeros(3, 12).index_add_(1, index.flatten(), weight.flatten(1))
    torch.testing.assert_close(values.grad, expected)
    torch.testing.assert_close(toeplitz(values, 6, 5, 7), values[:, index])


def test_auto_never_materialises_a_square_bias_for_long_inference(monkeypatch):
    """At inference the default path for biased variants is split: no (H, L, L) tensor."""
    enc = encoding("xl")
    q, k, v = qkv(64, 64, batch=1)
    calls = []
    original = type(enc.plan(2, 2)).full
    monkeypatch.setattr(type(enc.plan(2, 2)), "full", lambda self: calls.append(1) or original(self))
    with torch.no_grad():
        attention(q, k, v, position=enc, backend="auto")
    assert not calls


def test_split_refuses_to_drop_gradients():
    enc = encoding("xl:k=5")
    q, k, v = qkv(16, 16)
    with pytest.raises(UsageError, match="inference only"):
        attention(q, k, v, position=enc, backend="split")


def test_check_rejects_impossible_combinations():
    with pytest.raises(UsageError, match="no CPU backward"):
        check("flex", device="cpu", training=True)
    with pytest.raises(UsageError, match="inference only"):
        check("split", training=True)
    with pytest.raises(UsageError, match="did you mean"):
        check("chunkd")
    assert set(BACKENDS) >= {"auto", "reference", "sdpa", "chunked", "split", "flex"}
