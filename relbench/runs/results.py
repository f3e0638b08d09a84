"""The run directory: layout, locking, checksummed atomic writes.

    RUN/config.json                    how the run was made (config, git commit, versions, date)
    RUN/config.toml                    the same configuration as an experiment file (`--config` reproduces the run)
    RUN/checkpoints/<variant>-seed<s>/ model.pt, meta.json, resume.pt (see relbench/runs/checkpoints.py)
    RUN/train.csv                      loss curve: one row per variant x seed x logged step
    RUN/extrapolation.csv              one row per variant x seed x length x mode
    RUN/positions.csv, profile.csv, inspect.csv, report.md, *_pivot.csv, plots/
    RUN/checksums.json                 sha256 of every CSV relbench wrote
    RUN/.lock                          held by the relbench process working in RUN

Every file is written to a temporary file in the same folder, flushed to disk, renamed over the
old one, and the folder is flushed: an interrupted command leaves either the old file or the
new one. A CSV whose checksum is neither the one relbench last wrote nor the one before (a crash
between the two renames) was changed or truncated by something else, and is reported as such.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import filelock
import pandas as pd
import torch

from relbench.errors import RelbenchError, UsageError
from relbench.runs import distributed, machine

DEFAULT_RUN_DIR = Path("runs") / "default"
CONFIG = "config.json"
CONFIG_TOML = "config.toml"
TRAIN_CSV = "train.csv"
EXTRAPOLATION_CSV = "extrapolation.csv"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda handle: handle.write(data))


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Call write(handle) on a temporary file beside `path`, then rename it over `path` (see the
    module doc); for what is too large to hold as bytes first, such as np.save of a token array."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    """Make a rename durable (POSIX); a no-op where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        fix = (f"restore it from a copy ({Path(path).parent / CONFIG_TOML} holds the same settings); deleting it leaves "
               f"the run's files with no record of how they were made" if Path(path).name == CONFIG
               else "delete it or rerun the command that writes it")
        raise RelbenchError(f"cannot read {path}: {error}; {fix}") from None


CHECKSUMS = "checksums.json"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_csv(path: Path, frame: pd.DataFrame) -> None:
    """Write `frame` atomically and record its checksum (keeping the previous one, see module doc)."""
    path = Path(path)
    data = frame.to_csv(index=False).encode("utf-8")
    sums_path = path.parent / CHECKSUMS
    sums = read_checksums(sums_path)
    old = sums.get(path.name, {}).get("current")
    sums[path.name] = {"current": sha256_bytes(data), "previous": old}
    write_json(sums_path, sums)
    atomic_write_bytes(path, data)


def read_checksums(path: Path) -> dict[str, Any]:
    """The run's recorded checksums; {} when it has none yet. A damaged record is refused, never
    rebuilt: rebuilding it from the files it should vouch for would vouch for a damaged file."""
    if not path.is_file():
        return {}
    try:
        sums = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        sums, why = None, type(error).__name__
    else:
        why = "not a table of checksums"
    if not isinstance(sums, dict) or not all(isinstance(v, dict) and "current" in v for v in sums.values()):
        raise RelbenchError(f"{path} is damaged ({why}), so no file of the run can be told from a damaged copy; run "
                            f"`relbench verify --run-dir {path.parent}` to see what can still be checked")
    return sums


def checksum_problem(path: Path, data: bytes) -> str | None:
    """Why the bytes of CSV `path` cannot be trusted, or None when they are the ones relbench wrote."""
    sums_path = path.parent / CHECKSUMS
    known = read_checksums(sums_path).get(path.name)
    if known is None:
        where = "is missing" if not sums_path.is_file() else "does not list it"
        return f"{path} has no recorded checksum ({sums_path} {where}), so it cannot be told from a damaged copy"
    if sha256_bytes(data) not in (known.get("current"), known.get("previous")):
        return f"{path} was changed or truncated after relbench wrote it (checksum mismatch)"
    return None


def read_csv(path: Path, required: set[str] | frozenset[str] = frozenset()) -> pd.DataFrame:
    """A CSV relbench wrote, verified against its recorded checksum and required columns."""
    path = Path(path)
    fix = "delete it (or restore it) and rerun the command that writes it"
    try:
        data = path.read_bytes()
    except OSError as error:
        raise RelbenchError(f"cannot read {path}: {error.strerror}") from None
    problem = checksum_problem(path, data)
    if problem:
        raise RelbenchError(f"{problem}; `relbench verify --run-dir {path.parent}` says what can still be checked, or "
                            f"{fix}")
    try:
        frame = pd.read_csv(io.BytesIO(data))
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError) as error:
        raise RelbenchError(f"{path} is not a readable CSV ({str(error).splitlines()[0]}); {fix}") from None
    missing = set(required) - set(frame.columns)
    if missing:
        raise RelbenchError(f"{path} lacks the columns {', '.join(sorted(missing))}; {fix}")
    return frame


def replace_rows(table: pd.DataFrame, key: dict[str, Any], rows: list[dict[str, Any]]) -> pd.DataFrame:
    """`table` without its rows that match every value in `key`, plus `rows`."""
    if not table.empty and all(k in table.columns for k in key):
        same = pd.Series(True, index=table.index)
        for k, value in key.items():
            same &= table[k].astype(str) == str(value)
        table = table[~same]
    return pd.concat([table, pd.DataFrame(rows)], ignore_index=True)


def upsert(table: pd.DataFrame, row: dict[str, Any], key: list[str]) -> pd.DataFrame:
    """`table` with `row` appended, replacing any row that has the same values in `key`."""
    return replace_rows(table, {k: row[k] for k in key}, [row])


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


