"""Where documents come from: the embedded corpus, local files, or a Hugging Face hub dataset.

Each loader returns a `Source`: a fingerprint that changes when the source changes (cheap to
compute, so tokenized data can be looked up in the cache first), a description, and a function
that reads the documents.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from urllib.parse import urlparse

from relbench.errors import RelbenchError, UsageError

EMBEDDED = "sotu"
EMBEDDED_FILE = "sotu.jsonl.xz"
LOCAL_SUFFIXES = (".txt", ".jsonl", ".parquet")


@dataclass
class Source:
    fingerprint: str
    description: str
    read: Callable[[], list[str]]  # the documents, in source order


def open_source(dataset: str | None) -> Source:
    """The document source named by `dataset`: None or "sotu" (the embedded State of
    the Union corpus), a .txt file, a folder of .txt files, a .jsonl or .parquet file with a
    `text` column, or a hub name "name[:config]"."""
    if dataset in (None, "", EMBEDDED):
        return _embedded()
    path = Path(dataset).expanduser()
    if path.exists():
        return _local(path)
    if path.suffix in LOCAL_SUFFIXES or dataset.startswith((".", "/", "~")) or os.sep + os.sep in dataset:
        raise UsageError(f"dataset file {dataset} does not exist; give a .txt, .jsonl or .parquet file, "
                         f"a folder of .txt files, or a hub name such as wikitext:wikitext-2-raw-v1")
    return _hub(dataset)


def _embedded() -> Source:
    blob = resources.files("relbench.data").joinpath(EMBEDDED_FILE).read_bytes()

    def read() -> list[str]:
        return [json.loads(line)["text"] for line in lzma.decompress(blob).decode("utf-8").splitlines()]

    return Source("embedded:" + hashlib.sha256(blob).hexdigest(),
                  "State of the Union addresses 1790-2021 (embedded)", read)


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise RelbenchError(f"cannot read dataset file {path}: {error.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RelbenchError(f"dataset file {path} is not UTF-8 text (invalid byte at offset {error.start}); "
                            f"convert it, e.g. iconv -f latin1 -t utf-8") from None


def _stat_fingerprint(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for p in paths:
        st = p.stat()
        digest.update(f"{p.resolve()}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return "local:" + digest.hexdigest()


def _local(path: Path) -> Source:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise UsageError(f"dataset folder {path} holds no .txt files")
        reader, what = (lambda: [_read_text(p) for p in files]), f"{len(files)} .txt files in {path}"
    elif path.suffix == ".txt":
        files, reader, what = [path], (lambda: [_read_text(path)]), f"text file {path}"
    elif path.suffix == ".jsonl":
        files, reader, what = [path], (lambda: _jsonl_texts(path)), f"JSON lines {path}"
    elif path.suffix == ".parquet":
        files, reader, what = [path], (lambda: _parquet_texts(path)), f"parquet {path}"
    else:
        raise UsageError(f"dataset {path} is not a .txt, .jsonl or .parquet file or a folder of .txt files")

    def read() -> list[str]:
        documents = [d for d in reader() if d]
        if not documents:
            raise RelbenchError(f"dataset {path} holds no text")
        return documents

    try:
        fingerprint = _stat_fingerprint(files)
    except OSError as error:
        raise RelbenchError(f"cannot read dataset {path}: {error.strerror}") from None
    return Source(fingerprint, what, read)


def _jsonl_texts(path: Path) -> list[str]:
    texts = []
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise RelbenchError(f"{path} line {number} is not valid JSON: {error.msg}") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise RelbenchError(f'{path} line {number} has no "text" string field')
        texts.append(record["text"])
    return texts


def _parquet_texts(path: Path) -> list[str]:
    import pandas as pd

    try:
        frame = pd.read_parquet(path)
    except Exception as error:  # pyarrow raises a variety of types for a bad file
        raise RelbenchError(f"cannot read parquet file {path}: {error}") from None
    if "text" not in frame.columns:
        raise RelbenchError(f'{path} has no "text" column (columns: {", ".join(map(str, frame.columns))})')
    return [t for t in frame["text"].tolist() if isinstance(t, str)]


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection within `timeout` seconds."""
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        with socket.create_connection((endpoint.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def _go_offline() -> None:
    """Make huggingface_hub and datasets use their local cache only (no retries for minutes)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    for module_name, attribute in (("huggingface_hub.constants", "HF_HUB_OFFLINE"),
                                   ("datasets.config", "HF_HUB_OFFLINE"),
                                   ("datasets.config", "HF_DATASETS_OFFLINE")):
        module = sys.modules.get(module_name)
        if module is not None and hasattr(module, attribute):
            setattr(module, attribute, True)


def _hub(dataset: str) -> Source:
    name, _, config = dataset.partition(":")
    online = hub_reachable()
    if not online:
        _go_offline()
    import datasets

    try:
        data = datasets.load_dataset(name, config or None, split="train")
    except Exception as error:  # datasets raises many types (ConnectionError, FileNotFoundError, ValueError)
        if not online:
            raise RelbenchError(f'cannot reach the Hugging Face hub for dataset "{dataset}" and it is not in the '
                                f"local cache; connect to the network, or pass a local .txt/.jsonl/.parquet "
                                f"file with --dataset") from None
        raise RelbenchError(f'cannot load hub dataset "{dataset}": {str(error).splitlines()[0]}') from None
    if "text" not in data.column_names:
        raise RelbenchError(f'hub dataset "{dataset}" has no "text" column (columns: {", ".join(data.column_names)})')
    documents = [t for t in data["text"] if isinstance(t, str) and t]
    if not documents:
        raise RelbenchError(f'hub dataset "{dataset}" holds no text')
    fingerprint = "hub:" + str(getattr(data, "_fingerprint", dataset))
    return Source(fingerprint, f"hub dataset {dataset} (train split, {len(documents)} documents)", lambda: documents)
