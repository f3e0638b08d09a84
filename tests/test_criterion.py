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


def test_consolidation_trains_its_steps_past_the_confirming_check_and_past_the_cap(monkeypatch):
    """consolidate_steps: the run goes on after the criterion is met (here at the cap's last check),
    learned_step stays where it was met though a later check falls below, and the model at the
    confirming step is the criterion run's, weight for weight."""
    seen = {}

    def keep(model, step):
        seen["step"] = step
        seen["weights"] = {k: v.clone() for k, v in model.state_dict().items()}

    config = TrainConfig(task="passkey", steps=8, batch_size=2, eval_every=2, eval_batches=1, warmup_steps=1,
                         criterion_accuracy=0.95, criterion_checks=2, criterion_trials=10, min_lr_ratio=1.0,
                         consolidate_steps=4)
    scripted(monkeypatch, [0.1, 0.2, 0.96, 0.97, 0.5, 0.99])
    _, rows, summary = train_module.train_variant("alibi", MODEL, config, load_splits(), torch.device("cpu"),
                                                  on_learned=keep)
    rows = pd.DataFrame(rows)
    assert summary["learned"] is True and summary["learned_step"] == 6 and seen["step"] == 8
    assert summary["steps"] == 12 and summary["consolidated_steps"] == 4 and rows["step"].max() == 12
    assert summary["val_accuracy"] == 0.99
    assert rows.dropna(subset=["val_accuracy"])["step"].tolist() == [2, 4, 6, 8, 10, 12]
    stopped, _, plain, _ = run(monkeypatch, [0.1, 0.2, 0.96, 0.97], steps=8)
    assert plain["steps"] == 8 and plain["consolidated_steps"] == 0
    for name, weight in stopped.state_dict().items():
        torch.testing.assert_close(seen["weights"][name], weight, rtol=0, atol=0, msg=name)


def test_consolidation_decays_the_rate_from_where_the_criterion_was_met():
    import math

    from relbench.training.step import lr_at

    config = TrainConfig(task="passkey", criterion_accuracy=0.9, steps=100, warmup_steps=2, lr=2.0,
                         min_lr_ratio=1.0, consolidate_steps=5, consolidate_lr_ratio=0.1)
    # met at step 40 (constant rate 2.0 there): 5 steps from 2.0 to 0.2, cosine over progress 0, 1/4, .., 1
    expected = [0.2 + 0.9 * (1 + math.cos(math.pi * k / 4)) for k in range(5)]
    assert [lr_at(40 + k, config, consolidate_from=40) for k in range(5)] == pytest.approx(expected)
    assert lr_at(39, config, consolidate_from=40) == 2.0 and lr_at(3, config) == 2.0
    warming = dataclasses.replace(config, warmup_steps=10)      # met in the warm-up: decays from the rate there
    assert lr_at(4, warming, consolidate_from=4) == pytest.approx(0.8)
    assert lr_at(8, warming, consolidate_from=4) == pytest.approx(0.2)
    low = dataclasses.replace(config, consolidate_lr_ratio=0.5, warmup_steps=10)   # floor above the rate: it holds
    assert lr_at(6, low, consolidate_from=2) == pytest.approx(0.4)
    with pytest.raises(UsageError, match="no criterion"):
        TrainConfig(task="passkey", consolidate_steps=10)
    with pytest.raises(UsageError, match="consolidate_lr_ratio"):
        TrainConfig(task="passkey", criterion_accuracy=0.9, consolidate_steps=10, consolidate_lr_ratio=1.5)


def test_a_consolidated_runs_summary_from_its_curve_keeps_when_it_learned(monkeypatch):
    """A committed result keeps train.csv, not checkpoints: the summary rebuilt from the curve finds the
    first time the criterion held, though the last checks of consolidation fell below it."""
    from relbench.config import to_dict
    from relbench.evaluation.summaries import summary_from_rows

    config = TrainConfig(task="passkey", steps=8, batch_size=2, eval_every=2, eval_batches=1, warmup_steps=1,
                         criterion_accuracy=0.95, criterion_checks=2, criterion_trials=10, min_lr_ratio=1.0,
                         consolidate_steps=4)
    scripted(monkeypatch, [0.96, 0.97, 0.5, 0.6])
    _, rows, summary = train_module.train_variant("alibi", MODEL, config, load_splits(), torch.device("cpu"))
    assert summary["learned_step"] == 2 and summary["steps"] == 8 and summary["consolidated_steps"] == 4
    run = {"model": to_dict(MODEL), "train": to_dict(config)}
    rebuilt = summary_from_rows("alibi", 0, pd.DataFrame(rows), run)
    assert rebuilt["learned"] is True and rebuilt["learned_step"] == 2 and rebuilt["consolidated_steps"] == 4


