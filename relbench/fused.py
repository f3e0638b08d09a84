"""The exact decompositions handed to the fused CPU attention kernel (`split`, `split-linear`,
`toeplitz`; relbench/attention.py chooses among paths and describes each). Each takes the queries,
keys, values and a bias plan and returns the causal attention the reference path computes, for CPU
inference, in query blocks whose masks the fused kernel reads without an (H, L, L) tensor."""

from __future__ import annotations

import torch
from torch import Tensor

from relbench.positions.plan import BiasPlan, causal_mask, distance_grid

BAND_BLOCK = 64      # query rows per block of the split path's near band (fastest measured: 64 of 64..512)
LINEAR_BLOCKS = (256, 1024)  # query rows per block for linear biases (ALiBi): L/16 within these bounds,
                             # the fastest measured at 4096 (256) and 16384 (1024)


def split_fits(plan: BiasPlan, q: Tensor, k_len: int, block: int = BAND_BLOCK) -> bool:
    """Whether the horizon split has far keys to split off: square, on CPU, a horizon, and at least
    one block of queries beyond it (shorter, every key is near and the split is the chunked path)."""
    q_len = q.shape[-2]
    return (q_len == k_len and q.device.type == "cpu" and plan.horizon is not None
            and q_len >= plan.horizon + block)



# ---- split: far keys through the unbiased fused kernel, near keys with the bias --------------------
def _attend_lse(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False) -> tuple[Tensor, Tensor]:
    """Output (B, H, Lq, D) and log-sum-exp of the scaled logits (B, H, Lq), from the fused CPU kernel."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=mask)


def _merge(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> Tensor:
    """Softmax attention over the union of two disjoint key sets, from each set's output and LSE."""
    top = torch.maximum(lse_a, lse_b)
    w_a, w_b = torch.exp(lse_a - top)[..., None], torch.exp(lse_b - top)[..., None]   # (B, H, q, 1)
    return (out_a * w_a + out_b * w_b) / (w_a + w_b)


def _four_d(bias: Tensor) -> Tensor:
    return bias if bias.dim() == 4 else bias.unsqueeze(0)


def split_attention(q: Tensor, k: Tensor, v: Tensor, plan: BiasPlan, block: int = BAND_BLOCK) -> Tensor:
    """Square CPU inference with a bias constant beyond plan.horizon, on a sequence long enough to
    have far keys (`resolve` sends everything else elsewhere; this path never falls back)."""
    q_len = q.shape[-2]
    if not split_fits(plan, q, k.shape[-2], block):
        raise ValueError(f"the split path needs square CPU attention with a horizon and at least one far "
                         f"key block; got q_len={q_len}, k_len={k.shape[-2]}, device={q.device.type}, "
                         f"horizon={plan.horizon}, block={block}")
    horizon = max(1, plan.horizon)
    n = q_len
    out = torch.empty_like(q)
    # far keys: query i sees j <= i - horizon, i.e. queries horizon.. against keys ..n-horizon, causal
    far_out, far_lse = _attend_lse(q[..., horizon:, :], k[..., : n - horizon, :], v[..., : n - horizon, :], causal=True)
    far_lse = far_lse + plan.tail(horizon, n).to(q.dtype)                        # (B, H, n - horizon)
    # near keys: i - horizon < j <= i, in query blocks; a distance-only bias has the same tile for
    # every block (rows start .. start+block, keys start-horizon+1 .. start+block), built once
    tile = _band_tile(plan, block, horizon, q.dtype) if plan.distance_only else None
    for start in range(0, n, block):
        end = min(n, start + block)
        first_key = max(0, start - horizon + 1)
        if tile is not None:
            mask = tile[..., : end - start, first_key - (start - horizon + 1): end - (start - horizon + 1)]
        else:
            distance = distance_grid(start, end, first_key, end, q.device)        # (bq, bk)
            outside = (distance < 0) | (distance >= horizon)
            mask = _four_d(plan.block(start, end, first_key, end).to(q.dtype).masked_fill(outside, float("-inf")))
        near_out, near_lse = _attend_lse(q[..., start:end, :], k[..., first_key:end, :], v[..., first_key:end, :], mask)
        split_at = min(end, max(start, horizon))          # rows from here on also have far keys
        out[..., start:split_at, :] = near_out[..., : split_at - start, :]
        if split_at < end:
            rows = slice(split_at - horizon, end - horizon)
            out[..., split_at:end, :] = _merge(near_out[..., split_at - start:, :], near_lse[..., split_at - start:],
                                               far_out[..., rows, :], far_lse[..., rows])
    return out


def _band_tile(plan: BiasPlan, block: int, horizon: int, dtype: torch.dtype) -> Tensor:
    """(1, H, block, block + horizon - 1): the near-band bias of a query block against the keys from
    horizon - 1 before it, -inf outside the band (0 <= i - j < horizon)."""
    first = horizon - 1  # a block whose keys all exist; a distance-only bias is the same for every block
    tile = plan.block(first, first + block, 0, first + block).to(dtype)
    distance = distance_grid(first, first + block, 0, first + block, tile.device)
    return _four_d(tile.masked_fill((distance < 0) | (distance >= horizon), float("-inf")))


