"""[train] moments: a run trained to criterion is measured at several moments of its run. Training
saves each earlier moment's weights beside model.pt and records them in meta.json; `extrapolate`
loads every moment (each checked against its record) and deals each cell's trials among them."""

import pytest
import torch
from test_cli import run

from relbench.runs import checkpoints, integrity, results, rundir
from relbench.runs.results import sha256_bytes
from relbench.tasks import passkey
from relbench.tasks.base import Answer
from relbench.training import train as train_module


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """tiny-retrieval with three moments, every validation check at 100% (checks at steps 3 and 6 confirm
    the criterion at 6; the moments are 6, 9 and 12, past the 6-step cap)."""
    folder = tmp_path_factory.mktemp("moments")
    (folder / "moments.toml").write_text('preset = "tiny-retrieval"\n[train]\nmoments = 3\n[eval]\ntrials = 4\n')
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(train_module, "retrieval_accuracy", lambda *args: 1.0)
        done = run("train", "--config", folder / "moments.toml", "--variants", "alibi", "--run-dir", folder / "run")
    assert done.exit_code == 0, done.output
    return folder / "run"


def test_training_saves_and_records_each_earlier_moment(trained):
    checkpoint = rundir.checkpoint_dir(trained, "alibi", 0)
    meta = checkpoints.read_meta(checkpoint)
    assert meta["summary"]["learned_step"] == 3 and meta["summary"]["moments"] == [6, 9, 12]
    assert meta["summary"]["steps"] == 12 and meta["train"]["moments"] == 3
    assert [m["file"] for m in meta["moments"]] == ["moment0.pt", "moment1.pt"]
    for record in meta["moments"]:
        assert record["sha256"] == sha256_bytes((checkpoint / record["file"]).read_bytes())
    models = checkpoints.load_moments(checkpoint)
    assert len(models) == 3
    final = checkpoints.load_model(checkpoint).state_dict()
    assert all(torch.equal(a, b) for a, b in zip(models[-1].state_dict().values(), final.values()))
    assert not torch.equal(models[0].state_dict()["blocks.0.attn.qkv.weight"], final["blocks.0.attn.qkv.weight"])
    curve = results.read_csv(trained / "train.csv")
    assert curve["step"].max() == 12


def zeroed(checkpoint, index):
    """Zero moment `index`'s weights (recorded anew in meta.json): a model unlike the others."""
    name = checkpoints.MOMENT_FILE.format(index)
    state = {k: torch.zeros_like(v) for k, v in torch.load(checkpoint / name, weights_only=True).items()}
    torch.save(state, checkpoint / name)
    meta = checkpoints.read_meta(checkpoint)
    meta["moments"][index]["sha256"] = sha256_bytes((checkpoint / name).read_bytes())
    results.write_json(checkpoint / checkpoints.META_FILE, meta)


def test_extrapolate_deals_each_cells_trials_among_the_moments(trained, monkeypatch):
    """Moment 0 zeroed and an answer counted right only from a zeroed model: of each cell's 4 trials,
    trials 0 and 3 go to moment 0, so every passkey cell reads 2 of 4."""
    zeroed(rundir.checkpoint_dir(trained, "alibi", 0), 0)

    def fake(self, model, stream, plan, length, tokenizer, device, max_batch_tokens, options):
        zero = all(not p.any() for p in model.parameters())
        return [Answer(i, None, zero) for i in range(len(plan))]

    monkeypatch.setattr(passkey.Passkey, "answers", fake)
    done = run("extrapolate", "--run-dir", trained, "--task", "passkey")
    assert done.exit_code == 0, done.output
    rows = results.read_csv(trained / "passkey.csv")
    assert len(rows) == 2 * 5 and (rows["trials"] == 4).all()
    assert (rows["correct"] == 2).all() and (rows["accuracy"] == 0.5).all()
    from relbench.reporting import findings

    assert "trained to criterion at 112, each measured over 3 moments" in findings.retrieval_line(trained)


def test_a_damaged_moment_is_named_and_never_used(trained):
    checkpoint = rundir.checkpoint_dir(trained, "alibi", 0)
    data = (checkpoint / "moment1.pt").read_bytes()
    (checkpoint / "moment1.pt").write_bytes(data[: len(data) // 2])
    try:
        done = run("extrapolate", "--run-dir", trained, "--task", "passkey", "--force")
        errors = [line for line in done.output.splitlines() if line.startswith("error:")]
        assert done.exit_code == 1 and len(errors) == 1 and "Traceback" not in done.output
        assert "moment1.pt" in errors[0] and "checksum mismatch" in errors[0] and "--force" in errors[0]
        findings, _ = integrity.verify(trained)
        assert [f.status for f in findings if f.path == checkpoint] == [integrity.DAMAGED]
    finally:
        (checkpoint / "moment1.pt").write_bytes(data)
    assert checkpoints.damage(checkpoint) is None


def test_the_report_says_when_a_run_was_measured_at_its_moments(trained):
    from relbench.reporting import report

    config = results.read_json(trained / results.CONFIG)
    header, body = report.training_table(trained, config)
    assert body[0][header.index("learned at step, per seed")] == "3 (measured at 3 moments, steps 6-12)"


def test_a_run_with_moments_is_fine_tuned_from_its_last_and_measured_once(trained):
    """relbench finetune: the fine-tuning settings of a moments run train without moments (the copy of
    the run's [train] table would otherwise go on past the criterion at the new length)."""
    from relbench.training.finetune import settings

    meta = checkpoints.read_meta(rundir.checkpoint_dir(trained, "alibi", 0))
    tuned, record, _ = settings(meta, 224, 4, None, None)
    assert meta["train"]["moments"] == 3 and tuned.moments == 1 and tuned.steps == 4
    assert record["source_sha256"] == meta["sha256"]
