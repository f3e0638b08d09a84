"""Corpus loading, tokenization, deterministic splits and the on-disk token cache.

    splits = load_splits(None)          # the embedded State of the Union corpus, byte tokens
    splits.train, splits.validation, splits.test     # 1-D numpy arrays of token ids (memory-mapped)
    load_splits("wikitext:wikitext-103-raw-v1", "bpe:4096", stream=True, max_train_tokens=10**8)

Splits are by whole document: document i (in source order) goes to test when i % 10 == 9, to
validation when i % 10 == 4, to train otherwise, so no evaluation text is seen in training. A
source with fewer than 10 documents is split by position instead: the first 80% of its bytes
train, the next 10% validate, the last 10% test (each cut at the first token boundary at or
after that byte; for byte tokens, exactly there).

A BPE tokenizer (`bpe:N`) is trained on the train split's text only. `max_train_tokens` = N keeps
the first N tokens of the train split; the validation and test splits stay whole, so runs with
different budgets are evaluated on the same text. A stream (`stream=True`) is read in order, the
same rule applied to each document's index in the stream, and stops at the end of the block of
ten documents (indices 10k .. 10k + 9) in which the train split reaches N tokens: the validation
and test splits are the documents of the blocks read, and the train split is cut to N tokens. (A
BPE for a stream learns from the first train documents that hold N bytes, a part of the train
split, since every token holds at least a byte.)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, islice

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from relbench.config import DataConfig, run_data
from relbench.data import cache
from relbench.data.cache import SPLITS, cache_dir  # noqa: F401  (part of the module's API)
from relbench.data.corpus import Source, open_source
from relbench.data.tokenizer import ByteTokenizer, Tokenizer, from_hub, from_json, parse, train_bpe
from relbench.errors import RelbenchError, UsageError
from relbench.runs.results import atomic_write_text

SPLIT_RULE = "doc-mod10:test=9,val=4;stream-80-10-10:v1"   # part of every cache key: change it with the rule
CHUNK_CHARS = 1 << 22       # text tokenized per batch: enough for every core, little past a stream's budget
PROGRESS_BYTES = 1 << 23    # sources from this size on (or of unknown size) show a progress bar


@dataclass
class Splits:
    train: np.ndarray
    validation: np.ndarray
    test: np.ndarray
    tokenizer: Tokenizer
    description: str
    fingerprint: str

    def sizes(self) -> dict[str, int]:
        return {name: int(getattr(self, name).size) for name in SPLITS}


def split_of(index: int) -> str:
    """The split of document `index` (in source order) under the document rule."""
    return "test" if index % 10 == 9 else "validation" if index % 10 == 4 else "train"


def load_splits(dataset: str | None = None, tokenizer: str = "bytes", use_cache: bool = True, *,
                stream: bool = False, max_train_tokens: int | None = None, console: Console | None = None) -> Splits:
    """Tokenized splits of `dataset` (see relbench.data.corpus.open_source and the module doc),
    cached on disk under a key of the source's fingerprint, the tokenizer and the split rule.
    `console`: where progress and BPE training are shown (nothing when None)."""
    kind, value = parse(tokenizer)   # a bad name fails before any reading
    if max_train_tokens is not None and max_train_tokens < 1:
        raise UsageError(f"--max-train-tokens must be positive, got {max_train_tokens}")
    if stream and max_train_tokens is None:
        raise UsageError("--stream needs --max-train-tokens N: a stream is read until its train split holds N tokens")
    source = open_source(dataset, stream)
    budget = max_train_tokens if stream else None   # where reading stops; else the train split is cut after
    fingerprint = source.fingerprint + (f"|until {budget} train tokens" if budget else "")
    if kind == "bpe":
        tok = _bpe(int(value), source, fingerprint, budget, use_cache, console)
    else:
        tok = ByteTokenizer() if kind == "bytes" else from_hub(str(value))
    folder = cache.splits_folder(cache.key(fingerprint, tok.fingerprint, SPLIT_RULE))
    arrays = cache.read_splits(folder) if use_cache else None
    if arrays is None:
        arrays = tokenize_documents(source.read(), tok, budget, _progress(console, source, budget))
        if use_cache:
            try:
                cache.write_splits(folder, arrays, {"source": source.description, "fingerprint": fingerprint,
                                                    "tokenizer": tok.fingerprint})
                arrays = cache.read_splits(folder) or arrays   # memory-mapped: the pages are the cache's
            except OSError:
                pass  # a read-only cache folder only costs the tokenization next time
    description = source.description
    if max_train_tokens is not None:
        arrays["train"] = arrays["train"][:max_train_tokens]
        description += (f", read until its train split held {max_train_tokens:,} tokens" if stream
                        else f", train split cut to its first {max_train_tokens:,} tokens")
    for name in SPLITS:
        if arrays[name].size < 2:
            raise RelbenchError(f"the {name} split of {source.description} is empty; give a larger dataset")
    return Splits(arrays["train"], arrays["validation"], arrays["test"], tok, description, fingerprint)


def load_data(data: DataConfig, console: Console | None = None) -> Splits:
    """The splits `data` (a run's or an experiment's [data] table) names."""
    return load_splits(None if data.dataset == "sotu" else data.dataset, data.tokenizer, stream=data.stream,
                       max_train_tokens=data.max_train_tokens, console=console)


def load_run_splits(config: dict, console: Console | None = None) -> Splits:
    """The splits a run was trained on, from its config.json (see relbench.config.run_data)."""
    return load_data(run_data(config), console)


def _bpe(vocab_size: int, source: Source, fingerprint: str, budget: int | None, use_cache: bool,
         console: Console | None) -> Tokenizer:
    """bpe:N for this source: from the cache, or trained on the source's train split and cached."""
    name = f"bpe:{vocab_size}"
    path = cache.tokenizer_path(cache.key(fingerprint, name, SPLIT_RULE))
    if use_cache and path.is_file():
        try:
            return from_json(name, path.read_text(encoding="utf-8"))
        except Exception:  # a truncated or foreign file: train again (the cache is only a cache)
            pass
    if console is not None:
        console.print(f"training {name} (byte-level BPE) on the train split of {source.description}", markup=False)
    tok = train_bpe(training_texts(source.read(), budget), vocab_size)
    if use_cache:
        try:
            atomic_write_text(path, tok.to_str())
        except OSError:
            pass
    return tok


