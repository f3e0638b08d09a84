"""Registry-wide properties of every position variant, plus hand-computed values of the maths."""

import functools
import math

import pytest
import torch
from helpers import full_bias, layer_input

from relbench import positions
from relbench.errors import RelbenchError
from relbench.positions.base import PositionEncoding, UnsupportedLength

H, D = 4, 8
ALL = positions.names()


def build(name, **options):
    enc = positions.build(name, n_heads=H, head_dim=D, train_length=32, **options)
    enc.reset_parameters(torch.Generator().manual_seed(1))
    with torch.no_grad():  # make learned tables non-trivial so invariance checks can fail
        for p in enc.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    enc.project_parameters()   # as training does after every step
    return enc


def logits(enc, q, k):
    """Full pre-softmax logits (B, H, Lq, Lk) the attention would see, queries last Lq of Lk."""
    q, k, plan = enc.prepare(q, k, x=layer_input(enc, q.shape[0], k.shape[-2]))
    out = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if plan is not None:
        out = out + plan.full()
    return out


def test_registry_names_and_unknown():
    assert ALL == sorted(ALL)
    assert {"none", "sinusoidal", "learned", "rope", "shaw", "xl", "t5", "alibi"} <= set(ALL)
    with pytest.raises(RelbenchError) as info:
        positions.build("alibii", n_heads=8)
    assert 'did you mean "alibi"' in str(info.value) and "xl" in str(info.value)


def test_unknown_option_is_rejected():
    with pytest.raises(RelbenchError, match="k"):
        positions.build("xl", n_heads=8, kk=3)
    name, options = positions.parse_spec("xl:k=7,shared_heads=true")
    assert name == "xl" and options == {"k": 7, "shared_heads": True}
    with pytest.raises(RelbenchError, match="not a valid int"):
        positions.parse_spec("xl:k=seven")


BIAS = [n for n in ALL if positions.get(n).adds_bias]
CONTENT = [n for n in ALL if positions.get(n).content_dependent]
KEYS = [n for n in ALL if positions.get(n).key_dependent]
INPUT = [n for n in ALL if positions.get(n).input_dependent]
BATCH = set(CONTENT) | set(KEYS) | set(INPUT)     # a bias per sequence of the batch


def test_bias_variants_include_the_data_dependent_ones():
    """The bias tests below run over BIAS, so they cover Shaw, Transformer-XL, CoPE, DAPE and FoX
    with real queries, keys and layer inputs."""
    assert set(CONTENT) == {"shaw", "transformer-xl", "cope", "dape"} and BATCH <= set(BIAS)
    assert set(KEYS) == {"cope", "dape"} and set(INPUT) == {"fox"}
    assert {"xl", "t5", "alibi", "fire"} <= set(BIAS)


def _data(enc, k_len, seed=5, batch=2):
    """Keys (B, H, k_len, D) and the layer input (B, k_len, d_model), for schemes that read them."""
    return (torch.randn(batch, H, k_len, D, generator=torch.Generator().manual_seed(seed)),
            layer_input(enc, batch, k_len, seed + 100))


@pytest.mark.parametrize("name", ALL)
def test_bias_shape(name):
    enc = build(name)
    q = torch.randn(2, H, 3, D, generator=torch.Generator().manual_seed(4))   # projected queries
    bias = full_bias(enc, 3, 7, q, *_data(enc, 7))
    if name not in BIAS:
        assert enc.plan(3, 7, q) is None and bias is None
    elif name in BATCH:       # one bias per sequence of the batch: it depends on the data
        assert bias.shape == (2, H, 3, 7)
        assert not torch.equal(bias[0], bias[1])
    else:
        assert bias.shape == (H, 3, 7)
    if bias is not None:
        assert bias.isfinite().all() and bias.abs().sum() > 0


