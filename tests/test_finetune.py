"""relbench finetune: continue finished checkpoints at a longer length, beside the originals, and
compare zero-shot with fine-tuned in extrapolate and report."""

import hashlib
import os
import shutil
import signal

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from relbench.cli import app
from relbench.config import TrainConfig
from relbench.runs import checkpoints, results, rundir
from relbench.training import step as training_step
from relbench.training import train
from relbench.training.batches import training_batch
from relbench.training.finetune import batch_size_for, warmup_for

runner = CliRunner()
STEPS, LENGTH = 3, 64      # tiny preset: train length 32, batch 8; fine-tuning at 2x: batch 4, the same tokens per step


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def originals(run_dir) -> dict[str, str]:
    files = [run_dir / results.TRAIN_CSV]
    for spec in ("rope", "alibi", "learned"):
        folder = rundir.checkpoint_dir(run_dir, spec, 0)
        files += [folder / checkpoints.MODEL_FILE, folder / checkpoints.META_FILE]
    return {str(f.relative_to(run_dir)): sha256(f) for f in files}


def weights(run_dir, spec: str) -> dict[str, torch.Tensor]:
    return torch.load(rundir.checkpoint_dir(run_dir, spec, 0) / checkpoints.MODEL_FILE, weights_only=True)


def curve(run_dir) -> pd.DataFrame:
    return pd.read_csv(run_dir / "finetune.csv").drop(columns=["elapsed_s", "tokens_per_s"])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("trained")
    result = run("train", "--preset", "tiny", "--steps", STEPS, "--variants", "rope", "alibi", "learned",
                 "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    return run_dir


@pytest.fixture(scope="module")
def tuned(trained, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("tuned") / "run"
    shutil.copytree(trained, run_dir)
    before = originals(run_dir)
    result = run("finetune", "--length", LENGTH, "--steps", STEPS, "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    assert "learned: left out" in " ".join(result.output.split())   # it cannot represent 64 positions
    assert originals(run_dir) == before
    return run_dir


def test_finetune_writes_new_checkpoints_beside_untouched_originals(tuned):
    for spec in ("rope", "alibi"):
        meta = checkpoints.read_meta(rundir.checkpoint_dir(tuned, f"{spec}+ft{LENGTH}", 0))
        assert meta["finished"] and meta["variant"] == f"{spec}+ft{LENGTH}"
        assert meta["finetune"] == {"from": spec, "length": LENGTH, "steps": STEPS, "lr": 3e-3, "batch_size": 4,
                                    "warmup_steps": 1, "data_offset": STEPS, "source_sha256":
                                    checkpoints.read_meta(rundir.checkpoint_dir(tuned, spec, 0))["sha256"]}
        assert meta["model"]["train_length"] == 32 and meta["model"]["position"] == spec   # the model as trained
        before, after = weights(tuned, spec), weights(tuned, f"{spec}+ft{LENGTH}")
        assert before.keys() == after.keys()
        assert any(not torch.equal(before[k], after[k]) for k in before)
    assert not rundir.checkpoint_dir(tuned, f"learned+ft{LENGTH}", 0).exists()
    log = pd.read_csv(tuned / "finetune.csv")
    assert sorted(set(log["variant"])) == ["alibi+ft64", "rope+ft64"] and (log["length"] == LENGTH).all()
    assert sorted(log[log["variant"] == "rope+ft64"]["step"]) == [1, 2, 3]
    assert (log["tokens"] == log["step"] * 4 * LENGTH).all()
    config = results.read_json(tuned / results.CONFIG)
    assert config["finetune"]["rope+ft64"]["command"].startswith(f"relbench finetune --run-dir {tuned} --length 64 "
                                                                 f"--steps 3 --variants rope --seeds 0")
    assert "--variants rope --seeds 0" in (tuned / results.CONFIG_TOML).read_text()


def test_the_first_batch_is_the_training_rule_continued_at_the_new_length(trained):
    """Step 0 of fine-tuning reads windows of LENGTH + 1 tokens from a generator seeded by (seed,
    training steps + 0), the documented rule, written out here by hand."""
    from relbench.data import load_run_splits

    splits = load_run_splits(results.read_json(trained / results.CONFIG))
    tokens = torch.from_numpy(splits.train)
    config = TrainConfig(batch_size=4, seed=0)
    x, y, _ = training_batch(tokens, STEPS + 0, config, LENGTH, splits.tokenizer)
    generator = torch.Generator().manual_seed(0 * 1_000_003 + STEPS)
    starts = torch.randint(0, tokens.numel() - LENGTH, (4,), generator=generator)
    for row, start in enumerate(starts.tolist()):
        assert torch.equal(x[row], tokens[start: start + LENGTH].long())
        assert torch.equal(y[row], tokens[start + 1: start + LENGTH + 1].long())


def hand_continuation(run_dir, form: str = "") -> torch.nn.Module:
    """rope's checkpoint (with `form` set) through the documented fine-tuning steps, driven by hand:
    batches of the training rule from step STEPS on at LENGTH, training's schedule over STEPS steps
    with one warm-up step, training's own step functions."""
    from relbench.data import load_run_splits
    from relbench.positions import forms

    splits = load_run_splits(results.read_json(run_dir / results.CONFIG))
    tokens = torch.from_numpy(splits.train)
    meta = checkpoints.read_meta(rundir.checkpoint_dir(run_dir, "rope", 0))
    config = TrainConfig(**{**meta["train"], "steps": STEPS, "batch_size": 4, "warmup_steps": 1})
    model = checkpoints.load_model(rundir.checkpoint_dir(run_dir, "rope", 0)).train()
    if form:
        forms.apply(model, form)
    optimizer = training_step.make_optimizer(model, config)
    for step in range(STEPS):
        for group in optimizer.param_groups:
            group["lr"] = training_step.lr_at(step, config) * group["lr_scale"]
        x, y, w = training_batch(tokens, STEPS + step, config, LENGTH, splits.tokenizer)
        training_step.forward_backward(model, optimizer, x, y, w, torch.device("cpu"), config, step)
        training_step.optimizer_step(model, optimizer)
    return model


def test_fine_tuned_weights_are_a_hand_driven_continuation(tuned):
    """Load the original checkpoint, take a fresh optimiser and run the documented steps (batches of the
    training rule from step STEPS on at LENGTH, training's schedule over STEPS steps with one warm-up
    step) through training's own step functions: the weights are those finetune saved, bit for bit."""
    model = hand_continuation(tuned)
    got = weights(tuned, "rope+ft64")
    for name, value in model.state_dict().items():
        assert torch.equal(value, got[name]), name


def test_interrupted_finetune_resumes_to_the_uninterrupted_weights(trained, tuned, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    original = train.optimizer_step
    calls = {"n": 0}

    def step_then_signal(model, optimizer):
        original(model, optimizer)
        calls["n"] += 1
        if calls["n"] == 1:     # SIGTERM after the first step: finetune saves a resume.pt and stops
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(train, "optimizer_step", step_then_signal)
    result = run("finetune", "--length", LENGTH, "--steps", STEPS, "--variants", "rope", "--run-dir", run_dir)
    assert result.exit_code == 143, result.output
    assert "interrupted:" in result.output and "relbench finetune" in result.output
    folder = rundir.checkpoint_dir(run_dir, "rope+ft64", 0)
    assert checkpoints.load_resume(folder)["state"]["step"] == 1 and checkpoints.read_meta(folder) is None
    monkeypatch.undo()
    result = run("finetune", "--length", LENGTH, "--steps", STEPS, "--variants", "rope", "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    expected, got = weights(tuned, "rope+ft64"), weights(run_dir, "rope+ft64")
    for name in expected:
        assert torch.equal(expected[name], got[name]), name
    pd.testing.assert_frame_equal(curve(tuned).query("variant == 'rope+ft64'").reset_index(drop=True), curve(run_dir))
    again = run("finetune", "--length", LENGTH, "--steps", STEPS, "--variants", "rope", "--run-dir", run_dir)
    assert again.exit_code == 0 and "already fine-tuned" in again.output


def test_extrapolate_evaluates_both_and_the_report_compares_them(tuned, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(tuned, run_dir)
    result = run("extrapolate", "--run-dir", run_dir, "--lengths", 32, 64)
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(run_dir / "extrapolation.csv").set_index(["variant", "length"])
    assert sorted(set(rows.index.get_level_values(0))) == ["alibi", "alibi+ft64", "learned", "rope", "rope+ft64"]
    assert rows.loc[("rope+ft64", 64), "finetune_length"] == 64 and rows.loc[("rope+ft64", 64), "finetune_steps"] == 3
    assert rows.loc[("rope", 64), "finetune_length"] == 0 and rows.loc[("rope", 64), "finetune_steps"] == 0
    assert rows.loc[("rope+ft64", 64), "ppl"] != rows.loc[("rope", 64), "ppl"]
    # an evaluation form on the fine-tuned checkpoint is an entry of its own
    result = run("extrapolate", "--run-dir", run_dir, "--lengths", 64, "--variants", "rope+ft64@ntk:factor=2")
    assert result.exit_code == 0, result.output
    result = run("report", "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    report = (run_dir / "report.md").read_text()
    assert "## Fine-tuning to the target length" in report
    ppl = {(v, n): f"{rows.loc[(v, n), 'ppl']:.3f}" for v in ("rope", "rope+ft64") for n in (32, 64)}
    assert (f"| rope | 64, 3 steps | {ppl['rope', 32]} -> {ppl['rope+ft64', 32]} | "
            f"{ppl['rope', 64]} -> {ppl['rope+ft64', 64]} |") in report


PI = "rope@pi:factor=2+ft64"     # rope fine-tuned under PI at 64 = 2 x its training length: s pinned at 2


@pytest.fixture(scope="module")
def tuned_pi(trained, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("tuned_pi") / "run"
    shutil.copytree(trained, run_dir)
    result = run("finetune", "--length", LENGTH, "--steps", STEPS, "--variants", "rope@pi", "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    return run_dir


def test_a_form_is_fine_tuned_under_with_its_factor_pinned(tuned, tuned_pi):
    """PI's fine-tuning (Chen et al. 2023): the model trains under the form, s = 64 / 32 = 2 written into
    the entry; its weights are the hand-driven continuation with PI(factor=2) set, not plain rope's."""
    meta = checkpoints.read_meta(rundir.checkpoint_dir(tuned_pi, PI, 0))
    assert meta["variant"] == PI and meta["finetune"]["form"] == "pi:factor=2" and meta["model"]["position"] == "rope"
    assert results.read_json(tuned_pi / results.CONFIG)["finetune"][PI]["command"].startswith(
        f"relbench finetune --run-dir {tuned_pi} --length 64 --steps 3 --variants rope@pi:factor=2 --seeds 0")
    model = hand_continuation(tuned_pi, form="rope@pi:factor=2")
    got, plain = weights(tuned_pi, PI), weights(tuned, "rope+ft64")
    for name, value in model.state_dict().items():
        assert torch.equal(value, got[name]), name
    assert any(not torch.equal(got[k], plain[k]) for k in got)


def test_a_checkpoint_fine_tuned_under_a_form_is_evaluated_with_it_at_every_length(tuned_pi, tmp_path):
    """Its rows equal those of the same weights evaluated as a plain fine-tuned checkpoint with the
    explicit form "@pi:factor=2" (so the factor stays 2 at 128, not 128 / 32), and differ without it."""
    run_dir = tmp_path / "run"
    shutil.copytree(tuned_pi, run_dir)
    shutil.copytree(rundir.checkpoint_dir(run_dir, PI, 0), rundir.checkpoint_dir(run_dir, "rope+ft64", 0))
    specs = [PI, "rope+ft64@pi:factor=2", "rope+ft64", "rope@pi"]
    result = run("extrapolate", "--run-dir", run_dir, "--lengths", 32, 128, "--variants", *specs, "--task", "perplexity")
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(run_dir / "extrapolation.csv", keep_default_na=False).set_index(["variant", "length"])
    assert rows.loc[(PI, 128), "form"] == "pi:factor=2" and rows.loc[(PI, 128), "finetune_length"] == 64
    for n in (32, 128):
        assert rows.loc[(PI, n), "ppl"] == rows.loc[("rope+ft64@pi:factor=2", n), "ppl"]
        assert rows.loc[(PI, n), "ppl"] != rows.loc[("rope+ft64", n), "ppl"]
    assert run("report", "--run-dir", run_dir).exit_code == 0
    ppl = {(v, n): f"{rows.loc[(v, n), 'ppl']:.3f}" for v in ("rope@pi", PI) for n in (32, 128)}
    assert (f"| rope@pi | 64, 3 steps | {ppl['rope@pi', 32]} -> {ppl[PI, 32]} | "
            f"{ppl['rope@pi', 128]} -> {ppl[PI, 128]} |") in (run_dir / "report.md").read_text()


def test_the_control_continues_at_the_training_length_with_the_same_tokens(trained, tmp_path):
    """--length 32 (the training length): every variant, `learned` included, trains 3 more steps of
    8 x 32 (training's batch), the batches of training's steps 3.. at 32; the report compares it too."""
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    result = run("finetune", "--length", 32, "--steps", STEPS, "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    log = pd.read_csv(run_dir / "finetune.csv")
    assert sorted(set(log["variant"])) == ["alibi+ft32", "learned+ft32", "rope+ft32"]
    assert (log["tokens"] == log["step"] * 8 * 32).all()
    meta = checkpoints.read_meta(rundir.checkpoint_dir(run_dir, "rope+ft32", 0))
    assert meta["finetune"]["length"] == 32 and meta["finetune"]["batch_size"] == 8
    assert any(not torch.equal(weights(run_dir, "rope")[k], weights(run_dir, "rope+ft32")[k]) for k in weights(run_dir, "rope"))


def test_lr_and_batch_size_options_are_the_ones_used(trained, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    result = run("finetune", "--length", 96, "--steps", 2, "--variants", "alibi", "--lr", 1e-3, "--batch-size", 3,
                 "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    log = pd.read_csv(run_dir / "finetune.csv")
    assert log["lr"].iloc[0] == pytest.approx(1e-3)            # one warm-up step: step 1 at the peak
    assert list(log["tokens"]) == [3 * 96, 2 * 3 * 96]
    record = checkpoints.read_meta(rundir.checkpoint_dir(run_dir, "alibi+ft96", 0))["finetune"]
    assert record["lr"] == 1e-3 and record["batch_size"] == 3 and record["length"] == 96


def test_train_again_keeps_the_fine_tuned_record(tuned, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(tuned, run_dir)
    result = run("train", "--preset", "tiny", "--steps", STEPS, "--variants", "xl", "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    assert "rope+ft64" in results.read_json(run_dir / results.CONFIG)["finetune"]


def one_line_error(result, code, *fragments):
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == code, result.output
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in result.output, result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_errors_are_one_line(trained, tmp_path):
    one_line_error(run("finetune", "--length", 64, "--steps", 3, "--variants", "xl", "--run-dir", trained), 1,
                   "variant xl seed 0 has no finished checkpoint", f"relbench train --run-dir {trained} --variants xl")
    one_line_error(run("finetune", "--length", 16, "--steps", 3, "--run-dir", trained), 2,
                   "--length 16 is shorter than the training length 32")
    one_line_error(run("finetune", "--length", 64, "--steps", 3, "--variants", "learned", "--run-dir", trained), 2,
                   "learned represents positions below 32 only")
    one_line_error(run("finetune", "--length", 64, "--steps", 0, "--run-dir", trained), 2, "must be positive")
    one_line_error(run("finetune", "--length", 64, "--steps", 3, "--run-dir", tmp_path / "nope"), 1, "does not exist")
    one_line_error(run("extrapolate", "--run-dir", trained, "--lengths", 64, "--variants", "alibi+ft128"), 1,
                   f"relbench finetune --run-dir {trained} --length 128 --variants alibi --seeds 0")
    one_line_error(run("extrapolate", "--run-dir", trained, "--lengths", 64, "--variants", "rope@ntk:factor=4+ft128"), 1,
                   f"relbench finetune --run-dir {trained} --length 128 --variants rope@ntk:factor=4 --seeds 0")
    one_line_error(run("extrapolate", "--run-dir", trained, "--lengths", 64, "--variants", "rope@pi+ft64@yarn"), 2,
                   'was fine-tuned under form "pi"', "no second form")
    one_line_error(run("finetune", "--length", 64, "--steps", 3, "--variants", "rope+ft64", "--run-dir", trained), 2,
                   "is a fine-tuned checkpoint")
    one_line_error(run("finetune", "--length", 64, "--steps", 3, "--variants", "alibi@pi", "--run-dir", trained), 2,
                   'form "pi" does not apply to "alibi"')


def test_default_batch_keeps_the_tokens_per_step_and_warmup_is_short():
    assert batch_size_for(8, 32, 64) == (4, "")
    batch, note = batch_size_for(8, 32, 96)
    assert batch == 2 and "192 tokens per step; training took 256" in note
    assert batch_size_for(8, 32, 512)[0] == 1
    assert warmup_for(50, 200) == 20 and warmup_for(5, 3) == 1 and warmup_for(5, 1000) == 5
