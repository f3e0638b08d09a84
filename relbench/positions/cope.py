"""CoPE, Contextual Position Encoding (Golovneva, Wang, Weston and Sukhbaatar 2024, "Contextual
Position Encoding: Learning to Count What's Important"): positions are counted by the content.

    g_ij = sigmoid(q_i . k_j / sqrt(d))            (0 for future keys: the causal mask is in the logit)
    p_ij = sum_{t = j .. i} g_it, clipped at p_max - 1
    e_ij += q_i . e[p_ij], interpolated between e[floor p_ij] and e[ceil p_ij]

With every gate 1, p_ij = i - j + 1: the key itself counts. Defaults follow the paper's reference
code (its appendix listing, class CoPE(npos_max, head_dim)): the position embeddings are one
(head_dim, npos_max) table per layer shared by its heads, initialised to zero; the gates use the
scaled logits q.k / sqrt(d) with the mask added before the sigmoid; positions are the reversed
cumulative sum of the gates over keys; the position term q.e[p] is added unscaled. `npos_max`
(the paper's p_max) defaults to 64, the value DAPE's official GPT-NeoX code (chuanyang-Zheng/DAPE,
positional_embeddings.py, `CoPE(64, head_dim)`) trains its CoPE baseline with; that code matches
the paper's listing line for line. The counts need every gate of a query row, so the bias is O(L^2) by nature: blocks of
query rows keep the memory O(block x L).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from relbench.errors import UsageError
from relbench.positions.base import PositionEncoding, register
from relbench.positions.plan import BiasPlan, distance_grid


def contextual_positions(gates: Tensor, p_max: int) -> Tensor:
    """p[..., a, b] = sum of gates[..., a, b:] (keys from b to the row's last), clipped at p_max - 1;
    gates of future keys must already be zero."""
    return gates.flip(-1).cumsum(-1).flip(-1).clamp(max=p_max - 1)


def interpolate(table: Tensor, positions: Tensor) -> Tensor:
    """table[..., p] at fractional positions p, linearly between the nearest integers: the CoPE
    term q.e[p] from the products table = q.e[n] for every integer n (..., rows, npos)."""
    floor = positions.floor()
    weight = positions - floor                                           # gradient to the gates flows here
    low = torch.gather(table, -1, floor.long())
    high = torch.gather(table, -1, positions.ceil().long())
    return low + weight * (high - low)


class CopePlan(BiasPlan):
    """The CoPE term of rows of queries, computed per block from the queries, keys and the table."""

    def __init__(self, q: Tensor, k: Tensor, embeddings: Tensor, q_len: int, k_len: int):
        super().__init__(q.shape[1], q_len, k_len)
        self.q, self.k, self.embeddings = q, k, embeddings              # (B, H, Lq, D), (B, H, Lk, D), (D, npos)
        self.offset = k_len - q_len                                      # position of query row 0

    def block(self, q_start: int, q_end: int, k_start: int, k_end: int) -> Tensor:
        last = max(k_end, q_end)              # the counts of key j run over keys j .. i
        return self._term(q_start, q_end, k_start, last)[..., : k_end - k_start]

    def causal_block(self, q_start: int, q_end: int, k_end: int) -> Tensor:
        term = self._term(q_start, q_end, 0, k_end)
        return term.masked_fill_(distance_grid(q_start, q_end, 0, k_end, term.device) < 0, float("-inf"))

    def _term(self, q_start: int, q_end: int, k_start: int, k_end: int) -> Tensor:
        """(B, H, bq, bk) CoPE term for rows [q_start, q_end), keys [k_start, k_end) with k_end past
        every row's query: the counts need every key from j up to the query."""
        q = self.q[..., q_start - self.offset: q_end - self.offset, :]                      # (B, H, bq, D)
        logits = q @ self.k[..., k_start:k_end, :].transpose(-2, -1) / math.sqrt(q.shape[-1])
        future = distance_grid(q_start, q_end, k_start, k_end, q.device) < 0
        gates = torch.sigmoid(logits.masked_fill(future, float("-inf")))                   # (B, H, bq, bk)
        positions = contextual_positions(gates, self.embeddings.shape[-1])
        table = q @ self.embeddings.to(q.dtype)                                             # (B, H, bq, npos)
        return interpolate(table, positions)

    @property
    def requires_grad(self) -> bool:
        return self.q.requires_grad or self.k.requires_grad or self.embeddings.requires_grad


@register("cope")
class Cope(PositionEncoding):
    """Contextual positions counted by sigmoid gates, with a learned (head_dim, npos_max) table of
    position embeddings per layer, shared by its heads as in the paper's code."""

    family = "data-dependent bias"
    formula = "e_ij += q_i . e[p_ij], p_ij = sum_{t=j..i} sigmoid(q_i . k_t / sqrt d), clipped, interpolated"
    shared_across_layers = False
    adds_bias = True
    content_dependent = True
    key_dependent = True

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int, npos_max: int = 64):
        super().__init__(n_heads, head_dim, d_model, train_length)
        if npos_max < 1:
            raise UsageError(f"cope needs npos_max >= 1, got {npos_max}")
        self.npos_max = npos_max
        self.embeddings = nn.Parameter(torch.zeros(head_dim, npos_max))     # (D, npos): column n is e[n]

    def plan(self, q_len: int, k_len: int, q: Tensor | None = None, k: Tensor | None = None,
             x: Tensor | None = None) -> CopePlan:
        if q is None or k is None:
            raise UsageError("cope counts positions with the queries and keys: build its plan with q and k")
        return CopePlan(q, k, self.embeddings, q_len, k_len)

    def reset_parameters(self, generator: torch.Generator) -> None:
        """The paper's code initialises the table to zero: training starts without positions."""
        with torch.no_grad():
            self.embeddings.zero_()

    def extra_repr(self) -> str:
        return f"npos_max={self.npos_max}, head_dim={self.head_dim}"
