"""`relbench bench` runs both tracks by default: the language-model run and, inside it, the retrieval
run trained to criterion; the report opens with one table holding the perplexity ratio and the
reach of every variant, and says from its own copy rows whether the language models use distant
context."""

import pandas as pd
from typer.testing import CliRunner

from relbench.cli import app
from relbench.reporting.overview import context_note, uses_context

runner = CliRunner()

LM = """preset = "tiny"
[eval]
tasks = ["perplexity", "copy"]
trials = 2
"""
RETRIEVAL = """preset = "tiny"
[model]
train_length = 112
[train]
task = "passkey"
steps = 6
eval_every = 3
answer_weight = 10.0
min_lr_ratio = 1.0
criterion_accuracy = 0.95
criterion_trials = 10
[eval]
tasks = ["passkey", "mqar"]
trials = 1
length_multiples = [1, 2]
"""


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_bench_runs_both_tracks_and_opens_with_reach(tmp_path):
    (tmp_path / "lm.toml").write_text(LM)
    (tmp_path / "retrieval.toml").write_text(RETRIEVAL)
    run_dir = tmp_path / "run"
    result = run("bench", "--config", tmp_path / "lm.toml", "--retrieval-config", tmp_path / "retrieval.toml",
                 "--variants", "alibi", "xl", "--lengths", 32, 512, "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    assert "language-model track (preset tiny" in result.output and "retrieval track (preset tiny" in result.output
    assert "expected training at most" in result.output     # the retrieval cap is an upper bound
    # the retrieval track is its own run, inside the language-model run
    train = pd.read_csv(run_dir / "retrieval" / "train.csv")
    assert set(train["variant"]) == {"alibi", "xl"} and train["val_accuracy"].notna().any()
    # six steps teach no passkey retrieval: those models are not evaluated on it (it would say nothing)
    assert "passkey not learned at its training length" in result.output
    assert not (run_dir / "retrieval" / "passkey.csv").exists()
    assert set(pd.read_csv(run_dir / "retrieval" / "mqar.csv")["length"]) == {112, 224}   # not its training task
    report = (run_dir / "report.md").read_text()
    first = report.index("## ")
    assert report[first:].startswith("## Headline")
    headline = report[first:report.index("## ", first + 3)]
    assert "ppl ratio at 512 (16x)" in headline and "passkey reach" in headline and "MQAR reach" in headline
    for variant in ("alibi", "xl"):
        row = next(line for line in headline.splitlines() if line.startswith(f"| {variant} |"))
        # six steps teach no retrieval: not learned, never "none"
        assert "not learned (0/1)" in row and "none" not in row
    assert "Not learned at the training length" in headline
    retrieval_report = (run_dir / "retrieval" / "report.md").read_text()
    assert "learned at step, per seed" in retrieval_report and "not learned in 6" in retrieval_report
    # --not-learned evaluates them anyway, and the reach still comes from learned seeds only
    result = run("extrapolate", "--run-dir", run_dir / "retrieval", "--task", "passkey", "--not-learned")
    assert result.exit_code == 0, result.output
    assert set(pd.read_csv(run_dir / "retrieval" / "passkey.csv")["length"]) == {112, 224}


def test_a_presets_own_retrieval_track(tmp_path):
    """tiny names tiny-retrieval as its retrieval track: --preset tiny stays a smoke run in both tracks."""
    run_dir = tmp_path / "run"
    result = run("bench", "--preset", "tiny", "--variants", "alibi", "--lengths", 32, "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    assert "retrieval track (preset tiny-retrieval" in result.output
    assert set(pd.read_csv(run_dir / "retrieval" / "train.csv")["step"]) <= set(range(1, 7))
    # the closing lines: what it found, and why its retrieval seeds are not set beside the shipped panel's
    assert "Passkey (1 seed(s), trained to criterion at 112)" in result.output
    assert "this run's protocol differs (model.d_model: panel 64, this run 32)" in result.output
    assert (run_dir / "findings.md").read_text().startswith("# What this run found")


def test_bench_refuses_a_retrieval_config_without_both_tracks(tmp_path):
    result = run("bench", "--track", "lm", "--retrieval-config", tmp_path / "x.toml", "--run-dir", tmp_path / "r")
    assert result.exit_code != 0 and "--retrieval-config" in result.output
    result = run("bench", "--track", "everything", "--run-dir", tmp_path / "r")
    assert result.exit_code != 0 and "track" in result.output


def copy_rows(variant, ratios):
    """copy.csv rows: distance -> (ratio, low, high)."""
    return [{"variant": variant, "seed": 0, "distance": d, "status": "ok", "ratio": r, "ratio_low": lo,
             "ratio_high": hi} for d, (r, lo, hi) in ratios.items()]


def test_the_report_says_whether_its_language_models_use_distant_context():
    flat = pd.DataFrame(copy_rows("xl", {64: (1.04, 1.02, 1.06), 448: (1.00, 0.99, 1.01)})
                        + copy_rows("t5", {64: (0.99, 0.98, 1.001), 448: (1.0, 0.995, 1.004)}))
    assert uses_context(flat, 64) == {"xl": [], "t5": []}
    assert "do not use distant context" in context_note(flat, 64)
    copier = pd.DataFrame(copy_rows("xl", {64: (0.5, 0.45, 0.55), 448: (0.7, 0.6, 0.8)})
                          + copy_rows("t5", {64: (0.9, 0.85, 0.95), 448: (1.0, 0.99, 1.01)})
                          + copy_rows("rope", {32: (0.5, 0.4, 0.6), 448: (1.0, 0.99, 1.01)}))
    assert uses_context(copier, 64) == {"xl": [64, 448], "t5": [64], "rope": []}   # d=32 is below the segment
    note = context_note(copier, 64)
    assert "`xl` up to d=448" in note and "`t5` up to d=64" in note and "not used by `rope`" in note
    # over seeds the t-interval decides: two seeds at 0.9 and 1.1 do not show use
    seeds = pd.DataFrame([{"variant": "a", "seed": s, "distance": 448, "status": "ok", "ratio": r,
                           "ratio_low": r - 0.01, "ratio_high": r + 0.01} for s, r in ((0, 0.9), (1, 1.1))])
    assert uses_context(seeds, 64) == {"a": []}
    # a tight interval below 1.00 is not use when the copy lowers the loss by under 1%
    tight = pd.DataFrame(copy_rows("alibi", {64: (0.9995, 0.9993, 0.9997), 448: (0.985, 0.98, 0.99)}))
    assert uses_context(tight, 64) == {"alibi": [448]}
