"""cable (positions/fox.py): CABLE's context-aware bias, by hand against its official code's formula."""

import math

import torch
import torch.nn.functional as F

from relbench import positions
from relbench.attention import attention


def built():
    enc = positions.build("cable", n_heads=2, head_dim=4, d_model=8, train_length=16)
    enc.reset_parameters(torch.Generator().manual_seed(0))
    return enc


def test_defaults_are_the_codes():
    enc = built()
    assert torch.equal(enc.gate.bias, torch.zeros(2))                     # h_attn's bias starts at zero
    assert 0.005 < float(enc.gate.weight.std()) < 0.04                    # normal, std 0.02
    assert not enc.shared_across_layers and enc.input_dependent


@torch.no_grad()
def test_the_attention_by_hand():
    """softmax_j(q_i . k_j + b_i - b_j), b = cumsum(-softplus(h(x))): the code's unscaled logits."""
    enc = built()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 7, 8, generator=g)
    q, k, v = (torch.randn(1, 2, 7, 4, generator=g) for _ in range(3))
    b = torch.cumsum(-F.softplus(x @ enc.gate.weight.T + enc.gate.bias), dim=1).permute(0, 2, 1)   # (1, H, T)
    logits = q @ k.transpose(-2, -1) + (b[..., :, None] - b[..., None, :])
    logits = logits.masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf"))
    want = torch.softmax(logits, -1) @ v
    qq, kk, plan = enc.prepare(q, k, x=x)
    for backend in ("reference", "chunked", "auto"):
        torch.testing.assert_close(attention(qq, kk, v, plan, backend), want, atol=1e-5, rtol=1e-4)
    assert math.isclose(float((qq / q).mean()), 2.0, rel_tol=1e-5)      # sqrt(head_dim 4)
