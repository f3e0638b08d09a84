"""The exact decompositions handed to the fused CPU attention kernel (`split`, `split-linear`,
`toeplitz`; relbench/attention/__init__.py chooses among paths and describes each). Each takes the queries,
keys, values and a bias plan and returns the causal attention the reference path computes, for CPU
inference, in query blocks whose masks the fused kernel reads without an (H, L, L) tensor."""

from __future__ import annotations

import torch
from torch import Tensor

from relbench.positions.plan import BiasPlan, causal_mask, distance_grid

BAND_BLOCK = 32      # query rows per block of the split path's near band (docs/performance.md,
                     # "Measurements behind the defaults")
SPLIT_HORIZON_RATIO = 32   # auto takes the horizon split for a distance-only bias from L >= 32 x horizon (xl's
                           # 128 from 4096): its band costs L x (block + horizon) pairs at a small kernel tile
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


def _merge(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor, out: Tensor | None = None) -> Tensor:
    """Softmax attention over the union of two disjoint key sets, from each set's output and LSE:
    out_b + w (out_a - out_b) with w = exp(lse_a) / (exp(lse_a) + exp(lse_b)), in one pass (into
    `out`, a view of the result, when given)."""
    weight = torch.sigmoid(lse_a - lse_b)[..., None]                                    # (B, H, q, 1)
    return torch.lerp(out_b, out_a, weight) if out is None else torch.lerp(out_b, out_a, weight, out=out)


def four_d(bias: Tensor) -> Tensor:
    return bias if bias.dim() == 4 else bias.unsqueeze(0)


