"""Hand-computed values for the variants of the zoo (KERPLE, FIRE, Sandwich, xPos, dynamic,
Transformer-XL, t5-log2, xl with log-scaled distances), and the backends they claim."""

import math

import pytest
import torch

from relbench import positions
from relbench.attention import attention, check, recording
from relbench.errors import UsageError

H, D = 4, 8


def build(name, **options):
    enc = positions.build(name, n_heads=H, head_dim=D, train_length=64, **options)
    enc.reset_parameters(torch.Generator().manual_seed(0))
    return enc


def test_kerple_log_values():
    enc = build("kerple-log")
    with torch.no_grad():
        enc.r1.copy_(torch.tensor([1.0, 2.0, 0.5, 0.001]))   # the last is kept at 0.01
        enc.r2.copy_(torch.tensor([1.0, 0.5, 3.0, 1.0]))
    enc.project_parameters()
    bias = enc.distance_bias(torch.tensor([0, 1, 3]))
    expected = torch.tensor([[0, -math.log(2), -math.log(4)],
                             [0, -2 * math.log(1.5), -2 * math.log(2.5)],
                             [0, -0.5 * math.log(4), -0.5 * math.log(10)],
                             [0, -0.01 * math.log(2), -0.01 * math.log(4)]])
    torch.testing.assert_close(bias, expected)


def test_kerple_power_values_and_exponent_cap():
    enc = build("kerple-power")
    with torch.no_grad():
        enc.r1.copy_(torch.tensor([1.0, 0.5, 1.0, 1.0]))
        enc.r2.copy_(torch.tensor([1.0, 2.0, 0.5, 5.0]))     # 5 is kept at 2
    enc.project_parameters()
    bias = enc.distance_bias(torch.tensor([0, 2, 4]))
    expected = torch.tensor([[0, -2, -4], [0, -2, -8], [0, -math.sqrt(2), -2], [0, -4, -16]], dtype=torch.float32)
    torch.testing.assert_close(bias, expected)


def test_kerple_parameters_on_their_floor_still_get_gradients():
    enc = build("kerple-log")
    with torch.no_grad():
        enc.r1.fill_(-1.0)
    enc.project_parameters()   # stored at the floor, 0.01; the gradient can lift it off again
    assert torch.equal(enc.r1.detach(), torch.full((H,), 0.01))
    enc.distance_bias(torch.arange(5)).sum().backward()
    assert (enc.r1.grad != 0).all()


def test_sandwich_values():
    enc = build("sandwich", dim=4)
    # dim 4: frequencies 10000^(-2k/4) for k = 1, 2: 1/100 and 1/10000; inner product minus d/2 = 2
    d = torch.tensor([0, 1, 50])
    inner = torch.cos(d / 100.0) + torch.cos(d / 10000.0) - 2
    expected = torch.stack([inner / (8 * h / H) for h in range(1, H + 1)])
    torch.testing.assert_close(enc.distance_bias(d), expected.float())
    assert enc.n_params() == 0


def test_fire_values():
    enc = build("fire")
    plan = enc.plan(3, 600)
    i, j = 599, 597
    d, c = 2.0, 0.1
    threshold = 64 / 4                                                      # a quarter of the training length
    x = math.log(c * d + 1) / (math.log(c * max(threshold, i) + 1) + 1e-6)
    expected = enc.mlp(torch.tensor([[x]], dtype=torch.float32))[0]            # (H,)
    got = plan.block(597, 600, 0, 600)[:, 2, j]                               # row of query 599
    torch.testing.assert_close(got, expected)
    # below the threshold the normaliser is psi(16): the bias depends on i - j alone there
    early = enc.plan(100, 100).full()
    torch.testing.assert_close(early[:, 10, 5], early[:, 15, 10])
    assert not torch.allclose(early[:, 10, 5], early[:, 20, 15])
    # beyond it, it does not: the same distance reads a different normalised value
    late = enc.plan(2000, 2000).full()
    assert not torch.allclose(late[:, 1000, 990], late[:, 1900, 1890])


def test_xpos_scale_values():
    from relbench.positions.xpos import xpos_scale

    scale = xpos_scale(torch.tensor([0, 512, -512]), head_dim=4)
    zeta = torch.tensor([0.4 / 1.4, (0.5 + 0.4) / 1.4])
    expected = torch.stack([torch.ones(2), zeta, 1 / zeta])
    torch.testing.assert_close(scale, torch.cat((expected, expected), dim=-1))


