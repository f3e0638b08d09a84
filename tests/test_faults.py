"""Fault injection: kills and resumes, truncated files, random datasets, fuzzed arguments, locks,
out-of-memory and diverging training. Nothing finished may be lost, and no mistake may end in a
traceback."""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from helpers import resume_step
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from relbench.cli import app
from relbench.runs import checkpoints, results, rundir

runner = CliRunner()
STEPS = 150
TRAIN = ["train", "--preset", "tiny", "--variants", "xl", "--steps", str(STEPS)]
# Weights equal bit for bit only at one thread count (a float sum split over 1 or 2 threads adds in
# another order: 21 of 21 tensors differ after 150 steps), so the reference run and every interrupted
# one train at this one, whatever this host's default and whatever an earlier test left in this process.
THREADS = 1


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def state(run_dir: Path, spec: str = "xl", seed: int = 0) -> dict[str, torch.Tensor]:
    return torch.load(rundir.checkpoint_dir(run_dir, spec, seed) / checkpoints.MODEL_FILE, weights_only=True)


def curve(run_dir: Path) -> pd.DataFrame:
    return pd.read_csv(run_dir / "train.csv").drop(columns=["elapsed_s", "tokens_per_s"])


def train_process(run_dir: Path) -> subprocess.Popen:
    """`relbench train` of TRAIN in a fresh process at THREADS threads."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(THREADS)}
    return subprocess.Popen([sys.executable, "-m", "relbench", *TRAIN, "--run-dir", str(run_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The run never interrupted, trained as the interrupted ones are (a fresh process, THREADS
    threads), so nothing an earlier test left in this process can move its weights."""
    run_dir = tmp_path_factory.mktemp("straight")
    process = train_process(run_dir)
    _out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err.decode()
    return run_dir


def test_killed_and_resumed_training_ends_with_identical_weights(uninterrupted, tmp_path):
    """Interrupt `relbench train` at random steps with SIGINT, SIGTERM and SIGKILL, several times in
    a row, resuming each time: the final weights and loss curve equal the uninterrupted run's."""
    rng = random.Random(1234)
    folder = rundir.checkpoint_dir(tmp_path, "xl", 0)
    interruptions = []
    for attempt in range(8):
        process = train_process(tmp_path)
        if attempt < 4:  # the first four attempts are cut short; later ones are left to finish
            deadline = time.time() + 60
            before = resume_step(folder)
            while time.time() < deadline and resume_step(folder) == before and process.poll() is None:
                time.sleep(0.02)   # wait until this attempt has made progress
            time.sleep(rng.uniform(0, 0.3))
            how = [signal.SIGINT, signal.SIGTERM, signal.SIGKILL][attempt % 3]
            process.send_signal(how)
            interruptions.append((how.name, resume_step(folder)))
        _out, err = process.communicate(timeout=120)
        if how != signal.SIGKILL and process.returncode not in (0, None):
            assert b"Traceback" not in err, err.decode()
            # 130 / 143: the command stopped on the signal and said so. A SIGTERM that lands while torch
            # loads or while the process exits meets its default action (killed by it: -15, the shell's
            # 143), with nothing started or everything saved; a SIGINT there ends as 130 (relbench.cli.main).
            if not (how == signal.SIGTERM and process.returncode == -signal.SIGTERM):
                assert process.returncode in (130, 143), err.decode()
                assert b"interrupted:" in err, err.decode()
        meta = checkpoints.read_meta(folder)
        if meta and meta.get("finished"):
            break
    assert len(interruptions) >= 3, interruptions
    assert checkpoints.read_meta(folder)["finished"]
    expected, got = state(uninterrupted), state(tmp_path)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name
    pd.testing.assert_frame_equal(curve(uninterrupted), curve(tmp_path))


# Stands in for a slow import: the first `import torch` marks a file and waits, so the Ctrl-C lands
# inside the imports on any host (a fixed sleep before it raced a warm, fast import in CI: exit 0).
SLOW_TORCH = """
import runpy, sys, time
from pathlib import Path
marker = Path(sys.argv[1])
class SlowTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            marker.touch()
            time.sleep(60)
        return None
sys.meta_path.insert(0, SlowTorch())
sys.argv = ["relbench", "variants"]
runpy.run_module("relbench", run_name="__main__", alter_sys=True)
"""


