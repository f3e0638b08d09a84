"""Training and evaluation under torchrun: 2 gloo processes on the CPU against 1 process.

Each torchrun test launches `python -m torch.distributed.run --standalone --nproc_per_node 2 -m
relbench ...` (--standalone: a rendezvous on a free local port) with one thread per process; most
of their time is the three Python processes importing torch."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from relbench.cli import app
from relbench.errors import UsageError
from relbench.runs import checkpoints, distributed, results, rundir
from relbench.training.step import loss_denominator, rank_loss, weighted_loss

ROOT = Path(__file__).resolve().parents[1]
STEPS = 30   # the drift between float sums in another order stays far below 1e-5 (1.3e-7 measured)
TRAIN = ["train", "--preset", "tiny", "--variants", "xl", "--steps", STEPS]
TIMING = ["eval_s", "tokens_per_s", "bias_ms", "bias_peak_mb", "attention_ms", "attention_peak_mb", "elapsed_s"]
runner = CliRunner()


def torchrun(*args, device: str = "cpu") -> subprocess.Popen:
    """`relbench *args` in 2 processes under torchrun, in a session of its own (a signal to its
    process group reaches torchrun, which forwards it to its workers, and not pytest)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "relbench", *map(str, args), "--device", device]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def finish(process: subprocess.Popen) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=300)
    return process.returncode, out, err


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(rundir.checkpoint_dir(run_dir, "xl", 0) / checkpoints.MODEL_FILE, weights_only=True)


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[name] - b[name]).abs().max()) for name in a)


def summary(run_dir: Path) -> dict:
    return checkpoints.read_meta(rundir.checkpoint_dir(run_dir, "xl", 0))["summary"]


def curve(run_dir: Path) -> pd.DataFrame:
    return pd.read_csv(run_dir / results.TRAIN_CSV).drop(columns=["elapsed_s", "tokens_per_s"])


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("single")
    result = runner.invoke(app, [str(a) for a in TRAIN + ["--run-dir", run_dir]])
    assert result.exit_code == 0, result.output
    return run_dir


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("ddp")
    code, out, err = finish(torchrun(*TRAIN, "--run-dir", run_dir))
    assert code == 0, err
    return run_dir, out


def test_two_processes_train_the_weights_of_one(single, ddp):
    """The same global batch split over 2 processes makes the update of 1 process: the weights,
    the gradient norm at the last step, the validation loss and the logged (global) training loss
    agree up to the order of float sums; only rank 0 wrote and printed."""
    run_dir, out = ddp
    assert max_difference(weights(single), weights(run_dir)) < 1e-5
    one, two = summary(single), summary(run_dir)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-4)   # x world dropped would halve it
    assert two["val_loss"] == pytest.approx(one["val_loss"], rel=1e-5)
    pd.testing.assert_frame_equal(curve(single), curve(run_dir), check_exact=False, rtol=1e-5)
    assert results.read_json(run_dir / results.CONFIG)["environment"]["processes"] == 2
    assert out.count("xl: validation loss") == 1 and "2 processes" in out


def _workers(torchrun_pid: int) -> dict[int, int]:
    """rank -> pid of the processes torchrun started (Linux /proc)."""
    ranks = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if parent == torchrun_pid:
                env = dict(v.split("=", 1) for v in (stat.parent / "environ").read_text().split("\0") if "=" in v)
                ranks[int(env["RANK"])] = int(stat.parent.name)
        except (OSError, ValueError, KeyError, IndexError):
            continue
    return ranks


