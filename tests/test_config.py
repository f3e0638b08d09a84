"""Experiment files and presets: layering (preset < file < options), the resolved config.toml that
reproduces a run, one-line errors for bad files, `relbench presets`, and the optional tracker."""

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest
import torch
from test_cli import assert_one_line_error, run

from relbench import config
from relbench.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]


def test_every_preset_resolves_and_quick_is_what_the_readme_says():
    assert set(config.preset_names()) >= {"tiny", "quick", "standard", "retrieval", "paper"}
    for name in config.preset_names():
        exp = config.experiment(name)
        assert exp.preset == name and exp.description
    quick = config.experiment("quick")
    assert (quick.model.n_layers, quick.model.d_model, quick.model.n_heads, quick.model.train_length) == (4, 128, 4, 256)
    assert (quick.train.steps, quick.train.batch_size, quick.train.warmup_steps) == (400, 8, 50)
    assert quick.train.position_lr_scales["xl"] == 100.0 and quick.train.position_lr_scales["learned"] == 3.0
    assert (quick.data.dataset, quick.data.tokenizer) == ("sotu", "bytes")


def test_a_preset_that_starts_from_another_changes_only_what_it_says():
    quick, standard = config.experiment("quick"), config.experiment("standard")
    assert standard.model.n_layers == 6 and standard.train.steps == 1800 and standard.eval.eval_tokens == 131072
    assert standard.model.d_model == quick.model.d_model and standard.train.lr == quick.train.lr
    assert standard.train.position_lr_scales == quick.train.position_lr_scales


def test_paper_preset_mirrors_kerple():
    paper = config.experiment("paper")
    assert (paper.model.n_layers, paper.model.d_model, paper.model.n_heads, paper.model.train_length) == (12, 768, 12, 512)
    assert (paper.train.batch_size, paper.train.steps, paper.train.lr) == (32, 50000, 6e-4)
    assert paper.data.tokenizer == "gpt2" and paper.data.stream and paper.train.position_lr_scales == {}


def test_file_over_preset_and_options_over_file(tmp_path):
    file = tmp_path / "e.toml"
    file.write_text('preset = "tiny"\nvariants = ["alibi"]\nseeds = [3]\n[train]\nsteps = 6\nlr = 0.01\n'
                    '[model]\nn_layers = 1\n')
    exp = config.experiment(None, file, {"train": {"steps": 4, "lr": None}})
    assert exp.train.steps == 4 and exp.train.lr == 0.01           # option > file; None is "not given"
    assert exp.model.n_layers == 1 and exp.model.d_model == 32      # file > preset tiny
    assert exp.variants == ["alibi"] and exp.seeds == [3]
    assert config.experiment("quick", file).model.d_model == 128    # --preset replaces the file's base

    result = run("train", "--config", file, "--steps", 5, "--run-dir", tmp_path / "r")
    assert result.exit_code == 0, result.output
    written = json.loads((tmp_path / "r" / "config.json").read_text())
    assert written["train"]["steps"] == 5 and written["train"]["lr"] == 0.01 and written["model"]["n_layers"] == 1
    assert written["variants"] == ["alibi"] and written["seeds"] == [3]
    assert (tmp_path / "r" / "checkpoints" / "alibi-seed3" / "model.pt").is_file()


def test_config_toml_reproduces_the_run(tmp_path):
    """Every option that shapes the run must reach config.toml: the second run, from that file alone,
    has the same configuration and the same losses at every logged step."""
    first, second = tmp_path / "first", tmp_path / "second"
    result = run("train", "--preset", "tiny", "--variants", "alibi", "xl:k=8", "--steps", 12, "--lr", 0.01,
                 "--train-length", 24, "--batch-size", 4, "--position-lr-scale", 3, "--seeds", 1, "--run-dir", first)
    assert result.exit_code == 0, result.output
    result = run("train", "--config", first / "config.toml", "--run-dir", second)
    assert result.exit_code == 0, result.output
    a, b = (json.loads((d / "config.json").read_text()) for d in (first, second))
    a.pop("environment"), b.pop("environment")
    assert a == b
    losses = [pd.read_csv(d / "train.csv") for d in (first, second)]
    assert len(losses[0]) > 0 and losses[0]["variant"].unique().tolist() == ["alibi", "xl:k=8"]
    pd.testing.assert_frame_equal(losses[0][["variant", "seed", "step", "train_loss", "val_loss"]],
                                  losses[1][["variant", "seed", "step", "train_loss", "val_loss"]])


