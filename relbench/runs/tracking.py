"""Optional experiment tracking: `--log tensorboard` mirrors every row of train.csv, as it is
written, into RUN/tensorboard/<variant>-seed<s>/ (`tensorboard --logdir RUN/tensorboard`). Off by
default; train.csv stays the source of truth (a resumed run logs only the rows it adds)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from relbench.errors import UsageError, unknown

LOGGERS = ("none", "tensorboard")
FOLDER = "tensorboard"
NOT_SCALARS = ("variant", "seed", "step")


class TensorBoard:
    def __init__(self, run_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # torch raises this when the tensorboard package is missing
            raise UsageError("--log tensorboard needs the tensorboard package: pip install 'relbench[tensorboard]'") \
                from None
        self._writer_class, self.folder, self.writers = SummaryWriter, Path(run_dir) / FOLDER, {}

    def row(self, row: dict[str, Any]) -> None:
        """One train.csv row as scalars at its step (NaN entries, e.g. val_loss between evaluations, are skipped)."""
        key = f"{row['variant']}-seed{row['seed']}"
        if key not in self.writers:
            self.writers[key] = self._writer_class(log_dir=str(self.folder / key))
        writer = self.writers[key]
        for name, value in row.items():
            if name not in NOT_SCALARS and isinstance(value, (int, float)) and math.isfinite(value):
                writer.add_scalar(name, value, global_step=int(row["step"]))
        writer.flush()

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()


def open_logger(kind: str, run_dir: Path) -> TensorBoard | None:
    """The tracker named by --log (None for "none"); a clear error when its package is missing."""
    if kind not in LOGGERS:
        raise unknown("logger", kind, list(LOGGERS))
    return TensorBoard(run_dir) if kind == "tensorboard" else None
