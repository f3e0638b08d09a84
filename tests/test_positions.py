"""Registry-wide properties of every position variant, plus hand-computed values of the maths."""

import math

import pytest
import torch
from helpers import full_bias, layer_input

from relbench import positions
from relbench.errors import RelbenchError
from relbench.positions.base import UnsupportedLength

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


def test_an_option_whose_default_is_none_takes_the_type_its_annotation_names():
    # sinusoidal's scale defaults to None (d^-1/2) and is a float: it was once kept as the string "0.5"
    enc = positions.build_spec("sinusoidal:scale=0.5", n_heads=2, head_dim=8, train_length=16)
    assert enc.scale == 0.5 and isinstance(enc.scale, float)
    torch.testing.assert_close(enc.embed(4), positions.build("sinusoidal", n_heads=2, head_dim=8).embed(4) * 0.5 / 16 ** -0.5)
    with pytest.raises(RelbenchError, match="not a valid float"):
        positions.build_spec("sinusoidal:scale=big", n_heads=2, head_dim=8)


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
    assert set(CONTENT) == {"shaw", "transformer-xl", "cope", "dape", "path"} and BATCH <= set(BIAS)
    assert set(KEYS) == {"cope", "dape", "path", "grape-a"} and set(INPUT) == {"fox", "cable", "path"}
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
    """The determinism test below runs over PARAMETRIC only: the others have nothing to draw.
    A variant gaining or losing parameters must be added here, so it cannot drop out unseen."""
    assert set(PARAMETRIC) == {"learned", "xl", "t5", "t5-log2", "shaw", "dynamic", "fire", "kerple-log",
                               "kerple-power", "transformer-xl", "fox", "cable", "cope", "dape", "bam", "pope",
                               "path", "grape-a"}
    assert set(ALL) - set(PARAMETRIC) == {"none", "sinusoidal", "rope", "hope", "partial_rope", "xpos", "alibi", "sandwich",
                                          "stickbreaking"}


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


ZERO_INIT = {"cope",   # the paper's code starts its position table at zero: nothing to draw
             "pope",   # x-transformers starts the keys' phase at zero (bias_uniform_init=False)
             "bam"}    # the official defaults: the scale at the ALiBi slopes, the shape at 1 (bam:scale_init=sampled draws)
