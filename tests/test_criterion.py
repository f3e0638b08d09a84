"""Training to criterion: a retrieval run stops when its validation accuracy at the training length
holds the criterion for consecutive checks, records when it learned, and one that never gets there
trains to its cap and is marked not learned."""

import dataclasses

import pandas as pd
import pytest
import torch

from relbench.config import ModelConfig, TrainConfig
from relbench.data import load_splits
from relbench.errors import UsageError
from relbench.training import train as train_module
from relbench.training.stopping import learned_at

MODEL = ModelConfig(d_model=32, n_layers=2, n_heads=2, train_length=112)


def test_learned_at_needs_consecutive_checks_and_returns_the_first():
    assert learned_at([(100, 0.96), (200, 0.97)], 0.95, 2) == 100
    assert learned_at([(100, 0.96), (200, 0.94), (300, 0.99)], 0.95, 2) is None    # the streak broke
    assert learned_at([(100, 0.96), (200, 0.94), (300, 0.99), (400, 0.95)], 0.95, 2) == 300   # >= counts
    assert learned_at([(100, 1.0)], 0.95, 2) is None                                # one check is not enough
    assert learned_at([(100, 1.0)], 0.95, 1) == 100
    assert learned_at([(100, 1.0), (200, 1.0), (300, 1.0)], 0.95, 3) == 100
    assert learned_at([(100, 1.0), (200, 1.0)], 0.0, 2) is None                     # no criterion: never stops


def scripted(monkeypatch, accuracies):
    """Make every validation check return the next of `accuracies`; returns the calls made."""
    calls = []

    def fake(model, task, tokens, length, tokenizer, device, trials, n_pairs):
        calls.append((task, length, trials))
        return accuracies[len(calls) - 1]

    monkeypatch.setattr(train_module, "retrieval_accuracy", fake)
    return calls


def run(monkeypatch, accuracies, **train):
    config = TrainConfig(**{"task": "passkey", "steps": 12, "batch_size": 2, "eval_every": 2, "eval_batches": 1,
                            "warmup_steps": 1, "criterion_accuracy": 0.95, "criterion_checks": 2,
                            "criterion_trials": 10, "min_lr_ratio": 1.0, **train})
    calls = scripted(monkeypatch, accuracies)
    model, rows, summary = train_module.train_variant("alibi", MODEL, config, load_splits(), torch.device("cpu"))
    return model, pd.DataFrame(rows), summary, calls


def test_a_run_that_learns_stops_at_the_confirming_check(monkeypatch):
    _, rows, summary, calls = run(monkeypatch, [0.1, 0.96, 0.5, 0.97, 0.98, 1.0])
    # checks at steps 2, 4, 6, 8, 10: 0.97 at 8 and 0.98 at 10 are the first two in a row
    assert summary["learned"] is True and summary["learned_step"] == 8 and summary["steps"] == 10
    assert summary["step_cap"] == 12 and summary["val_accuracy"] == 0.98 and summary["criterion"] == 0.95
    assert len(calls) == 5 and calls[0] == ("passkey", 112, 10)
    checked = rows.dropna(subset=["val_accuracy"])
    assert checked["step"].tolist() == [2, 4, 6, 8, 10]
    assert checked["val_accuracy"].tolist() == [0.1, 0.96, 0.5, 0.97, 0.98]
    assert rows["step"].max() == 10                 # nothing trained after the criterion was met
    assert "learned at step 8" in train_module.learned_text(summary)


def test_a_run_that_never_learns_reaches_its_cap_and_is_marked(monkeypatch):
    _, _rows, summary, calls = run(monkeypatch, [0.5, 0.96, 0.2, 0.99, 0.0, 0.96])
    assert summary["learned"] is False and summary["learned_step"] is None
    assert summary["steps"] == 12 and len(calls) == 6        # the last check is the cap's
    assert "NOT learned" in train_module.learned_text(summary)


def test_without_a_criterion_accuracy_is_logged_and_training_runs_its_steps(monkeypatch):
    _, _rows, summary, calls = run(monkeypatch, [1.0] * 6, criterion_accuracy=0.0)
    assert summary["steps"] == 12 and summary["learned"] is None and len(calls) == 6
    assert train_module.learned_text(summary) == ""


def test_criterion_stopping_is_the_same_training_as_the_full_run_up_to_its_stop(monkeypatch):
    stopped, _, summary, _ = run(monkeypatch, [0.1, 0.96, 0.97, 1.0, 1.0, 1.0])
    assert summary["steps"] == 6
    full, _, _, _ = run(monkeypatch, [0.0] * 6, steps=6)
    for (name, a), (_, b) in zip(stopped.state_dict().items(), full.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_criterion_options_are_checked():
    with pytest.raises(UsageError, match="language-model run"):
        TrainConfig(task="lm", criterion_accuracy=0.95)
    with pytest.raises(UsageError, match="criterion_accuracy must be in"):
        TrainConfig(task="passkey", criterion_accuracy=1.5)
    assert dataclasses.replace(TrainConfig(task="passkey"), criterion_accuracy=0.9).criterion_checks == 2


def test_decay_steps_hold_the_peak_then_decay_over_the_last_steps_only():
    """Warm-up, stable, decay: with decay_steps the rate is the peak until the last decay_steps steps,
    so a criterion run that stops before them trained at a constant rate; 0 is the cosine after warm-up."""
    import math

    from relbench.training.step import lr_at

    wsd = TrainConfig(steps=10, warmup_steps=2, lr=1.0, min_lr_ratio=0.1, decay_steps=4)
    rates = [lr_at(step, wsd) for step in range(10)]
    assert rates[:6] == pytest.approx([0.5, 1.0, 1.0, 1.0, 1.0, 1.0])       # warm-up, then the peak to step 5
    # steps 6..9 decay: progress 0, 1/3, 2/3, 1 -> 0.1 + 0.45 (1 + cos(pi p))
    assert rates[6:] == pytest.approx([1.0, 0.775, 0.325, 0.1])
    cosine = TrainConfig(steps=10, warmup_steps=2, lr=1.0, min_lr_ratio=0.1)
    expected = [0.5, 1.0] + [0.1 + 0.45 * (1 + math.cos(math.pi * (s - 2) / 7)) for s in range(2, 10)]
    assert [lr_at(step, cosine) for step in range(10)] == pytest.approx(expected)
    with pytest.raises(UsageError, match="decay_steps"):
        TrainConfig(steps=10, warmup_steps=2, decay_steps=9)