def _interrupt(run_dir: Path, send) -> int:
    """Start the training, wait for a resumable checkpoint newer than any before it, `send(process)`
    a signal; returns the step it stopped at, after checking it said so in one line."""
    path = rundir.checkpoint_dir(run_dir, "xl", 0) / checkpoints.RESUME_FILE
    before = path.stat().st_mtime_ns if path.exists() else None
    process = torchrun(*TRAIN, "--run-dir", run_dir)
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None and \
            (path.stat().st_mtime_ns if path.exists() else None) == before:
        time.sleep(0.01)
    send(process)
    code, _, err = finish(process)
    assert code != 0 and err.count("interrupted:") == 1, err   # rank 0 says it for both
    assert 'File "' + str(ROOT / "relbench") not in err, err
    step = checkpoints.load_resume(path.parent)["state"]["step"]
    assert 0 < step < STEPS
    return step


def test_interrupted_run_resumes_to_the_weights_of_an_uninterrupted_one(ddp, tmp_path):
    """SIGINT to torchrun (which forwards it to both workers), then SIGTERM to rank 1 alone (it tells
    rank 0 through the per-step stop flag): both times every rank stops after the same step and rank 0
    saves; the run that finishes from there ends with the uninterrupted run's weights, bit for bit."""
    first = _interrupt(tmp_path, lambda p: os.killpg(p.pid, signal.SIGINT))
    second = _interrupt(tmp_path, lambda p: os.kill(_workers(p.pid)[1], signal.SIGTERM))
    assert first < second
    code, _, err = finish(torchrun(*TRAIN, "--run-dir", tmp_path))
    assert code == 0, err
    expected, got = weights(ddp[0]), weights(tmp_path)
    for name in expected:
        assert torch.equal(expected[name], got[name]), name
    pd.testing.assert_frame_equal(curve(ddp[0]), curve(tmp_path))


def test_a_batch_the_processes_cannot_share_is_refused_in_one_line(tmp_path):
    code, _, err = finish(torchrun("train", "--preset", "tiny", "--variants", "xl", "--batch-size", 7,
                                     "--run-dir", tmp_path))
    lines = [line for line in err.splitlines() if line.startswith(("error:", "rank "))]
    assert code != 0 and len(lines) == 1, err      # said once, by rank 0 (torchrun adds its own report)
    assert "--batch-size 7" in lines[0] and "2 processes" in lines[0] and "6 or 8" in lines[0]
    assert 'File "' + str(ROOT / "relbench") not in err, err
    assert not (tmp_path / "checkpoints").exists()


def _tables(run_dir: Path) -> dict[str, pd.DataFrame]:
    names = ["extrapolation.csv", "positions.csv", "copy.csv", "attention.csv"]
    return {name: pd.read_csv(run_dir / name).drop(columns=TIMING, errors="ignore") for name in names}


def test_extrapolate_under_two_processes_writes_the_rows_of_one(single, tmp_path):
    """Rows already there are kept; the rest, shared by 2 processes (a unit per rank: length 32 with
    the copy row, length 64), are merged by rank 0 into the CSVs one process writes, in its order."""
    one, two = tmp_path / "one", tmp_path / "two"
    common = ["extrapolate", "--lengths", 32, 64]
    for run_dir in (one, two):
        shutil.copytree(single, run_dir)
        result = runner.invoke(app, [str(a) for a in common + ["--task", "perplexity", "--run-dir", run_dir]])
        assert result.exit_code == 0, result.output
    rest = common + ["--task", "perplexity", "copy", "--mode", "nonoverlap", "sliding"]
    result = runner.invoke(app, [str(a) for a in rest + ["--run-dir", one]])
    assert result.exit_code == 0, result.output
    code, out, err = finish(torchrun(*rest, "--run-dir", two))
    assert code == 0, err
    assert "2 perplexity row(s) already computed, kept" in out and out.count("sliding    ppl") == 2, out
    expected, got = _tables(one), _tables(two)
    for name in expected:
        pd.testing.assert_frame_equal(expected[name], got[name], check_exact=False, rtol=1e-6, obj=name)
    assert len(got["extrapolation.csv"]) == 4 and len(got["copy.csv"]) == 1


