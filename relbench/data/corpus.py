"""Where documents come from: the embedded corpus, local files, a folder written by `datasets`'
save_to_disk, or a Hugging Face hub dataset; read whole, or streamed in order (`stream=True`).

Each loader returns a `Source`: a fingerprint that changes when the source changes (cheap to
compute, so tokenized data can be looked up in the cache first), a description, and a function
that reads the documents in order (a list, or a generator for sources too large to hold).
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import socket
import sys
from collections.abc import Callable, Iterable, Iterator
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
    read: Callable[[], Iterable[str]]  # the documents, in source order (each call reads from the start)
    size: int | None = None            # bytes on disk, when known cheaply (for progress)


def open_source(dataset: str | None, stream: bool = False) -> Source:
    """The document source named by `dataset`: None or "sotu" (the embedded State of
    the Union corpus), a .txt file, a folder of .txt files, a .jsonl or .parquet file with a
    `text` column, a folder written by `datasets`' save_to_disk, or a hub name "name[:config]".
    With `stream`, a hub dataset or local data file is read with `datasets`' streaming, in order,
    for as long as the reader asks (never downloaded or loaded whole)."""
    if dataset in (None, "", EMBEDDED):
        if stream:
            raise UsageError("--stream reads a hub dataset or a local data file in order; name one with --dataset "
                             "(the embedded corpus is read whole)")
        return _embedded()
    path = Path(dataset).expanduser()
    if path.exists():
        if is_saved(path):
            return _saved(path)   # memory-mapped and read lazily: streamed or not, it is never loaded whole
        return _local_stream(path) if stream else _local(path)
    if path.suffix in LOCAL_SUFFIXES or dataset.startswith((".", "/", "~")) or os.sep + os.sep in dataset:
        raise UsageError(f"dataset file {dataset} does not exist; give a .txt, .jsonl or .parquet file, "
                         f"a folder of .txt files or of datasets' save_to_disk, or a hub name such as "
                         f"wikitext:wikitext-2-raw-v1")
    return _hub_stream(dataset) if stream else _hub(dataset)


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


def _local_files(path: Path) -> list[Path]:
    """The files a local dataset path names (a folder: its .txt files, in name order)."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise UsageError(f"dataset folder {path} holds no .txt files")
        return files
    if path.suffix not in LOCAL_SUFFIXES:
        raise UsageError(f"dataset {path} is not a .txt, .jsonl or .parquet file or a folder of .txt files")
    return [path]


def _local(path: Path) -> Source:
    files = _local_files(path)
    if path.is_dir():
        reader, what = (lambda: [_read_text(p) for p in files]), f"{len(files)} .txt files in {path}"
    elif path.suffix == ".txt":
        reader, what = (lambda: [_read_text(path)]), f"text file {path}"
    elif path.suffix == ".jsonl":
        reader, what = (lambda: _jsonl_texts(path)), f"JSON lines {path}"
    else:
        reader, what = (lambda: _parquet_texts(path)), f"parquet {path}"

    def read() -> list[str]:
        documents = [d for d in reader() if d]
        if not documents:
            raise RelbenchError(f"dataset {path} holds no text")
        return documents

    try:
        fingerprint = _stat_fingerprint(files)
    except OSError as error:
        raise RelbenchError(f"cannot read dataset {path}: {error.strerror}") from None
    return Source(fingerprint, what, read, sum(p.stat().st_size for p in files))


# datasets' builder for each local file type; a .txt file is one document, as when read whole
STREAM_BUILDERS = {".txt": ("text", {"sample_by": "document"}), ".jsonl": ("json", {}), ".parquet": ("parquet", {})}


