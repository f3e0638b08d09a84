"""pope (positions/pope.py): polar coordinate position embeddings, against a by-hand logit and
x-transformers' defaults."""

import math

import pytest
import torch
import torch.nn.functional as F

from relbench import positions
from relbench.attention import attention
from relbench.model import GPT, ModelConfig


def built(**options):
    enc = positions.build("pope", n_heads=2, head_dim=4, train_length=16, **options)
    enc.reset_parameters(torch.Generator().manual_seed(0))
    return enc


def test_defaults_are_x_transformers():
    enc = built()
    assert enc.base == 10000.0 and torch.equal(enc.phase, torch.zeros(2, 4))      # bias_uniform_init=False: zeros
    assert enc.shared_across_layers and enc.n_params() == 2 * 4
    uniform = built(bias_uniform_init=True)
    assert float(uniform.phase.max()) <= 0 and float(uniform.phase.min()) >= -2 * math.pi and uniform.phase.std() > 0.5


def test_a_logit_by_hand():
    """q'_i . k'_j / sqrt(2d) = sum_c softplus(q_ic) softplus(k_jc) cos((i - j) theta_c - delta_hc) / sqrt(d),
    theta_c = 10000^(-c/4); a phase below -2 pi reads as -2 pi."""
    enc = built()
    with torch.no_grad():
        enc.phase.copy_(torch.tensor([[-0.5, -1.0, 0.0, -9.0], [0.0, 0.0, 0.0, 0.0]]))
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 2, 6, 4, generator=g), torch.randn(1, 2, 6, 4, generator=g)
    q2, k2 = enc.rotate(q, k)
    assert q2.shape == (1, 2, 6, 8)
    delta = [-0.5, -1.0, 0.0, -2 * math.pi]
    for i, j in ((5, 2), (3, 3), (4, 0)):
        want = sum(float(F.softplus(q[0, 0, i, c]) * F.softplus(k[0, 0, j, c]))
                   * math.cos((i - j) * 10000 ** (-c / 4) - delta[c]) for c in range(4)) / math.sqrt(4)
        got = float(q2[0, 0, i] @ k2[0, 0, j]) / math.sqrt(8)
        assert got == pytest.approx(want, abs=1e-5)


@torch.no_grad()
def test_only_the_gap_matters_and_every_path_agrees():
    enc = built()
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 40, 4, generator=g) for _ in range(3))
    q2, k2 = enc.rotate(q, k)
    far_q, far_k = enc.rotate(q, torch.cat([torch.randn(1, 2, 30, 4, generator=g), k], dim=2))
    torch.testing.assert_close(q2 @ k2.transpose(-2, -1), (far_q @ far_k.transpose(-2, -1))[..., 30:], atol=1e-4, rtol=1e-4)
    want = attention(q2, k2, v, None, "reference")
    for backend in ("sdpa", "chunked", "auto"):
        torch.testing.assert_close(attention(q2, k2, v, None, backend), want, atol=1e-5, rtol=1e-4)


def test_a_gpt_learns_the_phase():
    model = GPT(ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=2, train_length=16, position="pope"))
    assert len(model.positions) == 1                    # one module for the stack
    model(torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(0))).square().mean().backward()
    assert model.positions[0].phase.grad is not None and float(model.positions[0].phase.grad.abs().max()) > 0
