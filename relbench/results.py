"""The run directory: layout, manifest, and atomic writes.

    RUN/config.json                    how the run was made (config, git commit, versions, date)
    RUN/checkpoints/<variant>-seed<s>/ model.pt (weights) and meta.json (config, steps, status)
    RUN/train.csv                      loss curve: one row per variant x seed x logged step
    RUN/extrapolation.csv              one row per variant x seed x length x mode
    RUN/report.md, RUN/*_pivot.csv     rendered by `relbench report`

Every file is written to a temporary file in the same folder, flushed to disk and renamed over
the old one, so an interrupted command leaves either the old file or the new one.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from relbench.errors import RelbenchError

DEFAULT_RUN_DIR = Path("runs") / "default"
CONFIG = "config.json"
TRAIN_CSV = "train.csv"
EXTRAPOLATION_CSV = "extrapolation.csv"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RelbenchError(f"cannot read {path}: {error}; delete it or rerun the command that writes it") from None


def write_csv(path: Path, frame: pd.DataFrame) -> None:
    atomic_write_text(path, frame.to_csv(index=False))


def read_csv(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path)
    except (OSError, ValueError, pd.errors.ParserError) as error:
        raise RelbenchError(f"cannot read {path}: {error}; delete it or rerun the command that writes it") from None


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


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--verify", "-q", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(device: str) -> dict[str, Any]:
    """What a result depends on besides its config: code version, library versions, machine."""
    from relbench import __version__

    return {
        "relbench": __version__,
        "git_commit": git_commit(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_threads": torch.get_num_threads(),
        "device": device,
        "cuda_device": torch.cuda.get_device_name() if device.startswith("cuda") else None,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def require_run(run_dir: Path) -> dict[str, Any]:
    """The run's config.json; a clear error when `run_dir` is missing or not a relbench run."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RelbenchError(f"run directory {run_dir} does not exist; run `relbench train` first "
                            f"or pass --run-dir to an existing run")
    if not (run_dir / CONFIG).is_file():
        raise RelbenchError(f"{run_dir} is not a relbench run (no {CONFIG}); run `relbench train --run-dir {run_dir}`")
    return read_json(run_dir / CONFIG)


# ---- checkpoints ------------------------------------------------------------------------------------
MODEL_FILE = "model.pt"
META_FILE = "meta.json"


def save_checkpoint(folder: Path, model: torch.nn.Module, meta: dict[str, Any]) -> None:
    """Weights (model.pt, a plain state dict) and meta.json, each written atomically; meta last,
    so a checkpoint whose meta says finished always has its weights."""
    import io

    buffer = io.BytesIO()
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, buffer)
    atomic_write_bytes(Path(folder) / MODEL_FILE, buffer.getvalue())
    write_json(Path(folder) / META_FILE, meta)


def read_meta(folder: Path) -> dict[str, Any] | None:
    path = Path(folder) / META_FILE
    return read_json(path) if path.is_file() else None


def load_model(folder: Path, device: torch.device | str = "cpu"):
    """The GPT saved in `folder`, on `device`, in eval mode. Loaded with torch's safe loader
    (weights only, no arbitrary pickle); a missing or corrupt file is reported with its path."""
    from relbench.config import ModelConfig
    from relbench.model import GPT

    meta = read_meta(folder)
    if meta is None:
        raise RelbenchError(f"no checkpoint in {folder}; run `relbench train` for this variant")
    path = Path(folder) / MODEL_FILE
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated zip, wrong format, unpickling refused
        raise RelbenchError(f"checkpoint {path} is corrupt or unreadable ({type(error).__name__}); "
                            f"retrain it with `relbench train --force --variants {meta.get('variant', '?')}`") from None
    model = GPT(ModelConfig(**meta["model"]))
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        raise RelbenchError(f"checkpoint {path} does not match its config: {str(error).splitlines()[0]}") from None
    return model.to(device).eval()
