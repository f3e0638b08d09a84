"""Corpus loading, splits, the token cache, and clear errors for bad datasets."""

import json
import time

import numpy as np
import pandas as pd
import pytest

from relbench.data import cache_dir, corpus, load_splits, tokenize_documents
from relbench.data.tokenizer import RECORD_SEPARATOR, ByteTokenizer
from relbench.errors import RelbenchError


def test_embedded_corpus_splits_by_whole_speech():
    splits = load_splits(None)
    sizes = splits.sizes()
    assert sizes["train"] > 8_000_000 and 900_000 < sizes["test"] < 1_200_000
    # 233 speeches: 23 test, 23 validation, 187 train, each followed by one separator
    assert int((splits.test == RECORD_SEPARATOR).sum()) == 23
    assert int((splits.validation == RECORD_SEPARATOR).sum()) == 23
    assert int((splits.train == RECORD_SEPARATOR).sum()) == 187
    test_docs = set(bytes(splits.test).split(bytes([RECORD_SEPARATOR]))) - {b""}
    train_docs = set(bytes(splits.train).split(bytes([RECORD_SEPARATOR]))) - {b""}
    assert not test_docs & train_docs
    assert bytes(splits.test[:30]).startswith(b"Gentlemen of the Senate")


def test_split_rule_by_document_index():
    docs = [f"doc{i}" for i in range(20)]
    parts = tokenize_documents(docs, ByteTokenizer())
    sep = bytes([RECORD_SEPARATOR])
    assert bytes(parts["test"]).split(sep)[:-1] == [b"doc9", b"doc19"]
    assert bytes(parts["validation"]).split(sep)[:-1] == [b"doc4", b"doc14"]
    assert len(bytes(parts["train"]).split(sep)[:-1]) == 16


def test_few_documents_split_by_position():
    parts = tokenize_documents(["a" * 1000], ByteTokenizer())
    assert [parts[k].size for k in ("train", "validation", "test")] == [800, 100, 101]


def test_cache_is_used_and_keyed_by_source(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("hello world " * 100)
    first = load_splits(str(path))
    cached = list(cache_dir().glob("tokens/*/meta.json"))
    assert cached
    again = load_splits(str(path))
    assert isinstance(again.train, np.memmap)   # read from the cache, memory-mapped
    np.testing.assert_array_equal(first.train, again.train)
    path.write_text("other text " * 100)  # a changed file gets a new key
    assert bytes(load_splits(str(path)).train).startswith(b"other text")


def test_folder_jsonl_and_parquet(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(12):
        (folder / f"{i:02d}.txt").write_text(f"document number {i} " * 5)
    splits = load_splits(str(folder))
    assert bytes(splits.test).startswith(b"document number 9 ")
    lines = tmp_path / "d.jsonl"
    lines.write_text("\n".join(json.dumps({"text": f"line {i} " * 5}) for i in range(12)))
    assert bytes(load_splits(str(lines)).test).startswith(b"line 9 ")
    table = tmp_path / "d.parquet"
    pd.DataFrame({"text": [f"row {i} " * 5 for i in range(12)]}).to_parquet(table)
    assert bytes(load_splits(str(table)).validation).startswith(b"row 4 ")


@pytest.mark.parametrize("content, message", [
    (b"\xff\xfe\x00bad", "not UTF-8"),
    (b"", "holds no text"),
])
def test_bad_text_files(tmp_path, content, message):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(RelbenchError, match=message):
        load_splits(str(path))


def test_bad_jsonl(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n{not json\n')
    with pytest.raises(RelbenchError, match="line 2 is not valid JSON"):
        load_splits(str(path))
    path.write_text('{"body": "no text field"}\n')
    with pytest.raises(RelbenchError, match='no "text"'):
        load_splits(str(path))


def test_missing_local_file_is_not_taken_for_a_hub_name(tmp_path):
    with pytest.raises(RelbenchError, match="does not exist"):
        load_splits(str(tmp_path / "nope.txt"))


def test_hub_without_network_fails_fast(monkeypatch):
    """Without network the hub libraries are switched to offline mode (no retries for minutes)."""
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, "0")  # restored after the test
    monkeypatch.setattr(corpus, "hub_reachable", lambda timeout=3.0: False)
    start = time.perf_counter()
    with pytest.raises(RelbenchError, match="cannot reach the Hugging Face hub"):
        load_splits("surely-not/a-cached-dataset:config")
    import huggingface_hub.constants

    assert huggingface_hub.constants.HF_HUB_OFFLINE
    assert time.perf_counter() - start < 30  # generous: the requirement is seconds, not minutes


def test_byte_tokenizer_roundtrip():
    tok = ByteTokenizer()
    text = "Fellow-Citizens — “union” ’"
    assert tok.decode(tok.encode(text)) == text
    assert tok.vocab_size == 256
