"""What a position scheme really does, measured without reading its declarations: one boolean per
capability (adds a bias, rotates, depends on the queries, keys or layer input, distance only, a
horizon, linear, separable, a score_mod, replaces softmax attention, places tokens at chosen
positions) and the places where its plan's extras disagree with the bias the plan materialises.
The contract's capability properties (relbench/contract/properties.py) compare these with what the
class declares; tests/test_capabilities.py runs them on every built-in.

The scheme is built small (4 heads of 8, trained length 32) with its parameters moved off their
initial values, so a learned table that starts at zero can still show what it can do.
"""

from __future__ import annotations

import functools

import torch

from relbench import positions
from relbench.positions.base import PositionEncoding

H, D = 4, 8
TRAIN_LENGTH = 32
RECT = (24, 100)          # a rectangle, queries the last 24 of 100 positions (past FIRE's threshold)
LONG = 2 * 1024 + 256     # twice t5-log2's default horizon (1024) and more: every horizon shows
CAPABILITIES = ("adds_bias", "rotates", "content_dependent", "key_dependent", "input_dependent",
                "distance_only", "has_horizon", "linear", "separable", "has_score_mod", "replaces_softmax",
                "takes_positions")
# gapped positions of two sequences of 6 tokens within [0, 15): where takes_positions places them
CHOSEN = torch.tensor([[0, 2, 3, 7, 11, 14], [1, 4, 5, 6, 9, 13]])


def _logits(enc: PositionEncoding, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor, **given) -> torch.Tensor:
    """(B, H, Lq, Lk) content logits of the rotated q, k plus the plan's bias, at `given` positions."""
    q_rot, k_rot = enc.rotate(q, k, **given)
    logits = q_rot @ k_rot.transpose(-1, -2)
    plan = enc.plan(q.shape[-2], k.shape[-2], q, k, x, **given) if enc.adds_bias else None
    return logits if plan is None else logits + plan.full()


def measured_takes_positions(enc: PositionEncoding) -> bool:
    """Whether the scheme places tokens at chosen positions p (embed, rotate and plan with
    `positions=p`): it has an encoding (embeds, rotates or adds a bias), and its logits and
    embeddings at p are those of a sequence as long as the largest p, with the tokens at p (zeros
    between), read at rows and columns p. A scheme whose bias reads the tokens in between (FoX,
    CoPE) or whose interface has no positions does not; neither does `none`, which has nothing to place."""
    if enc.replaces_softmax:
        return False
    batch, length = CHOSEN.shape
    span = int(CHOSEN.max()) + 1
    q, k = queries(length, 21, batch), queries(length, 22, batch)
    x = layer_input(enc, batch, length, 23)
    try:
        at = _logits(enc, q, k, x, positions=CHOSEN)
        embedded = enc.embed(length, positions=CHOSEN)
    except (TypeError, ValueError, RuntimeError):   # an interface without positions
        return False
    plain_embedded = enc.embed(length)
    long_embedded = enc.embed(span)
    for b, p in enumerate(CHOSEN):
        q_long, k_long, x_long = (torch.zeros(1, t.shape[1], span, t.shape[-1]) for t in (q, k, x[:, None]))
        q_long[0, :, p], k_long[0, :, p], x_long[0, :, p] = q[b], k[b], x[b][None]
        read = _logits(enc, q_long, k_long, x_long[:, 0])[0][:, p][:, :, p]
        if not torch.allclose(at[b], read, rtol=1e-4, atol=1e-4):
            return False
        if (embedded is None) != (long_embedded is None) or (
                embedded is not None and not torch.allclose(embedded[b], long_embedded[p], rtol=1e-5, atol=1e-6)):
            return False
    q_rot, k_rot = enc.rotate(q, k)
    rotates = not (torch.equal(q_rot, q) and torch.equal(k_rot, k))
    return plain_embedded is not None or rotates or (enc.adds_bias and enc.plan(length, length, q, k, x) is not None)


def layer_input(enc: PositionEncoding, batch: int, k_len: int, seed: int = 0) -> torch.Tensor:
    """A random layer input (batch, k_len, d_model) for schemes that read it (FoX's forget gates)."""
    return torch.randn(batch, k_len, enc.d_model, generator=torch.Generator().manual_seed(seed))