def test_ctrl_c_while_the_libraries_load_ends_in_one_line_and_130(tmp_path):
    """A Ctrl-C in the first seconds, while torch and relbench import (about 2 s), is not a traceback
    and an exit by signal: one line and 130, as anywhere else."""
    marker = tmp_path / "importing-torch"
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
    process = subprocess.Popen([sys.executable, "-c", SLOW_TORCH, str(marker)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 60
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "relbench never imported torch"
    process.send_signal(signal.SIGINT)
    _out, err = process.communicate(timeout=60)
    assert process.returncode == 130, (process.returncode, err.decode())
    assert b"Traceback" not in err and err.decode().startswith("interrupted:"), err.decode()
    # the installed `relbench` command starts at the same guard (its wrapper imports the target first)
    from importlib.metadata import entry_points
    (script,) = entry_points(group="console_scripts", name="relbench")
    assert script.value == "relbench.__main__:run"


@pytest.fixture()
def finished(uninterrupted, tmp_path):
    """A copy of a finished, evaluated run to damage."""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted, run_dir)
    result = run("extrapolate", "--run-dir", run_dir, "--lengths", 32, 64)
    assert result.exit_code == 0, result.output
    return run_dir


def one_line_error(result, *fragments):
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert lines[-1].startswith("error:"), result.output
    for fragment in fragments:
        assert fragment in lines[-1], lines[-1]


@pytest.mark.parametrize("keep", [0, 100, 0.5])
def test_truncated_checkpoint_is_detected_with_its_path(finished, keep):
    path = rundir.checkpoint_dir(finished, "xl", 0) / checkpoints.MODEL_FILE
    data = path.read_bytes()
    path.write_bytes(data[: int(keep * len(data)) if isinstance(keep, float) else keep])
    one_line_error(run("extrapolate", "--run-dir", finished, "--lengths", 128), str(path), "corrupt")


def test_flipped_byte_in_checkpoint_is_detected(finished):
    path = rundir.checkpoint_dir(finished, "xl", 0) / checkpoints.MODEL_FILE
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    one_line_error(run("extrapolate", "--run-dir", finished, "--lengths", 128), str(path), "checksum")


@pytest.mark.parametrize("name", ["extrapolation.csv", "positions.csv", "train.csv"])
def test_truncated_csv_is_detected_and_left_alone(finished, name):
    path = finished / name
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    damaged = path.read_bytes()
    command = ["report"] if name == "extrapolation.csv" else ["extrapolate", "--lengths", 128]
    if name == "train.csv":
        command = ["train", "--preset", "tiny", "--variants", "alibi", "--steps", STEPS]
    one_line_error(run(*command, "--run-dir", finished), str(path), "changed or truncated")
    assert path.read_bytes() == damaged  # nothing overwritten: the user decides


def test_truncated_resume_state_is_reported(tmp_path):
    folder = rundir.checkpoint_dir(tmp_path, "xl", 0)
    process = subprocess.Popen([sys.executable, "-m", "relbench", *TRAIN, "--run-dir", str(tmp_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline and resume_step(folder) < 5:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    path = folder / checkpoints.RESUME_FILE
    path.write_bytes(path.read_bytes()[:200])
    one_line_error(run(*TRAIN, "--run-dir", tmp_path), str(path), "corrupt")


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(min_size=0, max_size=3000))
def test_random_bytes_as_a_dataset(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("bytes")
    path = folder / "random.txt"
    path.write_bytes(data)
    result = run("train", "--preset", "tiny", "--variants", "alibi", "--steps", 1, "--dataset", path,
                 "--run-dir", folder / "run")
    assert "Traceback" not in result.output
    assert result.exit_code in (0, 1), result.output
    if result.exit_code:
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert lines[-1].startswith("error:") and str(path) in lines[-1], result.output


OPTIONS = {
    "train": ["--variants", "--preset", "--seeds", "--steps", "--train-length", "--batch-size", "--lr", "--attention",
              "--precision", "--device", "--dataset"],
    "extrapolate": ["--lengths", "--variants", "--mode", "--stride", "--seeds", "--attention", "--eval-tokens",
                    "--device"],
    "report": [],
    "inspect": ["--variants", "--seed", "--lengths", "--device"],
    "variants": ["--heads", "--head-dim", "--layers", "--train-length"],
    "profile": ["--variants", "--attention", "--batch", "--heads", "--head-dim", "--repeats", "--device"],
}
VALUES = st.one_of(st.integers(-3, 3).map(str), st.integers(-10**12, 10**12).map(str),
                   st.sampled_from(["xl", "t5", "alibi", "xl:k=-1", "xl:k=abc", "t5:buckets=3", "flex", "split",
                                    "auto", "bf16", "fp64", "cuda", "cuda:7", "tpu", "tiny", "quick", "sliding",
                                    "nope", "", "nan", "inf", "-", "--", "1e309", "0.0", "/dev/null", "\x00"]),
                   st.text(max_size=12))


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(sorted(OPTIONS)), data=st.data())
def test_fuzzed_arguments_never_end_in_a_traceback(tmp_path_factory, command, data):
    args = [command]
    for _ in range(data.draw(st.integers(0, 4))):
        if OPTIONS[command] and data.draw(st.booleans()):
            args.append(data.draw(st.sampled_from(OPTIONS[command])))
        args.append(data.draw(VALUES))
    # keep whatever the fuzzer built fast and harmless: an empty run directory, a tiny preset,
    # one step, short profile runs (a later single-valued option wins), and a 2 GB memory
    # budget, so that a batch or model size the machine could just hold is refused like a hopeless one
    folder = tmp_path_factory.mktemp("fuzz")
    if command in ("train",):
        args += ["--preset", "tiny", "--steps", "1", "--seeds", "0"]
    if command == "profile":  # one variant and one backend unless the fuzzer chose (each runs in a fresh process)
        args += ["--lengths", "16", "--repeats", "1"] + ([] if "--variants" in args else ["--variants", "alibi"]) \
            + ([] if "--attention" in args else ["--attention", "sdpa"])
    args += [] if command == "variants" else (["--run-dir", str(folder)] if command != "inspect" else [str(folder)])
    result = runner.invoke(app, args, env={"RELBENCH_MEMORY": "2GB"})
    assert "Traceback" not in result.output, (args, result.output)
    assert result.exit_code in (0, 1, 2), (args, result.output)
    if result.exit_code:
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert lines and lines[-1].startswith("error:"), (args, result.output)
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), (args, result.exception)


SIZES = st.one_of(st.integers(1, 64), st.integers(1, 10**5), st.integers(1, 10**12))


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=SIZES, length=SIZES, variant=st.sampled_from(["xl", "fire", "rope", "transformer-xl"]))
def test_fuzzed_sizes_are_trained_or_refused_in_one_line(tmp_path_factory, batch, length, variant):
    """Any batch size and training length either trains (within a 1 GB budget) or is refused before
    any work with one line that says what it needs, never a traceback or an allocation that the
    kernel would answer with the OOM killer."""
    folder = tmp_path_factory.mktemp("sizes")
    result = runner.invoke(app, ["train", "--preset", "tiny", "--variants", variant, "--steps", "1", "--batch-size",
                                 str(batch), "--train-length", str(length), "--run-dir", str(folder)],
                           env={"RELBENCH_MEMORY": "1GB"})
    assert "Traceback" not in result.output, result.output
    if result.exit_code:
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 1 and lines[-1].startswith("error:"), result.output
        assert "needs at least" in lines[-1] or "shorter than one training window" in lines[-1], lines[-1]
        assert not (folder / "checkpoints").exists()


def test_second_process_on_a_run_directory_is_refused(finished):
    with rundir.RunLock(finished):
        one_line_error(run("extrapolate", "--run-dir", finished, "--lengths", 32), "another relbench process",
                       str(os.getpid()))
    assert run("report", "--run-dir", finished).exit_code == 0  # released


def test_relbench_imports_without_posix_only_modules():
    """Windows has no fcntl (nor resource): importing every command's module must not need them."""
    import subprocess
    import sys

    code = ("import sys, warnings\nwarnings.simplefilter('ignore')\n"
            "sys.modules.update(fcntl=None, resource=None, termios=None)\n"
            "import relbench.cli, relbench.runs.results, relbench.runs.rundir, relbench.cost.profiling, "
            "relbench.evaluation.extrapolate\nprint('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr


def test_a_lock_held_by_another_process_is_refused_with_its_pid(finished):
    import subprocess
    import sys

    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom relbench.runs import rundir\n"
                               f"with rundir.RunLock({str(finished)!r}):\n    print('held', flush=True)\n"
                               "    sys.stdin.readline()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        one_line_error(run("extrapolate", "--run-dir", finished, "--lengths", 32), "another relbench process",
                       f"pid {holder.pid}")
    finally:
        holder.communicate("\n", timeout=30)
    assert holder.returncode == 0
    assert run("report", "--run-dir", finished).exit_code == 0  # released when the holder finished


def test_out_of_memory_becomes_a_row_and_the_rest_continues(finished, monkeypatch):
    from relbench.evaluation import perplexity as evaluate

    original = evaluate.perplexity

    def perplexity(model, stream, length, *args, **kwargs):
        if length == 128:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 99999999999 bytes")
        return original(model, stream, length, *args, **kwargs)

    monkeypatch.setattr(evaluate, "perplexity", perplexity)
    result = run("extrapolate", "--run-dir", finished, "--lengths", 32, 128, 256, "--force")
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(finished / "extrapolation.csv")
    rows = rows[rows["segment"] == 256].set_index("length")
    assert rows.loc[128, "status"] == "oom" and rows.loc[32, "status"] == "ok" and rows.loc[256, "status"] == "ok"


def test_a_length_that_cannot_fit_is_an_oom_row_before_it_runs(finished, monkeypatch):
    """On CPU the kernel kills a process that allocates past the machine instead of raising, so a
    length whose materialised scores cannot fit is recorded as oom without running; the rest run."""
    from relbench.config import ModelConfig
    from relbench.cost import memory

    config = ModelConfig(**results.read_json(finished / results.CONFIG)["model"])
    small, large = (memory.evaluation_bytes(config, "reference", n, 4096 // n, True) for n in (32, 256))
    monkeypatch.setenv("RELBENCH_MEMORY", str((small + large) // 2))
    result = run("extrapolate", "--run-dir", finished, "--lengths", 32, 256, "--attention", "reference", "--force")
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(finished / "extrapolation.csv")
    rows = rows[rows["segment"] == 256].set_index("length")
    assert rows.loc[32, "status"] == "ok"
    assert rows.loc[256, "status"] == "oom" and rows.loc[256, "message"].startswith("skipped: reference attention")


def test_extrapolate_again_computes_only_what_is_missing(finished, monkeypatch):
    from relbench.evaluation import perplexity as evaluate

    calls = []
    original = evaluate.perplexity
    monkeypatch.setattr(evaluate, "perplexity",
                        lambda m, s, length, *a, **k: calls.append(length) or original(m, s, length, *a, **k))
    result = run("extrapolate", "--run-dir", finished, "--lengths", 32, 64)
    assert result.exit_code == 0, result.output
    assert calls == [] and "already computed" in result.output
    result = run("extrapolate", "--run-dir", finished, "--lengths", 32, 64, "--mode", "nonoverlap", "sliding")
    assert result.exit_code == 0, result.output
    assert calls == [32, 64]                                   # only the sliding rows were missing


def test_a_new_protocol_adds_rows_and_keeps_the_old_ones(finished):
    """Adding a longer length changes the scored text (segments of the longest length): every length is
    measured again under the new protocol, and the rows of the old one stay, never mixed with it."""
    before = pd.read_csv(finished / "extrapolation.csv")
    result = run("extrapolate", "--run-dir", finished, "--lengths", 32, 64, 128)
    assert result.exit_code == 0, result.output
    after = pd.read_csv(finished / "extrapolation.csv")
    assert len(after) == len(before) + 3
    assert sorted(after["segment"].unique()) == [64, 128] and after["protocol"].nunique() == 2
    pd.testing.assert_frame_equal(after[after["segment"] == 64].reset_index(drop=True), before)
    assert run("report", "--run-dir", finished).exit_code == 0
    report = (finished / "report.md").read_text()
    assert report.count("## Perplexity, nonoverlap") == 2


def test_diverging_variant_stops_keeps_its_last_good_state_and_others_finish(tmp_path, monkeypatch):
    from relbench.model import GPT

    original = GPT.forward
    calls = {"n": 0}

    def forward(self, tokens, **options):
        logits = original(self, tokens, **options)
        if self.training and self.config.position == "xl":
            calls["n"] += 1
            if calls["n"] > 12:
                return logits * float("nan")
        return logits

    monkeypatch.setattr(GPT, "forward", forward)
    result = run("train", "--preset", "tiny", "--variants", "xl", "alibi", "--run-dir", tmp_path)
    one_line_error(result, "diverged", "xl", "at step 13", "last resumable state (step 10)",
                   f"relbench train --preset tiny --run-dir {tmp_path}-lr0.001 --lr 0.001 --variants xl --seeds 0")
    xl = checkpoints.read_meta(rundir.checkpoint_dir(tmp_path, "xl", 0))
    assert xl["status"] == "diverged" and not xl["finished"]
    kept = checkpoints.load_resume(rundir.checkpoint_dir(tmp_path, "xl", 0))
    assert kept["state"]["step"] == 10   # the last periodic checkpoint before step 12
    assert checkpoints.read_meta(rundir.checkpoint_dir(tmp_path, "alibi", 0))["finished"]


def test_out_of_memory_in_training_is_one_line_and_keeps_what_was_done(tmp_path, monkeypatch):
    """CUDA raises OutOfMemoryError and CPU allocators raise RuntimeError: either becomes a one-line
    error that names the variant and the fix, and the finished variant and the last resumable state
    stay on disk; running again resumes from them."""
    from relbench.model import GPT

    original = GPT.forward
    calls = {"n": 0}

    def forward(self, tokens, **options):
        if self.training and self.config.position == "alibi":
            calls["n"] += 1
            if calls["n"] == 8:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return original(self, tokens, **options)

    monkeypatch.setattr(GPT, "forward", forward)
    result = run("train", "--preset", "tiny", "--variants", "xl", "alibi", "--run-dir", tmp_path)
    one_line_error(result, "out of memory training alibi at --batch-size 8 x --train-length 32", str(tmp_path),
                   "use a smaller --batch-size")
    assert checkpoints.read_meta(rundir.checkpoint_dir(tmp_path, "xl", 0))["finished"]
    kept = checkpoints.load_resume(rundir.checkpoint_dir(tmp_path, "alibi", 0))
    assert kept["state"]["step"] == 5   # the last periodic checkpoint before the failing step 8
    result = run("train", "--preset", "tiny", "--variants", "xl", "alibi", "--run-dir", tmp_path)
    assert result.exit_code == 0, result.output
    assert "xl: already trained" in result.output
    assert checkpoints.read_meta(rundir.checkpoint_dir(tmp_path, "alibi", 0))["finished"]


def test_training_log_records_the_largest_attention_logit(uninterrupted):
    log = pd.read_csv(uninterrupted / "train.csv")
    assert (log["max_attention_logit"] > 0).all()


def test_checkpoint_loads_the_bytes_it_verified(tmp_path, monkeypatch):
    """load_model checks model.pt's sha256 and must load those same bytes: if the file changes after
    the check (here: overwritten with garbage the moment it has been read), the verified weights are
    still what comes back, not a second read of the file."""
    from dataclasses import asdict

    from relbench.config import ModelConfig
    from relbench.model import GPT
    from relbench.runs.checkpoints import MODEL_FILE, load_model, save_checkpoint

    config = ModelConfig(vocab_size=256, d_model=32, n_layers=1, n_heads=2, train_length=16, position="alibi")
    model = GPT(config, seed=0)
    save_checkpoint(tmp_path, model, {"model": asdict(config), "variant": "alibi", "seed": 0})
    real_read = Path.read_bytes

    def read_then_clobber(self):
        data = real_read(self)
        if self.name == MODEL_FILE:
            self.write_bytes(b"not a checkpoint")
        return data

    monkeypatch.setattr(Path, "read_bytes", read_then_clobber)
    loaded = load_model(tmp_path)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_a_run_that_diverges_before_its_first_checkpoint_says_so_and_its_retry_works_as_printed(tmp_path, monkeypatch):
    from relbench.model import GPT

    original = GPT.forward

    def forward(self, tokens, **options):
        logits = original(self, tokens, **options)
        return logits * float("nan") if self.training and self.config.position == "xl" else logits

    monkeypatch.setattr(GPT, "forward", forward)
    run_dir = tmp_path / "r"
    result = run("train", "--preset", "tiny", "--variants", "xl", "alibi", "--run-dir", run_dir)
    one_line_error(result, "xl diverged", "at step 1", "no state of it was saved")
    monkeypatch.setattr(GPT, "forward", original)
    printed = result.output.split("`")[1].split()
    assert printed[:2] == ["relbench", "train"]
    again = run(*printed[1:])
    assert again.exit_code == 0, again.output
    assert checkpoints.read_meta(rundir.checkpoint_dir(Path(f"{run_dir}-lr0.001"), "xl", 0))["finished"]
    assert checkpoints.read_meta(rundir.checkpoint_dir(run_dir, "alibi", 0))["finished"]     # kept
