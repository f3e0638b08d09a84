"""Training runs side by side (`relbench train --jobs N`, relbench/training/jobs.py): the same weights
and loss curves as one after another at the same thread count, every file written by the parent,
Ctrl-C saving every child's state, a dead child losing only its own run, and --jobs refused in one
line where it cannot work."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import resume_step
from typer.testing import CliRunner

from relbench.cli import app
from relbench.cli.common import resolve_jobs
from relbench.config import ModelConfig, TrainConfig
from relbench.cost import memory, resident
from relbench.errors import UsageError
from relbench.runs import checkpoints, rundir

runner = CliRunner()
VARIANTS = ["alibi", "xl", "rope"]
TRAIN = ["train", "--preset", "tiny", "--steps", "20"]


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def curve(run_dir: Path) -> pd.DataFrame:
    frame = pd.read_csv(run_dir / "train.csv").drop(columns=["elapsed_s", "tokens_per_s"])
    return frame.sort_values(["variant", "seed", "step"]).reset_index(drop=True)


def weights(run_dir: Path, spec: str, seed: int = 0) -> dict[str, torch.Tensor]:
    return torch.load(rundir.checkpoint_dir(run_dir, spec, seed) / checkpoints.MODEL_FILE, weights_only=True)


@pytest.fixture()
def threads():
    """Restores torch's thread count after a test that sets it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    """The runs one after another in this process, at one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_dir = tmp_path_factory.mktemp("alone")
        result = run(*TRAIN, "--variants", *VARIANTS, "--seeds", 0, 1, "--run-dir", run_dir)
        assert result.exit_code == 0, result.output
    finally:
        torch.set_num_threads(before)
    return run_dir


def test_side_by_side_runs_train_the_weights_and_curves_of_runs_alone(alone, tmp_path, threads):
    """Two jobs of one thread each (two threads shared) give every run the weights, loss curve and
    summary it gets alone at one thread, in any order of finishing."""
    torch.set_num_threads(2)
    result = run(*TRAIN, "--variants", *VARIANTS, "--seeds", 0, 1, "--run-dir", tmp_path, "--jobs", 2)
    assert result.exit_code == 0, result.output
    assert "2 side by side, each in its own process with 1 thread(s)" in result.output
    pd.testing.assert_frame_equal(curve(alone), curve(tmp_path))
    for spec in VARIANTS:
        for seed in (0, 1):
            expected, got = weights(alone, spec, seed), weights(tmp_path, spec, seed)
            assert expected.keys() == got.keys()
            for name in expected:
                assert torch.equal(expected[name], got[name]), (spec, seed, name)
            a = checkpoints.read_meta(rundir.checkpoint_dir(alone, spec, seed))
            b = checkpoints.read_meta(rundir.checkpoint_dir(tmp_path, spec, seed))
            assert a["sha256"] == b["sha256"] and a["model"] == b["model"] and a["train"] == b["train"]
            for key in ("val_loss", "steps", "n_params", "position_lr_scale"):
                assert a["summary"][key] == b["summary"][key], key
            assert not (rundir.checkpoint_dir(tmp_path, spec, seed) / checkpoints.RESUME_FILE).exists()
    # a second command finds them all trained and trains nothing
    again = run(*TRAIN, "--variants", *VARIANTS, "--seeds", 0, 1, "--run-dir", tmp_path, "--jobs", 2)
    assert again.exit_code == 0 and again.output.count("already trained") == 6, again.output


def test_jobs_are_resolved_and_refused_in_one_line(threads):
    model, train = ModelConfig(d_model=32, n_layers=2, n_heads=2, train_length=32), TrainConfig(batch_size=8)
    cpu = torch.device("cpu")
    torch.set_num_threads(3)
    assert resolve_jobs("auto", ["alibi"], model, train, cpu) == 3        # one per thread this process may use
    assert resolve_jobs("2", ["alibi"], model, train, cpu) == 2
    assert resolve_jobs(" AUTO ", ["alibi"], model, train, torch.device("meta")) == 1   # not a CPU: alone
    for bad in ("0", "-1", "two", "1.5", ""):
        with pytest.raises(UsageError, match="--jobs must be a positive number or auto"):
            resolve_jobs(bad, ["alibi"], model, train, cpu)
    with pytest.raises(UsageError, match="trains runs side by side on a CPU; on meta use --jobs 1"):
        resolve_jobs("2", ["alibi"], model, train, torch.device("meta"))