def split_attention(q: Tensor, k: Tensor, v: Tensor, plan: BiasPlan, block: int = BAND_BLOCK) -> Tensor:
    """Square CPU inference with a bias constant beyond plan.horizon, on a sequence long enough to
    have far keys (`resolve` sends everything else elsewhere; this path never falls back).

    Far keys (i - j >= horizon) go through the unbiased fused kernel in one causal call, their
    constant added to its log-sum-exp. The near band (0 <= i - j < horizon) goes in query blocks of
    `block` rows, each against the block + horizon - 1 keys up to its last query, and all the blocks
    whose keys exist are ONE kernel call: the queries and keys are (blocks, H, rows, D) strided views
    (overlapping windows for the keys), the mask one (1, H, block, block + horizon - 1) tile for a
    distance-only bias, or a strided view of each query's band (BiasPlan.band) laid out with the
    relative shift otherwise. The rows before the first whole block and after the last each take one
    call of their own. Every piece is merged with its rows' far keys by log-sum-exp."""
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
    head = min(n, -(-horizon // block) * block)     # from here on every block's rows have far keys
    count = (n - head) // block                     # whole blocks, in one call
    end = head + count * block
    for start, stop in ((0, head), (end, n)):       # the rest: one call each
        if stop > start:
            first = max(0, start - horizon + 1)
            mask = _band_mask(plan, start, stop, first, stop, horizon, q.dtype)
            near_out, near_lse = _attend_lse(q[..., start:stop, :], k[..., first:stop, :], v[..., first:stop, :], mask)[:2]
            split_at = min(stop, max(start, horizon))          # rows from here on also have far keys
            out[..., start:split_at, :] = near_out[..., : split_at - start, :]
            if split_at < stop:
                rows = slice(split_at - horizon, stop - horizon)
                _merge(near_out[..., split_at - start:, :], near_lse[..., split_at - start:],
                       far_out[..., rows, :], far_lse[..., rows], out=out[..., split_at:stop, :])
    if count == 0:
        return out
    width = block + horizon - 1
    masks = _band_masks(plan, head, end, block, horizon, q.dtype)                   # (1 or B, blocks, H, block, width)
    for b in range(q.shape[0]):
        near_out, near_lse = _attend_lse(_windows(q[b], head, count, block, block),
                                         _windows(k[b], head - horizon + 1, count, block, width),
                                         _windows(v[b], head - horizon + 1, count, block, width),
                                         masks[min(b, masks.shape[0] - 1)])[:2]       # (blocks, H, block, D), (blocks, H, block)
        by_block = lambda t, b=b: t[b, :, head - horizon: end - horizon].unflatten(1, (count, block)).transpose(0, 1)
        target = out[b, :, head:end].unflatten(1, (count, block)).transpose(0, 1)
        _merge(near_out, near_lse, by_block(far_out), by_block(far_lse), out=target)
    return out


def _windows(t: Tensor, first: int, count: int, step: int, rows: int) -> Tensor:
    """(count, H, rows, D) view of t (H, L, D): window w is rows first + w * step .. + rows."""
    s = t.stride()
    return t.as_strided((count, t.shape[0], rows, t.shape[2]), (step * s[1], s[0], s[1], s[2]),
                        t.storage_offset() + first * s[1])


def _band_mask(plan: BiasPlan, q_start: int, q_end: int, k_start: int, k_end: int, horizon: int,
               dtype: torch.dtype) -> Tensor:
    """(1 or B, H, q, k): the bias of these queries and keys, -inf outside the band 0 <= i - j < horizon."""
    bias = plan.block(q_start, q_end, k_start, k_end).to(dtype)
    distance = distance_grid(q_start, q_end, k_start, k_end, bias.device)
    return four_d(bias.masked_fill((distance < 0) | (distance >= horizon), float("-inf")))


def _band_masks(plan: BiasPlan, q_start: int, q_end: int, block: int, horizon: int, dtype: torch.dtype) -> Tensor:
    """(1 or B, blocks, H, block, block + horizon - 1): the mask of each whole block from q_start
    (query a of block w against its keys c from q_start + w * block - horizon + 1), as the batched
    kernel call reads it. A distance-only bias is the same tile for every block (a stride-0 view).
    Otherwise each query's band R[a, e] (BiasPlan.band) goes into a row of width W = 2 block +
    horizon - 2 at column e + block - 1, -inf around it; reading that buffer with a row stride of
    W - 1 (Transformer-XL's relative shift) puts key c of row a at column c - a + block - 1."""
    width = block + horizon - 1
    count = (q_end - q_start) // block
    if plan.distance_only:
        tile = _band_mask(plan, horizon - 1, horizon - 1 + block, 0, width, horizon, dtype)  # keys all exist
        return tile[:, None].expand(tile.shape[0], count, *tile.shape[1:])
    band = four_d(plan.band(q_start, q_end, horizon).to(dtype))                      # (B, H, rows, horizon)
    row = 2 * block + horizon - 2
    shifted = band.new_full((*band.shape[:-1], row), float("-inf"))
    shifted[..., block - 1: block - 1 + horizon] = band
    s = shifted.stride()
    return shifted.as_strided((band.shape[0], count, band.shape[1], block, width),
                              (s[0], block * s[2], s[1], s[2] - 1, 1), shifted.storage_offset() + block - 1)


def _clamped_block(length: int, divisor: int, bounds: tuple[int, int]) -> int:
    return min(bounds[1], max(bounds[0], length // divisor))


def linear_block(length: int) -> int:
    """Query rows per block of the split-linear path: L/16 within LINEAR_BLOCKS."""
    return _clamped_block(length, 16, LINEAR_BLOCKS)


def split_linear_attention(q: Tensor, k: Tensor, v: Tensor, plan: BiasPlan, block: int | None = None) -> Tensor:
    """A separable bias, r(i) + c(j) on causal pairs (BiasPlan.key_terms): ALiBi's -m (i - j) =
    m (j - s) - m (i - s), FoX's F_i - F_j = (F_s - F_j) + (F_i - F_s). For a query block starting at
    s the row term is the same for every key of a row, so it cancels in the softmax; what is left is
    one per-key vector c(j) - c(s), broadcast over the rows: over the earlier keys a (.., 1, keys)
    mask, over the block's own keys a (block x block) tile with the causal -inf. The two are merged
    by log-sum-exp. Anchoring at s keeps the per-key values small near the block."""
    n = q.shape[-2]
    if not plan.separable or n != k.shape[-2] or q.device.type != "cpu":
        raise ValueError("the split-linear path needs square CPU attention with a separable bias (plan.key_terms)")
    block = linear_block(n) if block is None else block
    out = torch.empty_like(q)
    future = causal_mask(block, block, q.device)
    for start in range(0, n, block):
        end = min(n, start + block)
        size = end - start
        terms = plan.key_terms(start, end).to(q.dtype)                                   # (H or B,H, end): c(j) - c(s)
        terms = terms if terms.dim() == 3 else terms[None]
        near = terms[..., None, start:end].expand(*terms.shape[:2], size, size).masked_fill(future[:size, :size],
                                                                                             float("-inf"))
        near_out, near_lse = _attend_lse(q[..., start:end, :], k[..., start:end, :], v[..., start:end, :], near)
        if start == 0:
            out[..., :end, :] = near_out
            continue
        far_out, far_lse = _attend_lse(q[..., start:end, :], k[..., :start, :], v[..., :start, :],
                                       terms[..., None, :start])                      # (1 or B, H, 1, start)
        _merge(near_out, near_lse, far_out, far_lse, out=out[..., start:end, :])
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
