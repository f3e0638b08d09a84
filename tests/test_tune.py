"""Position learning rates: chosen per variant by validation loss at the training length (tune-lr),
applied by train from a sweep, a number or a variant's own option, and recorded with the run."""

import json

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from relbench.cli import app
from relbench.config import TrainConfig
from relbench.model import GPT, ModelConfig
from relbench.runs import rundir
from relbench.training.step import make_optimizer, position_lr

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def meta(run_dir, spec):
    return json.loads((rundir.checkpoint_dir(run_dir, spec, 0) / "meta.json").read_text())


def test_position_lr_precedence():
    config = TrainConfig(position_lr_scales={"xl": 10.0, "t5:num_buckets=8": 3.0})
    assert position_lr("xl", config) == (10.0, "tuned")
    assert position_lr("xl:k=4", config) == (10.0, "tuned")                  # by name when the spec is not listed
    assert position_lr("t5:num_buckets=8", config) == (3.0, "tuned")
    assert position_lr("t5", config) == (1.0, "default")
    assert position_lr("xl:position_lr_scale=2", config) == (2.0, "variant option")
    run_wide = TrainConfig(position_lr_scale=5.0, position_lr_scales={"xl": 10.0})
    assert position_lr("xl", run_wide) == (5.0, "run option")
    assert position_lr("xl:k=4,position_lr_scale=2", run_wide) == (2.0, "variant option")


def test_the_multiplier_reaches_only_the_position_parameters():
    model = GPT(ModelConfig(d_model=16, n_layers=1, n_heads=2, train_length=16, position="xl"))
    groups = make_optimizer(model, TrainConfig(position_lr_scale=7.0)).param_groups
    position = [g for g in groups if any(p is model.positions[0].table for p in g["params"])]
    assert len(position) == 1 and position[0]["lr_scale"] == 7.0 and position[0]["weight_decay"] == 0.0
    assert all(g["lr_scale"] == 1.0 for g in groups if g is not position[0])


def test_tune_lr_chooses_the_best_validation_loss_and_train_applies_it(tmp_path):
    sweep = tmp_path / "sweep"
    result = run("tune-lr", "--preset", "tiny", "--variants", "xl", "kerple-log", "--grid", 1, 30, "--steps", 10,
                 "--run-dir", sweep)
    assert result.exit_code == 0, result.output
    table = pd.read_csv(sweep / "lr_sweep.csv")
    assert len(table) == 4 and set(table["position_lr_scale"]) == {1.0, 30.0}
    for variant, mine in table.groupby("variant"):
        assert mine["chosen"].sum() == 1
        assert mine[mine["chosen"]]["val_loss"].iloc[0] == mine["val_loss"].min()
        for r in mine.itertuples():   # each row is that checkpoint's own final validation loss
            spec = f"{variant}:position_lr_scale={r.position_lr_scale:g}"
            assert meta(sweep, spec)["summary"]["val_loss"] == pytest.approx(r.val_loss)
            assert meta(sweep, spec)["summary"]["position_lr_scale"] == r.position_lr_scale
    chosen = json.loads((sweep / "position_lr.json").read_text())["chosen"]
    assert chosen == {v: float(m[m["chosen"]]["position_lr_scale"].iloc[0]) for v, m in table.groupby("variant")}

    trained = tmp_path / "trained"
    result = run("train", "--preset", "tiny", "--variants", "xl", "kerple-log", "xl:position_lr_scale=3", "--steps", 5,
                 "--run-dir", trained, "--position-lr-scale", sweep / "position_lr.json")
    assert result.exit_code == 0, result.output
    assert meta(trained, "xl")["summary"]["position_lr_scale"] == chosen["xl"]
    assert meta(trained, "xl")["summary"]["position_lr_source"] == "tuned"
    assert meta(trained, "xl:position_lr_scale=3")["summary"]["position_lr_scale"] == 3.0
    assert meta(trained, "xl")["train"]["position_lr_scale"] == chosen["xl"]
    assert run("extrapolate", "--run-dir", trained, "--lengths", 32).exit_code == 0
    assert run("report", "--run-dir", trained).exit_code == 0
    report = (trained / "report.md").read_text()
    assert "position lr x" in report and "| 3 (variant option) |" in report
    assert f"| {chosen['xl']:g} (tuned) |" in report


@pytest.mark.parametrize("value, fragment", [("-2", "positive"), ("nope.json", "does not exist"), ("0", "positive")])
def test_bad_position_lr_scale_is_one_line(tmp_path, value, fragment):
    result = run("train", "--preset", "tiny", "--variants", "xl", "--run-dir", tmp_path, "--position-lr-scale", value)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and fragment in lines[0], result.output
    assert not (tmp_path / "checkpoints").exists()


def test_variant_option_is_validated():
    from relbench import positions
    from relbench.errors import UsageError

    assert positions.training_options("xl:k=3,position_lr_scale=2") == {"position_lr_scale": 2.0}
    assert positions.parse_spec("xl:k=3,position_lr_scale=2") == ("xl", {"k": 3})
    with pytest.raises(UsageError, match="positive"):
        positions.parse_spec("xl:position_lr_scale=0")
    assert torch.is_tensor(GPT(ModelConfig(d_model=16, n_layers=1, n_heads=2, position="xl:position_lr_scale=2"))
                           .positions[0].table)
