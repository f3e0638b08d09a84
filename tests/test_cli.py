"""The command line: the train -> extrapolate -> report chain, and one-line errors."""

import pandas as pd
import pytest
from typer.testing import CliRunner

from relbench.cli import app, spread_variadic

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    result = run("train", "--preset", "tiny", "--variants", "alibi", "learned", "xl", "--seeds", 0, 1,
                 "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    return run_dir


def test_chain_train_extrapolate_report(trained):
    result = run("extrapolate", "--run-dir", trained, "--lengths", 32, 128, "--mode", "nonoverlap", "sliding",
                 "--stride", 16)
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(trained / "extrapolation.csv")
    assert len(rows) == 24  # 3 variants x 2 seeds x 2 lengths x 2 modes
    assert set(rows["status"]) == {"ok", "unsupported"}
    learned_long = rows[(rows["variant"] == "learned") & (rows["length"] == 128)]
    assert (learned_long["status"] == "unsupported").all() and learned_long["ppl"].isna().all()
    ok = rows[rows["status"] == "ok"]
    assert (ok["ppl"] > 1).all() and (ok["ppl"] < 256).all()
    assert (ok["n_tokens"] == ok["n_tokens"].iloc[0]).all()  # the same scored tokens at every length and mode
    assert (ok["attention_ms"] > 0).all()
    # the path each model's attention really took under --attention auto: both distance-only biases
    # on the toeplitz path
    assert set(ok[ok["variant"] == "alibi"]["path"]) == {"toeplitz"}
    assert set(ok[ok["variant"] == "xl"]["path"]) == {"toeplitz"}
    assert set(ok[ok["variant"] == "learned"]["path"]) == {"sdpa"}
    sliding = ok[ok["mode"] == "sliding"]
    assert (sliding["stride"] == 16).all() and (sliding["window"] == sliding["length"]).all()
    nonoverlap_128 = ok[(ok["mode"] == "nonoverlap") & (ok["length"] == 128)]
    assert (nonoverlap_128["n_windows"] == nonoverlap_128["n_tokens"] // 128).all()
    bins = pd.read_csv(trained / "positions.csv")
    for (variant, seed, length, mode), mine in bins.groupby(["variant", "seed", "length", "mode"]):
        row = ok[(ok["variant"] == variant) & (ok["seed"] == seed) & (ok["length"] == length) & (ok["mode"] == mode)]
        assert mine["n_tokens"].sum() == row["n_tokens"].iloc[0]
        assert mine["loss_sum"].sum() / mine["n_tokens"].sum() == pytest.approx(row["loss"].iloc[0], rel=1e-9)

    result = run("report", "--run-dir", trained)
    assert result.exit_code == 0, result.output
    assert "Perplexity" in result.output and "alibi" in result.output and "unsupported" in result.output
    report = (trained / "report.md").read_text()
    assert "| alibi |" in report and "L=128" in report and "sliding, stride 16" in report
    assert "[toeplitz]" in report and "[sdpa]" in report    # the cost table names the path
    assert "±" in report  # two seeds: intervals
    pivot = pd.read_csv(trained / "extrapolation_pivot.csv")
    alibi = pivot[(pivot["variant"] == "alibi") & (pivot["mode"] == "nonoverlap")].iloc[0]
    assert alibi["ratio@32"] == pytest.approx(1.0)
    assert alibi["n_seeds"] == 2
    per_seed = rows[(rows["variant"] == "alibi") & (rows["mode"] == "nonoverlap") & (rows["length"] == 128)]["ppl"]
    assert alibi["ppl@128"] == pytest.approx(per_seed.mean())
    assert alibi["std@128"] == pytest.approx(per_seed.std(ddof=1))
    for name in ("perplexity_vs_length", "loss_by_position", "learned_bias"):
        path = trained / "plots" / f"{name}.png"
        assert path.is_file() and path.stat().st_size > 1000
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"plots/{name}.png" in report


def test_copy_and_passkey_tasks_and_the_overview(trained, tmp_path):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    result = run("extrapolate", "--run-dir", run_dir, "--lengths", 32, 256, "--task", "perplexity", "copy", "passkey",
                 "--trials", 2, "--seeds", 0)
    assert result.exit_code == 0, result.output
    copies = pd.read_csv(run_dir / "copy.csv")
    assert sorted(copies["distance"].unique()) == [64, 128]                      # adjacent, and the farthest at 256
    assert set(copies[copies["variant"] == "learned"]["status"]) == {"unsupported"}  # 192 and 256 > 32
    ok = copies[copies["status"] == "ok"]
    assert (ok["trials"] == 2).all() and ((ok["ratio_low"] <= ok["ratio"]) & (ok["ratio"] <= ok["ratio_high"])).all()
    keys = pd.read_csv(run_dir / "passkey.csv")
    assert len(keys) == 3 * 2 * 5                                                 # variants x lengths x depths
    assert set(keys[keys["length"] == 32]["status"]) == {"unsupported"}           # shorter than one trial
    assert set(keys[(keys["length"] == 256) & (keys["variant"] != "learned")]["status"]) == {"ok"}
    reach = pd.read_csv(run_dir / "attention.csv")
    assert sorted(reach[reach["seed"] == 0]["variant"]) == ["alibi", "learned", "xl"] and (reach["length"] == 32).all()
    assert (reach["mean_distance"] > 0).all() and (reach["mean_distance"] < 32).all()
    assert run("extrapolate", "--run-dir", run_dir, "--lengths", 32, 256, "--task", "copy", "passkey", "--trials", 2,
               "--seeds", 0).output.count("passkey L=") == 0                       # nothing left to compute
    result = run("report", "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    report = (run_dir / "report.md").read_text()
    assert "## Overview" in report and "## Copy distance" in report and "## Passkey accuracy" in report
    assert (run_dir / "plots" / "copy_distance.png").stat().st_size > 1000
    assert not (run_dir / "plots" / "passkey.png").exists()     # no seed of these language models learned it


def test_inspect_reports_bias_size_reach_and_gradients(trained):
    result = runner.invoke(app, ["inspect", str(trained), "--variants", "xl", "alibi", "learned"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    frame = pd.read_csv(trained / "inspect.csv")
    stats = frame.dropna(subset=["head"])
    assert set(stats["length"]) == {32, 512}
    assert (stats[stats["variant"] == "alibi"]["bias_spread"] > 0).all()
    assert (stats[stats["variant"] == "learned"]["bias_spread"] == 0).all()   # no bias at all
    assert (stats["mean_distance"] >= 0).all() and (stats["mean_distance"] < stats["length"]).all()
    assert (frame[frame["variant"] == "learned"]["status"] == "unsupported").any()  # 512 > its 32 positions
    grads = frame.dropna(subset=["grad_norm"])
    assert set(grads["variant"]) == {"xl", "learned"} and (grads["grad_norm"] > 0).all()
    assert "mean distance" in result.output


def test_train_again_skips_finished_variants(trained):
    result = run("train", "--preset", "tiny", "--variants", "alibi", "--run-dir", trained)
    assert result.exit_code == 0, result.output
    assert "already trained" in result.output


def test_train_csv_has_a_loss_curve(trained):
    curve = pd.read_csv(trained / "train.csv")
    assert set(curve["variant"]) == {"alibi", "learned", "xl"} and set(curve["seed"]) == {0, 1}
    curve = curve[curve["seed"] == 0]
    alibi = curve[curve["variant"] == "alibi"].sort_values("step")
    assert alibi["train_loss"].iloc[-1] < alibi["train_loss"].iloc[0]  # training lowers the loss
    assert alibi["val_loss"].notna().any()


def assert_one_line_error(result, code, *fragments):
    assert result.exit_code == code, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0]


def test_unknown_variant(tmp_path):
    result = run("train", "--preset", "tiny", "--variants", "alibbi", "--run-dir", tmp_path / "r")
    assert_one_line_error(result, 2, 'unknown position variant "alibbi"', 'did you mean "alibi"')


def test_unknown_preset(tmp_path):
    assert_one_line_error(run("train", "--preset", "tinny", "--run-dir", tmp_path / "r"), 2, 'did you mean "tiny"')


@pytest.mark.parametrize("lengths, fragment", [(["0"], "positive"), (["-5"], "positive"),
                                               (["abc"], "Invalid value for '--lengths'"), (["32", "32"], "twice")])
def test_bad_lengths(trained, lengths, fragment):
    result = run("extrapolate", "--run-dir", trained, "--lengths", *lengths)
    assert_one_line_error(result, 2, fragment)


def test_missing_run_directory(tmp_path):
    assert_one_line_error(run("extrapolate", "--run-dir", tmp_path / "nope"), 1, "does not exist")
    assert_one_line_error(run("report", "--run-dir", tmp_path), 1, "not a relbench run")
    # control characters in what the user typed are escaped, so the message stays one line
    assert_one_line_error(run("inspect", "a\x1eb\nc"), 1, "a\\x1eb\\nc", "does not exist")


def test_help_has_an_example():
    for command in ("train", "extrapolate", "report", "bench", "variants"):
        result = run(command, "-h")
        assert result.exit_code == 0 and "Example" in result.output


def test_variants_lists_every_variant_with_parameters():
    result = runner.invoke(app, ["variants", "--heads", "8"], env={"COLUMNS": "250"})
    assert result.exit_code == 0
    for name in ("alibi", "xl", "t5", "shaw", "rope", "learned", "sinusoidal", "none"):
        assert name in result.output
    assert "4 x 2,056" in result.output  # xl: (2*128+1) x 8 per layer, 4 layers
    assert "T[clamp(i-j, -k, k) + k, h]" in result.output  # formulas are not eaten as markup


def test_spread_variadic():
    assert spread_variadic(["extrapolate", "--lengths", "1", "2,3", "--run-dir", "x"]) == [
        "extrapolate", "--lengths", "1", "--lengths", "2", "--lengths", "3", "--run-dir", "x"]
    assert spread_variadic(["x", "--lengths", "-5"]) == ["x", "--lengths", "-5"]
    assert spread_variadic(["x", "--lengths"]) == ["x", "--lengths"]

    # a variant's own options stay with it; a comma before another variant still splits
    given = ["train", "--variants", "t5:num_buckets=8,max_distance=12,xl", "alibi:ssmax=true,ssmax_bias=false"]
    assert spread_variadic(given) == [
        "train", "--variants", "t5:num_buckets=8,max_distance=12", "--variants", "xl",
        "--variants", "alibi:ssmax=true,ssmax_bias=false"]
    assert spread_variadic(["x", "--variants", "xl,rope@yarn:factor=16,alpha=2"]) == [
        "x", "--variants", "xl", "--variants", "rope@yarn:factor=16,alpha=2"]


def test_profile_writes_rows_and_report_shows_them(tmp_path):
    result = run("profile", "--lengths", 64, "--variants", "xl", "alibi", "--attention", "reference", "split",
                 "--repeats", 1, "--heads", 2, "--head-dim", 8, "--train-max", 64, "--run-dir", tmp_path, "--device", "cpu",
                 "--memory")
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "profile.csv")
    assert len(rows) == 4 and set(rows["status"]) == {"ok"}
    assert (rows["attention_ms"] > 0).all() and (rows["bias_ms"] >= 0).all()
    reference = rows[rows["backend"] == "reference"]
    assert reference["train_ms"].notna().all()           # the reference path trains; split does not
    assert rows[rows["backend"] == "split"]["train_ms"].isna().all()
    # the path that ran: xl's horizon (128) leaves nothing to split at 64, so its split is chunked
    paths = rows.set_index(["variant", "backend"])["path"]
    assert paths["xl", "split"] == "chunked" and paths["alibi", "split"] == "split-linear"
    assert paths["xl", "reference"] == "reference"
    assert rows[rows["backend"] == "reference"]["train_path"].eq("reference").all()
    result = run("report", "--run-dir", tmp_path)
    assert result.exit_code == 0, result.output
    assert "forward+backward" in (tmp_path / "report.md").read_text()
    assert "[chunked]" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "plots" / "attention_cost.png").stat().st_size > 1000


def test_profile_defaults_to_auto_and_reference_in_process(tmp_path, monkeypatch):
    """What a user asks first: each variant's auto path and the reference, timed in this process
    (no fresh process, no peak memory) unless --memory; --attention all is every backend."""
    from relbench.cost import profiling as profile

    monkeypatch.setattr(profile, "run_isolated", lambda *a: pytest.fail("isolated without --memory"))
    result = run("profile", "--lengths", 64, "--variants", "kerple-log", "none", "--repeats", 1, "--heads", 2,
                 "--head-dim", 8, "--run-dir", tmp_path, "--device", "cpu")
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "profile.csv")
    assert sorted(zip(rows["variant"], rows["backend"], rows["path"])) == [
        ("kerple-log", "auto", "toeplitz"), ("kerple-log", "reference", "reference"),
        ("none", "auto", "sdpa"), ("none", "reference", "reference")]
    assert rows["attention_peak_mb"].isna().all() and (rows["attention_ms"] > 0).all()
    monkeypatch.undo()
    result = run("profile", "--lengths", 64, "--variants", "alibi", "--attention", "all", "--memory", "--repeats", 1,
                 "--heads", 2, "--head-dim", 8, "--train-max", 0, "--run-dir", tmp_path / "all", "--device", "cpu")
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "all" / "profile.csv")
    assert sorted(rows["backend"]) == sorted(["auto", "reference", "sdpa", "chunked", "split", "toeplitz", "flex"])
    assert rows["attention_peak_mb"].notna().all()          # fresh processes measure peak memory


