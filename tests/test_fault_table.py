"""Environment faults, command by command: a file where the run directory should be, a full disk and a
folder that cannot be written each end in one line that names the cause and a fix, a non-zero exit,
no traceback, and leave every file that was there byte for byte as it was; a Ctrl-C at any moment of
start-up ends in one line and 130."""

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_cli import assert_one_line_error, run

from relbench.__main__ import INTERRUPTED
from relbench.runs import results, rundir

TINY = ["--preset", "tiny", "--variants", "alibi"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")
    assert run("train", *TINY, "--run-dir", folder).exit_code == 0
    assert run("extrapolate", "--run-dir", folder, "--lengths", 32).exit_code == 0
    return folder


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.startswith(".lock")}


def commands(run_dir: Path, other: Path) -> dict[str, list]:
    return {"train": ["train", *TINY, "--seeds", 1, "--run-dir", run_dir],
            "extrapolate": ["extrapolate", "--run-dir", run_dir, "--lengths", 64, "--force"],
            "report": ["report", "--run-dir", run_dir],
            "merge": ["merge", other, "--run-dir", run_dir],
            "bench": ["bench", "--track", "lm", *TINY, "--run-dir", run_dir]}


@pytest.mark.parametrize("command", ["train", "extrapolate", "report", "merge", "bench"])
def test_a_file_in_place_of_the_run_directory(tmp_path, trained, command):
    file = tmp_path / "not-a-folder"
    file.write_text("mine\n")
    done = run(*commands(file, trained)[command])
    assert_one_line_error(done, 2, "is a file")
    assert file.read_text() == "mine\n"


@pytest.mark.parametrize("fault,words", [(errno.ENOSPC, "free some space"), (errno.EACCES, "make it writable"),
                                         (errno.EROFS, "make it writable")])
@pytest.mark.parametrize("command", ["train", "extrapolate", "report", "merge", "bench"])
def test_a_full_or_unwritable_disk_ends_in_one_line_and_loses_nothing(tmp_path, trained, monkeypatch, command,
                                                                      fault, words):
    import shutil

    run_dir = tmp_path / "copy"
    shutil.copytree(trained, run_dir)
    before = snapshot(run_dir)

    def refuse(path, write):
        raise OSError(fault, errno.errorcode[fault] if fault not in (errno.ENOSPC,) else "No space left on device",
                      str(path))

    monkeypatch.setattr(results, "atomic_write", refuse)
    done = run(*commands(run_dir, trained)[command])
    ends_in_one_line(done, 1, words, "run the same command again")
    assert snapshot(run_dir) == before


def ends_in_one_line(result, code, *fragments):
    """The command's own progress may come first; its end is one error line and no traceback."""
    assert result.exit_code == code, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert errors == lines[-1:] and "Traceback" not in result.output, result.output
    for fragment in fragments:
        assert fragment in lines[-1]


@pytest.mark.parametrize("text,words", [
    ("[train]\nwarmup_steps = -5\n", ["[train] of", "warmup_steps is out of range: -5"]),
    ("[train]\ngrad_clip = 0.0\n", ["[train] of", "grad_clip"]),
    ("[model]\nmlp_ratio = -1.0\n", ["[model] of", "mlp_ratio"]),
    ('variants = []\n', ["variants in", "empty list"]),
    ('seeds = [-1]\n', ["seeds in", "0 or more"]),
])
def test_an_experiment_file_out_of_range_is_one_line_naming_the_key_and_the_file(tmp_path, text, words):
    file = tmp_path / "bad.toml"
    file.write_text('preset = "tiny"\n' + text)
    done = run("train", "--config", file, "--run-dir", tmp_path / "r")
    assert_one_line_error(done, 2, *words)
    assert str(file) in done.output and not (tmp_path / "r").exists()


def children_of(pid: int) -> list[int]:
    out = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        if int(fields.get("PPid", "0").strip()) == pid:
            out.append(int(status.parent.name))
    return out


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads /proc")
def test_workers_of_a_killed_parent_stop_save_and_resume(tmp_path):
    """SIGKILL of `train --jobs 2` leaves no orphan training: each worker sees its parent gone, stops after
    its step, saves where it was, and exits; the same command then resumes."""
    run_dir = tmp_path / "r"
    command = [sys.executable, "-m", "relbench", "train", "--preset", "tiny", "--variants", "alibi", "xl",
               "--steps", "20000", "--jobs", "2", "--run-dir", str(run_dir)]
    parent = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "2"})
    started = 0
    while started < 2:
        line = parent.stdout.readline()
        assert line, "train ended before both runs started"
        started += line.rstrip().endswith(": started")
    time.sleep(3)
    workers = [pid for pid in children_of(parent.pid) if "relbench" in Path(f"/proc/{pid}/cmdline").read_text()
               or "multiprocessing" in Path(f"/proc/{pid}/cmdline").read_text()]
    assert workers
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 60
    while any(Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()
              for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.5)
    alive = [pid for pid in workers if Path(f"/proc/{pid}").exists()
             and "zombie" not in Path(f"/proc/{pid}/status").read_text()]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"workers {alive} outlived their parent"
    for variant in ("alibi", "xl"):
        assert (rundir.checkpoint_dir(run_dir, variant, 0) / "resume.pt").is_file()


