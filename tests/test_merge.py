"""relbench merge: runs made side by side folded into one, and nothing lost when they disagree."""

import json
import shutil

import pandas as pd
import pytest
from typer.testing import CliRunner

from relbench.cli import app
from relbench.errors import UsageError
from relbench.evaluation.extrapolate import result_tables
from relbench.runs import machine, results, rundir
from relbench.runs.merge import merge_runs

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    """Two workers of one configuration: a holds alibi seed 0, b xl seeds 0 and 1 and alibi seed 1, each
    trained and evaluated (perplexity at 32 and 64, passkey at 32) in its own run directory."""
    root = tmp_path_factory.mktemp("workers")
    for name, variants, seeds in (("a", ["alibi"], [0]), ("b", ["xl", "alibi"], [0, 1])):
        folder = root / name
        result = run("train", "--preset", "tiny", "--variants", *variants, "--seeds", *seeds, "--run-dir", folder)
        assert result.exit_code == 0, result.output
        if name == "b":   # b's alibi seed 0 is not its share: a has it
            shutil.rmtree(folder / "checkpoints" / "alibi-seed0")
            curves = results.read_csv(folder / "train.csv")
            results.write_csv(folder / "train.csv", curves[~((curves.variant == "alibi") & (curves.seed == 0))])
        pairs = [(v, s) for v in variants for s in seeds if (name, v, s) != ("b", "alibi", 0)]
        for variant, seed in pairs:
            result = run("extrapolate", "--run-dir", folder, "--variants", variant, "--seeds", seed, "--lengths", 32, 64,
                         "--task", "perplexity", "passkey", "--trials", 2)
            assert result.exit_code == 0, result.output
    return root


def _snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
            and p.name not in (".lock", ".lock.pid")}


def _rows(folder, name):
    return results.read_csv(folder / name)


def test_merge_folds_every_table_checkpoint_and_pair(workers, tmp_path):
    target = tmp_path / "all"
    result = run("merge", workers / "a", workers / "b", "--run-dir", target)
    assert result.exit_code == 0, result.output
    config = rundir.require_run(target)
    assert config["variants"] == ["alibi", "xl"] and config["seeds"] == [0, 1]
    assert [m["run"] for m in config["merged_from"]] == [str(workers / "a"), str(workers / "b")]
    assert config["merged_from"][1]["environment"] == rundir.require_run(workers / "b")["environment"]
    assert sorted(p.name for p in (target / "checkpoints").iterdir()) == ["alibi-seed0", "alibi-seed1", "xl-seed0",
                                                                              "xl-seed1"]
    for name in ("meta.json", "model.pt"):
        assert (target / "checkpoints" / "xl-seed1" / name).read_bytes() == \
            (workers / "b" / "checkpoints" / "xl-seed1" / name).read_bytes()
    for name, key in (("train.csv", ["variant", "seed", "step"]), ("extrapolation.csv", ["variant", "seed", "length", "mode"]),
                      ("passkey.csv", ["variant", "seed", "length", "depth"]), ("positions.csv", ["variant", "seed", "length",
                                                                                                   "bin_start"])):
        both = pd.concat([_rows(workers / "a", name), _rows(workers / "b", name)], ignore_index=True)
        merged = _rows(target, name)
        assert len(merged) == len(both), name
        pd.testing.assert_frame_equal(merged.sort_values(key).reset_index(drop=True),
                                      both[merged.columns].sort_values(key).reset_index(drop=True), check_dtype=False)
    assert set(zip(_rows(target, "train.csv").variant, _rows(target, "train.csv").seed)) == {
        ("alibi", 0), ("alibi", 1), ("xl", 0), ("xl", 1)}
    # the merged run is one run: report sees every variant and seed, and extrapolate finds nothing left to do
    assert run("report", "--run-dir", target).exit_code == 0
    report = (target / "report.md").read_text()
    assert "| alibi |" in report and "| xl |" in report
    # the report names the machine of every folded run, not only the first one's
    commit_b = rundir.require_run(workers / "b")["environment"]["git_commit"] or "unknown"
    assert f"Folded in (`relbench merge`) from {workers / 'b'}: xl, alibi, seeds 0, 1, trained on " in report
    assert report.count(f"at commit {commit_b}") >= 2 and report.count("Folded in") == 2
    before = _rows(target, "extrapolation.csv")
    result = run("extrapolate", "--run-dir", target, "--variants", "alibi", "--seeds", 0, 1, "--lengths", 32, 64,
                 "--task", "perplexity")
    assert result.exit_code == 0, result.output
    pd.testing.assert_frame_equal(_rows(target, "extrapolation.csv"), before)
    # merging again changes nothing
    again = _snapshot(target)
    result = run("merge", workers / "a", workers / "b", "--run-dir", target)
    assert result.exit_code == 0, result.output
    after = _snapshot(target)
    for name in after:
        if name not in ("config.json",):
            assert after[name] == again[name], name
    assert len(json.loads(after["config.json"])["merged_from"]) == 4   # each fold is recorded


