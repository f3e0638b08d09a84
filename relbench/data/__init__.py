"""Corpus loading, tokenization, deterministic splits and the on-disk token cache.

    splits = load_splits(None)          # the embedded State of the Union corpus, byte tokens
    splits.train, splits.validation, splits.test     # 1-D uint8 numpy arrays of tokens

Splits are by whole document: document i (in source order) goes to test when i % 10 == 9, to
validation when i % 10 == 4, to train otherwise, so no evaluation text is seen in training. A
source with fewer than 10 documents is split by position instead: the first 80% of its token
stream trains, the next 10% validates, the last 10% tests.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from relbench.data.corpus import open_source
from relbench.data.tokenizer import ByteTokenizer, get_tokenizer
from relbench.errors import RelbenchError
from relbench.results import atomic_write_bytes

SPLIT_RULE = "doc-mod10:test=9,val=4;stream-80-10-10:v1"
SPLITS = ("train", "validation", "test")


@dataclass
class Splits:
    train: np.ndarray
    validation: np.ndarray
    test: np.ndarray
    tokenizer: ByteTokenizer
    description: str
    fingerprint: str

    def sizes(self) -> dict[str, int]:
        return {name: int(getattr(self, name).size) for name in SPLITS}


def cache_dir() -> Path:
    return Path(os.environ.get("RELBENCH_CACHE", Path.home() / ".cache" / "relbench"))


def split_documents(documents: list[str], tokenizer: ByteTokenizer) -> dict[str, np.ndarray]:
    """Token streams of the three splits (see the module docstring for the rule)."""
    if len(documents) >= 10:
        groups: dict[str, list[str]] = {name: [] for name in SPLITS}
        for i, text in enumerate(documents):
            groups["test" if i % 10 == 9 else "validation" if i % 10 == 4 else "train"].append(text)
        return {name: tokenizer.join(docs) for name, docs in groups.items()}
    stream = tokenizer.join(documents)
    a, b = int(0.8 * stream.size), int(0.9 * stream.size)
    return {"train": stream[:a], "validation": stream[a:b], "test": stream[b:]}


def load_splits(dataset: str | None = None, tokenizer: str = "bytes", use_cache: bool = True) -> Splits:
    """Tokenized splits of `dataset` (see relbench.data.corpus.open_source), cached on disk
    under a key of the source's fingerprint, the tokenizer and the split rule."""
    tok = get_tokenizer(tokenizer)
    source = open_source(dataset)
    key = hashlib.sha256(f"{source.fingerprint}|{tok.name}|{SPLIT_RULE}".encode()).hexdigest()[:24]
    path = cache_dir() / "tokens" / f"{key}.npz"
    arrays = _read_cache(path) if use_cache else None
    if arrays is None:
        arrays = split_documents(source.read(), tok)
        if use_cache:
            buffer = io.BytesIO()
            meta = json.dumps({"source": source.description, "fingerprint": source.fingerprint}).encode()
            np.savez(buffer, meta=np.frombuffer(meta, np.uint8), **arrays)
            try:
                atomic_write_bytes(path, buffer.getvalue())
            except OSError:
                pass  # a read-only cache folder only costs the tokenization next time
    for name in SPLITS:
        if arrays[name].size < 2:
            raise RelbenchError(f"the {name} split of {source.description} is empty; give a larger dataset")
    return Splits(arrays["train"], arrays["validation"], arrays["test"], tok, source.description, source.fingerprint)


def _read_cache(path: Path) -> dict[str, np.ndarray] | None:
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as cached:
            return {name: cached[name] for name in SPLITS}
    except Exception:  # a truncated or foreign file: rebuild it (the cache is only a cache)
        return None
