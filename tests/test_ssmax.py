"""Scalable-Softmax as a training option of every scheme ("VARIANT:ssmax=true"; model.py, positions/plan.py):
each query row's logits, content and bias, times s_h log n, n the keys the row sees, on every path."""

import math

import pytest
import torch
from attention_cases import H, encoding, qkv
from helpers import layer_input

from relbench import positions
from relbench.attention import attention, recording
from relbench.cost import memory
from relbench.errors import UsageError
from relbench.model import GPT, ModelConfig, scalable_softmax
from relbench.positions.plan import RowScaledPlan

SCALES = torch.tensor([1.0, 0.5, 2.0, 0.25])


def by_hand(q, k, v, inner, scales, k_len):
    """softmax over keys of (q.k / sqrt(d) + bias) * s_h * log(p + 1) for query position p, causal."""
    q_len = q.shape[-2]
    logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if inner is not None:
        logits = logits + inner.full()
    rows = torch.arange(k_len - q_len, k_len)
    factor = scales[:, None] * torch.log(rows.float() + 1)                    # (H, q)
    logits = logits * factor[..., None]
    logits = logits.masked_fill(rows[:, None] < torch.arange(k_len)[None, :], float("-inf"))
    return torch.softmax(logits, -1) @ v


def test_the_row_factor_by_hand():
    """Rows at positions 0, 3 and 7 of head 1 (s = 0.5): 0, 0.5 log 4, 0.5 log 8 times the inner bias."""
    inner = encoding("alibi").plan(8, 8)
    plan = RowScaledPlan(inner, SCALES)
    block, raw = plan.full(), inner.full()
    assert torch.equal(block[1, 0], torch.zeros(8))
    torch.testing.assert_close(block[1, 3], raw[1, 3] * 0.5 * math.log(4))
    torch.testing.assert_close(block[1, 7], raw[1, 7] * 0.5 * math.log(8))
    causal = plan.causal_block(0, 8, 8)
    assert not causal.isnan().any() and causal[0, 0, 1].item() == float("-inf")


@pytest.mark.parametrize("spec", ["alibi", "bam", "xl:k=5", "shaw:k=3", "fox", "rope", "none", "kerple-log", "dape"])
@pytest.mark.parametrize("q_len, k_len", [(40, 40), (9, 40)])
@torch.no_grad()
def test_every_path_computes_the_scaled_softmax(spec, q_len, k_len):
    enc = encoding(spec)
    q, k, v = qkv(q_len, k_len)
    q, k, inner = enc.prepare(q, k, x=layer_input(enc, 2, k_len))
    want = by_hand(q, k, v, inner, SCALES, k_len)
    q_s, plan = scalable_softmax(q, inner, SCALES, k_len)
    for backend in ("reference", "sdpa", "chunked", "auto"):
        torch.testing.assert_close(attention(q_s, k, v, plan, backend), want, rtol=1e-4, atol=1e-5, msg=backend)


@torch.no_grad()
def test_the_split_path_keeps_the_horizon_and_agrees():
    """xl's bias is constant beyond k = 5: the row factor keeps it constant, so split still runs, at a
    length where it does (>= 32 x the horizon)."""
    enc = encoding("xl:k=5")
    q, k, v = qkv(200, 200)
    q, k, inner = enc.prepare(q, k)
    q_s, plan = scalable_softmax(q, inner, SCALES, 200)
    assert plan.horizon == inner.horizon is not None
    with recording() as taken:
        got = attention(q_s, k, v, plan, "auto")
    assert taken == {"split": 1}
    torch.testing.assert_close(got, by_hand(q, k, v, inner, SCALES, 200), rtol=1e-4, atol=1e-5)


def test_the_score_mod_adds_the_scaled_bias_to_a_scaled_score():
    """score_mod(score, b, h, q, kv) = score + s_h log(p + 1) bias, p the query's absolute position,
    evaluated elementwise on the whole grid (no FlexAttention compile needed)."""
    inner = encoding("kerple-log").plan(6, 10)
    plan = RowScaledPlan(inner, SCALES)
    h, qi, kv = torch.meshgrid(torch.arange(H), torch.arange(6), torch.arange(10), indexing="ij")
    score = torch.randn(H, 6, 10, generator=torch.Generator().manual_seed(2))
    got = plan.score_mod()(score, 0, h, qi, kv)
    torch.testing.assert_close(got, score + plan.full(), rtol=1e-5, atol=1e-5)


def test_a_model_trains_its_scales_from_one_and_counts_them():
    config = ModelConfig(vocab_size=256, d_model=32, n_layers=3, n_heads=4, train_length=64, position="alibi:ssmax=true")
    model = GPT(config, seed=0)
    plain = GPT(ModelConfig(**{**config.__dict__, "position": "alibi"}), seed=0)
    assert all(torch.equal(b.attn.ssmax.detach(), torch.ones(4)) for b in model.blocks)
    assert model.n_params() == plain.n_params() + 3 * 4 == memory.parameter_count(config)
    tokens = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(0))
    model(tokens).float().pow(2).mean().backward()
    assert all(b.attn.ssmax.grad.abs().sum() > 0 for b in model.blocks)
    # the same weights without the factor give other logits: the option does something
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.endswith("ssmax")})
    assert not torch.allclose(model(tokens), plain(tokens))


@torch.no_grad()
def test_content_only_leaves_the_bias_as_it_is():
    """ssmax_bias=false (BAM's official ALiBi+SSMax): (q.k / sqrt(d)) * s_h log n + bias, the bias unscaled;
    the plan keeps its fast paths (alibi stays distance-only)."""
    enc = encoding("alibi")
    q, k, v = qkv(40, 40)
    q, k, inner = enc.prepare(q, k)
    q_s, plan = scalable_softmax(q, inner, SCALES, 40, bias=False)
    assert plan is inner and plan.distance_only
    rows = torch.arange(40)
    factor = SCALES[:, None] * torch.log(rows.float() + 1)
    logits = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])) * factor[..., None] + inner.full()
    want = torch.softmax(logits.masked_fill(rows[:, None] < rows[None, :], float("-inf")), -1) @ v
    torch.testing.assert_close(attention(q_s, k, v, plan, "auto"), want, rtol=1e-4, atol=1e-5)
    model = GPT(ModelConfig(vocab_size=256, d_model=32, n_layers=2, n_heads=4, train_length=64,
                            position="alibi:ssmax=true,ssmax_bias=false"), seed=0)
    assert not model.blocks[0].attn.ssmax_bias and model.blocks[0].attn.ssmax is not None


def test_the_option_is_parsed_like_the_other_training_options():
    assert positions.training_options("bam:ssmax=true") == {"ssmax": True}
    assert positions.parse_spec("bam:ssmax=true,shape_init=2") == ("bam", {"shape_init": "2"})
    with pytest.raises(UsageError, match="ssmax"):
        positions.training_options("alibi:ssmax=maybe")
    with pytest.raises(UsageError, match="add ssmax=true"):
        positions.training_options("alibi:ssmax_bias=false")
