"""Small helpers shared by the tests (not part of the package)."""

from __future__ import annotations

import torch

from relbench import positions


def full_bias(enc: positions.PositionEncoding, q_len: int, k_len: int, q: torch.Tensor | None = None):
    """The bias `enc` adds to the logits of q_len queries over k_len keys, materialised: (H, q_len,
    k_len), (B, H, q_len, k_len) for content-dependent schemes (pass the projected queries q), or
    None when the scheme adds no bias."""
    if not enc.adds_bias:
        return None
    return enc.plan(q_len, k_len, q).full()