def _on_ranks(monkeypatch, world: int, fn):
    """fn() as each of `world` ranks would compute it (no process group: rank and world patched)."""
    monkeypatch.setattr(distributed, "world", lambda: world)
    out = []
    for r in range(world):
        monkeypatch.setattr(distributed, "rank", lambda r=r: r)
        out.append(fn())
    return out


def test_each_rank_takes_its_own_contiguous_rows(monkeypatch):
    batch = torch.arange(12).view(6, 2)
    parts = _on_ranks(monkeypatch, 3, lambda: distributed.share(batch))
    assert torch.equal(torch.cat(parts), batch) and all(len(p) == 2 for p in parts)
    with pytest.raises(UsageError, match="use a multiple of 4, such as 4 or 8"):
        _on_ranks(monkeypatch, 4, lambda: distributed.share(batch))


@pytest.mark.parametrize("kind", ["passkey", "uneven"])
def test_weighted_loss_split_over_ranks_is_the_unsplit_loss_and_gradient(monkeypatch, kind):
    """Each rank's weighted NLL sum over the GLOBAL weight sum adds up to the global weighted mean,
    and world x it, averaged over ranks as DDP averages gradients, gives the global gradient, also
    when the ranks' rows carry different weight sums (where a per-rank mean, averaged, is wrong)."""
    B, L, V, world = 4, 16, 11, 2
    g = torch.Generator().manual_seed(0)
    inputs, targets = torch.randint(0, V, (B, L), generator=g), torch.randint(0, V, (B, L), generator=g)
    if kind == "passkey":
        w = torch.ones(B, L)
        w[:, L - 5:] = 10.0                  # passkey's weights: the five answer digits x10, the text x1
    else:
        w = torch.rand(B, L, generator=g) * torch.tensor([[1.0], [1.0], [5.0], [0.1]])
    model = torch.nn.Embedding(V, V)

    def grads(loss: torch.Tensor) -> torch.Tensor:
        model.zero_grad()
        loss.backward()
        return model.weight.grad.clone()

    full = weighted_loss(model(inputs), targets, w)
    expected = grads(full)
    denominator = loss_denominator(targets, w)
    parts = _on_ranks(monkeypatch, world, lambda: rank_loss(model(distributed.share(inputs)),
                                                            distributed.share(targets), distributed.share(w),
                                                            denominator))
    torch.testing.assert_close(sum(p.detach() for p in parts), full.detach())
    averaged = sum(grads(p * world) for p in parts) / world
    torch.testing.assert_close(averaged, expected)
    per_rank_means = _on_ranks(monkeypatch, world, lambda: weighted_loss(
        model(distributed.share(inputs)), distributed.share(targets), distributed.share(w)).detach())
    assert (kind == "passkey") == torch.allclose(sum(per_rank_means) / world, full.detach())


def test_without_torchrun_nothing_is_distributed():
    assert not distributed.active() and distributed.world() == 1 and distributed.is_main()
    batch = torch.arange(6)
    assert distributed.share(batch) is not None and torch.equal(distributed.share(batch), batch)
    assert distributed.on_main(lambda x: x + 1, 1) == 2 and distributed.all_gather("a") == ["a"]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_two_gpus_train_the_weights_of_one(tmp_path):
    """NCCL, cuda:LOCAL_RANK: 2 GPUs against 1 (looser than on the CPU: CUDA's float sums, such as
    the embedding's gradient, are not in a fixed order)."""
    one, two = tmp_path / "one", tmp_path / "two"
    result = runner.invoke(app, [str(a) for a in TRAIN + ["--run-dir", one, "--device", "cuda"]])
    assert result.exit_code == 0, result.output
    code, _, err = finish(torchrun(*TRAIN, "--run-dir", two, device="cuda"))
    assert code == 0, err
    assert max_difference(weights(one), weights(two)) < 1e-4
    assert results.read_json(two / results.CONFIG)["environment"]["device"] == "cuda:0"
