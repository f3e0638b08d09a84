"""The split paths (relbench/attention/fused.py): the far/near horizon split and the linear split for a
separable bias, against the reference path, with their merges counted (the `merges` fixture of
conftest.py) at sizes where each branch runs."""

import pytest
import torch
from attention_cases import LONG, SPLIT, D, H, encoding, prepared

from relbench.attention import attention, chunked_attention, recording
from relbench.attention.fused import linear_block, split_attention, split_linear_attention
from relbench.positions.plan import BiasPlan


def test_the_horizon_split_merges_far_and_near_keys_at_length_150(merges):
    """At LONG every SPLIT variant runs the far/near decomposition: count the merges."""
    for spec in SPLIT:
        merges.clear()
        enc = encoding(spec)
        q, k, v, plan = prepared(enc, LONG, LONG, batch=1)
        with torch.no_grad(), recording() as taken:
            attention(q, k, v, plan, "split")
        assert dict(taken) == {"split": 1}, spec
        # blocks of 32 rows: rows 0..31 in one call, the three whole blocks 32..127 in the batched call,
        # rows 128..149 in one call; each merges its rows that have far keys (from the horizon on) once
        horizon = max(1, plan.horizon)
        assert merges == [(1, H, 32 - horizon, D), (1, H, 22, D), (3, H, 32, D)], spec


@pytest.mark.parametrize("spec", SPLIT)
@pytest.mark.parametrize("block", [1, 4, 7])
@torch.no_grad()
def test_split_with_small_blocks_matches_reference(spec, block, merges):
    """Band blocks smaller than the horizon and than the sequence: every merge branch runs, every row
    with far keys is merged exactly once, and the whole blocks after the first rows go in one call per
    batch entry, `block` rows each."""
    enc = encoding(spec)
    length = 29
    q, k, v, plan = prepared(enc, length, length)
    ref = attention(q, k, v, plan, "reference")
    torch.testing.assert_close(split_attention(q, k, v, plan, block=block), ref, rtol=1e-5, atol=1e-5)
    horizon = max(1, plan.horizon)
    assert sum(shape[0] * shape[2] for shape in merges) == q.shape[0] * (length - horizon)
    whole_blocks = (length - -(-horizon // block) * block) // block
    assert merges.count((whole_blocks, H, block, D)) == q.shape[0] and whole_blocks > 1
    torch.testing.assert_close(chunked_attention(q, k, v, plan, block=block), ref, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_auto_takes_the_horizon_split_for_a_short_horizon_at_length():
    """A distance-only bias with a horizon goes through the split from L >= 32 x horizon (xl:k=5 from
    160), square only; shorter, or with queries over a longer context, through the toeplitz view."""
    for spec in ("xl:k=5", "t5:num_buckets=8,max_distance=10"):
        enc = encoding(spec)
        horizon = enc.horizon()
        for q_len, k_len, path in ((32 * horizon, 32 * horizon, "split"), (32 * horizon - 1, 32 * horizon - 1, "toeplitz"),
                                   (40, 32 * horizon, "toeplitz")):
            q, k, v, plan = prepared(enc, q_len, k_len)
            with recording() as taken:
                out = attention(q, k, v, plan, "auto")
            assert dict(taken) == {path: 1}, (spec, q_len, k_len)
            torch.testing.assert_close(out, attention(q, k, v, plan, "reference"), rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_shaw_band_is_its_bias_on_the_keys_up_to_each_query():
    """ShawPlan.band slices its products; the generic BiasPlan.band gathers the same from blocks."""
    for spec in ("shaw:k=3", "shaw:k=1", "shaw:k=0"):
        _q, _k, _v, plan = prepared(encoding(spec), 40, 40)
        horizon = max(1, plan.horizon or 1)
        band = plan.band(horizon + 2, 40, horizon)
        torch.testing.assert_close(band, BiasPlan.band(plan, horizon + 2, 40, horizon), rtol=0, atol=0)
        # row a, column e: the key at distance horizon - 1 - e
        a, e = 7, horizon - 1
        torch.testing.assert_close(band[..., a, e], plan.block(horizon + 2 + a, horizon + 3 + a,
                                                               horizon + 2 + a - (horizon - 1) + e,
                                                               horizon + 3 + a - (horizon - 1) + e)[..., 0, 0])


@pytest.mark.parametrize("spec", ["alibi", "fox"])
@pytest.mark.parametrize("block", [1, 5, 8, 37])
@torch.no_grad()
def test_linear_split_uses_its_block_size_and_matches_reference(spec, block, merges):
    """Every separable bias (ALiBi's slopes, FoX's per-batch running sums) in blocks of every size."""
    enc = encoding(spec)
    q, k, v, plan = prepared(enc, 37, 37)
    ref = attention(q, k, v, plan, "reference")
    torch.testing.assert_close(split_linear_attention(q, k, v, plan, block=block), ref, rtol=1e-5, atol=1e-5)
    assert len(merges) == -(-37 // block) - 1      # every block after the first merges with earlier keys


@torch.no_grad()
def test_linear_split_at_dispatch_length_merges_blocks(merges):
    """Through `attention(..., "split")`, ALiBi's block is L/16 clamped to 256..1024: at 600, blocks of 256,
    so two merges."""
    enc = encoding("alibi")
    q, k, v, plan = prepared(enc, 600, 600, batch=1)
    assert linear_block(600) == 256
    with recording() as taken:
        out = attention(q, k, v, plan, "split")
    assert dict(taken) == {"split-linear": 1} and len(merges) == 2
    torch.testing.assert_close(out, attention(q, k, v, plan, "reference"), rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_split_is_exact_for_default_options_at_long_range():
    """Default horizons (xl 128, t5 ~113, shaw 16) and ALiBi at a length well past them."""
    for name, path in (("xl", "split"), ("t5", "split"), ("shaw", "split"), ("alibi", "split-linear")):
        enc = encoding(name)
        q, k, v, plan = prepared(enc, 300, 300, batch=1)
        with recording() as taken:
            out = attention(q, k, v, plan, "split")
        assert dict(taken) == {path: 1}, name
        torch.testing.assert_close(out, attention(q, k, v, plan, "reference"), rtol=1e-5, atol=1e-5)
