"""HoPE: RoPE whose pairs that turn less than one full turn over the training length are left
unrotated. The kept pairs by hand, the unrotated channels' part of q.k independent of position, RoPE
itself when every pair is kept, the option's bound."""

import math

import pytest
import torch

from relbench import positions
from relbench.errors import UsageError

H, D = 2, 8


def build(spec: str = "hope", train_length: int = 32):
    return positions.build_spec(spec, n_heads=H, head_dim=D, train_length=train_length)


def test_kept_pairs_by_hand():
    # theta_c = 10000^(-2c/8) = 1, 0.1, 0.01, 0.001; times 32: 32, 3.2, 0.32, 0.032 against 2 pi = 6.28
    torch.testing.assert_close(build().frequencies(32), torch.tensor([1.0, 0.0, 0.0, 0.0]))
    # at a training length of 64, 0.1 * 64 = 6.4 >= 2 pi keeps the second pair too
    torch.testing.assert_close(build(train_length=64).frequencies(64), torch.tensor([1.0, 0.1, 0.0, 0.0]))
    # cycles=0.5: a half turn suffices: 3.2 >= pi keeps pair 1, 0.32 < pi drops pair 2
    torch.testing.assert_close(build("hope:cycles=0.5").frequencies(32), torch.tensor([1.0, 0.1, 0.0, 0.0]))
    # the frequencies do not depend on the evaluated length: no angle at 64x was unseen at 1x
    torch.testing.assert_close(build().frequencies(32 * 64), build().frequencies(32))


def test_unrotated_channels_are_position_independent_and_the_rest_is_rope():
    hope, rope = build(), positions.build("rope", n_heads=H, head_dim=D, train_length=32)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, H, 40, D, generator=g), torch.randn(1, H, 40, D, generator=g)
    q_h, k_h = hope.rotate(q, k)
    # channels (c, c + 4) of pairs 1-3 are untouched, pair 0 (channels 0 and 4) rotated as RoPE's
    still = [1, 2, 3, 5, 6, 7]
    torch.testing.assert_close(q_h[..., still], q[..., still])
    torch.testing.assert_close(k_h[..., still], k[..., still])
    q_r, k_r = rope.rotate(q, k)
    torch.testing.assert_close(q_h[..., [0, 4]], q_r[..., [0, 4]])
    torch.testing.assert_close(k_h[..., [0, 4]], k_r[..., [0, 4]])
    # the same query and key vector at distance 3 and at distance 30: only pair 0's part moves
    vec = torch.randn(1, H, 1, D, generator=g)
    same = vec.expand(1, H, 40, D)
    qs, ks = hope.rotate(same, same)
    near, far = (qs[..., 33, :] * ks[..., 30, :]), (qs[..., 33, :] * ks[..., 3, :])
    torch.testing.assert_close(near[..., still], far[..., still])
    assert not torch.allclose(near[..., [0, 4]].sum(-1), far[..., [0, 4]].sum(-1))


def test_every_pair_kept_is_rope():
    hope = build("hope:cycles=0.000001")
    assert bool(hope.kept().all())
    rope = positions.build("rope", n_heads=H, head_dim=D, train_length=32)
    q, k = torch.randn(2, H, 9, D), torch.randn(2, H, 9, D)
    for a, b in zip(hope.rotate(q, k), rope.rotate(q, k)):
        torch.testing.assert_close(a, b)


def test_threshold_is_one_full_turn():
    # a pair exactly at one turn over the training length stays rotary, just below it does not
    hope = build(train_length=64)
    theta = torch.tensor(10000.0) ** (-2 / 8)                        # 0.1: 6.4 turns-radians over 64
    assert math.isclose(float(theta) * 64, 6.4, rel_tol=1e-6)
    assert hope.kept().tolist() == [True, True, False, False]
    assert build(train_length=62).kept().tolist() == [True, False, False, False]   # 6.2 < 2 pi


def test_cycles_must_be_positive():
    with pytest.raises(UsageError, match="must be positive"):
        build("hope:cycles=0")
