"""DAPE, Data-Adaptive Positional Encoding (Zheng, Gao, Shi, Xiong, Sun, Li, Huang, Ren, Ng, Jiang,
Li and Li 2024, "DAPE: Data-Adaptive Positional Encoding for Length Extrapolation", NeurIPS 2024):
the bias of a base scheme refined by a small MLP across heads that also sees the attention logits,

    logits = A + B + f([A; B]),   A = q.k / sqrt(d) (H values per pair),  B = base bias (H values),

f: R^2H -> R^H applied to every (i, j) pair, mixing the heads. The bias this scheme adds is
B + f([A; B]); attention adds A itself.

Defaults, checked against the official code (chuanyang-Zheng/DAPE, DAPE.py: AliBi_DAPE and
ParallelKerpleLog_DAPE, `x + bias + mlp2(cat(x, bias))` on the scaled scores; its 125M configs set
mlp_width 32): the base is KERPLE's logarithmic variant (DAPE-Kerple; `base=alibi` for
DAPE-ALiBi), f is a two-layer MLP 2H -> `width` -> H with `width` = 32 and a LeakyReLU between,
PyTorch's default Linear initialisation, one MLP and one base kernel per layer (as there). The MLP runs on every pair, so
the bias is O(L^2 x width) by nature; blocks of query rows keep it O(block x L x width).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from relbench.errors import UsageError
from relbench.positions.base import PositionEncoding, RelativeBias, build, register
from relbench.positions.plan import BiasPlan, distance_grid

BASES = {"kerple": "kerple-log", "alibi": "alibi"}   # option value -> registered base scheme


class DapePlan(BiasPlan):
    """B + f([A; B]) for blocks of query rows: the logits A of the block, the base plan's block B."""

    def __init__(self, dape: Dape, q: Tensor, k: Tensor, q_len: int, k_len: int):
        super().__init__(q.shape[1], q_len, k_len)
        self.dape, self.q, self.k = dape, q, k                     # (B, H, Lq, D), (B, H, Lk, D)
        self.base = dape.base.plan(q_len, k_len)                    # (H, ...) distance plan
        self.offset = k_len - q_len

    def block(self, q_start: int, q_end: int, k_start: int, k_end: int) -> Tensor:
        q = self.q[..., q_start - self.offset: q_end - self.offset, :]                    # (B, H, bq, D)
        logits = q @ self.k[..., k_start:k_end, :].transpose(-2, -1) / math.sqrt(q.shape[-1])
        base = self.base.block(q_start, q_end, k_start, k_end).to(logits.dtype)           # (H, bq, bk)
        return self.dape.refine(logits, base.expand_as(logits))                           # (B, H, bq, bk)

    def causal_block(self, q_start: int, q_end: int, k_end: int) -> Tensor:
        bias = self.block(q_start, q_end, 0, k_end)
        return bias.masked_fill_(distance_grid(q_start, q_end, 0, k_end, bias.device) < 0, float("-inf"))

    @property
    def requires_grad(self) -> bool:
        return self.q.requires_grad or self.k.requires_grad or any(p.requires_grad for p in self.dape.parameters())


@register("dape")
class Dape(PositionEncoding):
    """A base bias (KERPLE-log or ALiBi) plus an MLP over the heads of [logits, base bias]; one per layer."""

    family = "data-dependent bias"
    formula = "e_ij += B_ij + MLP([A_ij; B_ij]) across heads, A = q.k / sqrt d, B = KERPLE-log (or ALiBi)"
    shared_across_layers = False
    adds_bias = True
    content_dependent = True
    key_dependent = True

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int, base: str = "kerple",
                 width: int = 32):
        super().__init__(n_heads, head_dim, d_model, train_length)
        if base not in BASES:
            raise UsageError(f'dape\'s base must be one of {", ".join(BASES)}, got "{base}"')
        if width < 1:
            raise UsageError(f"dape needs width >= 1, got {width}")
        self.base_name = base
        self.base: RelativeBias = build(BASES[base], n_heads=n_heads, head_dim=head_dim, d_model=d_model,
                                        train_length=train_length)
        self.mlp = nn.Sequential(nn.Linear(2 * n_heads, width), nn.LeakyReLU(), nn.Linear(width, n_heads))

    def refine(self, logits: Tensor, base: Tensor) -> Tensor:
        """B + f([A; B]) for logits A and base bias B, both (B, H, q, k): the MLP runs over the heads."""
        features = torch.cat([logits, base], dim=1).movedim(1, -1)                        # (B, q, k, 2H)
        return base + self.mlp(features.to(self.mlp[0].weight.dtype)).movedim(-1, 1).to(base.dtype)

    def plan(self, q_len: int, k_len: int, q: Tensor | None = None, k: Tensor | None = None,
             x: Tensor | None = None) -> DapePlan:
        if q is None or k is None:
            raise UsageError("dape's MLP reads the attention logits: build its plan with q and k")
        return DapePlan(self, q, k, q_len, k_len)

    def reset_parameters(self, generator: torch.Generator) -> None:
        self.base.reset_parameters(generator)
        with torch.no_grad():
            for layer in (self.mlp[0], self.mlp[2]):  # PyTorch's default Linear init, from our generator
                bound = layer.in_features ** -0.5
                layer.weight.copy_((torch.rand(layer.weight.shape, generator=generator) * 2 - 1) * bound)
                layer.bias.copy_((torch.rand(layer.bias.shape, generator=generator) * 2 - 1) * bound)

    def project_parameters(self) -> None:
        self.base.project_parameters()

    def extra_repr(self) -> str:
        return f"base={self.base_name}, width={self.mlp[0].out_features}, heads={self.n_heads}"
