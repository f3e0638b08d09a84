"""BAM (positions/bam.py): hand-computed bias values, the official code's prior as a reference, its
defaults, its options and what training sees of them."""

import math

import pytest
import torch

from relbench import positions
from relbench.errors import UsageError
from relbench.model import GPT, ModelConfig
from relbench.positions.alibi import slopes


def gpt(spec):
    return GPT(ModelConfig(vocab_size=256, d_model=32, n_layers=3, n_heads=4, train_length=64, position=spec), seed=0)


def built(spec, n_heads=2, train_length=64):
    enc = positions.build_spec(spec, n_heads=n_heads, head_dim=8, train_length=train_length)
    enc.reset_parameters(torch.Generator().manual_seed(0))
    return enc


def official_prior(scale, shape, loc, seq_len, eps=1e-5):
    """ArthurSBianchessi/BAM, models/bam.py, AttentionPrior.forward, written out: (1, H, L, L) with
    b = positions[None, :] - positions[:, None] (j - i), shifted by 2 sinh(loc), then
    -((|b| + eps) ** shape) * exp(scale), scale the log of the head's slope."""
    p = torch.arange(seq_len).float()
    b = (p[None, :] - p[:, None]).reshape(1, 1, seq_len, seq_len)
    b = b - (loc.exp() - (-loc).exp())
    return -((b.abs() + eps) ** shape) * scale.exp()


def test_bias_values_by_hand():
    """Head 0: scale 0.5, shape 1.5, mu 0; head 1: scale 2, shape 0.5, mu 1 (a trained location)."""
    enc = built("bam:train_mu=true")
    with torch.no_grad():
        enc.theta_alpha.copy_(torch.tensor([math.log(0.5), math.log(2.0)]))
        enc.theta_beta.copy_(torch.tensor([1.5, 0.5]))
        enc.mu.copy_(torch.tensor([0.0, 1.0]))
    bias = enc.distance_bias(torch.tensor([0, 1, 3]))
    eps = 1e-5
    want = torch.tensor([[-0.5 * eps ** 1.5, -0.5 * (1 + eps) ** 1.5, -0.5 * (3 + eps) ** 1.5],
                         [-2.0 * (1 + eps) ** 0.5, -2.0 * eps ** 0.5, -2.0 * (2 + eps) ** 0.5]])
    torch.testing.assert_close(bias, want, rtol=1e-6, atol=1e-7)
    assert bias[0, 2].item() == pytest.approx(-2.598089, abs=2e-6)     # -0.5 * 3.00001^1.5
    assert bias[1, 2].item() == pytest.approx(-2.828434, abs=2e-6)     # -2 * 2.00001^0.5


def test_the_causal_bias_is_the_official_prior():
    """mu = -2 sinh(loc): the official code shifts the signed offset j - i, this one the distance i - j."""
    enc = built("bam:train_mu=true", n_heads=4)
    scale = torch.tensor([0.3, -1.0, -2.0, 0.1])
    shape = torch.tensor([1.0, 1.7, 0.4, 2.0])
    loc = torch.tensor([0.0, 0.5, -0.3, 1.2])
    with torch.no_grad():
        enc.theta_alpha.copy_(scale)
        enc.theta_beta.copy_(shape)
        enc.mu.copy_(-2 * torch.sinh(loc))
    L = 40
    ours = enc.plan(L, L).full()                                                       # (H, L, L)
    reference = official_prior(scale.view(1, 4, 1, 1), shape.view(1, 4, 1, 1), loc.view(1, 4, 1, 1), L)[0]
    causal = torch.ones(L, L).tril().bool()
    torch.testing.assert_close(ours[:, causal], reference[:, causal], rtol=1e-5, atol=1e-5)


def test_defaults_follow_the_official_code_and_start_as_alibi():
    """BATModelArgs: scale_init 'slope' (stored as its log), shape_init 1, loc_init 0 and frozen,
    eps 1e-5, one prior for every layer; with those the bias is ALiBi's up to slope * eps."""
    enc = built("bam", n_heads=8)
    torch.testing.assert_close(enc.theta_alpha.detach(), slopes(8).log())
    assert torch.equal(enc.theta_beta.detach(), torch.ones(8))
    assert torch.equal(enc.mu, torch.zeros(8)) and not isinstance(enc.mu, torch.nn.Parameter)
    assert enc.eps == 1e-5
    assert {name for name, _ in enc.named_parameters()} == {"theta_alpha", "theta_beta"}
    alibi = positions.build("alibi", n_heads=8, head_dim=8)
    torch.testing.assert_close(enc.plan(50, 50).full(), alibi.plan(50, 50).full(), rtol=0, atol=1e-5)
    model = gpt("bam")
    assert len(model.positions) == 1
    torch.testing.assert_close(model.positions[0].theta_alpha.detach(), slopes(4).log())   # kept by the model's init
    assert len(gpt("bam:shared=false").positions) == gpt("bam").config.n_layers


def test_options_set_the_initialisation_and_what_is_trained():
    linear = built("bam:shape_init=linear", n_heads=5)
    torch.testing.assert_close(linear.theta_beta.detach(), torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0]))
    fixed = built("bam:scale_init=0.25,shape_init=2,train_shape=false,mu_init=3")
    torch.testing.assert_close(fixed.theta_alpha.detach(), torch.full((2,), math.log(0.25)))
    assert {name for name, _ in fixed.named_parameters()} == {"theta_alpha"}
    assert torch.equal(fixed.theta_beta, torch.full((2,), 2.0)) and torch.equal(fixed.mu, torch.full((2,), 3.0))
    # the location is a peak: the bias is highest (least negative) at distance mu
    bias = fixed.distance_bias(torch.arange(8))[0]
    assert int(bias.argmax()) == 3
    one = built("bam:scale_init=sampled,shape_init=sampled")
    other = positions.build_spec("bam:scale_init=sampled,shape_init=sampled", n_heads=2, head_dim=8, train_length=64)
    other.reset_parameters(torch.Generator().manual_seed(1))
    assert not torch.equal(one.theta_alpha, other.theta_alpha) and not torch.equal(one.theta_beta, other.theta_beta)


def test_trained_parameters_get_gradients_and_frozen_ones_are_saved():
    model = gpt("bam")
    tokens = torch.randint(0, model.config.vocab_size, (2, 16))
    model(tokens).float().pow(2).mean().backward()
    prior = model.positions[0]
    assert prior.theta_alpha.grad.abs().sum() > 0 and prior.theta_beta.grad.abs().sum() > 0
    assert "positions.0.mu" in model.state_dict()


@pytest.mark.parametrize("option, message", [("scale_init=wide", "scale_init must be slope, sampled or a number"),
                                             ("shape_init=x", "shape_init must be linear, sampled or a number"),
                                             ("scale_init=-1", "scale_init must be positive"),
                                             ("eps=0", "eps must be positive")])
def test_bad_options_are_refused_in_one_line(option, message):
    with pytest.raises(UsageError, match=message) as error:
        positions.build_spec(f"bam:{option}", n_heads=2, head_dim=8, train_length=64)
    assert "\n" not in str(error.value)
