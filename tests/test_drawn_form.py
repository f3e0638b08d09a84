"""The `drawn` evaluation form: a model read with its tokens at a sorted random subset of [0, N), as
randomized-positions training places them (Ruoss et al. 2023's test protocol). The draw by hand
(range, order, a function of the sequence alone), the positions reaching every encoding, the
limit from the trained variant, the lengths it cannot place, the dense bias in the memory check,
and the competence rule: a model read at drawn positions is judged by its accuracy at 1x there."""

import dataclasses

import pandas as pd
import pytest
import torch

from relbench import positions
from relbench.config import ModelConfig
from relbench.cost import memory
from relbench.errors import UsageError
from relbench.evaluation import reach
from relbench.evaluation.evaluators import not_learned, unfit
from relbench.model import GPT
from relbench.positions import forms
from relbench.positions.base import UnsupportedLength, sorted_draw

CFG = ModelConfig(vocab_size=256, d_model=16, n_layers=2, n_heads=2, train_length=16,
                  position="rope:random_positions=64")


def drawn_model(spec: str = "rope:random_positions=64@drawn", position: str | None = None) -> GPT:
    model = GPT(dataclasses.replace(CFG, position=position or forms.scheme_spec(spec)), seed=0)
    forms.apply(model, spec)
    return model


def test_the_limit_comes_from_the_trained_variant_or_is_given():
    assert forms.parse_form("rope:random_positions=8192@drawn").limit == 8192
    assert forms.parse_form("alibi:random_positions=512@drawn:limit=300").limit == 300
    assert forms.parse_form("rope@drawn:limit=8192").limit == 8192          # an ordinary model, read at drawn positions
    with pytest.raises(UsageError, match=r"not trained with random_positions.*drawn:limit=N"):
        forms.parse_form("rope@drawn")
    with pytest.raises(UsageError, match=r'"drawn" does not apply to "fox".*alibi'):
        forms.parse_form("fox@drawn:limit=64")
    with pytest.raises(UsageError, match="must be positive"):
        forms.parse_form("rope@drawn:limit=-3")
    assert forms.places_positions("rope:random_positions=64@drawn")
    assert not forms.places_positions("rope@yarn") and not forms.places_positions("rope:random_positions=64")


def test_each_sequence_is_placed_at_a_sorted_subset_that_depends_on_it_alone():
    model = drawn_model()
    form = model.positions[0].form
    tokens = torch.randint(0, 256, (6, 40), generator=torch.Generator().manual_seed(1))
    placed = form.placement(model.positions[0], tokens)
    assert placed.shape == (6, 40) and placed.dtype == torch.int64
    assert int(placed.min()) >= 0 and int(placed.max()) < 64
    assert bool((placed[:, 1:] > placed[:, :-1]).all())                 # strictly increasing: distinct, in order
    assert len({tuple(r.tolist()) for r in placed}) == 6                 # each sequence its own draw
    # a function of the sequence: the same row alone, or in another batch, sits at the same positions
    torch.testing.assert_close(form.placement(model.positions[0], tokens[3:4]), placed[3:4])
    torch.testing.assert_close(form.placement(model.positions[0], tokens.flip(0)), placed.flip(0))
    other = forms.parse_form("rope:random_positions=64@drawn:seed=1")
    assert not torch.equal(other.placement(model.positions[0], tokens), placed)
    # the draw is the training draw's: sorted_draw from a generator seeded by the row
    assert torch.equal(sorted_draw(torch.Generator().manual_seed(0), 64, 64), torch.arange(64))


@pytest.mark.parametrize("scheme", ["rope", "alibi", "sinusoidal", "fire"])
def test_the_model_under_the_form_is_the_model_at_those_positions(scheme):
    """Logits under `drawn` equal the plain model's given the drawn positions, and differ from its
    logits at 0 .. L - 1: the positions reach the encodings."""
    spec = f"{scheme}:random_positions=64@drawn"
    model = drawn_model(spec)
    tokens = torch.randint(0, 256, (3, 16), generator=torch.Generator().manual_seed(2))
    placed = model.positions[0].form.placement(model.positions[0], tokens)
    under_form = model(tokens)
    for enc in model.positions:
        enc.form = None
    torch.testing.assert_close(under_form, model(tokens, positions=placed))
    assert not torch.allclose(under_form, model(tokens), atol=1e-4)


def test_lengths_beyond_the_limit_cannot_be_placed():
    model = drawn_model("rope:random_positions=64@drawn:limit=20")
    assert model.max_length == 20
    with pytest.raises(UnsupportedLength, match="at most 20 tokens"):
        model(torch.zeros(1, 24, dtype=torch.long))
    assert model(torch.zeros(1, 20, dtype=torch.long)).shape == (1, 20, 256)
    skipped = unfit(model, 24, 1, "sdpa", torch.device("cpu"))
    assert skipped is not None and skipped.status == "unsupported"
    assert unfit(model, 20, 1, "sdpa", torch.device("cpu")) is None


def test_the_memory_check_counts_a_dense_bias_per_sequence():
    cfg = dataclasses.replace(CFG, position="alibi")
    plain = memory.evaluation_bytes(cfg, "sdpa", 1024, 3, True)
    dense = memory.evaluation_bytes(cfg, "sdpa", 1024, 3, True, dense_bias=True)
    assert dense - plain == 4 * 3 * 2 * 1024 * 1024                      # fp32 x batch x heads x L x L
    assert memory.evaluation_bytes(cfg, "sdpa", 1024, 3, False, dense_bias=True) == \
        memory.evaluation_bytes(cfg, "sdpa", 1024, 3, False)              # rope: no bias to densify


def test_a_model_read_at_drawn_positions_is_judged_by_its_accuracy_there():
    """The criterion was checked at 0 .. L - 1: it decides for the plain spec, not for @drawn, which is
    evaluated and counts as learned when its accuracy at the training length is at least 90%."""
    meta = {"train": {"task": "passkey", "criterion_accuracy": 0.95},
            "summary": {"learned": False, "val_accuracy": 0.0, "steps": 5000}}
    assert not_learned(meta, "passkey", "rope:random_positions=64") is not None
    assert not_learned(meta, "passkey", "rope:random_positions=64@drawn") is None
    assert reach.training_competence("/nonexistent", "rope:random_positions=64@drawn", 0) is None
    rows = pd.DataFrame([{"variant": v, "seed": 0, "length": n, "depth": 0.5, "trials": 10, "status": "ok",
                          "correct": c, "accuracy": c / 10, "train_length": 128}
                         for v, n, c in [("r@drawn", 128, 10), ("r@drawn", 512, 2), ("q@drawn", 128, 5)]])
    reaches = reach.reach_of(rows, "trials", {("r@drawn", 0): 128, ("q@drawn", 0): 128},
                             {("r@drawn", 0): None, ("q@drawn", 0): None})
    assert reaches["r@drawn"].cell() == "128" and reaches["q@drawn"].cell() == "not learned (0/1)"


def test_schemes_without_chosen_positions_are_listed_when_refused():
    takes = [n for n in positions.names() if positions.get(n).takes_positions]
    assert forms.schemes_of(forms.get_form("drawn")) == takes