def _same_vector_products(enc, pair, q_len, k_len):
    """(H, q_len, k_len) q_n . k_m after enc.rotate, for the same vector x as query and key at
    every position: x = 0.6 e_c + 0.8 e_(c + D/2) (|x|^2 = 1) on channel pair c = `pair` only."""
    x = torch.zeros(D)
    x[pair], x[pair + D // 2] = 0.6, 0.8
    q_rot, k_rot = enc.rotate(x.expand(1, H, q_len, D).clone(), x.expand(1, H, k_len, D).clone())
    return (q_rot[0] @ k_rot[0].transpose(-2, -1)).double()


@pytest.mark.parametrize("q_len, k_len", [(600, 600), (7, 600)])
def test_xpos_decays_by_zeta_per_channel_pair_and_rope_does_not(q_len, k_len):
    """The same vector as query and key at every position, on one channel pair c (channels c and
    c + D/2, the NeoX layout): both schemes rotate the pair by (n - m) theta_c, theta_c =
    10000^(-2c/D), so RoPE gives q_n . k_m = cos((n - m) theta_c), and xPos multiplies it by
    zeta_c^((n - m) / 512), zeta_c = (2c/D + 0.4) / 1.4: by hand, for D = 8, 0.4/1.4, 0.65/1.4,
    0.9/1.4, 1.15/1.4. Queries are the last q_len of k_len positions."""
    zetas = [0.4 / 1.4, 0.65 / 1.4, 0.9 / 1.4, 1.15 / 1.4]
    distance = (torch.arange(k_len - q_len, k_len)[:, None] - torch.arange(k_len)[None, :]).double()   # n - m
    causal = distance >= 0
    xpos, rope = build("xpos"), build("rope")
    for pair, zeta in enumerate(zetas):
        plain = torch.cos(distance * 10000.0 ** (-2 * pair / D))                  # RoPE, by hand
        decayed = plain * zeta ** (distance / 512)                                 # xPos, by hand
        for enc, want in ((rope, plain), (xpos, decayed)):
            got = _same_vector_products(enc, pair, q_len, k_len)
            torch.testing.assert_close(got[:, causal], want.expand_as(got)[:, causal], rtol=1e-4, atol=1e-5,
                                       msg=f"{enc.name}, channel pair {pair}")
    # the factor itself, xPos over RoPE: 1 at n - m = 0, zeta_c at n - m = 512, zeta_c^(1/2) at 256
    pair = D // 2 - 1                   # the slowest pair: cos((n - m) theta) stays far from 0 up to 512
    ratio = _same_vector_products(xpos, pair, q_len, k_len) / _same_vector_products(rope, pair, q_len, k_len)
    got = ratio[:, -1, [-1, -257, -513]]                                           # last query, n - m = 0, 256, 512
    want = torch.tensor([1.0, zetas[pair] ** 0.5, zetas[pair]], dtype=torch.float64)
    torch.testing.assert_close(got, want.expand_as(got), rtol=1e-4, atol=1e-6)


def test_dynamic_starts_unbiased_inside_a_gpt_and_is_log_scaled():
    """Inside a GPT, which initialises every module (position modules included): the bias each
    layer adds at initialisation is exactly zero, while the MLP is not dead (its hidden layer is
    drawn, and its zero last layer gets a gradient), so training starts unbiased and can move."""
    from relbench.model import GPT, ModelConfig

    layers, length = 3, 40
    model = GPT(ModelConfig(vocab_size=64, d_model=32, n_layers=layers, n_heads=H, train_length=64,
                            position="dynamic"), seed=0)
    assert len(model.positions) == layers                                          # one MLP per layer
    plans = {}
    tokens = torch.randint(0, 64, (2, length), generator=torch.Generator().manual_seed(0))
    logits = model(tokens, observe=lambda layer, q, k, plan: plans.__setitem__(layer, plan))
    assert sorted(plans) == list(range(layers))
    for layer, plan in plans.items():
        bias = plan.full()
        assert bias.shape == (H, length, length)
        assert torch.equal(bias, torch.zeros_like(bias)), f"layer {layer} starts biased"
        hidden = model.position(layer).mlp[0]
        assert hidden.weight.abs().sum() > 0 and hidden.bias.abs().sum() > 0
    logits.logsumexp(-1).sum().backward()
    for layer in range(layers):
        assert model.position(layer).mlp[-1].weight.grad.abs().sum() > 0
    enc = build("dynamic")
    torch.testing.assert_close(enc.features(torch.tensor([0, 1, -3])), torch.tensor([0, math.log(2), -math.log(4)]))


def test_transformer_xl_matches_the_formula():
    enc = build("transformer-xl")
    with torch.no_grad():
        for p in enc.parameters():
            p.normal_(0, 0.5)
    q, k = torch.randn(1, H, 5, D), torch.randn(1, H, 5, D)
    q_u, k_same, plan = enc.prepare(q, k)                                      # plan from q, then q + u
    bias = plan.full()                                         # (1, H, 5, 5)
    R = positions.absolute.sinusoid_table(5, H * D)
    for i in range(5):
        for j in range(i + 1):
            r = enc.W_R(R[i - j]).view(H, D)
            content = ((q[0, :, i] + enc.u) * k[0, :, j]).sum(-1)
            position = ((q[0, :, i] + enc.v) * r).sum(-1)
            total = (q_u[0, :, i] * k_same[0, :, j]).sum(-1) / math.sqrt(D) + bias[0, :, i, j]
            torch.testing.assert_close(total, (content + position) / math.sqrt(D))


def test_t5_log2_buckets():
    from relbench.positions.t5 import log2_bucket

    d = torch.tensor([0, 1, 2, 3, 4, 7, 8, 511, 512, 1023, 1024, 5000, -3])
    assert log2_bucket(d).tolist() == [0, 1, 2, 2, 3, 3, 4, 9, 10, 10, 11, 11, 0]
    assert build("t5-log2").table.shape == (12, H)


def test_xl_log_scaled_distances():
    enc = build("xl", k=64, log_from=8, log_buckets=4)
    assert enc.table.shape == (2 * (8 + 4) + 1, H)
    # rows: 12 + d below 8; 12 + 8 + floor(log(d/8)/log(8) * 4) up to 63 (log bucket b starts at
    # 8 * 8^(b/4): 13.45, 22.6, 38.05); 12 + 12 from 64 on; negative distances mirror
    d = torch.tensor([0, 7, 8, 13, 14, 22, 23, 38, 39, 63, 64, 1000, -7, -14, -1000])
    assert enc.index(d).tolist() == [12, 19, 20, 20, 21, 21, 22, 22, 23, 23, 24, 24, 5, 3, 0]
    assert enc.horizon() == 64


@pytest.mark.parametrize("name", ["fire", "kerple-log", "sandwich", "dynamic"])
def test_split_is_refused_for_biases_without_a_horizon(name):
    with pytest.raises(UsageError, match="chunked"):
        check("split", build(name))


def test_flex_is_refused_for_transformer_xl():
    with pytest.raises(UsageError, match="score_mod"):
        check("flex", build("transformer-xl"))


@pytest.mark.parametrize("name", ["fire", "kerple-log", "sandwich", "xpos", "t5-log2"])
@torch.no_grad()
def test_flex_matches_reference_for_the_zoo(name):
    enc = build(name)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, H, 64, D, generator=g) for _ in range(3))
    q, k, plan = enc.prepare(q, k)
    ref = attention(q, k, v, plan, "reference")
    with recording() as taken:
        out = attention(q, k, v, plan, "flex")
    assert dict(taken) == {"flex": 1}
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fire_curve_is_its_mlp(seed):
    """FIRE evaluates its ReLU MLP as the piecewise-linear function it is: values and gradients (to x
    and to every MLP weight) equal the MLP's, including with random weights that put kinks in [0, 1]
    and a unit with zero input weight."""
    enc = build("fire")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in enc.mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
        enc.mlp[0].weight[3, 0] = 0.0
    x = torch.rand(40, 50, generator=g).requires_grad_(True)
    want = enc.mlp(x[..., None]).permute(2, 0, 1)
    got = enc.curve(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    weights = torch.randn(want.shape, generator=g)
    params = [x, *enc.mlp.parameters()]
    for a, b in zip(torch.autograd.grad((want * weights).sum(), params), torch.autograd.grad((got * weights).sum(), params)):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("c, threshold_ratio", [(0.1, 0.25), (2.0, 1.0), (0.003, 0.1)])
@torch.no_grad()
def test_fire_inference_bias_by_key_segments_is_the_mlp(c, threshold_ratio):
    """The inference bias of FIRE (lines between ramp bounds, ramps only inside them, groups of
    FIRE_ROWS query rows) equals its MLP on every pair, with weights that put many kinks inside
    [0, 1), rows below and above the threshold, several row groups per block, query suffixes, and
    psi from nearly linear (small c) to strongly logarithmic (large c)."""
    from relbench.positions import fire as fire_module

    enc = positions.build("fire", n_heads=H, head_dim=D, train_length=256, threshold_ratio=threshold_ratio)
    enc.reset_parameters(torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(5)
    enc.mlp[0].weight.copy_(torch.rand(enc.mlp[0].weight.shape, generator=g) * 4 - 2)
    enc.mlp[0].bias.copy_(-enc.mlp[0].weight[:, 0] * (torch.rand(32, generator=g) * 1.4 - 0.2))  # kinks in (-0.2, 1.2)
    enc.mlp[2].weight.copy_(torch.randn(enc.mlp[2].weight.shape, generator=g))
    enc.c.fill_(c)
    kinks = -enc.mlp[0].bias / enc.mlp[0].weight[:, 0]
    assert ((kinks > 0) & (kinks < 1)).sum() >= 20
    for q_len, k_len, (q0, q1) in [(300, 300, (0, 300)), (300, 300, (130, 290)), (100, 700, (650, 700))]:
        plan = enc.plan(q_len, k_len)
        got = plan.causal_block(q0, q1, q1)
        query = torch.arange(q0, q1, dtype=torch.float32)[:, None]
        distance = (query - torch.arange(q1)[None]).abs()
        x = enc.psi(distance) / (enc.psi(torch.maximum(query, enc.threshold())) + fire_module.EPS)
        want = enc.mlp(x[..., None]).permute(2, 0, 1).masked_fill(distance_future(q0, q1), float("-inf"))
        assert (q1 - q0) > fire_module.FIRE_ROWS or q_len == 100
        torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)


def distance_future(q0, q1):
    return torch.arange(q0, q1)[:, None] < torch.arange(q1)[None]