def test_profile_records_oom_and_continues(tmp_path):
    result = run("profile", "--lengths", 32, 2_000_000, "--variants", "xl", "--attention", "reference",
                 "--repeats", 1, "--heads", 2, "--head-dim", 8, "--run-dir", tmp_path, "--device", "cpu")
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(tmp_path / "profile.csv").set_index("length")
    assert rows.loc[32, "status"] == "ok"
    assert rows.loc[2_000_000, "status"] == "oom" and "skipped: needs about" in rows.loc[2_000_000, "message"]


def test_profile_skips_what_does_not_fit_before_building_anything(tmp_path, monkeypatch):
    # q, k, v and the output at L=64, 8 heads x 64 channels take 512 KB; the budget is 256 KB
    monkeypatch.setenv("RELBENCH_MEMORY", "256KB")
    result = run("profile", "--lengths", 64, "--variants", "xl", "--attention", "sdpa", "--repeats", 1,
                 "--run-dir", tmp_path, "--device", "cpu")
    assert result.exit_code == 0, result.output
    row = pd.read_csv(tmp_path / "profile.csv").iloc[0]
    assert row["status"] == "oom" and row["message"] == "skipped: needs about 512 KB, 256 KB available"


def test_profile_csv_keeps_every_shape_and_the_report_tells_them_apart(tmp_path):
    for heads in (2, 4):
        result = run("profile", "--lengths", 32, "--variants", "alibi", "--attention", "sdpa", "--repeats", 1,
                     "--heads", heads, "--head-dim", 8, "--run-dir", tmp_path, "--device", "cpu")
        assert result.exit_code == 0, result.output
        assert "H=2" not in result.output  # the command shows the shape it measured, nothing else
    rows = pd.read_csv(tmp_path / "profile.csv")
    assert sorted(rows["heads"]) == [2, 4]
    result = run("report", "--run-dir", tmp_path)
    assert result.exit_code == 0, result.output
    text = (tmp_path / "report.md").read_text()
    assert "| alibi | sdpa | B=1 H=2 d=8 cpu |" in text and "| alibi | sdpa | B=1 H=4 d=8 cpu |" in text