def test_jobs_fit_in_memory(threads, monkeypatch):
    """auto takes as many jobs as fit; a number that does not fit is refused naming one that does."""
    model, train = ModelConfig(d_model=32, n_layers=2, n_heads=2, train_length=32), TrainConfig(batch_size=8)
    one = memory.model_bytes(model) + max(resident.training_bytes(dataclasses.replace(model, position=s), 8,
                                                                   train.precision) for s in ("alibi", "dape"))
    one += resident.SIDE_PROCESS     # each run's own process, torch loaded again (about 220 MB)
    torch.set_num_threads(8)
    monkeypatch.setenv(memory.ENV, str(int(one * 2.5)))
    cpu = torch.device("cpu")
    assert resolve_jobs("auto", ["alibi", "dape"], model, train, cpu) == 2
    assert resolve_jobs("2", ["alibi", "dape"], model, train, cpu) == 2
    with pytest.raises(Exception, match=r"training 3 runs side by side \(--jobs 3\).*--jobs 2 fits"):
        resolve_jobs("3", ["alibi", "dape"], model, train, cpu)
    monkeypatch.setenv(memory.ENV, str(int(one * 0.5)))
    assert resolve_jobs("auto", ["alibi", "dape"], model, train, cpu) == 1


def test_bad_jobs_on_the_command_line_is_one_line(tmp_path):
    result = run(*TRAIN, "--variants", "alibi", "--run-dir", tmp_path, "--jobs", "many")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1].startswith("error: --jobs must be a positive number or auto")
    assert not (tmp_path / "train.csv").exists()


def _start(run_dir: Path, steps: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "2"}
    return subprocess.Popen([sys.executable, "-m", "relbench", "train", "--preset", "tiny", "--steps", str(steps),
                             "--variants", "alibi", "xl", "--run-dir", str(run_dir), "--jobs", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def _wait_for_progress(process: subprocess.Popen, folders: list[Path]) -> None:
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None and min(resume_step(f) for f in folders) < 10:
        time.sleep(0.05)
    assert process.poll() is None, process.communicate()


def test_ctrl_c_stops_every_side_by_side_run_after_saving_it(tmp_path):
    """SIGINT to the parent: each child stops after its step and saves where it was, the command
    exits 130 with one "interrupted:" line, and nothing is marked finished."""
    folders = [rundir.checkpoint_dir(tmp_path, spec, 0) for spec in ("alibi", "xl")]
    process = _start(tmp_path, 4000)
    _wait_for_progress(process, folders)
    before = [resume_step(f) for f in folders]
    process.send_signal(signal.SIGINT)
    _out, err = process.communicate(timeout=120)
    assert process.returncode == 130, err.decode()
    text = err.decode()
    assert "Traceback" not in text and "interrupted: 2 run(s) stopped and saved where they were" in text, text
    for folder, step in zip(folders, before):
        assert resume_step(folder) >= step > 0
        assert not (checkpoints.read_meta(folder) or {}).get("finished")
    assert not (tmp_path / "train.csv").exists()


def _children(pid: int) -> list[int]:
    """The spawned training processes of `pid` (not multiprocessing's resource tracker)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    found = []
    for child in map(int, out):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in command and b"resource_tracker" not in command:
            found.append(child)
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the child processes through /proc")
def test_a_killed_child_loses_only_its_own_run(tmp_path):
    """SIGKILL to one child: the other run finishes and is written, the dead one's last resumable
    state is kept, and the command ends with exit code 1 naming it."""
    process = _start(tmp_path, 1500)
    folders = [rundir.checkpoint_dir(tmp_path, spec, 0) for spec in ("alibi", "xl")]
    _wait_for_progress(process, folders)
    children = _children(process.pid)
    assert len(children) == 2, children
    victim = children[0]
    os.kill(victim, signal.SIGKILL)
    _out, err = process.communicate(timeout=300)
    text = err.decode() + _out.decode()
    assert process.returncode == 1, text
    assert "Traceback" not in text and "its process ended with exit code -9" in text, text
    metas = [checkpoints.read_meta(f) or {} for f in folders]
    assert sorted(bool(m.get("finished")) for m in metas) == [False, True], metas
    dead = folders[[bool(m.get("finished")) for m in metas].index(False)]
    assert resume_step(dead) > 0                                    # its last resumable state is kept
    rows = pd.read_csv(tmp_path / "train.csv")
    assert set(rows["variant"]) == {json.loads((f / "meta.json").read_text())["variant"]
                                    for f, m in zip(folders, metas) if m.get("finished")}
