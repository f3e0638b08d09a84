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
        position = torch.arange(q_start, q_end, device=rows.device)
        u, columns = rows, []
        for j in range(min(q_end, self.k_len) - 1, k_start - 1, -1):     # keys from the last query's backwards
            if j < k_end:
                columns.append((u * self.k[..., j, None, :].float()).sum(-1))        # u_j . k_j, (B, H, bq)
            seen = (position >= j).to(u.dtype)[:, None]                           # rows past key j take H_j
            step = self.beta[..., j, None, None] * (u * self.w[..., j, None, :]).sum(-1, keepdim=True)
            u = u - seen * step * self.w[..., j, None, :]
        path = torch.stack(columns[::-1], dim=-1) if columns else rows.new_zeros(*rows.shape[:-1], 0)
        path = path[..., : k_end - k_start] if path.shape[-1] >= k_end - k_start else F.pad(
            path, (0, k_end - k_start - path.shape[-1]))                           # keys after every query
        plain = rows @ self.k[..., k_start:k_end, :].float().transpose(-2, -1)
        return ((path - plain) / math.sqrt(rows.shape[-1])).to(self.q.dtype)

    @property
    def requires_grad(self) -> bool:
        return any(t.requires_grad for t in (self.q, self.k, self.w, self.beta))


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
        self.w_conv = nn.Conv1d(width, width, conv_size, groups=width, bias=False)
        self.bt = nn.Linear(d_model, n_heads)

    def transforms(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(w (B, H, L, D) unit vectors, beta (B, H, L) in (0, 2)) of the layer input x (B, L, d_model)."""
        B, L, _ = x.shape
        w = self.w_up(self.w_down(x.to(self.bt.weight.dtype))).transpose(1, 2)    # (B, H D, L)
        w = F.silu(self.w_conv(F.pad(w, (self.w_conv.kernel_size[0] - 1, 0))))    # causal: no later token
        w = F.normalize(w.transpose(1, 2).reshape(B, L, self.n_heads, self.head_dim).float(), dim=-1)
        return w.transpose(1, 2), 2 * torch.sigmoid(self.bt(x.to(self.bt.weight.dtype)).float()).transpose(1, 2)

    def plan(self, q_len: int, k_len: int, q: Tensor | None = None, k: Tensor | None = None,
             x: Tensor | None = None) -> HouseholderPlan:
        if q is None or k is None or x is None or x.shape[-2] != k_len:
            raise UsageError(f"path transforms the keys by the layer input: build its plan with q, k and x of {k_len} positions")
        w, beta = self.transforms(x)
        return HouseholderPlan(q, k, w, beta)

    def reset_parameters(self, generator: torch.Generator) -> None:
        with torch.no_grad():
            for weight in (self.w_down.weight, self.w_up.weight, self.w_conv.weight, self.bt.weight):
                weight.copy_(torch.randn(weight.shape, generator=generator) * INIT_STD)
            self.bt.bias.zero_()

    def extra_repr(self) -> str:
        return f"heads={self.n_heads}, rank={self.w_down.out_features}, conv={self.w_conv.kernel_size[0]}"
