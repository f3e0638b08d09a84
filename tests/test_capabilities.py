"""Every variant's declared capabilities (positions/base.py's class attributes) against what it
really does, measured on its bias with options and without; and prepare()'s order of work."""

import functools

import pytest
import torch
from helpers import layer_input

from relbench import positions
from relbench.positions.base import PositionEncoding

H, D = 4, 8
ALL = positions.names()


# ---- declared capabilities against what each variant really does ----------------------------------
CAPABILITIES = ["adds_bias", "rotates", "content_dependent", "key_dependent", "input_dependent",
                "distance_only", "has_horizon", "linear", "separable", "has_score_mod"]
# every variant with its defaults, and with options: the declaration is per class, so it must hold
# whatever the options (scheme("xl:k=5") is the xl class)
OPTION_SPECS = ["xl:k=5", "xl:k=5,shared_heads=true", "xl:k=40,log_from=4,log_buckets=3", "xl:k=0",
                "t5:bidirectional=true", "t5:num_buckets=8,max_distance=12",
                "t5:num_buckets=8,max_distance=12,bidirectional=true", "t5-log2:max_distance=8",
                "shaw:k=3", "shaw:k=0", "dynamic:log_distance=false", "dynamic:width=4,depth=1",
                "fire:width=4,threshold_ratio=0.5", "sandwich:dim=16", "rope:base=100",
                "xpos:base=100,scale_base=64", "sinusoidal:base=100,scale=0.5", "fox:bias_init=2",
                "cope:npos_max=5", "dape:base=alibi", "dape:base=kerple,width=4"]
SPECS = ALL + OPTION_SPECS
RECT = (24, 100)          # a rectangle, queries the last 24 of 100 positions (past FIRE's threshold)
LONG = 2 * 1024 + 256     # twice t5-log2's default horizon (1024) and more: every horizon shows


def test_capability_list_is_complete_and_each_is_exercised_both_ways():
    """Every boolean the base class declares (besides shared_across_layers and relative) is checked
    below, every variant with options is checked with options, and each capability is declared by
    some variant and not by another, so both directions of each "<=>" run."""
    declared = {name for name, value in vars(PositionEncoding).items() if isinstance(value, bool)}
    assert declared - {"shared_across_layers", "relative"} == set(CAPABILITIES)
    assert {s.split(":")[0] for s in OPTION_SPECS} == {n for n in ALL if positions.get(n).options()}
    for capability in CAPABILITIES:
        values = {getattr(positions.get(n), capability) for n in ALL}
        assert values == {True, False}, capability


def perturbed(spec):
    """`spec` built small, initialised from a seeded generator, then every parameter moved away from
    its initial value (transformer-xl's u and v, dynamic's last layer start at zero), then projected
    back into its allowed set as training does."""
    enc = positions.build_spec(spec, n_heads=H, head_dim=D, train_length=32)
    enc.reset_parameters(torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=g))
    enc.project_parameters()
    return enc


def _queries(q_len, seed):
    return torch.randn(2, H, q_len, D, generator=torch.Generator().manual_seed(seed))


def _measured_horizon(plan, length, rows=512):
    """Smallest h such that in every row (every head and sequence too) the bias of each causal key
    at distance >= h equals the bias of key 0; and whether the plan's tail() is that constant
    beyond the plan's own horizon (True when it names none)."""
    worst, tail_ok = 0, True
    for start in range(0, length, rows):
        end = min(length, start + rows)
        block = plan.block(start, end, 0, length)                                     # (..., bq, L)
        distance = torch.arange(start, end)[:, None] - torch.arange(length)[None, :]  # (bq, L)
        differs = (block != block[..., :1]).flatten(0, -3).any(0) & (distance >= 0)   # causal keys only
        first = torch.where(differs.any(-1), differs.float().argmax(-1), torch.arange(start, end) + 1)
        worst = max(worst, int((torch.arange(start, end) - first + 1).max()))        # h_i = i - j_min + 1
        if plan.horizon is not None and end > plan.horizon:
            lo = max(start, plan.horizon)
            far = block[..., lo - start:, :]
            tail = plan.tail(lo, end)[..., None].expand_as(far)                         # (..., bq, L)
            beyond = distance[lo - start:] >= plan.horizon
            tail_ok = tail_ok and torch.equal(torch.where(beyond, far, tail), tail)
    return worst, tail_ok


