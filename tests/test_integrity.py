"""A run's integrity is proven, never rebuilt: a damaged or missing checksums.json makes readers refuse the
run, `relbench verify` says what can still be proven and --repair records only what is whole; a run
without its config.json is adopted by no configuration; merge refuses a damaged checkpoint."""

import json
import shlex
import shutil

import pytest
from test_cli import assert_one_line_error, run
from test_fault_table import trained  # noqa: F401  (the fixture: a tiny trained and evaluated run)

from relbench.runs import checkpoints, results, rundir


@pytest.fixture
def copy(trained, tmp_path):  # noqa: F811  (the fixture imported above)
    shutil.copytree(trained, tmp_path / "run")
    return tmp_path / "run"


@pytest.mark.parametrize("damage", ["truncated", "deleted", "not a table"])
def test_a_damaged_or_missing_checksum_record_makes_the_run_refused_not_rebuilt(copy, damage):
    sums = copy / results.CHECKSUMS
    if damage == "truncated":
        sums.write_bytes(sums.read_bytes()[:20])
    elif damage == "deleted":
        sums.unlink()
    else:
        sums.write_text("[1, 2]\n")
    before = sums.read_bytes() if sums.exists() else None
    done = run("report", "--run-dir", copy)
    said = "has no recorded checksum" if damage == "deleted" else f"{sums} is damaged"
    assert_one_line_error(done, 1, said, "relbench verify --run-dir")
    assert (sums.read_bytes() if sums.exists() else None) == before      # nothing rebuilt it


def test_a_csv_cut_mid_row_is_refused_even_after_its_record_is_gone_and_repair_leaves_it_out(copy):
    path = copy / results.TRAIN_CSV
    path.write_bytes(path.read_bytes()[:-7])
    (copy / results.CHECKSUMS).unlink()
    assert_one_line_error(run("report", "--run-dir", copy), 1, "no recorded checksum")
    done = run("verify", "--run-dir", copy, "--repair")
    assert done.exit_code == 1 and "train.csv: its last line is cut short" in done.output
    sums = results.read_checksums(copy / results.CHECKSUMS)
    assert "extrapolation.csv" in sums and results.TRAIN_CSV not in sums
    assert_one_line_error(run("report", "--run-dir", copy), 1, str(path))


def test_verify_repairs_a_lost_record_of_whole_files_and_says_so(copy):
    (copy / results.CHECKSUMS).unlink()
    done = run("verify", "--run-dir", copy)
    assert done.exit_code == 1 and "whole, unrecorded" in done.output and "--repair" in done.output
    done = run("verify", "--run-dir", copy, "--repair")
    assert done.exit_code == 0 and "recorded on their structure alone" in done.output
    assert run("report", "--run-dir", copy).exit_code == 0
    assert run("verify", "--run-dir", copy).exit_code == 0


def test_verify_finds_a_checkpoint_that_does_not_match_its_meta(copy):
    model = rundir.checkpoint_dir(copy, "alibi", 0) / checkpoints.MODEL_FILE
    model.write_bytes(model.read_bytes()[:100])
    done = run("verify", "--run-dir", copy)
    assert done.exit_code == 1 and "checksum mismatch" in done.output


def test_a_run_without_its_config_is_adopted_by_no_configuration(copy):
    (copy / results.CONFIG).unlink()
    done = run("train", "--preset", "tiny", "--variants", "xl", "--steps", 5, "--run-dir", copy)
    assert_one_line_error(done, 2, "no config.json", "restore")
    assert not rundir.checkpoint_dir(copy, "xl", 0).exists()


def test_a_damaged_config_says_to_restore_it_not_to_delete_it(copy):
    (copy / results.CONFIG).write_text("{")
    done = run("report", "--run-dir", copy)
    assert_one_line_error(done, 1, "restore it", "config.toml")
    assert "delete it" not in done.output


def test_merge_refuses_a_truncated_checkpoint_writes_nothing_and_prints_a_fix_that_works(trained, tmp_path):  # noqa: F811
    source = tmp_path / "source"
    assert run("train", "--preset", "tiny", "--variants", "xl", "--run-dir", source).exit_code == 0
    model = rundir.checkpoint_dir(source, "xl", 0) / checkpoints.MODEL_FILE
    model.write_bytes(model.read_bytes()[:100])
    target = tmp_path / "target"
    shutil.copytree(trained, target)
    before = {p: p.read_bytes() for p in target.rglob("*") if p.is_file() and not p.name.startswith(".lock")}
    done = run("merge", source, "--run-dir", target)
    assert_one_line_error(done, 1, "corrupt or truncated", "nothing was written")
    after = {p: p.read_bytes() for p in target.rglob("*") if p.is_file() and not p.name.startswith(".lock")}
    assert after == before and json.loads((target / results.CONFIG).read_text())["variants"] == ["alibi"]
    printed = shlex.split(done.output.split("`")[1])  # the fix, typed as printed, retrains it; then it merges
    assert printed[:2] == ["relbench", "train"] and run(*printed[1:]).exit_code == 0
    assert run("merge", source, "--run-dir", target).exit_code == 0


def test_the_fix_printed_for_a_corrupt_checkpoint_works_as_printed(copy):
    model = rundir.checkpoint_dir(copy, "alibi", 0) / checkpoints.MODEL_FILE
    model.write_bytes(model.read_bytes()[:100])
    done = run("extrapolate", "--run-dir", copy, "--lengths", 32, "--force")
    assert done.exit_code == 1 and "corrupt or truncated" in done.output
    printed = shlex.split(done.output.split("`")[1])
    assert printed[:2] == ["relbench", "train"]
    assert run(*printed[1:]).exit_code == 0
    assert run("extrapolate", "--run-dir", copy, "--lengths", 32, "--force").exit_code == 0


@pytest.mark.parametrize("damage", [{"seeds": "0"}, {"variants": [1]}, {"model": None}])
def test_a_config_whose_fields_are_of_the_wrong_kind_is_refused_and_nothing_is_written(copy, damage):
    path = copy / results.CONFIG
    path.write_text(json.dumps({**json.loads(path.read_text()), **damage}))
    before = (copy / "report.md").read_bytes() if (copy / "report.md").exists() else None
    assert_one_line_error(run("report", "--run-dir", copy), 1, "config.json is damaged", "restore it")
    assert ((copy / "report.md").read_bytes() if (copy / "report.md").exists() else None) == before