def test_a_differing_row_stops_the_merge_before_any_write(workers, tmp_path):
    target, other = tmp_path / "t", tmp_path / "o"
    shutil.copytree(workers / "a", target)
    shutil.copytree(workers / "a", other)
    frame = _rows(other, "extrapolation.csv")
    frame.loc[0, "ppl"] = frame.loc[0, "ppl"] + 1.0          # one row of alibi seed 0 differs
    results.write_csv(other / "extrapolation.csv", frame)
    shutil.copytree(workers / "b" / "checkpoints" / "xl-seed0", other / "checkpoints" / "xl-seed0")  # and one is new
    before = _snapshot(target)
    with pytest.raises(UsageError, match=r"extrapolation.csv .*'variant': 'alibi'.*differs.*Nothing was written"):
        merge_runs(target, [other], result_tables())
    assert _snapshot(target) == before
    result = run("merge", other, "--run-dir", target)
    assert result.exit_code != 0 and "Nothing was written" in result.output and "Traceback" not in result.output
    assert _snapshot(target) == before

    # --replace: the folded run's row wins, the target's other rows stay, the new checkpoint comes
    done = merge_runs(target, [other], result_tables(), replace=True)
    assert done.replaced["extrapolation.csv"] == 1 and done.checkpoints == ["xl-seed0"]
    merged, mine = _rows(target, "extrapolation.csv"), _rows(workers / "a", "extrapolation.csv")
    assert len(merged) == len(mine)
    assert sorted(merged.ppl) == sorted([frame.loc[0, "ppl"], *mine.ppl.iloc[1:]])


def test_a_group_table_is_replaced_whole(workers, tmp_path):
    """positions.csv's bins go with their perplexity row: a replaced row brings its own bins, none
    of the old ones stays beside them."""
    target, other = tmp_path / "t", tmp_path / "o"
    shutil.copytree(workers / "a", target)
    shutil.copytree(workers / "a", other)
    bins = _rows(other, "positions.csv")
    first = bins.iloc[0]
    group = ((bins.variant == first.variant) & (bins.length == first.length) & (bins["mode"] == first["mode"]))
    assert group.sum() > 2
    kept = bins[~group | (bins.index == bins[group].index[0])].copy()
    kept.loc[kept.index[0], "loss_sum"] = 0.0                 # the group is now one bin, and it differs
    results.write_csv(other / "positions.csv", kept)
    merge_runs(target, [other], result_tables(), replace=True)
    merged = _rows(target, "positions.csv")
    assert len(merged) == len(kept)
    mine = merged[(merged.variant == first.variant) & (merged.length == first.length) & (merged["mode"] == first["mode"])]
    assert len(mine) == 1 and mine.loss_sum.iloc[0] == 0.0