@pytest.mark.parametrize("text, fragments", [
    ('[train]\nstepz = 3\n', ['unknown key "stepz" in [train]', 'did you mean "steps"']),
    ('[train]\nsteps = "many"\n', ["steps in [train]", "must be an integer"]),
    ('[train]\nlr = true\n', ["lr in [train]", "must be a number"]),
    ('[model]\nposition = "xl"\n', ['unknown key "position"', "top-level `variants`"]),
    ('[train]\nseed = 1\n', ['unknown key "seed"', "`seeds`"]),
    ('preset = "tinny"\n', ['unknown preset "tinny"', 'did you mean "tiny"']),
    ('variants = "xl"\n', ["variants in", "must be a list of strs"]),
    ('[train\nsteps = 3\n', ["is not valid TOML", "line 1"]),
    ('modle = 3\n', ['unknown key "modle"', 'did you mean "model"']),
    ('[train]\nsteps = 0\n', ["steps must be positive"]),
])
def test_a_bad_experiment_file_is_one_line_and_writes_nothing(tmp_path, text, fragments):
    file = tmp_path / "bad.toml"
    file.write_text(text)
    assert_one_line_error(run("train", "--config", file, "--run-dir", tmp_path / "r"), 2, *fragments)
    assert not (tmp_path / "r").exists()


def test_a_missing_file_and_a_preset_loop(tmp_path, monkeypatch):
    assert_one_line_error(run("train", "--config", tmp_path / "nope.toml", "--run-dir", tmp_path / "r"), 2,
                          "nope.toml does not exist")
    tables = {"a": {"preset": "b"}, "b": {"preset": "a"}}
    monkeypatch.setattr(config, "read_preset", lambda name: tables[name])
    with pytest.raises(UsageError, match="loop: a -> b -> a"):
        config.layered("a")


def test_presets_command_lists_every_preset():
    result = run("presets")
    assert result.exit_code == 0, result.output
    for name in config.preset_names():
        assert name in result.output


