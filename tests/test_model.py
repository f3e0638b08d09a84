"""The GPT with every variant: shapes, causality, shared parameters, where forward builds its tensors.
Lengths beyond training and gradients to every position parameter are the contract's properties
(relbench/contract/), which tests/test_contract.py runs on every registered variant."""

import pytest
import torch

from relbench import positions
from relbench.model import GPT, ModelConfig

ALL = positions.names()
TRAIN_LENGTH = 16


def tiny(name, **overrides):
    config = {"vocab_size": 256, "d_model": 32, "n_layers": 2, "n_heads": 4, "train_length": TRAIN_LENGTH, "position": name}
    config.update(overrides)
    return GPT(ModelConfig(**config), seed=0)


@pytest.mark.parametrize("name", ALL)
def test_output_shape(name):
    logits = tiny(name)(torch.randint(0, 256, (2, TRAIN_LENGTH)))
    assert logits.shape == (2, TRAIN_LENGTH, 256)


@pytest.mark.parametrize("name", ALL)
def test_causal(name):
    """Changing token t never changes the logits at positions before t."""
    model = tiny(name).eval()
    tokens = torch.randint(0, 256, (1, TRAIN_LENGTH))
    changed = tokens.clone()
    t = 9
    changed[0, t] = (tokens[0, t] + 1) % 256
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :t], b[:, :t])
    assert not torch.allclose(a[:, t:], b[:, t:])


def test_same_initial_weights_for_shared_parameters():
    a, b = tiny("xl"), tiny("alibi")
    shared = dict(b.named_parameters())
    for pname, p in a.named_parameters():
        if not pname.startswith("positions."):
            torch.testing.assert_close(p, shared[pname])


def test_t5_table_is_shared_by_layers_and_xl_is_per_layer():
    assert len(tiny("t5").positions) == 1
    assert len(tiny("xl").positions) == 2


def test_spec_options_reach_the_encoding():
    model = tiny("xl:k=5")
    assert model.position(0).k == 5 and model.position(0).table.shape == (11, 4)


@pytest.mark.parametrize("name", [n for n in positions.names() if n != "fire"])
@pytest.mark.parametrize("grad", [False, True])
def test_forward_builds_nothing_on_the_cpu_when_the_model_is_elsewhere(name, grad):
    """The meta device stands in for CUDA: a model moved there must run its forward (inference and
    training paths) without any tensor made on the CPU, probes included; mixing devices raises.
    (FIRE's exact piecewise-linear curve sorts its kinks, a data-dependent step meta cannot run.)"""
    model = GPT(ModelConfig(vocab_size=32, d_model=32, n_layers=2, n_heads=4, train_length=16, position=name))
    model = model.to("meta")
    with torch.set_grad_enabled(grad):
        logits = model(torch.zeros(2, 24 if model.max_length is None else 16, dtype=torch.long, device="meta"))
    assert logits.device.type == "meta" and logits.shape[-1] == 32


@pytest.mark.parametrize("name", ["shaw", "transformer-xl", "alibi", "none"])
def test_memory_check_before_evaluation_builds_no_probe(name):
    """extrapolate's fit check on a model already on its device (meta standing in for CUDA) reads
    the scheme's declared adds_bias; the old probe built CPU queries and crashed for shaw and
    transformer-xl."""
    from relbench.evaluation import evaluators

    model = GPT(ModelConfig(vocab_size=32, d_model=32, n_layers=2, n_heads=4, train_length=16, position=name))
    assert evaluators.unfit(model.to("meta"), 64, 1, "reference", torch.device("meta")) is None