@functools.cache
def measure(spec):
    """What the built variant really does, without reading any declaration: one boolean per
    capability, and the list of places where its plan's extras (the plan-level horizon, tail,
    linear slopes, score_mod, distance_only) disagree with the bias the plan itself materialises."""
    enc = perturbed(spec)
    q_len, k_len = RECT
    q1, q2 = _queries(q_len, 3), _queries(q_len, 4)
    k = torch.randn(2, H, k_len, D, generator=torch.Generator().manual_seed(5))
    x, x2 = layer_input(enc, 2, k_len, 9), layer_input(enc, 2, k_len, 10)
    k2 = torch.randn(2, H, k_len, D, generator=torch.Generator().manual_seed(11))
    q_rot, k_rot = enc.rotate(q1, k)
    facts, problems = dict.fromkeys(CAPABILITIES, False), []
    facts["rotates"] = not (torch.equal(q_rot, q1) and torch.equal(k_rot, k))
    plan = enc.plan(q_len, k_len, q1, k, x)
    facts["adds_bias"] = plan is not None
    if plan is None:
        return facts, problems

    def differs(b2):
        return not torch.equal(b1.expand_as(b2), b2.expand_as(b1))

    b1 = plan.full()                                              # (H, q, k) or (B, H, q, k)
    assert b1.isfinite().all() and b1.std() > 1e-3, f"{spec}: a degenerate bias tests nothing"
    facts["content_dependent"] = differs(enc.plan(q_len, k_len, q2, k, x).full())
    facts["key_dependent"] = differs(enc.plan(q_len, k_len, q1, k2, x).full())
    facts["input_dependent"] = differs(enc.plan(q_len, k_len, q1, k, x2).full())
    batch_dependent = facts["content_dependent"] or facts["key_dependent"] or facts["input_dependent"]
    if not batch_dependent and not torch.equal(enc.plan(q_len, k_len).full(), b1):
        problems.append("plan without queries differs (the model builds shared plans without q)")
    # distance_only: constant along every diagonal of a rectangle (queries past FIRE's threshold)
    facts["distance_only"] = torch.allclose(b1[..., 1:, 1:], b1[..., :-1, :-1], rtol=0, atol=1e-6)
    if plan.distance_only and not facts["distance_only"]:
        problems.append("plan.distance_only on a bias that is not Toeplitz (split reuses one tile)")
    # linear: bias == -s_h (i - j) on every causal pair, one slope per head (read at distance 1)
    distance = (torch.arange(k_len - q_len, k_len)[:, None] - torch.arange(k_len)[None, :]).float()
    causal = distance >= 0
    rows = torch.arange(q_len)
    slope = -b1[..., rows, rows + k_len - q_len - 1].reshape(-1, H, q_len)        # (B or 1, H, q)
    same_slope = torch.allclose(slope, slope[:1, :, :1].expand_as(slope))
    residual = b1 + slope.reshape(*b1.shape[:-1], 1) * distance
    facts["linear"] = same_slope and torch.allclose(residual[..., causal], torch.zeros(()), rtol=0, atol=1e-5)
    if (plan.linear_slopes is not None) != facts["linear"]:
        problems.append(f"plan.linear_slopes is {plan.linear_slopes} on a bias with linear={facts['linear']}")
    elif plan.linear_slopes is not None and not torch.allclose(
            (-plan.linear_slopes[:, None, None] * distance).expand_as(b1)[..., causal], b1[..., causal]):
        problems.append("plan.linear_slopes are not the bias's slopes (split-linear uses them)")
    # separable: bias = r(i) + c(j) on causal pairs with c not constant (a constant bias needs no
    # split): r from key 0 (before every query), c from the last row (after every key)
    r, c = b1[..., :, :1], b1[..., -1:, :] - b1[..., -1:, :1]
    atol = 1e-6 * (10 + float(b1[..., causal].abs().amax()))     # r + c rounds at the scale of the largest term
    facts["separable"] = (torch.allclose((r + c).expand_as(b1)[..., causal], b1[..., causal], rtol=0, atol=atol)
                          and bool((c - c[..., :1]).abs().amax() > 1e-4))
    if plan.separable != facts["separable"]:
        problems.append(f"plan.separable is {plan.separable} on a bias with separable={facts['separable']}")
    elif plan.separable:
        for anchor in (0, k_len - q_len, k_len - 2):   # the key terms the split-linear path reads, any anchor
            expected = b1[..., -1, :] - b1[..., -1, anchor:anchor + 1]
            if not torch.allclose(plan.key_terms(anchor, k_len).expand_as(expected), expected, rtol=0, atol=atol):
                problems.append(f"plan.key_terms({anchor}) are not the bias's per-key terms")
    # horizon: measured at a long length (> 2x t5-log2's 1024): every row constant from h <= LONG/2;
    # the plan must name such a horizon then (and no horizon otherwise), with tail() the constant.
    # Where keys or the layer input move the bias (CoPE's counts saturate at p_max only where the
    # gates add up), any horizon is the data's, not the scheme's: the split path needs one fixed for
    # every input, so such a plan names none, and one random input cannot show there is none
    if facts["key_dependent"] or facts["input_dependent"]:
        if plan.horizon is not None:
            problems.append(f"a data-dependent plan names horizon {plan.horizon}")
    else:
        long_plan = enc.plan(LONG, LONG, _queries(LONG, 6))
        horizon, tail_ok = _measured_horizon(long_plan, LONG)
        facts["has_horizon"] = horizon <= LONG // 2
        plan_horizon = long_plan.horizon is not None and horizon <= long_plan.horizon <= LONG // 2
        if plan_horizon != facts["has_horizon"] or not tail_ok:
            problems.append(f"plan horizon {long_plan.horizon} (tail right: {tail_ok}), measured {horizon}")
    # score_mod: a plan that has one computes the same bias with it
    facts["has_score_mod"] = plan.has_score_mod
    if plan.has_score_mod:
        index = [torch.arange(n).view([-1 if d == axis else 1 for d in range(4)])
                 for axis, n in enumerate((2, H, q_len, k_len))]
        modded = plan.score_mod()(torch.zeros(2, H, q_len, k_len), *index)
        if not torch.allclose(modded[..., causal], b1.expand_as(modded)[..., causal], rtol=1e-5, atol=1e-5):
            problems.append("score_mod is not the plan's bias")
    return facts, problems


