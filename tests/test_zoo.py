"""Hand-computed values for the variants of the zoo (KERPLE, FIRE, Sandwich, xPos, dynamic,
Transformer-XL, t5-log2, xl with log-scaled distances), and the backends they claim."""

import math

import pytest
import torch

from relbench import positions
from relbench.attention import attention, check
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


def test_xpos_scale_values_and_relative_decay():
    from relbench.positions.xpos import xpos_scale

    scale = xpos_scale(torch.tensor([0, 512, -512]), head_dim=4)
    zeta = torch.tensor([0.4 / 1.4, (0.5 + 0.4) / 1.4])
    expected = torch.stack([torch.ones(2), zeta, 1 / zeta])
    torch.testing.assert_close(scale, torch.cat((expected, expected), dim=-1))
    enc = build("xpos")
    ones = torch.ones(1, H, 1, D)
    # a query at position n and a key at m: q.k = sum_c zeta_c^((n-m)/512) x rotation
    q, k = enc.rotate(ones.expand(1, H, 600, D).clone(), ones.expand(1, H, 600, D).clone())
    near, far = (q[0, 0, 599] * k[0, 0, 598]).sum(), (q[0, 0, 599] * k[0, 0, 0]).sum()
    assert far.abs() < near.abs()


def test_dynamic_starts_unbiased_and_is_log_scaled():
    enc = build("dynamic")
    assert enc.distance_bias(torch.arange(10)).abs().max() == 0
    torch.testing.assert_close(enc.features(torch.tensor([0, 1, -3])), torch.tensor([0, math.log(2), -math.log(4)]))


def test_transformer_xl_matches_the_formula():
    enc = build("transformer-xl")
    with torch.no_grad():
        for p in enc.parameters():
            p.normal_(0, 0.5)
    q, k = torch.randn(1, H, 5, D), torch.randn(1, H, 5, D)
    q_u, k_same = enc.rotate(q, k)
    bias = enc.plan(5, 5, q_u).full()                                         # (1, H, 5, 5)
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
    q, k = enc.rotate(q, k)
    ref = attention(q, k, v, position=enc, backend="reference")
    torch.testing.assert_close(attention(q, k, v, position=enc, backend="flex"), ref, rtol=1e-4, atol=1e-4)


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
