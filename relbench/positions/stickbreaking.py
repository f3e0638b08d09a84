"""Stick-breaking attention (Tan, Shen, Yang, Courville and Panda 2025, "Scaling Stick-Breaking
Attention: An Efficient Implementation and In-depth Study", ICLR 2025, arXiv 2410.17980): no softmax
and no position encoding. Query i breaks a stick from the nearest key backwards: key j takes the
share beta_ij = sigmoid(z_ij) of what the keys between them left,

    A_ij = sigmoid(z_ij) * prod_{j < k < i} (1 - sigmoid(z_ik)),     z_ij = q_i . k_j / sqrt(d),

so order enters through the product alone, and nearer keys are served first. What is left of the
stick, 1 - sum_j A_ij, goes to the query's own value v_i.

Defaults, checked against the official code (shawntan/stickbreaking-attention, `sb_ref.stickbreaking`
and the reference of tests/test_attn.py): logits scaled by 1/sqrt(d); keys strictly before the query
(`attend_current = False`: the product and the keys run over k < i; True: k <= i); the remainder added
as rem * v_i. It is not a bias on softmax logits: the scheme replaces the attention itself
(`replaces_softmax`), so the bias backends, `--attention` and FlexAttention do not apply. The CPU path is
exact and O(L^2): log A_ij = log sigmoid(z_ij) + sum_{j<k<i} log sigmoid(-z_ik), the sum an exclusive
reverse cumulative sum along the keys, in blocks of query rows for memory; the official Triton kernel
(CUDA only) is not used."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from relbench.errors import UsageError
from relbench.positions.base import PositionEncoding, register


def stick_breaking_weights(q: Tensor, k: Tensor, q_start: int, attend_current: bool = False) -> tuple[Tensor, Tensor]:
    """The weights A_ij (B, H, q, k_len) of queries at absolute positions q_start .. q_start + q - 1 over
    keys 0 .. k_len - 1 (zero on the keys a query may not attend), and each query's remainder (B, H, q).
    The remainder is the whole product prod_k (1 - beta_ik) = 1 - sum_j A_ij, read in log space from
    the same sums: exact and never negative, where 1 - sum rounds below 0 once the sum is near 1."""
    z = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])                       # (B, H, q, k)
    rows = torch.arange(q_start, q_start + q.shape[-2], device=q.device)[:, None]
    keys = torch.arange(k.shape[-2], device=q.device)[None, :]
    allowed = keys <= rows if attend_current else keys < rows                     # (q, k)
    log_take = F.logsigmoid(z).masked_fill(~allowed, float("-inf"))              # log beta_ij
    log_leave = F.logsigmoid(-z).masked_fill(~allowed, 0.0)                      # log (1 - beta_ik)
    # sum over k >= j of log_leave[k], then shifted by one key to k > j (exact, no subtraction)
    from_key = log_leave.flip(-1).cumsum(-1).flip(-1)
    after = torch.cat([from_key[..., 1:], torch.zeros_like(from_key[..., :1])], dim=-1)
    return torch.exp(log_take + after), torch.exp(from_key[..., 0])


BLOCK_BYTES = 64 << 20     # one (B, H, rows, keys) fp32 tensor of a block within this; a block holds a few
BLOCK_ROWS = (16, 512)     # query rows per block, at least and at most


def block_rows(batch_heads: int, k_len: int) -> int:
    """Query rows per block: as many as keep one (B, H, rows, k_len) fp32 tensor within BLOCK_BYTES
    (a block holds about five of them, and autograd keeps them for backward), within BLOCK_ROWS."""
    return min(BLOCK_ROWS[1], max(BLOCK_ROWS[0], BLOCK_BYTES // (4 * batch_heads * max(1, k_len))))


def stick_breaking_attention(q: Tensor, k: Tensor, v: Tensor, attend_current: bool = False,
                             block: int | None = None) -> Tensor:
    """(B, H, q_len, D): stick-breaking attention of q (B, H, q_len, D), the last q_len of k_len
    positions, over k, v (B, H, k_len, D), the remainder on each query's own value; in blocks of
    `block` query rows (`block_rows` by default)."""
    q_len, k_len = q.shape[-2], k.shape[-2]
    if q_len > k_len:
        raise UsageError(f"stick-breaking attention needs queries among the keys: {q_len} queries, {k_len} keys")
    offset = k_len - q_len
    block = block_rows(q.shape[0] * q.shape[1], k_len) if block is None else block
    outputs = []
    for start in range(0, q_len, block):
        end = min(q_len, start + block)
        keys = offset + end                                                      # later keys get no weight
        weights, remainder = stick_breaking_weights(q[..., start:end, :], k[..., :keys, :], offset + start,
                                                    attend_current)
        out = weights.to(v.dtype) @ v[..., :keys, :]
        outputs.append(out + remainder[..., None].to(v.dtype) * v[..., offset + start: offset + end, :])
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-2)


@register("stickbreaking")
class StickBreaking(PositionEncoding):
    """Stick-breaking attention in place of softmax attention; no position encoding, no parameters."""

    family = "stick-breaking attention (no softmax; not a bias)"
    formula = ("A_ij = sigmoid(z_ij) * prod_{j<k<i} (1 - sigmoid(z_ik)), z = q.k / sqrt d, no softmax; "
               "the rest of the stick on v_i (Tan et al. 2025)")
    replaces_softmax = True

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int, attend_current: bool = False):
        super().__init__(n_heads, head_dim, d_model, train_length)
        self.attend_current = attend_current

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor | None:
        return stick_breaking_attention(q, k, v, self.attend_current)

    def attention_weights(self, q: Tensor, k: Tensor) -> Tensor | None:
        q_len, k_len = q.shape[-2], k.shape[-2]
        weights, remainder = stick_breaking_weights(q, k, k_len - q_len, self.attend_current)
        rows = torch.arange(q_len, device=q.device)
        weights[..., rows, rows + k_len - q_len] += remainder                     # the rest on v_i
        return weights

    def extra_repr(self) -> str:
        return f"attend_current={self.attend_current}"
