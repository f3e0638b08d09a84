"""PaTH attention (Yang et al. 2025, "PaTH Attention: Position Encoding via Accumulating Householder
Transformations", arXiv 2505.16381): between key j and query i the key passes through one
data-dependent Householder-like transform per token in between,

    logit(i, j) = q_i^T H_i H_(i-1) ... H_(j+1) k_j / sqrt(d),     H_t = I - beta_t w_t w_t^T,

so positions are the accumulated product of what the tokens in between say. Checked against the
official code (fla-org/flash-linear-attention, fla/layers/path_attn.py `PaTHAttention` with its
defaults: `w_proj` low rank, Linear(d_model, 32) then Linear(32, H d), no bias; `w_conv1d` a causal
depthwise ShortConvolution of kernel 3 with SiLU and no bias; w L2-normalised per head;
beta_t = 2 sigmoid(`bt_proj`(x_t)), a Linear with bias, so H_t may reflect (negative eigenvalues);
no forget gate, no QK-norm; the decoding path's `rank_one_update` fixes the order: the past keys are
transformed by each new token's H before its own key joins) and its initialisation
(fla/models/path_attn, `_init_weights`: Linear and Conv1d weights normal with std 0.02, biases zero).

relbench runs it as a bias on the plain logits, b_ij = logit(i, j) - q_i . k_j / sqrt(d), which reads
the queries, the keys and the layer input (content-, key- and input-dependent, like Shaw and CoPE):
every softmax path then computes PaTH attention exactly. The plan's blocks run the transforms
backwards from each block's last query, O(rows x keys x d) each: an exact CPU reference, O(L^2 d) per
head, not the official chunked Triton kernels (CUDA only).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from relbench.config import INIT_STD
from relbench.errors import UsageError
from relbench.positions.base import PositionEncoding, register
from relbench.positions.plan import BiasPlan


class HouseholderPlan(BiasPlan):
    """b_ij = (q_i^T H_i ... H_(j+1) k_j - q_i . k_j) / sqrt(d), from q (B, H, q_len, D), k (B, H, k_len,
    D), w (B, H, k_len, D) unit vectors and beta (B, H, k_len)."""

    def __init__(self, q: Tensor, k: Tensor, w: Tensor, beta: Tensor):
        super().__init__(q.shape[1], q.shape[-2], k.shape[-2])
        self.q, self.k, self.w, self.beta = q, k, w, beta
        self.offset = self.k_len - self.q_len            # absolute position of query row 0

    def block(self, q_start: int, q_end: int, k_start: int, k_end: int) -> Tensor:
        rows = self.q[..., q_start - self.offset: q_end - self.offset, :].float()      # (B, H, bq, D)
        keys, bq = self.k.float(), rows.shape[-2]
        # keys from the last query's backwards. delta holds, for the rows at or after key j (a suffix of
        # the block), what the transforms since each row's own position have added to its query: a row
        # joins at its own key with nothing added, and its bias on key j is delta . k_j / sqrt(d) (the
        # plain q . k left to the attention path, never computed here and taken away)
        delta, joined, columns = rows[..., bq:, :], bq, []
        for j in range(min(q_end, self.k_len) - 1, k_start - 1, -1):
            a = max(0, j - q_start)
            if a < joined:
                delta, joined = torch.cat([torch.zeros_like(rows[..., a:joined, :]), delta], dim=-2), a
            if j < k_end:
                columns.append(F.pad((delta * keys[..., j, None, :]).sum(-1), (a, 0)))   # (B, H, bq)
            if j == k_start:      # no key below: H_j would act on nothing (and a graph no loss reaches)
                break
            w = self.w[..., j, None, :]
            step = self.beta[..., j, None, None] * ((rows[..., a:, :] + delta) * w).sum(-1, keepdim=True)
            delta = delta - step * w
        columns = columns[::-1] + [rows.new_zeros(rows.shape[:-1])] * (k_end - k_start - len(columns))
        return (torch.stack(columns, dim=-1) / math.sqrt(rows.shape[-1])).to(self.q.dtype)

    @property
    def requires_grad(self) -> bool:
        return any(t.requires_grad for t in (self.q, self.k, self.w, self.beta))


def causal_conv(x: Tensor, kernel: Tensor) -> Tensor:
    """A causal depthwise convolution of x (B, C, L) by kernel (C, K), as nn.Conv1d(C, C, K, groups=C)
    with K - 1 zeros padded before the sequence: out_t = sum_s kernel[:, s] x_(t - K + 1 + s). Written
    as K shifted products so that what autograd saves is the same at every batch size."""
    size, length = kernel.shape[1], x.shape[-1]
    padded = F.pad(x, (size - 1, 0))
    return sum(padded[..., s: s + length] * kernel[:, s, None] for s in range(size))


@register("path")
class PathAttention(PositionEncoding):
    """PaTH: the keys carried to each query through the Householder transforms of the tokens between."""

    family = "data-dependent transform"
    formula = "q_i^T (I - b_i w_i w_i^T) ... (I - b_(j+1) w_(j+1) w_(j+1)^T) k_j, w, b from the tokens between (PaTH)"
    shared_across_layers = False
    adds_bias = True
    content_dependent = True
    key_dependent = True
    input_dependent = True

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int, rank: int = 32,
                 conv_size: int = 3):
        super().__init__(n_heads, head_dim, d_model, train_length)
        if rank < 1 or conv_size < 1:
            raise UsageError(f"path's rank={rank} and conv_size={conv_size} must be positive")
        width = n_heads * head_dim
        self.w_down = nn.Linear(d_model, rank, bias=False)
        self.w_up = nn.Linear(rank, width, bias=False)
        self.w_conv = nn.Parameter(torch.zeros(width, conv_size))   # a depthwise Conv1d's weight, (H d, 1, K) squeezed
        self.bt = nn.Linear(d_model, n_heads)

    def transforms(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(w (B, H, L, D) unit vectors, beta (B, H, L) in (0, 2)) of the layer input x (B, L, d_model)."""
        B, L, _ = x.shape
        w = self.w_up(self.w_down(x.to(self.bt.weight.dtype))).transpose(1, 2)    # (B, H D, L)
        w = F.silu(causal_conv(w, self.w_conv))                                     # causal: no later token
        # a copy at every batch size (at one sequence reshape would view it, and what autograd saves would
        # not be linear in the batch: cost/memory.py fits it as a line)
        w = F.normalize(w.transpose(1, 2).contiguous().view(B, L, self.n_heads, self.head_dim).float(), dim=-1)
        return w.transpose(1, 2), 2 * torch.sigmoid(self.bt(x.to(self.bt.weight.dtype)).float()).transpose(1, 2)

    def plan(self, q_len: int, k_len: int, q: Tensor | None = None, k: Tensor | None = None,
             x: Tensor | None = None) -> HouseholderPlan:
        if q is None or k is None or x is None or x.shape[-2] != k_len:
            raise UsageError(f"path transforms the keys by the layer input: build its plan with q, k and x of {k_len} positions")
        w, beta = self.transforms(x)
        return HouseholderPlan(q, k, w, beta)

    def reset_parameters(self, generator: torch.Generator) -> None:
        with torch.no_grad():
            for weight in (self.w_down.weight, self.w_up.weight, self.w_conv, self.bt.weight):
                weight.copy_(torch.randn(weight.shape, generator=generator) * INIT_STD)
            self.bt.bias.zero_()

    def extra_repr(self) -> str:
        return f"heads={self.n_heads}, rank={self.w_down.out_features}, conv={self.w_conv.shape[1]}"