def test_bench_with_the_committed_example_file_offline(tmp_path):
    """The example file names three variants, two seeds and perplexity only; --preset tiny and short
    lengths keep it to seconds (options override the file)."""
    run_dir = tmp_path / "three"
    result = run("bench", "--track", "lm", "--config", ROOT / "examples" / "three-schemes.toml", "--preset", "tiny",
                 "--lengths", 32, 64, "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(run_dir / "extrapolation.csv")
    assert sorted(set(zip(rows["variant"], rows["seed"]))) == [(v, s) for v in ("alibi", "rope", "xl") for s in (0, 1)]
    assert sorted(rows["length"].unique()) == [32, 64]
    assert not (run_dir / "copy.csv").exists()                # the file's [eval] tasks: perplexity only
    assert (run_dir / "report.md").is_file()


def test_extrapolate_takes_variants_seeds_and_eval_from_a_file(tmp_path):
    run_dir = tmp_path / "r"
    assert run("train", "--preset", "tiny", "--variants", "alibi", "rope", "--run-dir", run_dir).exit_code == 0
    file = tmp_path / "eval.toml"
    file.write_text('variants = ["rope"]\n[eval]\ntasks = ["perplexity"]\nlengths = [32, 96]\n')
    result = run("extrapolate", "--config", file, "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(run_dir / "extrapolation.csv")
    assert rows["variant"].unique().tolist() == ["rope"] and sorted(rows["length"].unique()) == [32, 96]


def test_tensorboard_mirrors_train_csv(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "r"
    result = run("train", "--preset", "tiny", "--variants", "alibi", "--run-dir", run_dir, "--log", "tensorboard")
    assert result.exit_code == 0, result.output
    events = EventAccumulator(str(run_dir / "tensorboard" / "alibi-seed0"))
    events.Reload()
    rows = pd.read_csv(run_dir / "train.csv")
    for column in ("train_loss", "lr", "tokens"):
        logged = [(e.step, e.value) for e in events.Scalars(column)]
        assert [s for s, _ in logged] == rows["step"].tolist()
        assert [v for _, v in logged] == pytest.approx(rows[column].tolist(), rel=1e-6)
    validated = rows.dropna(subset=["val_loss"])
    assert [e.step for e in events.Scalars("val_loss")] == validated["step"].tolist()


def test_tensorboard_missing_is_one_line_before_any_work(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tensorboard(name, *args, **kwargs):
        if name.startswith("torch.utils.tensorboard"):
            raise ImportError("no tensorboard")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tensorboard)
    result = run("train", "--preset", "tiny", "--variants", "alibi", "--run-dir", tmp_path / "r", "--log", "tensorboard")
    assert_one_line_error(result, 2, "relbench[tensorboard]")
    assert not (tmp_path / "r" / "config.json").exists()


def test_dry_run_measures_and_writes_nothing(tmp_path):
    import dataclasses

    from relbench.model import GPT

    result = run("train", "--preset", "tiny", "--variants", "alibi", "xl", "--seeds", 0, 1, "--steps", 40,
                 "--dry-run", "--run-dir", tmp_path / "r")
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "r").exists()
    tiny = config.experiment("tiny")
    for spec in ("alibi", "xl"):
        params = GPT(dataclasses.replace(tiny.model, position=spec)).n_params()
        assert f"{params:,}" in result.output
    text = " ".join(result.output.split())      # the console wraps long lines
    assert "40 steps x 8 sequences = 10,240 tokens per run, 2 variant(s) x 2 seed(s)" in text
    assert "projected:" in text and "for 4 run(s)" in text


def test_largest_batch_is_the_largest_that_fits():
    from relbench.cost import resident

    model = dataclasses.replace(config.experiment("tiny").model, position="xl")
    need = {b: resident.training_bytes(model, b, "fp32") for b in (1, 7, 8)}
    assert resident.largest_batch(model, "fp32", need[7], 64) == 7            # exactly fits
    assert resident.largest_batch(model, "fp32", need[8] - 1, 64) == 7
    assert resident.largest_batch(model, "fp32", need[8], 5) == 5              # never above the batch asked for
    assert resident.largest_batch(model, "fp32", need[1] - 1, 64) == 0         # not one sequence


def test_a_batch_beyond_memory_is_refused_with_the_batch_that_fits_and_the_dry_run_times_a_micro_batch(
        tmp_path, monkeypatch):
    from relbench.cli import dryrun
    from relbench.cost import memory, resident

    tiny = config.experiment("tiny")
    model = dataclasses.replace(tiny.model, position="xl")
    fits = 3
    monkeypatch.setenv(memory.ENV, str(resident.training_bytes(model, fits, "fp32") + 1))
    result = run("train", "--preset", "tiny", "--variants", "xl", "--batch-size", 64, "--run-dir", tmp_path / "r")
    assert_one_line_error(result, 1, "--batch-size 3 fits (the largest that does)")
    assert not (tmp_path / "r" / "config.json").exists()
    # the dry run does not refuse: it says what fits, and times a micro-batch that fits in half the budget
    result = run("train", "--preset", "tiny", "--variants", "xl", "--batch-size", 64, "--dry-run")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "no (3)" in text and "scaled to the batch of 64" in text and "the largest --batch-size that does" in text
    row = dryrun.measure("xl", dataclasses.replace(tiny, train=dataclasses.replace(tiny.train, batch_size=64)),
                         torch.device("cpu"))
    assert row["micro_batch"] == 1 and row["fits_batch"] == 3    # half of a budget of 3 holds no sequence: one is timed
    # a slow step: the micro-batch shrinks so that a timed step stays near MICRO_STEP_SECONDS
    monkeypatch.delenv(memory.ENV)
    train = dataclasses.replace(tiny.train, batch_size=64)
    assert dryrun.micro_batch(model, train, torch.device("cpu"), dryrun.MICRO_STEP_SECONDS / 4) == 4
    assert dryrun.micro_batch(model, train, torch.device("cpu"), 1e-6) == 64


def test_the_dry_run_composes_a_step_from_one_and_two_layers_the_vocabulary_and_the_batch(monkeypatch):
    """A step's time is never measured on the configured model: it is composed from steps of the
    variant's model at one and two layers with a small vocabulary, the vocabulary's share measured
    once on shorter sequences, and the batch (the per-token work scales with it; the optimiser and
    the per-weight work of a step do not). With a step whose cost is known in each part, the
    composition gives the configured model's step."""
    from relbench.cli import dryrun
    from relbench.cost import memory
    from relbench.model import GPT

    def fake_step(model, optimizer, window, device, config):
        blocks, vocab, batch, tokens = len(model.blocks), model.config.vocab_size, window.shape[0], window.shape[1] - 1
        fixed = 1e-3 + 2e-3 * blocks + 1e-6 * vocab                 # casting, clipping, allocating gradients
        return fixed + batch * tokens * (1e-6 + 3e-6 * blocks + 1e-9 * vocab), 1e-4 + 2e-4 * blocks + 1e-7 * vocab

    monkeypatch.setattr(dryrun, "_step", fake_step)
    tiny = config.experiment("tiny")
    exp = dataclasses.replace(tiny, model=dataclasses.replace(tiny.model, n_layers=6, vocab_size=3000, train_length=512),
                              train=dataclasses.replace(tiny.train, batch_size=8))
    assert dryrun.VOCABULARY_LENGTH < 512      # the vocabulary's share is timed shorter and scaled to 512 tokens
    extra = 3000 - memory.PROBE_VOCAB
    assert dryrun.vocabulary_seconds(exp, torch.device("cpu")) == pytest.approx((1.1e-6 * extra, 1e-9 * extra))
    row = dryrun.measure("alibi", exp, torch.device("cpu"))
    assert row["micro_batch"] == 8
    fixed = 1e-3 + 2e-3 * 6 + 1e-6 * 3000 + 1e-4 + 2e-4 * 6 + 1e-7 * 3000    # once per step, whatever the batch
    assert row["seconds_per_step"] == pytest.approx(fixed + 8 * 512 * (1e-6 + 3e-6 * 6 + 1e-9 * 3000))
    model = dataclasses.replace(exp.model, position="xl")
    assert dryrun.measure("xl", exp, torch.device("cpu"))["params"] == GPT(model).n_params()
    assert dryrun.measure("xl", exp, torch.device("cpu"))["position_params"] == GPT(model).n_params(positions_only=True)


def test_a_run_recorded_before_a_key_existed_matches_that_key_at_its_default():
    """A config.json written before train.decay_steps existed was trained with its default (0): the same
    configuration today, and another one once the key is set."""
    from dataclasses import asdict

    from relbench.runs.runconfig import differences

    found = config.experiment("retrieval")
    new = {"model": asdict(found.model), "train": {k: v for k, v in asdict(found.train).items() if k != "seed"},
           "data": asdict(found.data)}
    old = {**new, "train": {k: v for k, v in new["train"].items() if k != "decay_steps"}}
    assert differences(old, new) == [] and differences(new, old) == []      # either side may be the older
    assert differences(old, {**new, "train": {**new["train"], "decay_steps": 1000}}) == ["train"]
    assert differences({**old, "train": {**old["train"], "lr": 1e-3}}, new) == ["train"]


def test_a_rate_scale_counts_for_the_variants_that_read_it():
    """train.position_lr_scales is read by spec, then by scheme (positions.Spec.scale_keys): an entry
    none of the variants trained under the old table reads differs in nothing (a new variant trains at
    the new table's rate); a layout reads its own spec only; a variant that does not parse here (a
    plugin not loaded) leaves the whole table counted."""
    from dataclasses import asdict

    from relbench.runs.runconfig import differences

    found = config.experiment("retrieval")
    base = {"model": asdict(found.model), "train": {k: v for k, v in asdict(found.train).items() if k != "seed"},
            "data": asdict(found.data)}

    def run(variants, **scales):
        return {**base, "variants": variants, "train": {**base["train"], "position_lr_scales": scales}}

    assert differences(run(["xl"], t5=30.0, xl=30.0), run(["t5"], t5=1.0, xl=30.0)) == []   # t5 is new here
    assert differences(run(["xl"], xl=30.0), run(["t5"], xl=1.0)) == ["train"]             # xl's was trained
    assert differences(run(["t5:max_distance=64"], t5=30.0), run(["xl"], t5=1.0)) == ["train"]   # by scheme
    assert differences(run(["xl"], t5=30.0), run(["xl"], t5=1.0), variants=["t5"]) == ["train"]
    assert differences(run(["rope*3,none"], rope=2.0), run(["rope*3,none"], rope=1.0)) == []
    assert differences(run(["rope*3,none"], **{"rope*3,none": 2.0}), run(["rope*3,none"])) == ["train"]
    assert differences(run(["mine-not-loaded"], t5=30.0), run(["mine-not-loaded"], t5=1.0)) == ["train"]


def test_the_dry_run_projects_runs_side_by_side_at_their_share_of_the_threads(monkeypatch):
    """With --jobs N the dry run times each step at one run's share of the threads and divides the
    sum over the runs among the N (as bench's announcement does); alone it is the sum."""
    import io

    from relbench.cli import dryrun, pipeline
    from relbench.cli.common import make_console

    seen = []

    def fake_measure(spec, exp, device, vocabulary=None):
        seen.append(torch.get_num_threads())
        return {"seconds_per_step": 0.5 if spec == "alibi" else 1.0, "params": 1, "position_params": 0,
                "memory_bytes": 1, "fits_batch": None, "micro_batch": 8}

    monkeypatch.setattr(dryrun, "measure", fake_measure)
    monkeypatch.setattr(dryrun, "vocabulary_seconds", lambda exp, device: (0.0, 0.0))
    monkeypatch.setattr(pipeline, "resolve_jobs", lambda jobs, specs, model, train, device: int(jobs))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: seen.append(("set", n)))
    tiny = config.experiment("tiny")
    exp = dataclasses.replace(tiny, train=dataclasses.replace(tiny.train, steps=120))
    out = io.StringIO()
    monkeypatch.setattr(pipeline, "console", make_console(out))
    # 2 variants x 2 seeds x 120 steps at 0.5 s and 1 s: 360 s of training, 180 s of wall with 2 jobs
    pipeline.dry_run_experiment(exp, ["alibi", "xl"], [0, 1], "cpu", "2")
    text = " ".join(out.getvalue().split())
    assert "2 side by side (--jobs), each step measured at 2 of 4 threads" in text
    assert ("set", 2) in seen and seen[-1] == ("set", 4)             # the share while timing, then the threads back
    assert f"about {dryrun.human_time(180)} of wall time" in text and f"projected: {dryrun.human_time(360)}" in text
    out.truncate(0)
    pipeline.dry_run_experiment(exp, ["alibi", "xl"], [0, 1], "cpu", "1")
    assert "side by side" not in out.getvalue()