def test_a_seed_configured_but_never_finished_is_not_recorded(workers, tmp_path):
    """A worker stopped before its next seed finished (config.json lists seeds 0 and 5, train.csv holds seed 0
    only): the merged run and its record name the seed it holds, so the report does not claim seed 5."""
    source = tmp_path / "a"
    shutil.copytree(workers / "a", source)
    config = json.loads((source / "config.json").read_text())
    config["seeds"], config["variants"] = [0, 5], ["alibi", "xl"]
    (source / "config.json").write_text(json.dumps(config))
    target = tmp_path / "all"
    result = run("merge", source, "--run-dir", target)
    assert result.exit_code == 0, result.output
    merged = rundir.require_run(target)
    assert merged["seeds"] == [0] and merged["variants"] == ["alibi"]
    assert [(m["variants"], m["seeds"]) for m in merged["merged_from"]] == [(["alibi"], [0])]
    assert run("report", "--run-dir", target).exit_code == 0
    assert f"Folded in (`relbench merge`) from {source}: alibi, seeds 0, trained on " in (target / "report.md").read_text()


def test_runs_of_another_configuration_do_not_merge(workers, tmp_path):
    other = tmp_path / "lr"
    result = run("train", "--preset", "tiny", "--variants", "xl", "--seeds", 0, "--lr", 1e-3, "--run-dir", other)
    assert result.exit_code == 0, result.output
    target = tmp_path / "t"
    shutil.copytree(workers / "a", target)
    before = _snapshot(target)
    result = run("merge", other, "--run-dir", target)
    assert result.exit_code != 0 and "different train configuration" in result.output
    assert _snapshot(target) == before
    missing = run("merge", tmp_path / "missing", "--run-dir", target)
    assert missing.exit_code != 0 and "does not exist" in missing.output.replace("\n", " ")
    assert "target run itself" in run("merge", target, "--run-dir", target).output.replace("\n", " ")


def test_a_forced_evaluation_replaces_its_position_bins(workers, tmp_path):
    """A bin row's n_tokens is the bin's count: the bins of a perplexity row are keyed without it,
    so evaluating again (--force) replaces them instead of adding a second set beside them."""
    target = tmp_path / "t"
    shutil.copytree(workers / "a", target)
    before = _rows(target, "positions.csv")
    result = run("extrapolate", "--run-dir", target, "--lengths", 32, 64, "--task", "perplexity", "--force")
    assert result.exit_code == 0, result.output
    after = _rows(target, "positions.csv")
    assert len(after) == len(before)
    pd.testing.assert_frame_equal(after.sort_values(["length", "bin_start"]).reset_index(drop=True),
                                  before.sort_values(["length", "bin_start"]).reset_index(drop=True))


def test_the_environment_names_the_cpu_and_its_attention_features():
    """config.json's environment names the machine a run's figures came from: the CPU's model and
    which of AVX2, AVX-512, AVX-512-BF16 and AMX it has (the attention speed depends on them)."""
    from relbench.runs.machine import cpu_name

    info = ("processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 sha_ni\n"
            "processor\t: 1\nmodel name\t: AMD EPYC 9R14\n")
    assert cpu_name(info) == "AMD EPYC 9R14; avx2 avx512f avx512_bf16"
    assert cpu_name("model name\t: Old Core i5\nflags\t\t: fpu sse2 avx\n") == "Old Core i5"
    assert cpu_name("flags\t\t: avx2\n").endswith("; avx2")
    assert "cpu" in machine.environment("cpu")


def test_merge_folds_only_the_seeds_and_variants_named(workers, tmp_path):
    """`--seeds 1 --variants xl`: only xl seed 1's rows and checkpoint come over, and config.json records
    only what was folded."""
    target = tmp_path / "some"
    assert run("merge", workers / "a", "--run-dir", target).exit_code == 0
    result = run("merge", workers / "b", "--seeds", 1, "--variants", "xl", "--run-dir", target)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (target / "checkpoints").iterdir()) == ["alibi-seed0", "xl-seed1"]
    for name in ("train.csv", "extrapolation.csv", "passkey.csv"):
        rows = _rows(target, name)
        pairs = set(zip(rows["variant"].astype(str), rows["seed"].astype(int)))
        assert pairs == {("alibi", 0), ("xl", 1)}, (name, pairs)
    config = rundir.require_run(target)
    assert config["variants"] == ["alibi", "xl"] and config["seeds"] == [0, 1]
    assert config["merged_from"][-1]["variants"] == ["xl"] and config["merged_from"][-1]["seeds"] == [1]