def test_a_batch_that_cannot_fit_is_refused_before_any_work(tmp_path):
    result = run("train", "--preset", "tiny", "--variants", "alibi", "--batch-size", 10**6, "--run-dir", tmp_path / "r")
    assert_one_line_error(result, 1, "training alibi at --batch-size 1000000 x --train-length 32", "needs at least",
                          "fits (the largest that does)")
    assert not (tmp_path / "r" / "config.json").exists()


def test_variants_refuses_a_model_that_cannot_exist(tmp_path):
    result = run("variants", "--heads", 10**6)
    assert_one_line_error(result, 1, "1000000 heads", "TB of memory")


def test_split_backend_is_refused_for_training(tmp_path):
    result = run("train", "--preset", "tiny", "--variants", "xl", "--attention", "split", "--run-dir", tmp_path)
    assert_one_line_error(result, 2, "inference only")


def test_train_prints_the_expected_time_before_it_goes_on(tmp_path):
    result = run("train", "--preset", "tiny", "--variants", "alibi", "xl", "--run-dir", tmp_path)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())                     # the console wraps long lines
    assert text.count("expected: ") == 1, result.output
    assert "of training for the 2 run(s) to go (alibi took" in text and "--preset tiny" in text
    assert text.index("expected: ") < text.index("alibi: validation loss")   # before the first run ends


