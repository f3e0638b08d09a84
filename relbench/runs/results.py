"""A run directory's files: their names, atomic writes, JSON, and the checksummed CSV tables.

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

The run directory itself (its checkpoint folders, the checks that a folder is a run, the lock) is
relbench/runs/rundir.py; what config.json and config.toml record, and whether a command's
configuration may add to a run, is relbench/runs/runconfig.py.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import pandas as pd

from relbench.errors import RelbenchError

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
