"""Every variant's declared capabilities (positions/base.py's class attributes) against what it
really does, measured on its bias with options and without; and prepare()'s order of work."""

import pytest
import torch
from helpers import layer_input

from relbench import contract, positions
from relbench.positions.base import PositionEncoding

H, D = contract.H, contract.D
ALL = positions.names()


# ---- declared capabilities against what each variant really does ----------------------------------
# the measurement is relbench/contract/measurement.py's (what `relbench check` runs on a user's scheme)
CAPABILITIES = list(contract.CAPABILITIES)
# every variant with its defaults, and with options: the declaration is per class, so it must hold
# whatever the options (scheme("xl:k=5") is the xl class)
OPTION_SPECS = ["xl:k=5", "xl:k=5,shared_heads=true", "xl:k=40,log_from=4,log_buckets=3", "xl:k=0",
                "t5:bidirectional=true", "t5:num_buckets=8,max_distance=12",
                "t5:num_buckets=8,max_distance=12,bidirectional=true", "t5-log2:max_distance=8",
                "shaw:k=3", "shaw:k=0", "dynamic:log_distance=false", "dynamic:width=4,depth=1",
                "fire:width=4,threshold_ratio=0.5", "sandwich:dim=16", "rope:base=100",
                "xpos:base=100,scale_base=64", "hope:cycles=0.5",
                "partial_rope:fraction=0.5,base=100",
                "pope:base=100,bias_uniform_init=true",
                "path:rank=4,conv_size=2", "grape-a:omega_init=2", "sinusoidal:base=100,scale=0.5", "fox:bias_init=2",
                "cope:npos_max=5", "dape:base=alibi", "dape:base=kerple,width=4",
                "bam:shape_init=2,train_mu=true,mu_init=1.5", "bam:scale_init=sampled,shape_init=linear,shared=false",
                "bam:scale_init=0.25,train_shape=false,shape_init=2,eps=0.5", "stickbreaking:attend_current=true"]
SPECS = ALL + OPTION_SPECS
perturbed, measure, queries = contract.perturbed, contract.measure, contract.queries


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


@pytest.mark.parametrize("capability", CAPABILITIES)
@pytest.mark.parametrize("spec", SPECS)
def test_declared_capability_matches_behaviour(spec, capability):
    """Each class-level declaration, read as backends and commands read it (positions.scheme), is
    what the built variant does: adds_bias <=> plan() is a bias; rotates <=> rotate() changes q or
    k; content_dependent <=> two query sets give two biases; key_dependent <=> two key sets do;
    input_dependent <=> two layer inputs do; distance_only <=> the bias is Toeplitz
    on a rectangle; has_horizon <=> at a long length every row is constant beyond some distance;
    linear <=> the causal bias is -slope_h (i - j); separable <=> it is r(i) + c(j) with c not
    constant; has_score_mod <=> the plan has a score_mod; replaces_softmax <=> attend() gives an output that
    is not softmax attention's."""
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
    q, k = queries(5, 7), torch.randn(2, H, 9, D, generator=torch.Generator().manual_seed(8))
    x = layer_input(enc, 2, 9)
    q_rot, k_rot, plan = enc.prepare(q, k, x=x)
    want_q, want_k = enc.rotate(q, k)
    torch.testing.assert_close(q_rot, want_q, rtol=0, atol=0)
    torch.testing.assert_close(k_rot, want_k, rtol=0, atol=0)
    assert (plan is None) == (not enc.adds_bias)
    if plan is not None:
        torch.testing.assert_close(plan.full(), enc.plan(5, 9, q, k, x).full(), rtol=0, atol=0)
        given = enc.plan(5, 9, queries(5, 9), k, x)
        assert enc.prepare(q, k, given)[2] is given