def test_moments_train_on_at_the_rate_they_had_and_keep_each_moment(monkeypatch, tmp_path):
    """[train] moments = 3: the run goes on two checks past the one that confirms its criterion (step 8
    here, past the cap) at the rate it had, saves the weights at steps 8 and 10 as it goes, and ends at
    12 with the model of a run that simply trained on; the first moment is the criterion run's model."""
    from relbench.runs import checkpoints

    accuracies = [0.1, 0.2, 0.96, 0.97, 0.5, 0.99]
    config = {"steps": 8, "lr": 2e-3, "warmup_steps": 1}
    scripted(monkeypatch, accuracies)
    train = TrainConfig(**{"task": "passkey", "batch_size": 2, "eval_every": 2, "eval_batches": 1,
                           "criterion_accuracy": 0.95, "criterion_checks": 2, "criterion_trials": 10,
                           "min_lr_ratio": 0.5, "moments": 3, **config})
    model, rows, summary = train_module.train_variant("alibi", MODEL, train, load_splits(), torch.device("cpu"),
                                                      folder=tmp_path)
    assert summary["learned_step"] == 6 and summary["steps"] == 12 and summary["moments"] == [8, 10, 12]
    assert sorted(p.name for p in tmp_path.glob("moment*.pt")) == ["moment0.pt", "moment1.pt"]
    rates = pd.DataFrame(rows).set_index("step")["lr"]
    # held where the cosine to half the peak left it at the cap, not decayed on, not back at the peak
    assert rates.loc[8] == pytest.approx(1e-3) and rates.loc[9:12].tolist() == pytest.approx([1e-3] * 4)
    criterion, _, plain, _ = run(monkeypatch, accuracies[:4], **config, min_lr_ratio=0.5)
    assert plain["steps"] == 8 and plain["moments"] == []
    first = torch.load(tmp_path / "moment0.pt", weights_only=True)
    for name, weight in criterion.state_dict().items():
        torch.testing.assert_close(first[name], weight, rtol=0, atol=0, msg=name)
    second, last = torch.load(tmp_path / "moment1.pt", weights_only=True), model.state_dict()
    assert not any(torch.equal(second[k], last[k]) or torch.equal(second[k], first[k]) for k in last
                   if k.endswith("attn.qkv.weight"))   # three moments, three models
    checkpoints.clear_moments(tmp_path)
    assert not list(tmp_path.glob("moment*.pt"))


def test_moments_options_are_checked():
    assert TrainConfig(task="passkey", criterion_accuracy=0.9, moments=5, eval_every=50).after_criterion == 200
    assert TrainConfig(task="passkey", criterion_accuracy=0.9, consolidate_steps=30).after_criterion == 30
    for bad in ({"moments": 0, "criterion_accuracy": 0.9}, {"moments": 3},
                {"moments": 3, "criterion_accuracy": 0.9, "consolidate_steps": 10}):
        with pytest.raises(UsageError, match="moments must be"):
            TrainConfig(task="passkey", **bad)


def test_a_run_interrupted_between_its_moments_resumes_to_the_same_moments(monkeypatch, tmp_path):
    """Stopped at step 9 (moment 0 saved at 8, moment 1 not yet), resumed: the moments and the final
    model are the uninterrupted run's, bit for bit, and the summary lists every moment once."""
    import signal

    from relbench.training.stopping import Interrupted, StopRequest

    train = TrainConfig(task="passkey", steps=8, batch_size=2, eval_every=2, eval_batches=1, warmup_steps=1,
                        criterion_accuracy=0.95, criterion_checks=2, criterion_trials=10, min_lr_ratio=1.0,
                        moments=3, checkpoint_every=1)
    accuracies = [0.1, 0.2, 0.96, 0.97, 0.5, 0.99]
    scripted(monkeypatch, accuracies)
    straight = tmp_path / "straight"
    model, _, summary = train_module.train_variant("alibi", MODEL, train, load_splits(), torch.device("cpu"),
                                                   folder=straight)
    stop, cut = StopRequest(), tmp_path / "cut"

    def at(row):
        if row["step"] == 9:
            stop.signum = signal.SIGINT
    scripted(monkeypatch, accuracies)
    with pytest.raises(Interrupted):
        train_module.train_variant("alibi", MODEL, train, load_splits(), torch.device("cpu"), folder=cut, stop=stop,
                                   on_row=at)
    assert [p.name for p in cut.glob("moment*.pt")] == ["moment0.pt"]
    scripted(monkeypatch, accuracies[4:])
    resumed, _, again = train_module.train_variant("alibi", MODEL, train, load_splits(), torch.device("cpu"),
                                                   folder=cut)
    assert summary["moments"] == again["moments"] == [8, 10, 12]
    for name in ("moment0.pt", "moment1.pt"):
        assert (straight / name).read_bytes() == (cut / name).read_bytes()
    for (name, a), (_, b) in zip(model.state_dict().items(), resumed.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_a_resume_state_saved_before_a_setting_existed_resumes_at_its_default(monkeypatch, tmp_path):
    """A resume.pt whose settings lack a [train] key (saved by an older relbench, before `moments`) is
    the run at that key's default and resumes; one saved with another value of a key is refused."""
    from relbench.errors import RelbenchError
    from relbench.runs import checkpoints

    train = TrainConfig(task="passkey", steps=4, batch_size=2, eval_every=2, eval_batches=1, warmup_steps=1,
                        criterion_accuracy=0.95, criterion_trials=10, min_lr_ratio=1.0, checkpoint_every=2)
    scripted(monkeypatch, [0.0, 0.0])
    model, _, _ = train_module.train_variant("alibi", MODEL, train, load_splits(), torch.device("cpu"))
    identity = {"model": dataclasses.asdict(dataclasses.replace(MODEL, position="alibi")), "train": dataclasses.asdict(train)}
    identity["train"]["position_lr_scale"] = 1.0
    old = {**identity, "train": {k: v for k, v in identity["train"].items() if k != "moments"}}
    for saved, ok in ((old, True), ({**identity, "train": {**identity["train"], "lr": 1.0}}, False)):
        checkpoints.save_resume(tmp_path, model, train_module.make_optimizer(model, train),
                                {"step": 2, "identity": saved})
        scripted(monkeypatch, [0.0])     # one check: resumed at step 2, not trained again from 0
        if ok:
            _, _, summary = train_module.train_variant("alibi", MODEL, train, load_splits(), torch.device("cpu"),
                                                       folder=tmp_path)
            assert summary["steps"] == 4
        else:
            with pytest.raises(RelbenchError, match="another configuration"):
                train_module.train_variant("alibi", MODEL, train, load_splits(), torch.device("cpu"), folder=tmp_path)