@pytest.mark.parametrize("name", [n for n in ALL if positions.get(n).relative])
def test_relative_variants_depend_only_on_distance(name):
    enc = build(name)
    g = torch.Generator().manual_seed(3)
    n, shift = 6, 40  # shift beyond xl/shaw/t5 edges too
    q = torch.randn(1, H, n, D, generator=g)
    k = torch.randn(1, H, n, D, generator=g)
    base = logits(enc, q, k)                                               # positions 0..n-1
    k_far = torch.cat([torch.randn(1, H, shift, D, generator=g), k], dim=2)  # keys 0..shift+n-1
    shifted = logits(enc, q, k_far)[..., shift:]                           # same pairs, shifted by `shift`
    torch.testing.assert_close(shifted, base, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", BIAS)
def test_bias_for_query_suffix_matches_full_square(name):
    """Queries are the last q_len of k_len positions: a suffix of rows of the square bias (for a
    content-dependent scheme, built from the same last q_len queries)."""
    enc = build(name)
    q = torch.randn(2, H, 9, D, generator=torch.Generator().manual_seed(4))
    data = _data(enc, 9)
    full, part = full_bias(enc, 9, 9, q, *data), full_bias(enc, 4, 9, q[..., 5:, :], *data)
    assert full.abs().sum() > 0
    torch.testing.assert_close(part, full[..., 5:, :])


def test_xl_equals_seed_table_lookup():
    enc = build("xl", k=3)
    L = 9
    expected = torch.empty(H, L, L)
    for i in range(L):
        for j in range(L):
            expected[:, i, j] = enc.table[max(-3, min(3, i - j)) + 3]
    torch.testing.assert_close(full_bias(enc, L, L), expected)


def test_xl_shared_heads_has_one_column():
    enc = build("xl", k=4, shared_heads=True)
    assert enc.table.shape == (9, 1)
    bias = full_bias(enc, 5, 5)
    torch.testing.assert_close(bias[0], bias[3])


def test_t5_buckets_unidirectional_hand_computed():
    # relative_position = key - query; n = query - key. 16 exact buckets, then
    # 16 + floor(log(n/16) / log(128/16) * 16), capped at 31.
    n = torch.tensor([0, 1, 15, 16, 22, 31, 32, 63, 64, 127, 128, 1000])
    expected = torch.tensor([0, 1, 15, 16, 18, 21, 21, 26, 26, 31, 31, 31])
    got = positions.t5.relative_position_bucket(-n, bidirectional=False)
    assert got.tolist() == expected.tolist()
    assert positions.t5.relative_position_bucket(torch.tensor([1, 5, 500]), bidirectional=False).tolist() == [0, 0, 0]


def test_t5_buckets_bidirectional_hand_computed():
    # 16 buckets a side, 8 exact; future keys (relative_position > 0) get offset 16.
    # |n| = 11 is still bucket 8 (log(11/8) / log(16) * 8 = 0.92); |n| = 12 is the first in bucket 9.
    rel = torch.tensor([0, -1, 1, -7, 7, -8, 8, -11, 11, -12, 12, -127, 127, -128, 128, -5000])
    expected = torch.tensor([0, 1, 17, 7, 23, 8, 24, 8, 24, 9, 25, 15, 31, 15, 31, 15])
    assert positions.t5.relative_position_bucket(rel, bidirectional=True).tolist() == expected.tolist()


def test_t5_bidirectional_option_gives_future_keys_their_buckets():
    enc = build("t5", bidirectional=True)
    distance = torch.tensor([[0, -1, 1]])  # i - j: j = i + 1 is a future key
    bias = enc.distance_bias(distance)
    torch.testing.assert_close(bias[:, 0, 1], enc.table[17])
    torch.testing.assert_close(bias[:, 0, 2], enc.table[1])


def test_alibi_slopes_power_of_two():
    assert positions.alibi.slopes(8).tolist() == [2.0 ** -k for k in range(1, 9)]


def test_alibi_slopes_not_power_of_two():
    # 6 heads: the 4-head slopes 2^-2, 2^-4, 2^-6, 2^-8, then every other 8-head slope: 2^-1, 2^-3
    assert positions.alibi.slopes(6).tolist() == [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]
    # 12 heads: 8-head slopes, then 16-head slopes 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5
    expected = [2.0 ** -k for k in range(1, 9)] + [2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5]
    torch.testing.assert_close(positions.alibi.slopes(12), torch.tensor(expected))


def test_alibi_bias_values():
    enc = build("alibi")
    bias = full_bias(enc, 3, 3)
    assert bias[0, 2, 0].item() == pytest.approx(-2 * 2 ** -2)   # H=4: slopes 2^-2, 2^-4, ...
    assert bias[1, 2, 1].item() == pytest.approx(-1 * 2 ** -4)
    assert bias[:, 1, 1].abs().sum().item() == 0


def test_shaw_matches_explicit_formula():
    enc = build("shaw", k=2)
    q = torch.randn(1, H, 5, D)
    got = full_bias(enc, 5, 5, q)
    for i in range(5):
        for j in range(5):
            a = enc.vectors[max(-2, min(2, j - i)) + 2]
            torch.testing.assert_close(got[0, :, i, j], q[0, :, i] @ a / math.sqrt(D))


def test_rope_preserves_norm_and_is_identity_at_zero():
    enc = build("rope")
    q = torch.randn(1, H, 5, D)
    q_rot, _ = enc.rotate(q, q)
    torch.testing.assert_close(q_rot.norm(dim=-1), q.norm(dim=-1))
    torch.testing.assert_close(q_rot[..., 0, :], q[..., 0, :])


def test_sinusoid_values():
    table = positions.absolute.sinusoid_table(3, 4)
    # d=4: frequencies 1 and 1/100; PE[p] = [sin p, cos p, sin p/100, cos p/100]
    p = torch.arange(3.0)
    expected = torch.stack([p.sin(), p.cos(), (p / 100).sin(), (p / 100).cos()], dim=1)
    torch.testing.assert_close(table, expected)


def test_learned_refuses_lengths_beyond_training():
    enc = build("learned")
    assert enc.embed(32).shape == (32, H * D)
    with pytest.raises(UnsupportedLength, match="below 32"):
        enc.embed(33)


PARAMETRIC = [n for n in ALL if positions.build(n, n_heads=H, head_dim=D, train_length=32).n_params() > 0]


def test_parametric_variants_are_the_expected_ones():
    """The determinism test below runs over PARAMETRIC only: the other six have nothing to draw.
    A variant gaining or losing parameters must be added here, so it cannot drop out unseen."""
    assert set(PARAMETRIC) == {"learned", "xl", "t5", "t5-log2", "shaw", "dynamic", "fire", "kerple-log",
                               "kerple-power", "transformer-xl", "fox", "cope", "dape"}
    assert set(ALL) - set(PARAMETRIC) == {"none", "sinusoidal", "rope", "xpos", "alibi", "sandwich"}


def _initial_parameters(name, seed, global_seed):
    torch.manual_seed(global_seed)    # reset_parameters must not read the global generator
    enc = positions.build(name, n_heads=H, head_dim=D, train_length=32)
    with torch.no_grad():              # nothing may survive from the constructor
        for p in enc.parameters():
            p.fill_(float("nan"))
    enc.reset_parameters(torch.Generator().manual_seed(seed))
    return {key: p.detach().clone() for key, p in enc.named_parameters()}


@pytest.mark.parametrize("name", PARAMETRIC)
def test_build_is_deterministic_per_generator(name):
    """reset_parameters sets every parameter from the generator it is given and from nothing else:
    the same seed gives the same values whatever the global seed, another seed other values."""
    a, b, other = (_initial_parameters(name, 1, 10), _initial_parameters(name, 1, 20),
                   _initial_parameters(name, 2, 10))
    assert a
    for key in a:
        assert a[key].isfinite().all(), f"{name}: {key} not set by reset_parameters"
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, msg=f"{name}: {key}")
    if name not in ZERO_INIT:
        assert any(not torch.equal(a[key], other[key]) for key in a), f"{name} ignores its generator"


ZERO_INIT = {"cope"}   # the paper's code starts its position table at zero: nothing to draw


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