def run_config(exp, specs: list[str], seeds: list[int], splits) -> dict[str, Any]:
    """What config.json records of a run made from the experiment `exp` (a relbench.config.Experiment)
    on `splits`: config.toml holds the same but what loading the data found (see `write_config`)."""
    from relbench.config import to_dict

    config = {"preset": exp.preset, "model": to_dict(exp.model), "train": to_dict(exp.train),
              "eval": to_dict(exp.eval), "data": to_dict(exp.data), "dataset_description": splits.description,
              "tokenizer_fingerprint": splits.tokenizer.fingerprint, "variants": specs, "seeds": seeds}
    config["model"].pop("position")
    config["model"].pop("attention")
    config["train"].pop("seed")
    return config


def write_config(run_dir: Path, config: dict[str, Any], description: str) -> None:
    """RUN/config.json and RUN/config.toml, the same configuration: `relbench train --config
    RUN/config.toml --run-dir NEW` trains the run again (the environment is only in the JSON)."""
    from relbench import __version__
    from relbench.config import to_toml

    write_json(Path(run_dir) / CONFIG, config)
    files = [r["path"] for r in config.get("plugins", []) if r.get("path")]
    tables = {"preset": config["preset"], **({"description": description} if description else {}),
              **({"plugins": files} if files else {}),
              **{k: config[k] for k in ("variants", "seeds", "data", "model", "train", "eval")}}
    header = (f"# The resolved configuration of this run, written by relbench {__version__}. Reproduce it with\n"
              f"#   relbench train --config {Path(run_dir) / CONFIG_TOML} --run-dir NEW_RUN_DIR\n")
    if config.get("finetune"):   # not part of the training run: the commands that made its fine-tuned checkpoints
        header += "# and its fine-tuned checkpoints (relbench/training/finetune.py) with\n" + "".join(
            f"#   {entry['command']}\n" for entry in config["finetune"].values())
    atomic_write_text(Path(run_dir) / CONFIG_TOML, to_toml(tables, header))


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The parts of a run's configuration that differ (a run directory holds one configuration)."""
    from relbench.config import run_data, to_dict

    old_data = to_dict(run_data(old))   # a config.json from before [data]: its defaults
    return ([key for key in ("model", "train")
             if with_defaults(key, old.get(key), new[key]) != with_defaults(key, new[key], old.get(key) or {})]
            + [key for key, value in new["data"].items() if old_data.get(key) != value])


def with_defaults(table: str, old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any] | None:
    """A recorded [model] or [train] table with the keys it lacks (written before they existed, such
    as train.decay_steps) at their defaults, which is how that run was trained: an old run stays
    compatible with a configuration that leaves the new keys at their defaults."""
    from relbench.config import ModelConfig, TrainConfig

    if old is None:
        return None
    defaults = dataclasses.asdict(ModelConfig() if table == "model" else TrainConfig())
    return {**{k: defaults[k] for k in new if k not in old and k in defaults}, **old}


def merged_plugins(old: list[dict[str, Any]], specs: list[str], run_dir: Path) -> list[dict[str, Any]]:
    """The plugins a run's variants need: those recorded before, and those this command loaded for its
    variants. A plugin file recorded before that has changed since is refused: the run's earlier
    variants were trained with the file as it was."""
    from relbench.positions import plugins

    out = list(old)
    for record in plugins.records_for(specs):
        same = next((r for r in out if r.get("path", r.get("entry_point")) == record.get("path", record.get("entry_point"))),
                    None)
        if same is None:
            out.append(record)
        elif same.get("sha256") != record.get("sha256") or same.get("distribution") != record.get("distribution"):
            raise UsageError(f"plugin {record.get('path') or record.get('entry_point')} changed since {run_dir}'s "
                             f"variants {', '.join(same['variants'])} were trained with it; use another --run-dir, or "
                             f"restore the file")
        else:
            same.update(variants=sorted(set(same["variants"]) | set(record["variants"])))
    return out


def record_run(run_dir: Path, config: dict[str, Any], specs: list[str], seeds: list[int], device: torch.device,
               description: str) -> dict[str, Any]:
    """config.json and config.toml with this command's variants and seeds added, after checking that
    the run directory holds no run of another configuration; returns what it wrote."""
    path = Path(run_dir) / CONFIG
    if not path.is_file() and ((Path(run_dir) / "checkpoints").is_dir() or any(Path(run_dir).glob("*.csv"))):
        raise UsageError(f"{run_dir} holds a run's files but no {CONFIG}, so how they were made is unknown and no "
                         f"configuration may adopt them; restore {path} (config.toml beside it holds the settings) "
                         f"or use another --run-dir")
    if path.is_file():
        old = read_json(path)
        differs = differences(old, config)
        if differs:
            raise UsageError(f"{run_dir} holds a run with a different {' and '.join(differs)} configuration "
                             f"(preset {old.get('preset')}); use another --run-dir, or delete {run_dir} to start over")
        known = old.get("variants", [])
        config["variants"] = known + [s for s in specs if s not in known]
        config["seeds"] = sorted(set(old.get("seeds", [])) | set(seeds))
        for kept in ("finetune", "merged_from", "against"):   # what earlier commands recorded of the run
            if old.get(kept):
                config[kept] = old[kept]
    plugin_records = merged_plugins(read_json(path).get("plugins", []) if path.is_file() else [], config["variants"],
                                    run_dir)
    if plugin_records:
        config["plugins"] = plugin_records
    config["environment"] = machine.environment(str(device))
    write_config(run_dir, config, description)
    return config