def test_expected_time_message_scales_with_the_steps_left():
    from relbench.training.train import expected_time_message

    assert expected_time_message(0.5, 2400, 6, "xl").startswith("expected: about 20 min of training for the 6 run(s)")
    assert "under a minute" in expected_time_message(0.01, 100, 1, "xl")
    assert expected_time_message(0.5, 2400, 6, "xl", capped=True).startswith("expected: at most 20 min")


def test_a_piped_console_keeps_a_wide_table_row_on_one_line(monkeypatch):
    """In a pipe or a CI log Rich would wrap at 80 columns, a variant's reach over three lines."""
    import io

    from rich.table import Table

    from relbench.cli.common import PIPE_WIDTH, make_console

    monkeypatch.delenv("COLUMNS", raising=False)
    table = Table("variant", "perplexity ratio at 16x", "passkey reach", "steps to learn passkey")
    table.add_row("kerple-power", "1.02 [0.98, 1.07]", "2048 (2/3; per seed 512, 8192)", "1900 (1400-2400)")
    out = io.StringIO()
    piped = make_console(out)
    assert piped.width == PIPE_WIDTH
    piped.print(table)
    rows = [line for line in out.getvalue().splitlines() if "kerple-power" in line]
    assert len(rows) == 1 and "2048 (2/3; per seed 512, 8192)" in rows[0] and "1900 (1400-2400)" in rows[0]
    monkeypatch.setenv("COLUMNS", "100")          # the user's own width wins
    assert make_console(io.StringIO()).width == 100


@pytest.mark.parametrize("command", ["bench", "train", "extrapolate", "report", "merge", "verify", "check"])
def test_help_keeps_each_example_on_a_line_of_its_own(command):
    """Click rewraps a docstring's paragraphs; the examples are kept as written, one command per line."""
    text = run(command, "--help").output
    block = text.split("Examples:")[1].split("Options:")[0].split("Arguments:")[0]
    lines = [line.strip() for line in block.splitlines() if line.strip()]
    assert lines and all(line.startswith("relbench ") and line.count("relbench ") == 1 for line in lines), lines