def perturbed(spec: str) -> PositionEncoding:
    """`spec` built small, initialised from a seeded generator, then every parameter moved away from
    its initial value (transformer-xl's u and v, dynamic's last layer start at zero), then projected
    back into its allowed set as training does."""
    enc = positions.build_spec(spec, n_heads=H, head_dim=D, train_length=TRAIN_LENGTH)
    enc.reset_parameters(torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in enc.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=g))
    enc.project_parameters()
    return enc


def queries(q_len: int, seed: int, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, H, q_len, D, generator=torch.Generator().manual_seed(seed))


def measured_horizon(plan, length: int, rows: int = 512) -> tuple[int, bool]:
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
def measure(spec: str) -> tuple[dict[str, bool], list[str]]:
    """What the built scheme really does, without reading any declaration: one boolean per
    capability, and the list of places where its plan's extras (the plan-level horizon, tail,
    linear slopes, score_mod, distance_only) disagree with the bias the plan itself materialises.
    Cached per spec: call `measure.cache_clear()` after changing a scheme's code (a plugin reloaded)."""
    enc = perturbed(spec)
    q_len, k_len = RECT
    q1, q2 = queries(q_len, 3), queries(q_len, 4)
    k = torch.randn(2, H, k_len, D, generator=torch.Generator().manual_seed(5))
    x, x2 = layer_input(enc, 2, k_len, 9), layer_input(enc, 2, k_len, 10)
    k2 = torch.randn(2, H, k_len, D, generator=torch.Generator().manual_seed(11))
    q_rot, k_rot = enc.rotate(q1, k)
    facts, problems = dict.fromkeys(CAPABILITIES, False), []
    facts["rotates"] = not (torch.equal(q_rot, q1) and torch.equal(k_rot, k))
    facts["takes_positions"] = measured_takes_positions(enc)
    # replaces_softmax: attend() gives an output, and not softmax attention's (stick-breaking)
    v = torch.randn(2, H, k_len, D, generator=torch.Generator().manual_seed(12))
    own = enc.attend(q_rot, k_rot, v)
    if own is not None:
        from relbench.attention import reference_attention

        softmax = reference_attention(q_rot, k_rot, v, enc.plan(q_len, k_len, q1, k, x) if enc.adds_bias else None)
        facts["replaces_softmax"] = not torch.allclose(own, softmax, rtol=1e-4, atol=1e-5)
    plan = enc.plan(q_len, k_len, q1, k, x)
    facts["adds_bias"] = plan is not None
    if plan is None:
        return facts, problems

    def differs(b2):
        return not torch.equal(b1.expand_as(b2), b2.expand_as(b1))

    b1 = plan.full()                                              # (H, q, k) or (B, H, q, k)
    if not (b1.isfinite().all() and b1.std() > 1e-3):
        problems.append("the bias is not finite, or constant: nothing can be measured on it")
        return facts, problems
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
    facts["linear"] = measured_linear(plan, b1, problems)
    facts["separable"] = measured_separable(plan, b1, problems)
    if facts["key_dependent"] or facts["input_dependent"]:
        # any horizon is the data's, not the scheme's (measured_plan_horizon says why)
        if plan.horizon is not None:
            problems.append(f"a data-dependent plan names horizon {plan.horizon}")
    else:
        facts["has_horizon"] = measured_plan_horizon(enc, problems)
    facts["has_score_mod"] = plan.has_score_mod
    if plan.has_score_mod and not score_mod_matches(plan, b1):
        problems.append("score_mod is not the plan's bias")
    return facts, problems


def causal_distances(q_len: int = RECT[0], k_len: int = RECT[1]) -> torch.Tensor:
    """(q_len, k_len) float distances i - j of the last q_len queries to every key (>= 0: causal)."""
    return (torch.arange(k_len - q_len, k_len)[:, None] - torch.arange(k_len)[None, :]).float()


