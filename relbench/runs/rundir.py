"""The run directory itself: the checkpoint folder of a variant and seed, the checks that a
--run-dir is a folder and a relbench run (a whole config.json, its recorded plugins loaded again),
and the lock a command holds on it. Its files are written and read by relbench/runs/results.py.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import filelock

from relbench.errors import RelbenchError, UsageError
from relbench.runs import distributed
from relbench.runs.results import CONFIG, CONFIG_TOML, read_json, write_json


def slug(text: str) -> str:
    """A file-name-safe form of a variant spec ("xl:k=64" -> "xl_k-64")."""
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text.replace("=", "-")).strip("_")


def checkpoint_dir(run_dir: Path, variant: str, seed: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"{slug(variant)}-seed{seed}"


def require_run(run_dir: Path) -> dict[str, Any]:
    """The run's config.json; a clear error when `run_dir` is missing or not a relbench run."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"--run-dir {run_dir} is a file, not a run directory; pass the folder `relbench train` wrote")
    if not run_dir.is_dir():
        raise RelbenchError(f"run directory {run_dir} does not exist; run `relbench train` first "
                            f"or pass --run-dir to an existing run")
    if not (run_dir / CONFIG).is_file():
        raise RelbenchError(f"{run_dir} is not a relbench run (no {CONFIG}); run `relbench train --run-dir {run_dir}`")
    config = read_json(run_dir / CONFIG)
    problem = config_problem(config)
    if problem:
        raise RelbenchError(f"{run_dir / CONFIG} is damaged ({problem}); restore it from a copy ({run_dir / CONFIG_TOML} "
                            f"holds the same settings); nothing of the run was read or written")
    if config.get("plugins"):   # the schemes of the user's own files it was trained with: the same files again
        from relbench.positions import plugins

        now = plugins.load_recorded(config["plugins"], run_dir, *plugins.command_options())
        if now != config["plugins"]:   # a change accepted (--accept-plugin-change): recorded
            config["plugins"] = now
            write_json(run_dir / CONFIG, config)
    return config


def config_problem(config: Any) -> str | None:
    """What makes a config.json unusable as a run's record, or None."""
    if not isinstance(config, dict):
        return "not a table"
    for key in ("model", "train"):
        if not isinstance(config.get(key), dict):
            return f"{key} is not a table"
    checks = {"variants": str, "seeds": int}
    for key, kind in checks.items():
        value = config.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
            return f"{key} is not a list of {kind.__name__}s: {value!r}"
    return None


def check_folder(run_dir: Path) -> None:
    """A --run-dir that names a file is refused before any work (a missing one is made when written)."""
    if Path(run_dir).exists() and not Path(run_dir).is_dir():
        raise UsageError(f"--run-dir {run_dir} is a file, not a folder; pass a folder (a new one is made)")


class RunLock:
    """An exclusive lock on a run directory for the length of a command. A second relbench process
    on the same directory gets a clear error, naming the pid of the first, instead of interleaving
    its writes. The lock is `filelock`'s (flock on POSIX, msvcrt on Windows; the OS releases it when
    a process dies); the holder's pid sits beside it in `.lock.pid` for the message.

    Under torchrun rank 0 takes it for the whole job and every rank learns whether it got it, so
    all go on or all stop with the same message (no rank waits for a lock its own job holds)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / ".lock"
        self.pid_path = Path(run_dir) / ".lock.pid"
        self.lock: filelock.FileLock | None = None

    def __enter__(self) -> RunLock:
        distributed.on_main(self._acquire)
        return self

    def _acquire(self) -> None:
        check_folder(self.path.parent)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(self.path, thread_local=False)
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            try:
                holder = self.pid_path.read_text().strip() or "unknown"
            except OSError:
                holder = "unknown"
            raise RelbenchError(f"another relbench process (pid {holder}) is working in {self.path.parent}; "
                                f"wait for it to finish, or use another --run-dir") from None
        self.lock = lock
        self.pid_path.write_text(str(os.getpid()))

    def __exit__(self, *exc) -> None:
        if self.lock is not None:
            self.pid_path.unlink(missing_ok=True)
            self.lock.release()
            self.lock = None