def training_texts(documents: Iterable[str], budget_bytes: int | None = None) -> Iterator[str]:
    """The train split's text, in order: what a tokenizer may learn from (never validation or test
    text). With `budget_bytes`, only the first train documents that hold that many bytes (counting
    one for each document's separator, as the token streams do)."""
    docs = iter(documents)
    head = list(islice(docs, 10))
    if len(head) < 10:   # the position rule: the text of the first 80% of the bytes
        data = b"".join(text.encode("utf-8") + bytes([ByteTokenizer.separator]) for text in head)
        cut = data[: int(0.8 * len(data))].decode("utf-8", errors="ignore")   # drops a character cut in two
        yield from (text for text in cut.split(chr(ByteTokenizer.separator)) if text)
        return
    seen = 0
    for index, text in enumerate(chain(head, docs)):
        if split_of(index) == "train":
            yield text
            seen += len(text.encode("utf-8")) + 1
            if budget_bytes is not None and seen >= budget_bytes:
                return


def tokenize_documents(documents: Iterable[str], tokenizer: Tokenizer, budget: int | None = None,
                       progress: _Progress | None = None) -> dict[str, np.ndarray]:
    """The three splits' token streams, every document followed by the separator, read in chunks
    (each tokenized as one batch, on all cores for BPE); with `budget`, reading stops at the end of
    the block of ten documents in which the train split reaches `budget` tokens."""
    docs = iter(documents)
    head = list(islice(docs, 10))
    if len(head) < 10:
        return _split_by_position(tokenizer.join(head), tokenizer)
    parts: dict[str, list[np.ndarray]] = {name: [] for name in SPLITS}
    index, train_tokens = 0, 0
    separator = np.array([tokenizer.separator], dtype=tokenizer.dtype)
    full = done = False   # full: the train split holds `budget` tokens; done: and its block of ten is read
    with progress or _Progress(None, None, None) as bar:
        for chunk in _chunks(chain(head, docs)):
            pieces: dict[str, list[np.ndarray]] = {name: [] for name in SPLITS}
            for tokens in tokenizer.encode_batch(chunk):
                name = split_of(index)
                index += 1
                if name == "train" and full:
                    continue   # beyond the budget: only the block's validation and test documents are still read
                pieces[name] += [tokens, separator]
                if name == "train":
                    train_tokens += tokens.size + 1
                    full = budget is not None and train_tokens >= budget
                if full and index % 10 == 0:
                    done = True
                    break
            for name in SPLITS:   # one array per split and chunk, not two per document
                if pieces[name]:
                    parts[name].append(np.concatenate(pieces[name]))
            bar.advance(sum(len(text) for text in chunk), train_tokens)
            if done:
                break
    return {name: np.concatenate(parts[name]) if parts[name] else np.zeros(0, dtype=tokenizer.dtype)
            for name in SPLITS}


def _chunks(documents: Iterator[str]) -> Iterator[list[str]]:
    chunk, size = [], 0
    for text in documents:
        chunk.append(text)
        size += len(text)
        if size >= CHUNK_CHARS:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _split_by_position(stream: np.ndarray, tokenizer: Tokenizer) -> dict[str, np.ndarray]:
    """Train, validation and test at 80% and 90% of the stream's bytes, each cut at the first token
    boundary at or after that byte (for bytes: exactly there)."""
    ends = np.cumsum(tokenizer.token_bytes[stream])         # (n,) bytes up to and including each token
    total = int(ends[-1]) if stream.size else 0
    a, b = (int(np.searchsorted(ends, int(share * total))) + 1 if int(share * total) else 0 for share in (0.8, 0.9))
    return {"train": stream[:a], "validation": stream[a:b], "test": stream[b:]}


class _Progress:
    """A transient progress bar over a source's bytes (or a stream's train tokens), shown on
    `console` for a large or unbounded source only."""

    def __init__(self, console: Console | None, total: int | None, unit: str | None):
        self.unit, self.done = unit, 0
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[shown]}"),
                            TimeElapsedColumn(), console=console, transient=True, disable=console is None)
        self.task = self.bar.add_task("tokenizing", total=total, shown="")

    def __enter__(self) -> _Progress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def advance(self, chars: int, train_tokens: int) -> None:
        self.done = train_tokens if self.unit == "train tokens" else self.done + chars
        self.bar.update(self.task, completed=self.done, shown=f"{self.done:,} {self.unit}")


def _progress(console: Console | None, source: Source, budget: int | None) -> _Progress | None:
    if console is None or (budget is None and source.size is not None and source.size < PROGRESS_BYTES):
        return None
    return _Progress(console, budget, "train tokens") if budget else _Progress(console, source.size, "characters")
