"""The T5 relative position bias (Raffel et al. 2020, "Exploring the Limits of Transfer Learning
with a Unified Text-to-Text Transformer", sec. 2.1; mesh-tensorflow's `_relative_position_bucket`):
a learned scalar per head for each of 32 buckets of relative distance, shared by all layers."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from relbench.errors import UsageError
from relbench.positions.base import RelativeBias, register, table_rows


def relative_position_bucket(relative_position: Tensor, bidirectional: bool = True,
                             num_buckets: int = 32, max_distance: int = 128) -> Tensor:
    """Bucket of each relative_position = key position - query position, as in T5.

    Unidirectional: only n = query - key >= 0 (past keys) is distinguished; future keys share
    bucket 0. Bidirectional: half of the buckets go to future keys (offset num_buckets // 2).
    Within a direction's `nb` buckets, distances below nb // 2 get their own bucket; the rest are
    spaced logarithmically up to `max_distance`, and every farther distance is in the last bucket.
    """
    n = -relative_position.long()                       # query - key
    offset = torch.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        offset = (n < 0).long() * num_buckets            # keys after the query: the upper half
        n = n.abs()
    else:
        n = n.clamp(min=0)
    max_exact = num_buckets // 2
    # log-spaced region, computed on n >= max_exact only (clamp keeps log() finite elsewhere)
    scaled = torch.log(n.clamp(min=max_exact).float() / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (scaled * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return offset + torch.where(n < max_exact, n, large)


@register("t5")
class T5Bias(RelativeBias):
    """T5's bucketed bias: 32 buckets, max distance 128, one scalar per bucket and head, one table
    shared by every layer. Causal models use the unidirectional buckets; `bidirectional=true`
    gives future keys their own half of the buckets (as in T5's encoder)."""

    formula = "b = T[bucket(i-j), h]; 16 exact buckets, 16 log-spaced to 128, then constant"
    shared_across_layers = True
    has_horizon = True

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int,
                 num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = False):
        super().__init__(n_heads, head_dim, d_model, train_length)
        half = num_buckets // 2 if bidirectional else num_buckets
        if half < 2 or max_distance <= half // 2:
            raise UsageError(f"t5 needs num_buckets >= {4 if bidirectional else 2} and max_distance above "
                             f"the exact buckets; got num_buckets={num_buckets}, max_distance={max_distance}")
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.bidirectional = bidirectional
        self.table = nn.Parameter(torch.zeros(num_buckets, n_heads))  # (buckets, H)
        # first distance from which every farther past key shares the last bucket
        n = torch.arange(max_distance + 1, device="cpu")   # a fact of the options: computed on the CPU wherever
                                                           # the module is built (the meta device has no values)
        buckets = relative_position_bucket(-n, bidirectional, num_buckets, max_distance)
        self._horizon = int((buckets != buckets[-1]).nonzero().max()) + 1

    def horizon(self) -> int:
        return self._horizon

    def distance_bias(self, distance: Tensor) -> Tensor:
        bucket = relative_position_bucket(-distance, self.bidirectional, self.num_buckets, self.max_distance)
        return table_rows(self.table, bucket).movedim(-1, 0)  # (H, *shape)

    def reset_parameters(self, generator: torch.Generator) -> None:
        # T5 initialises the relative attention bias from N(0, 1) * factor with factor 1.0 (HF's
        # T5PreTrainedModel); a causal LM from scratch trains more stably from a small start.
        with torch.no_grad():
            self.table.copy_(torch.randn(self.table.shape, generator=generator) * 0.02)

    def extra_repr(self) -> str:
        return f"buckets={self.num_buckets}, max_distance={self.max_distance}, bidirectional={self.bidirectional}"


def log2_bucket(distance: Tensor, max_distance: int = 1024) -> Tensor:
    """The seed's simplified bucketing of i - j: bucket 0 for distance 0 (and for future keys),
    bucket 1 + floor(log2(d)) for 1 <= d < max_distance (boundaries 1, 2, 4, ..., max_distance),
    and one last bucket for every distance >= max_distance."""
    d = distance.long().clamp(min=0)
    last = int(math.log2(max_distance)) + 1
    exponent = torch.floor(torch.log2(d.clamp(min=1).double())).long() + 1
    return torch.where(d == 0, torch.zeros_like(d), exponent).clamp(max=last)


@register("t5-log2")
class T5Log2(RelativeBias):
    """The seed's pseudo-code version of T5's buckets: power-of-two boundaries 1, 2, 4, ..., 1024
    and one bucket beyond (12 buckets), one learned scalar per bucket and head, shared by every
    layer, so the seed's simplification can be compared with canonical `t5`."""

    formula = "b = T[min(1 + floor(log2(i-j)), 11), h], T[0] at distance 0; shared by layers"
    shared_across_layers = True
    has_horizon = True

    def __init__(self, n_heads: int, head_dim: int, d_model: int, train_length: int, max_distance: int = 1024):
        super().__init__(n_heads, head_dim, d_model, train_length)
        if max_distance < 1 or max_distance & (max_distance - 1):
            raise UsageError(f"t5-log2 needs a power-of-two max_distance, got {max_distance}")
        self.max_distance = max_distance
        self.table = nn.Parameter(torch.zeros(int(math.log2(max_distance)) + 2, n_heads))  # (buckets, H)

    def distance_bias(self, distance: Tensor) -> Tensor:
        return table_rows(self.table, log2_bucket(distance, self.max_distance)).movedim(-1, 0)   # (H, *shape)

    def horizon(self) -> int:
        return self.max_distance

    def reset_parameters(self, generator: torch.Generator) -> None:
        with torch.no_grad():
            self.table.copy_(torch.randn(self.table.shape, generator=generator) * 0.02)

    def extra_repr(self) -> str:
        return f"buckets={self.table.shape[0]}, max_distance={self.max_distance}"
