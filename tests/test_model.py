"""The GPT with every variant: shapes, causality, lengths beyond training, gradients, backends."""

import pytest
import torch
import torch.nn.functional as F

from relbench import positions
from relbench.model import GPT, ModelConfig
from relbench.positions.base import UnsupportedLength

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


@pytest.mark.parametrize("name", ALL)
def test_lengths_beyond_training(name):
    model = tiny(name).eval()
    tokens = torch.randint(0, 256, (1, 4 * TRAIN_LENGTH))
    if model.max_length is not None:
        assert model.max_length == TRAIN_LENGTH
        with pytest.raises(UnsupportedLength):
            model(tokens)
    else:
        with torch.no_grad():
            assert torch.isfinite(model(tokens)).all()


@pytest.mark.parametrize("name", ALL)
def test_gradients_reach_every_position_parameter(name):
    model = tiny(name)
    with torch.no_grad():  # leave the near-zero init so every parameter has a visible effect
        for p in model.positions.parameters():
            p.normal_(0, 0.5)
    model.project_parameters()   # as training does after every step
    tokens = torch.randint(0, 256, (2, TRAIN_LENGTH + 1))
    loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    for pname, p in model.positions.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname


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
