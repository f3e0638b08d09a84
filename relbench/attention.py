"""Causal attention with an optional position bias, behind one function.

q, k, v are (B, H, L, D) with queries the LAST Lq of the Lk key positions. Backends:

- `reference`: materialise the scores, add the bias, mask, softmax (the seed's path; the
  baseline every other path is tested against).
- `sdpa`: torch's scaled_dot_product_attention; `is_causal` without a bias, a float mask
  (bias + causal -inf) with one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from relbench.errors import unknown
from relbench.positions.base import PositionEncoding

BACKENDS = ("auto", "reference", "sdpa")


def causal_mask(q_len: int, k_len: int, device=None) -> Tensor:
    """(Lq, Lk) boolean, True where the key lies after the query (masked)."""
    query_pos = torch.arange(k_len - q_len, k_len, device=device)
    return torch.arange(k_len, device=device)[None, :] > query_pos[:, None]


def logits_bias(position: PositionEncoding | None, q: Tensor, k_len: int,
                bias: Tensor | None = None) -> Tensor | None:
    """The total additive bias, (H, Lq, Lk) or (B, H, Lq, Lk), or None when the scheme has none.

    `bias` is a content-independent bias already built by the caller (shared across layers);
    without it the position builds its own."""
    if position is None:
        return bias
    if bias is None:
        bias = position.bias(q.shape[-2], k_len)
    query_bias = position.query_bias(q, k_len)
    if query_bias is None:
        return bias
    return query_bias if bias is None else query_bias + bias


def reference_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    q_len, k_len = q.shape[-2], k.shape[-2]
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, Lq, Lk)
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    scores = scores.masked_fill(causal_mask(q_len, k_len, q.device), float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)                    # (B, H, Lq, D)


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    q_len, k_len = q.shape[-2], k.shape[-2]
    if bias is None and q_len == k_len:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    mask = torch.zeros(q_len, k_len, dtype=q.dtype, device=q.device) if bias is None else bias.to(q.dtype)
    mask = mask.masked_fill(causal_mask(q_len, k_len, q.device), float("-inf"))  # (H?, Lq, Lk)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise unknown("attention backend", backend, list(BACKENDS))
    return "sdpa" if backend == "auto" else backend


def attention(q: Tensor, k: Tensor, v: Tensor, position: PositionEncoding | None = None,
              backend: str = "auto", bias: Tensor | None = None) -> Tensor:
    """Causal attention of q (B, H, Lq, D) over k, v (B, H, Lk, D) with `position`'s bias.

    Rotary schemes must already have rotated q and k (`position.rotate`)."""
    total = logits_bias(position, q, k.shape[-2], bias)
    path = resolve_backend(backend)
    if path == "reference":
        return reference_attention(q, k, v, total)
    return sdpa_attention(q, k, v, total)
