"""FoX, the Forgetting Transformer (Lin, Nikishin, He and Courville 2025, "Forgetting Transformer:
Softmax Attention with a Forget Gate", ICLR 2025): each head has a scalar forget gate per token,

    f_t = sigmoid(w_h . x_t + b_h),     logit(i, j) += sum_{t = j+1 .. i} log f_t  (= F_i - F_j),

with x_t the attention layer's input (after its LayerNorm) and F the running sum of log f. It is
the only position information: FoX uses no RoPE or other encoding ("No other position encoding").
Within a query row F_i is a constant, so the bias is exactly a per-key term plus a per-row one,
which is what its fast block uses.

Defaults, checked against the official code (zhixuan-lin/forgetting-transformer, the `full`
forget gate of modeling_forgetting_transformer.py): the gate is `fgate_proj`, a linear map with
bias of the layer input (after the attention LayerNorm) to one logit per head, one per layer; its
weight is drawn like the model's other projections (normal, std 0.02, the repository's
initializer_range) and its bias is zero (`fgate_bias_init` off, the default: f = 0.5 for a zero
input). The repository's `fgate_bias_init` (biases spread over decay times, for its data-
independent gates) and FoX (Pro)'s output gate, QK-norm and key shift are not here: set `bias_init` for that.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from relbench.config import INIT_STD
from relbench.errors import UsageError
from relbench.positions.base import PositionEncoding, register
from relbench.positions.plan import BiasPlan, distance_grid


def anchored_log_forget(log_f: Tensor, anchor: int, lo: int, hi: int) -> Tensor:
    """(..., hi - lo): G_t for t in [lo, hi), with G_t - G_s = sum_{u = s+1 .. t} log f_u for any s, t
    and G_anchor = 0 (lo <= anchor < hi). Summing outwards from an anchor in the block (forward
    after it, backward before it) keeps the terms near the block small and exact in fp32 at any
    length, where F_i - F_j of one running sum from position 0 would cancel two large numbers."""
    after = log_f[..., anchor + 1: hi].cumsum(-1)                                  # G_{anchor+1 .. hi-1}
    before = log_f[..., lo + 1: anchor + 1].flip(-1).cumsum(-1).flip(-1)           # -G_{lo .. anchor-1}
    zero = log_f.new_zeros(*log_f.shape[:-1], 1)
    return torch.cat([-before, zero, after], dim=-1)


class ForgetPlan(BiasPlan):
    """sum_{t = j+1 .. i} log f_t, held as the (B, H, k_len) log forget gates of every position."""

    separable = True       # F_i - F_j: a per-row plus a per-key term (CPU inference: split-linear)

    def __init__(self, log_f: Tensor, q_len: int, k_len: int):
        super().__init__(log_f.shape[1], q_len, k_len)
        self.log_f = log_f                                                          # (B, H, k_len)

    def block(self, q_start: int, q_end: int, k_start: int, k_end: int) -> Tensor:
        lo, hi = min(q_start, k_start), max(q_end, k_end)
        g = anchored_log_forget(self.log_f, q_start, lo, hi)                        # (B, H, hi - lo)
        rows, keys = g[..., q_start - lo: q_end - lo], g[..., k_start - lo: k_end - lo]
        return rows[..., :, None] - keys[..., None, :]                              # (B, H, bq, bk)

    def causal_block(self, q_start: int, q_end: int, k_end: int) -> Tensor:
        """The block as one per-row column minus one per-key row, anchored at the block's first query
        (O(L) sums, then one broadcast subtraction), with the causal -inf written in place."""
        g = anchored_log_forget(self.log_f, q_start, 0, k_end)                      # (B, H, k_end)
        bias = g[..., q_start:q_end, None] - g[..., None, :]                        # (B, H, bq, k_end)
        return bias.masked_fill_(distance_grid(q_start, q_end, 0, k_end, bias.device) < 0, float("-inf"))

    def key_terms(self, anchor: int, k_end: int) -> Tensor:
        """F_i - F_j = (F_anchor - F_j) + (F_i - F_anchor): c(j) - c(anchor) = -G_j, the sums anchored there."""
        return -anchored_log_forget(self.log_f, anchor, 0, k_end)                  # (B, H, k_end)

    @property
    def requires_grad(self) -> bool:
        return self.log_f.requires_grad


@register("fox")
class ForgettingGate(PositionEncoding):
    """A forget gate per head, f_t = sigmoid(w_h . x_t + b_h), from the layer input; one per layer."""

    family = "data-dependent bias"
    formula = "e_ij += sum_{t=j+1..i} log f_t, f_t = sigmoid(w_h . x_t + b_h) per head (FoX)"
    shared_across_layers = False
    adds_bias = True
    input_dependent = True
    separable = True

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int, bias_init: float = 0.0):
        super().__init__(n_heads, head_dim, d_model, train_length)
        self.bias_init = bias_init
        self.gate = nn.Linear(d_model, n_heads)                      # x_t -> one forget logit per head

    def log_forget(self, x: Tensor) -> Tensor:
        """(B, H, L) log f_t for the layer input x (B, L, d_model)."""
        return F.logsigmoid(self.gate(x.to(self.gate.weight.dtype))).transpose(1, 2)

    def plan(self, q_len: int, k_len: int, q: Tensor | None = None, k: Tensor | None = None,
             x: Tensor | None = None) -> ForgetPlan:
        if x is None or x.shape[-2] != k_len:
            raise UsageError(f"fox's forget gates read the layer input: build its plan with x of {k_len} positions")
        return ForgetPlan(self.log_forget(x), q_len, k_len)

    def reset_parameters(self, generator: torch.Generator) -> None:
        with torch.no_grad():
            self.gate.weight.copy_(torch.randn(self.gate.weight.shape, generator=generator) * INIT_STD)
            self.gate.bias.fill_(self.bias_init)

    def extra_repr(self) -> str:
        return f"heads={self.n_heads}, bias_init={self.bias_init:g}"


@register("cable")
class ContextAwareBias(ForgettingGate):
    """CABLE (Veisi and Mansourian 2025, "Context-aware Biases for Length Extrapolation"; official code
    axiomlab/Cable, src/Cable.py, CausalSelfAttention): per head and token a bias g_t = h(x_t), a linear
    map with bias of the layer input (`h_attn`, nn.Linear(n_embd, n_head): weight normal std 0.02, bias
    zero, the repository's _init_weights), and

        b = cumsum(-softplus(g)),   logit(i, j) += b_i - b_j = -sum_{t = j+1 .. i} softplus(g_t).

    Since -softplus(g) = log sigmoid(-g), this is FoX's bias with the gate's sign flipped (one
    function class; at their zero-mean initialisation the two are distributed alike), and it runs on
    FoX's plan and paths. What differs is the code's logit scale: it divides q and k by
    sqrt(C / n_embd) = 1, so q.k is not divided by sqrt(head_dim); relbench follows the code and
    multiplies q by sqrt(head_dim) against its attention paths' 1/sqrt(d). CABLE with the usual scale
    is `fox` (the sign of a learned gate aside)."""

    formula = "e_ij += b_i - b_j, b = cumsum(-softplus(w_h . x_t + c_h)) per head (CABLE); q.k not scaled by 1/sqrt(d)"
    rotates = True          # the code's logit scale: q times sqrt(head_dim)

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int):
        super().__init__(n_heads, head_dim, d_model, train_length, bias_init=0.0)

    def log_forget(self, x: Tensor) -> Tensor:
        """(B, H, L) -softplus(g_t) for the layer input x (B, L, d_model)."""
        return -F.softplus(self.gate(x.to(self.gate.weight.dtype))).transpose(1, 2)

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        return q * self.head_dim ** 0.5, k

    def extra_repr(self) -> str:
        return f"heads={self.n_heads}"