def measured_linear(plan, b1: torch.Tensor, problems: list[str]) -> bool:
    """Whether the bias `b1` of `plan` (on the RECT rectangle) is -s_h (i - j) on every causal pair,
    one slope per head (read at distance 1); where plan.linear_slopes disagree, a problem is appended."""
    q_len, k_len = RECT
    distance = causal_distances()
    causal = distance >= 0
    rows = torch.arange(q_len)
    slope = -b1[..., rows, rows + k_len - q_len - 1].reshape(-1, H, q_len)        # (B or 1, H, q)
    same_slope = torch.allclose(slope, slope[:1, :, :1].expand_as(slope))
    residual = b1 + slope.reshape(*b1.shape[:-1], 1) * distance
    linear = same_slope and torch.allclose(residual[..., causal], torch.zeros(()), rtol=0, atol=1e-5)
    if (plan.linear_slopes is not None) != linear:
        problems.append(f"plan.linear_slopes is {plan.linear_slopes} on a bias with linear={linear}")
    elif plan.linear_slopes is not None and not torch.allclose(
            (-plan.linear_slopes[:, None, None] * distance).expand_as(b1)[..., causal], b1[..., causal]):
        problems.append("plan.linear_slopes are not the bias's slopes (split-linear uses them)")
    return linear


def measured_separable(plan, b1: torch.Tensor, problems: list[str]) -> bool:
    """Whether the bias `b1` of `plan` (on the RECT rectangle) is r(i) + c(j) on causal pairs with c not
    constant (a constant bias needs no split): r from key 0 (before every query), c from the last row
    (after every key). Where plan.separable or plan.key_terms disagree, problems are appended."""
    q_len, k_len = RECT
    causal = causal_distances() >= 0
    r, c = b1[..., :, :1], b1[..., -1:, :] - b1[..., -1:, :1]
    atol = 1e-6 * (10 + float(b1[..., causal].abs().amax().detach()))     # r + c rounds at the scale of the largest term
    separable = (torch.allclose((r + c).expand_as(b1)[..., causal], b1[..., causal], rtol=0, atol=atol)
                 and bool((c - c[..., :1]).abs().amax() > 1e-4))
    if plan.separable != separable:
        problems.append(f"plan.separable is {plan.separable} on a bias with separable={separable}")
    elif plan.separable:
        for anchor in (0, k_len - q_len, k_len - 2):   # the key terms the split-linear path reads, any anchor
            expected = b1[..., -1, :] - b1[..., -1, anchor:anchor + 1]
            if not torch.allclose(plan.key_terms(anchor, k_len).expand_as(expected), expected, rtol=0, atol=atol):
                problems.append(f"plan.key_terms({anchor}) are not the bias's per-key terms")
    return separable


def measured_plan_horizon(enc: PositionEncoding, problems: list[str]) -> bool:
    """has_horizon, measured at a long length (> 2x t5-log2's 1024): every row constant from h <= LONG/2;
    the plan must name such a horizon then (and no horizon otherwise), with tail() the constant, or a
    problem is appended. Only for a bias that neither keys nor the layer input move: where they do
    (CoPE's counts saturate at p_max only where the gates add up), any horizon is the data's, not the
    scheme's: the split path needs one fixed for every input, so such a plan names none, and one
    random input cannot show there is none."""
    long_plan = enc.plan(LONG, LONG, queries(LONG, 6))
    horizon, tail_ok = measured_horizon(long_plan, LONG)
    has_horizon = horizon <= LONG // 2
    plan_horizon = long_plan.horizon is not None and horizon <= long_plan.horizon <= LONG // 2
    if plan_horizon != has_horizon or not tail_ok:
        problems.append(f"plan horizon {long_plan.horizon} (tail right: {tail_ok}), measured {horizon}")
    return has_horizon


def score_mod_matches(plan, b1: torch.Tensor) -> bool:
    """Whether the plan's score_mod computes its bias `b1` (on the RECT rectangle) on every causal pair."""
    q_len, k_len = RECT
    causal = causal_distances() >= 0
    index = [torch.arange(n).view([-1 if d == axis else 1 for d in range(4)])
             for axis, n in enumerate((2, H, q_len, k_len))]
    modded = plan.score_mod()(torch.zeros(2, H, q_len, k_len), *index)
    return torch.allclose(modded[..., causal], b1.expand_as(modded)[..., causal], rtol=1e-5, atol=1e-5)
