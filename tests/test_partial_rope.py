"""partial_rope (positions/rope.py): GPT-NeoX's partial rotary embedding, checked by hand."""

import math

import pytest
import torch

from relbench import positions
from relbench.errors import UsageError
from relbench.positions import forms


def test_defaults_are_gpt_neoxs():
    enc = positions.build("partial_rope", n_heads=2, head_dim=64, train_length=32)
    assert (enc.fraction, enc.base, enc.rotary_dim) == (0.25, 10000.0, 16)     # rotary_pct 0.25 of 64


def test_the_rotation_by_hand():
    """head_dim 16, fraction 0.25: channels 0-3 rotate as a 4-channel RoPE (pairs (0, 2) and (1, 3) at
    frequencies 1 and 10000^(-1/2)); channels 4-15 are untouched."""
    enc = positions.build("partial_rope", n_heads=1, head_dim=16, train_length=32)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 6, 16, generator=g), torch.randn(1, 1, 6, 16, generator=g)
    q2, k2 = enc.rotate(q, k)
    assert torch.equal(q2[..., 4:], q[..., 4:]) and torch.equal(k2[..., 4:], k[..., 4:])
    p = 5
    for pair, theta in ((0, 1.0), (1, 10000 ** -0.5)):
        a, b = q[0, 0, p, pair], q[0, 0, p, pair + 2]
        angle = p * theta
        assert q2[0, 0, p, pair].item() == pytest.approx(float(a * math.cos(angle) - b * math.sin(angle)), abs=1e-6)
        assert q2[0, 0, p, pair + 2].item() == pytest.approx(float(a * math.sin(angle) + b * math.cos(angle)), abs=1e-6)


def test_the_unrotated_channels_carry_no_position():
    """q.k over channels 4-15 is the same at every pair of positions; over 0-3 it depends on i - j only."""
    enc = positions.build("partial_rope", n_heads=1, head_dim=16, train_length=32)
    v = torch.randn(16, generator=torch.Generator().manual_seed(1))
    same = v.expand(1, 1, 40, 16)
    q2, k2 = enc.rotate(same, same)
    content = q2[..., 4:] @ k2[..., 4:].transpose(-2, -1)
    assert torch.allclose(content, content[..., :1, :1].expand_as(content))
    rotary = (q2[..., :4] @ k2[..., :4].transpose(-2, -1))[0, 0]
    assert rotary[10, 3].item() == pytest.approx(rotary[30, 23].item(), abs=1e-4)
    assert rotary[10, 3].item() != pytest.approx(rotary[10, 4].item(), abs=1e-4)


@pytest.mark.parametrize("fraction", [0.0, 1.5, 0.05])
def test_a_fraction_that_rotates_nothing_is_refused(fraction):
    with pytest.raises(UsageError, match="partial_rope"):
        positions.build("partial_rope", n_heads=1, head_dim=16, train_length=32, fraction=fraction)


def test_rope_forms_read_the_rotated_channels():
    """NTK rescales the ladder of the rotated channels (4 here, not 16); p-RoPE keeps int(p * 4 / 2) of them."""
    enc = positions.build("partial_rope", n_heads=1, head_dim=16, train_length=32)
    enc.form = forms.parse_form("partial_rope@ntk:factor=4")
    assert enc.frequencies(128).shape == (2,)
    enc.form = forms.parse_form("partial_rope@prope:p=0.5")
    assert enc.frequencies(128).tolist() == [1.0, 0.0]