def _local_stream(path: Path) -> Source:
    files = _local_files(path)
    builder, options = STREAM_BUILDERS[files[0].suffix]

    def read() -> Iterator[str]:
        import datasets

        data = datasets.load_dataset(builder, data_files=[str(p) for p in files], split="train", streaming=True,
                                     **options)
        yield from _streamed_texts(data, f"dataset {path}")

    try:
        fingerprint = "stream:" + _stat_fingerprint(files)
    except OSError as error:
        raise RelbenchError(f"cannot read dataset {path}: {error.strerror}") from None
    return Source(fingerprint, f"{path} (streamed)", read, sum(p.stat().st_size for p in files))


def _streamed_texts(rows: Iterable[dict], what: str) -> Iterator[str]:
    """_texts of a stream, whose reader fails only as it reads (bad JSON, not UTF-8, lost network)."""
    try:
        yield from _texts(rows, what)
    except RelbenchError:
        raise
    except Exception as error:  # datasets and its readers raise many types
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise RelbenchError(f"cannot read {what} as a stream: {reason}") from None


def _texts(rows: Iterable[dict], what: str) -> Iterator[str]:
    """The non-empty "text" strings of `rows`, in order; an error naming the columns when there is none."""
    for row in rows:
        if "text" not in row:
            raise RelbenchError(f'{what} has no "text" column (columns: {", ".join(map(str, row))})')
        if isinstance(row["text"], str) and row["text"]:
            yield row["text"]


def is_saved(path: Path) -> bool:
    """Whether `path` is a folder written by `datasets`' save_to_disk (a Dataset or a DatasetDict)."""
    return (path / "dataset_dict.json").is_file() or ((path / "state.json").is_file()
                                                       and (path / "dataset_info.json").is_file())


def _saved(path: Path) -> Source:
    """A save_to_disk folder: a Dataset, or a DatasetDict's "train" split (relbench makes its own
    validation and test splits from its documents, as for a hub dataset). Arrow files are memory-
    mapped and read in batches, so the dataset is never loaded whole."""
    import datasets

    try:
        data = datasets.load_from_disk(str(path))
    except Exception as error:  # a damaged or foreign folder
        raise RelbenchError(f"cannot load saved dataset {path}: {str(error).splitlines()[0]}") from None
    what = f"saved dataset {path}"
    if isinstance(data, datasets.DatasetDict):
        if "train" not in data:
            raise UsageError(f"{what} has no train split (splits: {', '.join(data)}); relbench reads the train split "
                             f"and makes its own validation and test splits")
        data, what = data["train"], f"saved dataset {path} (train split)"
    if "text" not in data.column_names:
        raise RelbenchError(f'{what} has no "text" column (columns: {", ".join(data.column_names)})')

    def read() -> Iterator[str]:
        for batch in data.iter(batch_size=1000):
            yield from (t for t in batch["text"] if isinstance(t, str) and t)

    files = sorted(p for p in path.rglob("*") if p.is_file())
    return Source("saved:" + _stat_fingerprint(files), f"{what}, {data.num_rows:,} rows", read,
                  sum(p.stat().st_size for p in files))


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


def go_offline() -> None:
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
        go_offline()
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


def _hub_stream(dataset: str) -> Source:
    """A hub dataset's train split, streamed. It is identified by its name (its revision would need the
    network), so a run's cached tokens open offline later; delete the cache to read a changed dataset."""
    name, _, config = dataset.partition(":")

    def read() -> Iterator[str]:
        if not hub_reachable():
            raise RelbenchError(f'cannot reach the Hugging Face hub to stream dataset "{dataset}"; connect to the '
                                f"network, or pass a local file or save_to_disk folder with --dataset")
        import datasets

        try:
            data = datasets.load_dataset(name, config or None, split="train", streaming=True)
        except Exception as error:  # datasets raises many types (ConnectionError, FileNotFoundError, ValueError)
            raise RelbenchError(f'cannot stream hub dataset "{dataset}": {str(error).splitlines()[0]}') from None
        yield from _streamed_texts(data, f'hub dataset "{dataset}"')

    return Source(f"stream:hub:{dataset}", f"hub dataset {dataset} (train split, streamed)", read)