def _with_scales(source, folder, scales):
    """A copy of the run `source` whose config.json gives position_lr_scales `scales` (a rate table
    that names schemes, as a preset's sweep does)."""
    shutil.copytree(source, folder)
    config = rundir.require_run(folder)
    results.write_json(folder / results.CONFIG, {**config, "train": {**config["train"], "position_lr_scales": scales}})
    return folder


def test_a_rate_no_folded_variant_reads_is_no_difference(workers, tmp_path):
    """The target's table is kept, so it must give each folded variant the rate it trained at, and only
    that: b (xl and alibi) folds into a whose table gives t5 another rate, and into one whose table gives
    its own alibi another rate when `--variants xl` leaves b's alibi out; not when b's alibi or xl
    trained at another rate than the target's table says."""
    def target(name, scales):
        folder = _with_scales(workers / "a", tmp_path / name, scales)
        return folder, _snapshot(folder)

    def merge(source, folder, *options):
        return run("merge", source, *options, "--run-dir", folder)

    b_t5 = _with_scales(workers / "b", tmp_path / "b-t5", {"t5": 3.0})
    folder, _ = target("t", {})
    result = merge(b_t5, folder)
    assert result.exit_code == 0, result.output
    assert rundir.require_run(folder)["train"]["position_lr_scales"] == {}    # the target's table is kept
    folder, _ = target("alibi-at-3", {"alibi": 3.0})
    result = merge(workers / "b", folder, "--variants", "xl")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["alibi-seed0", "xl-seed0", "xl-seed1"]
    for name, source, options in (("refused-alibi", workers / "b", ()),
                                  ("refused-xl", _with_scales(workers / "b", tmp_path / "b-xl", {"xl": 3.0}), ())):
        folder, before = target(name, {"alibi": 3.0} if name == "refused-alibi" else {})
        result = merge(source, folder, *options)
        assert result.exit_code != 0 and "different train configuration" in result.output, (name, result.output)
        assert _snapshot(folder) == before


def test_a_run_folded_together_keeps_each_machine_when_folded_again(workers, tmp_path):
    """Folding a merged run into another keeps where each of its seeds came from: the runs it had folded
    in, each with its own machine, and only the rest under the merged run's own environment."""
    b = tmp_path / "b"
    shutil.copytree(workers / "b", b)
    config = json.loads((b / "config.json").read_text())
    config["environment"]["cpu"] = "Another CPU; avx2"
    (b / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    first, second = tmp_path / "first", tmp_path / "second"
    assert run("merge", workers / "a", b, "--run-dir", first).exit_code == 0
    result = run("merge", first, "--run-dir", second)
    assert result.exit_code == 0, result.output
    entries = [(m["run"], m["variants"], m["seeds"], m["environment"]["cpu"])
               for m in rundir.require_run(second)["merged_from"]]
    cpu_a = rundir.require_run(workers / "a")["environment"]["cpu"]
    assert (f"{workers / 'a'} (via {first})", ["alibi"], [0], cpu_a) in entries
    assert (f"{b} (via {first})", ["xl", "alibi"], [0, 1], "Another CPU; avx2") in entries
    assert not [e for e in entries if e[0] == str(first)]       # nothing of `first` is its own: all folded in
    assert run("report", "--run-dir", second).exit_code == 0
    assert f"from {b} (via {first}): xl, alibi, seeds 0, 1, trained on Another CPU; avx2" in \
        (second / "report.md").read_text()
