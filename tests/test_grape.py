"""grape-a (positions/grape.py): GRAPE's key-gated additive bias, by hand against the official formula."""

import math

import torch
import torch.nn.functional as F

from relbench import positions
from relbench.attention import attention


def built(**options):
    enc = positions.build("grape-a", n_heads=2, head_dim=4, train_length=16, **options)
    enc.reset_parameters(torch.Generator().manual_seed(0))
    return enc


def test_defaults_are_the_official_configs():
    enc = built()
    torch.testing.assert_close(F.softplus(enc.rate), torch.ones(2))             # omega starts at 1 x the ALiBi slope
    assert 0.2 < float(enc.u.std()) < 0.9                                        # normal, std 1/sqrt(4)
    assert not enc.shared_across_layers and enc.key_dependent and not enc.content_dependent


@torch.no_grad()
def test_the_bias_by_hand():
    """b(i, j) = -(i - j) softplus(w_h) m_h softplus(u_h . k_j / sqrt(d) / |u_h|), m the ALiBi slopes 1/4, 1/16."""
    enc = built(omega_init=2.0)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 7, 4, generator=g) for _ in range(3))
    bias = enc.plan(7, 7, q, k).full()[0]
    for h, slope in ((0, 2 ** -4), (1, 2 ** -8)):
        u = enc.u[h] / enc.u[h].norm()
        for i, j in ((6, 0), (4, 3), (5, 5)):
            want = -(i - j) * 2.0 * slope * math.log1p(math.exp(float(k[0, h, j] @ u) / 2))
            assert abs(float(bias[h, i, j]) - want) < 1e-6, (h, i, j)
    logits = q @ k.transpose(-2, -1) / 2 + bias
    logits = logits.masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf"))
    plan = enc.plan(7, 7, q, k)
    for backend in ("reference", "chunked", "auto"):
        torch.testing.assert_close(attention(q, k, v, plan, backend), torch.softmax(logits, -1) @ v)