@pytest.mark.parametrize("command", [["check"], ["train", "--preset", "tiny", "--plugin"]])
def test_a_plugin_whose_import_never_returns_is_stopped_in_one_line(tmp_path, monkeypatch, command):
    hang = tmp_path / "hang.py"
    hang.write_text("import time\nwhile True:\n    time.sleep(0.05)\n")
    monkeypatch.setenv("RELBENCH_PLUGIN_TIMEOUT", "0.5")
    done = run(*command, hang, "--run-dir", tmp_path / "r") if "train" in command else run(*command, hang)
    assert_one_line_error(done, 2, f"plugin {hang} did not finish importing within 0.5 s", "RELBENCH_PLUGIN_TIMEOUT")
    monkeypatch.setenv("RELBENCH_PLUGIN_TIMEOUT", "soon")
    assert_one_line_error(run("check", hang), 2, "RELBENCH_PLUGIN_TIMEOUT must be a number")


def test_a_token_budget_too_small_to_draw_a_sequence_from_is_refused_with_the_least_that_works(tmp_path):
    done = run("train", *TINY, "--max-train-tokens", 5, "--run-dir", tmp_path / "r")
    ends_in_one_line(done, 2, "holds 5 tokens", "--max-train-tokens 66 or more")
    assert run("train", *TINY, "--max-train-tokens", 66, "--run-dir", tmp_path / "ok").exit_code == 0


# Moments of start-up, each "once this module has finished importing" (python -X importtime prints a
# line as each import ends): typer loaded, numpy loaded inside torch's start-up, torch loaded, every
# import done (the command running).
STARTUP = ["typer", "numpy", "torch", "relbench.cli"]


def interruptible() -> None:
    """In the child, before it runs: SIGINT back to its default, as at a terminal. A test run started in
    the background (`cmd &` in a script, CI) hands its children SIGINT ignored, and relbench then keeps
    it ignored on purpose (relbench/__main__.py), so the Ctrl-C these tests send would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process")
@pytest.mark.parametrize("module", STARTUP)
def test_ctrl_c_at_any_moment_of_start_up_ends_in_one_line_and_130(tmp_path, module):
    """`relbench train` gets SIGINT as soon as `module` has loaded: stderr holds one line (besides
    -X importtime's own) and the exit code is 130, never a traceback, an abort or a lost Ctrl-C."""
    command = [sys.executable, "-X", "importtime", "-m", "relbench", "train", *TINY, "--steps", "100000",
               "--run-dir", str(tmp_path / "r")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                               preexec_fn=interruptible)
    try:
        for line in process.stderr:
            if line.startswith("import time:") and line.rsplit("|", 1)[-1].strip() == module:
                break
        else:
            pytest.fail(f"`{module}` was never imported")
        process.send_signal(signal.SIGINT)
        rest = process.stderr.read()
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    lines = [line for line in rest.splitlines() if line.strip() and not line.startswith("import time:")]
    # 130, or death by SIGINT, which a shell reports as the same 130: in 3 of 36 tries with the
    # interrupt landing as typer starts (just after rich's emoji table loads), relbench.cli.main said
    # its one line and exited 130, and the interpreter then ended by SIGINT all the same (CPython's
    # exit_sigint, for a KeyboardInterrupt it counts as unhandled); a plain import interrupted and
    # caught does not do it (tried), and the path inside CPython was not traced
    assert process.returncode in (130, -signal.SIGINT), (process.returncode, rest[-3000:])
    assert len(lines) == 1 and lines[0].startswith("interrupted:"), rest[-3000:]


# Stands in for a library whose start-up swallows an interrupt: the first `import torch` marks a file,
# waits, and drops whatever ends the wait. numpy's C start-up inside torch's import did that with a
# KeyboardInterrupt (9 of 80 Ctrl-Cs at 0.1-2.5 s after the start on a loaded 2-core host, before
# relbench/__main__.py ended the process itself): the command went on training, or failed later with
# a traceback about a half-loaded numpy; one more, raised through torch's C++ start-up, aborted (SIGABRT).
SWALLOWING_TORCH = """
import runpy, sys, time
from pathlib import Path
marker = Path(sys.argv[1])
class SwallowingTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            marker.touch()
            try:
                time.sleep(60)
            except BaseException:
                pass
        return None
sys.meta_path.insert(0, SwallowingTorch())
sys.argv = ["relbench", "variants"]
runpy.run_module("relbench", run_name="__main__", alter_sys=True)
"""


def test_ctrl_c_in_a_library_that_swallows_it_while_loading_still_ends_in_one_line_and_130(tmp_path):
    marker = tmp_path / "importing-torch"
    process = subprocess.Popen([sys.executable, "-c", SWALLOWING_TORCH, str(marker)], preexec_fn=interruptible,
                               stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "relbench never imported torch"
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert (process.returncode, err.splitlines()) == (130, [INTERRUPTED]), out[-500:]
