"""The on-disk cache of tokenized splits and of trained tokenizers.

    $RELBENCH_CACHE/tokens/<key>/train.npy, validation.npy, test.npy    token ids, one array per split
    $RELBENCH_CACHE/tokens/<key>/meta.json                             source, tokenizer, dtype and sizes
    $RELBENCH_CACHE/tokens/bpe-<key>.json                               a trained BPE (tokenizers' JSON)

($RELBENCH_CACHE defaults to ~/.cache/relbench.) The arrays are opened memory-mapped, so a large
corpus costs no memory and no loading time until its pages are read. Every file is written
atomically (a new file renamed over the old, never rewritten in place, so arrays still mapped from
an old entry stay valid), meta.json last: an entry without a readable meta.json, or with an array whose type or
size differs from it (truncated, foreign), is rebuilt. The cache is only a cache: deleting it
costs the tokenization (and BPE training) once more.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from relbench.runs.results import atomic_write, atomic_write_text

SPLITS = ("train", "validation", "test")
META = "meta.json"


def cache_dir() -> Path:
    return Path(os.environ.get("RELBENCH_CACHE", Path.home() / ".cache" / "relbench"))


def key(*parts: str) -> str:
    """The cache key of `parts` (for token arrays: source fingerprint, tokenizer fingerprint, split rule)."""
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]


def splits_folder(cache_key: str) -> Path:
    return cache_dir() / "tokens" / cache_key


def tokenizer_path(cache_key: str) -> Path:
    return cache_dir() / "tokens" / f"bpe-{cache_key}.json"


def read_splits(folder: Path) -> dict[str, np.ndarray] | None:
    """The cached splits in `folder`, memory-mapped; None when the entry is missing or damaged."""
    try:
        meta = json.loads((Path(folder) / META).read_text(encoding="utf-8"))
        arrays = {}
        for name in SPLITS:
            # copy-on-write: torch.from_numpy wants a writable array; nothing is ever written back
            array = np.load(Path(folder) / f"{name}.npy", mmap_mode="c", allow_pickle=False)
            if array.ndim != 1 or array.dtype != np.dtype(meta["dtype"]) or array.size != meta["sizes"][name]:
                return None
            arrays[name] = array
        return arrays
    except Exception:  # missing, truncated or foreign files: rebuild the entry
        return None


def write_splits(folder: Path, arrays: dict[str, np.ndarray], meta: dict) -> None:
    """Each split as an .npy file, then meta.json (which marks the entry complete)."""
    folder = Path(folder)
    (folder / META).unlink(missing_ok=True)   # an entry being rewritten is incomplete until its meta is back
    for name in SPLITS:
        atomic_write(folder / f"{name}.npy", lambda handle, name=name: np.save(handle, arrays[name]))
    sizes = {name: int(arrays[name].size) for name in SPLITS}
    atomic_write_text(folder / META, json.dumps({**meta, "dtype": str(arrays["train"].dtype), "sizes": sizes},
                                                indent=2) + "\n")