@pytest.mark.parametrize("capability", CAPABILITIES)
@pytest.mark.parametrize("spec", SPECS)
def test_declared_capability_matches_behaviour(spec, capability):
    """Each class-level declaration, read as backends and commands read it (positions.scheme), is
    what the built variant does: adds_bias <=> plan() is a bias; rotates <=> rotate() changes q or
    k; content_dependent <=> two query sets give two biases; key_dependent <=> two key sets do;
    input_dependent <=> two layer inputs do; distance_only <=> the bias is Toeplitz
    on a rectangle; has_horizon <=> at a long length every row is constant beyond some distance;
    linear <=> the causal bias is -slope_h (i - j); separable <=> it is r(i) + c(j) with c not
    constant; has_score_mod <=> the plan has a score_mod."""
    declared = getattr(positions.scheme(spec), capability)
    assert getattr(perturbed(spec), capability) == declared
    facts, _ = measure(spec)
    assert facts[capability] == declared, f'"{spec}" declares {capability}={declared}'


@pytest.mark.parametrize("spec", SPECS)
def test_plan_extras_agree_with_the_bias(spec):
    """What the backends read from a plan besides its bias says what the bias does: a horizon (with
    its tail) exactly where the bias has one, linear slopes exactly for a linear bias and equal to
    its slopes, distance_only only for a Toeplitz bias, a score_mod equal to the bias, and the same
    plan without queries for a scheme that does not depend on them."""
    _, problems = measure(spec)
    assert problems == [], f"{spec}: {problems}"


@pytest.mark.parametrize("name", ALL)
def test_prepare_plans_from_the_projected_queries_then_rotates(name):
    """prepare() = plan(q) from the queries BEFORE rotate, then rotate; a plan passed in is kept."""
    enc = perturbed(name)
    q, k = _queries(5, 7), torch.randn(2, H, 9, D, generator=torch.Generator().manual_seed(8))
    x = layer_input(enc, 2, 9)
    q_rot, k_rot, plan = enc.prepare(q, k, x=x)
    want_q, want_k = enc.rotate(q, k)
    torch.testing.assert_close(q_rot, want_q, rtol=0, atol=0)
    torch.testing.assert_close(k_rot, want_k, rtol=0, atol=0)
    assert (plan is None) == (not enc.adds_bias)
    if plan is not None:
        torch.testing.assert_close(plan.full(), enc.plan(5, 9, q, k, x).full(), rtol=0, atol=0)
        given = enc.plan(5, 9, _queries(5, 9), k, x)
        assert enc.prepare(q, k, given)[2] is given
