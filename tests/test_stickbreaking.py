"""Stick-breaking attention (positions/stickbreaking.py): hand-computed weights, a direct O(L^3)
reference, the official code's reference formula, causality, blocks and the model around it."""

import math

import pytest
import torch

from relbench import positions
from relbench.attention import recording
from relbench.model import GPT, ModelConfig
from relbench.positions.stickbreaking import stick_breaking_attention, stick_breaking_weights

B, H, D = 2, 3, 8


def qkv(q_len, k_len, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, n, D, generator=g, dtype=dtype) for n in (q_len, k_len, k_len))


def direct(q, k, v, attend_current=False):
    """O(L^3): for each query i and key j, sigmoid(z_ij) times the product over the keys between them
    (j < k < i, or j < k <= i when the query attends to itself), in float64; the rest on v_i."""
    q, k, v = q.double(), k.double(), v.double()
    q_len, k_len = q.shape[-2], k.shape[-2]
    z = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    beta = torch.sigmoid(z)
    out = torch.zeros_like(q)
    for a in range(q_len):
        i = k_len - q_len + a
        last = i if attend_current else i - 1                     # the nearest key the query may take
        total = torch.zeros(q.shape[:2], dtype=torch.float64)
        for j in range(last + 1):
            weight = beta[..., a, j].clone()
            for m in range(j + 1, last + 1):
                weight = weight * (1 - beta[..., a, m])
            out[..., a, :] += weight[..., None] * v[..., j, :]
            total += weight
        out[..., a, :] += (1 - total)[..., None] * v[..., i, :]
    return out


def official_reference(q, k, v, attend_current=False):
    """shawntan/stickbreaking-attention: sb_ref.stickbreaking with tests/test_attn.py's masks and
    cum_weight = tril(ones, -1), then o + rem * v (written out here)."""
    L = q.shape[-2]
    cum_weight = torch.ones(L, L).tril(-1)
    mask = torch.ones(L, L).triu(1 if attend_current else 0).bool()
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    log_z = torch.nn.functional.logsigmoid(logits).masked_fill(mask, -1e5)
    log_beta = torch.nn.functional.logsigmoid(-logits).masked_fill(mask, 0)
    att = (log_z + torch.einsum("bhij,jk->bhik", log_beta, cum_weight)).exp()
    return att @ v + (1 - att.sum(-1))[..., None] * v


def test_three_positions_by_hand():
    """Query at position 2 over keys 0, 1 (not itself): A_21 = s(z_21), A_20 = s(z_20) (1 - s(z_21)),
    and the rest (1 - s(z_21))(1 - s(z_20)) on its own value. q = 1 (d = 1), k = (2, -1, 0.5)."""
    q = torch.ones(1, 1, 3, 1)
    k = torch.tensor([2.0, -1.0, 0.5]).view(1, 1, 3, 1)
    v = torch.tensor([10.0, 20.0, 30.0]).view(1, 1, 3, 1)
    s = torch.sigmoid
    w, rest_of_stick = stick_breaking_weights(q, k, 0)
    w = w[0, 0]
    assert torch.equal(w[0], torch.zeros(3)) and w[1, 1] == 0 and w[2, 2] == 0
    z20, z21 = torch.tensor(2.0), torch.tensor(-1.0)
    assert w[2, 1].item() == pytest.approx(s(z21).item(), rel=1e-6)
    assert w[2, 0].item() == pytest.approx((s(z20) * (1 - s(z21))).item(), rel=1e-6)
    out = stick_breaking_attention(q, k, v)[0, 0, :, 0]
    rest = (1 - s(z21)) * (1 - s(z20))
    assert rest_of_stick[0, 0, 2].item() == pytest.approx(rest.item(), rel=1e-6)
    assert rest_of_stick[0, 0, 0].item() == 1.0
    assert out[2].item() == pytest.approx((s(z21) * 20 + s(z20) * (1 - s(z21)) * 10 + rest * 30).item(), rel=1e-6)
    assert out[0].item() == pytest.approx(10.0)          # no key before it: the whole stick on its own value