def _clamped_block(length: int, divisor: int, bounds: tuple[int, int]) -> int:
    return min(bounds[1], max(bounds[0], length // divisor))


def linear_block(length: int) -> int:
    """Query rows per block of the split-linear path: L/16 within LINEAR_BLOCKS."""
    return _clamped_block(length, 16, LINEAR_BLOCKS)


def split_linear_attention(q: Tensor, k: Tensor, v: Tensor, plan: BiasPlan, block: int | None = None) -> Tensor:
    """bias = -m (i - j) = m (j - s) - m (i - s) for a query block starting at s: the second term is
    the same for every key of a row, so it cancels; the first is a per-key bias, broadcast over rows.
    Within a block (keys s .. s+block) the masked bias is the same tile for every block."""
    n = q.shape[-2]
    if plan.linear_slopes is None or n != k.shape[-2] or q.device.type != "cpu":
        raise ValueError("the split-linear path needs square CPU attention with a linear bias (plan.linear_slopes)")
    slopes = plan.linear_slopes.to(q.dtype)
    block = linear_block(n) if block is None else block
    out = torch.empty_like(q)
    offsets = torch.arange(block, device=q.device, dtype=q.dtype)                       # j - s in a block
    near_tile = (slopes[:, None, None] * offsets[None, None, :]).expand(-1, block, -1)   # (H, block, block)
    near_tile = _four_d(near_tile.masked_fill(causal_mask(block, block, q.device), float("-inf")))
    for start in range(0, n, block):
        end = min(n, start + block)
        size = end - start
        near_out, near_lse = _attend_lse(q[..., start:end, :], k[..., start:end, :], v[..., start:end, :],
                                         near_tile[..., :size, :size])
        if start == 0:
            out[..., :end, :] = near_out
            continue
        keys = torch.arange(-start, 0, device=q.device, dtype=q.dtype)                 # j - s for j < s
        far_bias = (slopes[:, None] * keys[None, :])[None, :, None, :]                # (1, H, 1, start)
        far_out, far_lse = _attend_lse(q[..., start:end, :], k[..., :start, :], v[..., :start, :], far_bias)
        out[..., start:end, :] = _merge(near_out, near_lse, far_out, far_lse)
    return out


# ---- toeplitz: a distance-only bias as a zero-copy strided view ------------------------------------------
TOEPLITZ_BLOCKS = (256, 1024)  # query rows per call: L/8 within these bounds


def toeplitz_block(length: int) -> int:
    """Query rows per call of the toeplitz path: L/8 within TOEPLITZ_BLOCKS."""
    return _clamped_block(length, 8, TOEPLITZ_BLOCKS)


def toeplitz_attention(q: Tensor, k: Tensor, v: Tensor, plan: BiasPlan, block: int | None = None) -> Tensor:
    """A bias that depends on i - j alone, with the causal mask folded in, handed to the fused CPU
    kernel as a strided view of one O(L) vector per head: nothing (H, L, L)-sized is built or read
    from memory beyond the vector.

    With the keys in reverse order (j' = Lk - 1 - j), query row a and reversed key j' are at
    distance d = a + j' - (Lq - 1), so the mask is M[a, j'] = w[a + j'] with w[x] the bias at
    distance x - (Lq - 1), and -inf for x < Lq - 1 (future keys): a Hankel matrix, which
    `as_strided` expresses with strides (1, 1) and no copy. Queries go in blocks that attend only to
    the keys up to their last query, so the wasted work is the upper half of the diagonal blocks."""
    q_len, k_len = q.shape[-2], k.shape[-2]
    if not plan.distance_only or q.device.type != "cpu":
        raise ValueError("the toeplitz path needs a distance-only plan on the CPU")
    block = toeplitz_block(q_len) if block is None else block
    w = plan.values.to(dtype=q.dtype, memory_format=torch.contiguous_format, copy=True)  # (H, q_len + k_len - 1)
    w[:, : q_len - 1] = float("-inf")                                         # distances < 0: future keys
    k_rev, v_rev = k.flip(-2), v.flip(-2)
    offset = k_len - q_len
    out = torch.empty_like(q)
    for start in range(0, q_len, block):
        end = min(q_len, start + block)
        keys = offset + end                                                   # keys 0 .. keys-1, reversed: k_len-keys ..
        first = k_len - keys                                                  # the first reversed key used
        mask = w[:, start + first:].as_strided((1, w.shape[0], end - start, keys), (0, w.stride(0), 1, 1))
        out[..., start:end, :] = _attend_lse(q[..., start:end, :], k_rev[..., first:, :], v_rev[..., first:, :], mask)[0]
    return out
