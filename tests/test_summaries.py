"""A committed result has no checkpoints (results/*/checkpoints/ is ignored): its report is made again
from train.csv and config.json (relbench/evaluation/summaries.py). The summary rebuilt from them equals
the checkpoint's on every key both have, and the report's tables are the same with or without the
checkpoints."""

import math
import shutil

import pandas as pd
import pytest
from typer.testing import CliRunner

from relbench.cli import app
from relbench.evaluation.summaries import recorded_summary, summary_from_rows
from relbench.runs import checkpoints, rundir

runner = CliRunner()
KEYS = ["steps", "step_cap", "val_loss", "val_accuracy", "criterion", "learned", "learned_step", "position_lr_scale",
        "precision", "n_params", "position_params"]


def run(*args):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A retrieval run trained to criterion (too briefly to learn) and a language-model run."""
    retrieval, lm = tmp_path_factory.mktemp("retrieval"), tmp_path_factory.mktemp("lm")
    run("train", "--preset", "tiny-retrieval", "--variants", "alibi", "xl", "--seeds", 0, 1, "--run-dir", retrieval)
    run("train", "--preset", "tiny", "--variants", "t5", "--steps", 12, "--run-dir", lm)
    return retrieval, lm


def _same(a, b, key):
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b


@pytest.mark.parametrize("which", [0, 1])
def test_the_summary_from_train_csv_is_the_checkpoints(trained, tmp_path, which):
    source = trained[which]
    config = rundir.require_run(source)
    copy = tmp_path / "run"
    shutil.copytree(source, copy)
    shutil.rmtree(copy / "checkpoints")
    for spec in config["variants"]:
        for seed in config["seeds"]:
            meta = checkpoints.read_meta(rundir.checkpoint_dir(source, spec, seed))["summary"]
            assert recorded_summary(source, spec, seed) == meta          # a checkpoint: its own summary
            rebuilt = recorded_summary(copy, spec, seed)
            assert rebuilt is not None and rebuilt["source"] == "train.csv"
            for key in KEYS:
                assert _same(rebuilt[key], meta[key], key), (spec, seed, key, rebuilt[key], meta[key])
            assert rebuilt["train_seconds"] == pytest.approx(meta["train_seconds"], abs=0.5)
    if which == 0:
        assert rebuilt["learned"] is False and rebuilt["step_cap"] == rebuilt["steps"] == 6
    else:
        assert rebuilt["learned"] is None and rebuilt["criterion"] is None
    assert recorded_summary(copy, "rope", 0) is None                     # never trained there


def test_the_learned_step_is_the_first_of_the_checks_that_held():
    config = {"model": {"d_model": 32, "n_layers": 2, "n_heads": 2, "train_length": 64, "vocab_size": 256},
              "train": {"steps": 900, "criterion_accuracy": 0.95, "criterion_checks": 2, "task": "passkey",
                        "position_lr_scales": {"xl": 30.0}}}
    nan = float("nan")
    rows = pd.DataFrame({"step": [100, 200, 250, 300, 400], "val_accuracy": [0.5, 0.96, nan, 0.9, 0.97],
                         "val_loss": [2.0, 1.5, nan, 1.4, 1.2], "elapsed_s": [1.0, 2.0, 2.5, 3.0, 4.0],
                         "tokens": [1000, 2000, 2500, 3000, 4000]})
    learned = summary_from_rows("xl", 3, pd.concat([rows, pd.DataFrame({"step": [500], "val_accuracy": [0.99],
                                                                       "val_loss": [1.1], "elapsed_s": [5.0],
                                                                       "tokens": [5000]})], ignore_index=True), config)
    assert learned["learned"] is True and learned["learned_step"] == 400 and learned["steps"] == 500
    assert learned["step_cap"] == 900 and learned["val_loss"] == 1.1 and learned["tokens_per_s"] == 1000.0
    assert learned["position_lr_scale"] == 30.0 and learned["position_params"] > 0
    held_once = summary_from_rows("xl", 3, rows, config)      # 0.96 then 0.90: not two in a row; 0.97 alone
    assert held_once["learned"] is False and held_once["learned_step"] is None and held_once["step_cap"] == 400


def test_the_report_is_the_same_without_checkpoints(trained, tmp_path):
    source = trained[0]
    run("extrapolate", "--run-dir", source, "--not-learned")
    copy = tmp_path / "run"
    shutil.copytree(source, copy)
    shutil.rmtree(copy / "checkpoints")
    run("report", "--run-dir", source)
    run("report", "--run-dir", copy)

    def tables(path):
        text = (path / "report.md").read_text()
        return [line for line in text.splitlines() if line.startswith("|")]

    with_them, without = tables(source), tables(copy)
    assert any("not learned" in line for line in with_them) and len(with_them) == len(without)
    for a, b in zip(with_them, without):   # the same, but for the time a step took (read a moment apart)
        for x, y in zip(a.split("|"), b.split("|"), strict=True):
            if x != y:
                assert float(x.replace(",", "")) == pytest.approx(float(y.replace(",", "")), rel=0.01), (a, b)