@pytest.mark.parametrize("attend_current", [False, True])
@pytest.mark.parametrize("q_len, k_len, block", [(17, 17, None), (17, 17, 1), (17, 17, 5), (6, 17, 4), (1, 17, 3)])
def test_matches_the_direct_reference(attend_current, q_len, k_len, block):
    q, k, v = qkv(q_len, k_len)
    got = stick_breaking_attention(q, k, v, attend_current, block)
    torch.testing.assert_close(got.double(), direct(q, k, v, attend_current), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attend_current", [False, True])
def test_matches_the_official_reference_formula(attend_current):
    q, k, v = qkv(40, 40, seed=3)
    torch.testing.assert_close(stick_breaking_attention(q, k, v, attend_current),
                               official_reference(q, k, v, attend_current), rtol=1e-5, atol=1e-5)


def test_causal_a_later_key_or_value_changes_nothing_before_it():
    q, k, v = qkv(30, 30, seed=4)
    base = stick_breaking_attention(q, k, v)
    k2, v2 = k.clone(), v.clone()
    k2[..., 20:, :] += 5.0
    v2[..., 20:, :] -= 3.0
    moved = stick_breaking_attention(q, k2, v2)
    torch.testing.assert_close(moved[..., :20, :], base[..., :20, :], rtol=0, atol=0)
    assert not torch.allclose(moved[..., 20:, :], base[..., 20:, :])


def test_blocks_give_the_same_gradients():
    grads = []
    for block in (None, 3):
        q, k, v = (t.requires_grad_() for t in qkv(25, 25, seed=5))
        stick_breaking_attention(q, k, v, block=block).square().sum().backward()
        grads.append([t.grad for t in (q, k, v)])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_long_sequences_stay_finite_and_the_weights_sum_to_one():
    enc = positions.build("stickbreaking", n_heads=H, head_dim=D)
    q, k, _ = qkv(64, 4096, seed=6)
    weights = enc.attention_weights(q * 3, k * 3)                               # sharp logits
    assert weights.isfinite().all() and (weights >= 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, 64), rtol=0, atol=1e-5)
    assert (weights[..., :, 4096 - 64 + 1:].triu(1) == 0).all()


def test_the_model_attends_with_it_on_any_backend():
    config = ModelConfig(vocab_size=256, d_model=24, n_layers=2, n_heads=H, train_length=32, position="stickbreaking")
    model = GPT(config, seed=0)
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    with recording() as taken:
        out = model(tokens)
    assert taken == {"stickbreaking": 2} and out.isfinite().all()              # no softmax path ran
    out.float().pow(2).mean().backward()
    assert all(p.grad is not None for p in model.blocks[0].attn.parameters())
    assert positions.scheme("stickbreaking").replaces_softmax and not positions.scheme("stickbreaking").adds_bias


def test_inspect_and_profile_measure_its_own_attention():
    """`relbench inspect`'s mean distance reads the stick-breaking weights (with the rest on the query
    itself), not a softmax of its logits; `relbench profile` times its own attention."""
    from relbench.cost.inspection import layer_statistics
    from relbench.cost.profiling import profile_one

    config = ModelConfig(vocab_size=256, d_model=24, n_layers=2, n_heads=H, train_length=32, position="stickbreaking")
    model = GPT(config, seed=0)
    tokens = torch.randint(0, 256, (1, 32), generator=torch.Generator().manual_seed(1))
    seen = {}
    model(tokens, observe=lambda layer, q, k, plan: seen.setdefault(layer, (q, k)))
    q, k = seen[0]
    distance = (torch.arange(32)[:, None] - torch.arange(32)[None, :]).float()
    weights = model.position(0).attention_weights(q, k)
    softmax = torch.softmax((q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(distance < 0, float("-inf")), -1)
    rows = [r for r in layer_statistics(model, tokens) if r["layer"] == 0]
    for head, row in enumerate(rows):
        assert row["mean_distance"] == pytest.approx(float((weights[0, head] * distance).sum(-1).mean()), rel=1e-5)
        assert row["mean_distance"] != pytest.approx(float((softmax[0, head] * distance).sum(-1).mean()), rel=1e-3)
    row = profile_one("stickbreaking", "auto", 128, heads=2, head_dim=8, repeats=1, peak=False)
    assert row["status"] == "ok" and row["path"] == "stickbreaking" and row["train_path"] == "stickbreaking"


def test_gradients_match_the_direct_reference():
    """Backward through the log-space path is the gradient of the direct O(L^3) product (float64)."""
    q, k, v = (t.double().requires_grad_() for t in qkv(12, 12, seed=7))
    weight = torch.randn(B, H, 12, D, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    (stick_breaking_attention(q, k, v, block=5) * weight).sum().backward()
    ours = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    (direct(q, k, v) * weight).sum().backward()
    for a, b in zip(ours, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
