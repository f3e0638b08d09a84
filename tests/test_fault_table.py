"""Environment faults, command by command: a file where the run directory should be, a full disk and a
folder that cannot be written each end in one line that names the cause and a fix, a non-zero exit,
no traceback, and leave every file that was there byte for byte as it was."""

import errno
from pathlib import Path

import pytest
from test_cli import assert_one_line_error, run

from relbench.runs import results

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
