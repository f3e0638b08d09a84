"""Tokenizers (bytes, a BPE trained on the train split, hub), bits per byte, large and streamed
corpora, the memory-mapped token cache, and a tiny BPE run from train to report."""

import json
import math
import time

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from relbench import data
from relbench.cli import app
from relbench.data import cache, corpus, load_run_splits, load_splits, tokenize_documents, training_texts
from relbench.data import tokenizer as tokenizers
from relbench.data.tokenizer import ByteTokenizer, bytes_to_unicode, parse, token_dtype, train_bpe
from relbench.errors import RelbenchError, UsageError
from relbench.evaluation.perplexity import perplexity, scored_text
from relbench.model import GPT, ModelConfig
from relbench.runs import checkpoints, results, rundir
from relbench.tasks import passkey

MULTILINGUAL = ["Fellow-Citizens of the Senate — “union” ’tis", "Grüße aus Köln: Straße, Öl, Äpfel.",
                "日本語のテキストと中文文本", "Привет, мир! Ελληνικά. עברית. العربية",
                "emoji 🎉🚀 and 𝄞 music",
                "tabs\tand\nnewlines\r\n and \x1e record separators and <|record-separator|> spelled out"]


def speeches(count=40, chars=6000):
    """The first `count` State of the Union speeches, cut to `chars` characters: a small real corpus."""
    return [text[:chars] for text in corpus.open_source(None).read()[:count]]


def write_jsonl(path, documents):
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in documents))
    return path


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A token cache of this test's own (the session's is shared by every test)."""
    monkeypatch.setenv("RELBENCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def bpe():
    return train_bpe(speeches(20) + MULTILINGUAL, 400)


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line_error(result, code, *fragments):
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == code and len(lines) == 1 and lines[0].startswith("error:"), result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_gpt2_byte_map_is_the_byte_level_alphabet():
    from tokenizers.pre_tokenizers import ByteLevel

    mapping = bytes_to_unicode()
    assert sorted(mapping) == list(range(256)) and len(set(mapping.values())) == 256
    assert set(mapping.values()) == set(ByteLevel.alphabet())
    assert mapping[ord("A")] == "A" and mapping[ord(" ")] == "Ġ" and mapping[ord("\n")] == "Ċ"


def test_bpe_round_trip_and_token_bytes(bpe):
    assert bpe.vocab_size == 400 and bpe.dtype == np.uint16 and bpe.token_bytes.shape == (400,)
    for text in MULTILINGUAL:
        tokens = bpe.encode(text)
        assert tokens.dtype == np.uint16
        assert bpe.decode(tokens) == text
        assert int(bpe.token_bytes[tokens].sum()) == len(text.encode("utf-8"))   # exact bytes per token
    assert int(bpe.token_bytes[bpe.encode("the nation")].max()) > 1            # merges hold several bytes
    stream = bpe.join(MULTILINGUAL)                                              # + one byte per separator
    assert int(bpe.token_bytes[stream].sum()) == sum(len(t.encode()) + 1 for t in MULTILINGUAL)
    assert (stream == bpe.separator).sum() == len(MULTILINGUAL)                  # the spelled-out token is text
    assert bpe.decode(stream) == "".join(t + "\x1e" for t in MULTILINGUAL)


def test_token_dtype_follows_the_vocabulary():
    assert [token_dtype(n) for n in (256, 257, 65535, 65536, 200_000)] == [np.uint8, np.uint16, np.uint16, np.int32,
                                                                          np.int32]


@pytest.mark.parametrize("name, fragment", [("bpe:abc", "whole number"), ("bpe", "whole number"),
                                            ("bpe:10", "too small"), ("bpe:256", "at least 257"),
                                            ("no such/tokenizer/here", "unknown tokenizer")])
def test_bad_tokenizer_names(name, fragment):
    with pytest.raises(UsageError, match=fragment):
        parse(name)
    assert parse("bpe:0300") == ("bpe", 300) and parse("gpt2") == ("hub", "gpt2") and parse("bytes") == ("bytes", None)


def test_bpe_is_trained_on_the_train_split_only():
    """A word that occurs only in validation and test documents is never merged."""
    docs = [f"plain words number {i} " * 20 + (" zyzzyva" * 50 if i % 5 == 4 else "") for i in range(40)]
    assert "zyzzyva" not in "".join(training_texts(docs))
    tok = train_bpe(training_texts(docs), 600)
    assert len(tok.encode(" zyzzyva")) >= 4
    assert len(train_bpe(docs, 600).encode(" zyzzyva")) == 1      # what learning from every document would do


def test_bpe_is_deterministic_and_cached(tmp_path, monkeypatch, own_cache):
    path = write_jsonl(tmp_path / "d.jsonl", speeches(20, 3000))
    first = load_splits(str(path), "bpe:500")
    assert first.tokenizer.vocab_size == 500 and first.train.dtype == np.uint16
    assert len(list(cache.cache_dir().glob("tokens/bpe-*.json"))) == 1
    again = train_bpe(training_texts(speeches(20, 3000)), 500)
    assert again.to_str() == first.tokenizer.to_str()                  # the same training gives the same merges

    def no_training(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(data, "train_bpe", no_training)
    monkeypatch.setattr(data, "tokenize_documents", no_training)
    cached = load_splits(str(path), "bpe:500")                        # tokenizer and tokens from the cache
    assert cached.tokenizer.fingerprint == first.tokenizer.fingerprint
    np.testing.assert_array_equal(cached.test, first.test)
    for name in cache.SPLITS:
        assert isinstance(getattr(cached, name), np.memmap)


def test_memmap_cache_is_rebuilt_when_damaged(tmp_path, monkeypatch, own_cache):
    path = write_jsonl(tmp_path / "d.jsonl", speeches(12, 2000))
    loaded = load_splits(str(path))
    first = {name: np.array(getattr(loaded, name)) for name in cache.SPLITS}   # copies: the files are damaged below
    del loaded
    (entry,) = [p.parent for p in cache.cache_dir().glob("tokens/*/meta.json")]
    calls = []
    original = data.tokenize_documents
    monkeypatch.setattr(data, "tokenize_documents", lambda *a, **k: calls.append(1) or original(*a, **k))
    load_splits(str(path))
    assert calls == []                                                  # reused
    damaged = entry / "train.npy"
    damaged.write_bytes(damaged.read_bytes()[:1000])                    # truncated
    again = load_splits(str(path))
    assert calls == [1]
    np.testing.assert_array_equal(again.train, first["train"])
    (entry / "meta.json").write_text("{not json")                        # a foreign meta.json
    np.testing.assert_array_equal(load_splits(str(path)).test, first["test"])
    assert calls == [1, 1]
    np.save(entry / "test.npy", first["test"][:-7])                        # a whole array, of another size
    np.testing.assert_array_equal(load_splits(str(path)).test, first["test"])
    assert calls == [1, 1, 1]


def test_position_rule_cuts_at_a_token_boundary_after_the_byte(bpe):
    docs = ["one long document " * 200, "and a second one, shorter " * 50]
    total = sum(len(t.encode()) + 1 for t in docs)
    parts = tokenize_documents(docs, bpe)
    train_bytes = int(bpe.token_bytes[parts["train"]].sum())
    assert int(0.8 * total) <= train_bytes < int(0.8 * total) + 20          # the first boundary at or after 80%
    assert sum(int(bpe.token_bytes[parts[k]].sum()) for k in parts) == total
    byte_parts = tokenize_documents(docs, ByteTokenizer())
    assert byte_parts["train"].size == int(0.8 * total)                      # bytes: exactly at the byte
    assert byte_parts["validation"].size == int(0.9 * total) - int(0.8 * total)
    trained_on = "\x1e".join(training_texts(docs)).encode()            # the documents it holds, as joined
    assert len(trained_on) <= train_bytes and bpe.decode(parts["train"]).encode().startswith(trained_on)


def tiny_model(vocab_size):
    torch.manual_seed(0)
    return GPT(ModelConfig(vocab_size=vocab_size, d_model=16, n_layers=1, n_heads=2, position="alibi",
                           train_length=16)).eval()


def test_bits_per_byte_of_byte_tokens_is_the_loss_over_ln2():
    test = ByteTokenizer().encode(" ".join(speeches(3, 2000)))
    # 420 tokens: dividing by a power of two would be exact anyway
    text = scored_text(test, [16, 60], 7 * 60, ByteTokenizer.token_bytes)
    for mode, stride in (("nonoverlap", None), ("sliding", 8)):
        result = perplexity(tiny_model(256), text, 16, 4096, "cpu", mode, stride)
        assert result.n_bytes == result.n_tokens
        assert result.bits_per_byte == result.loss / math.log(2)


def test_bits_per_byte_of_bpe_matches_a_hand_computation(bpe):
    """Total loss in bits over the scored predictions / bytes of their targets' text, the bytes
    counted by the tokenizer library's own decoder (ASCII text: one byte per character)."""
    ascii_text = " ".join(speeches(8, 1500)).encode("ascii", errors="ignore").decode()
    tokens = bpe.encode(ascii_text)                                           # one document: no separators
    text = scored_text(tokens, [16], 96, bpe.token_bytes)
    model = tiny_model(bpe.vocab_size)
    result = perplexity(model, text, 16, 4096, "cpu")
    nats, n_bytes = 0.0, 0
    for offset in text.offsets:
        first = offset + text.context
        for start in range(first, first + text.segment, 16):
            window = torch.from_numpy(tokens[start: start + 17].astype(np.int64))
            nats += F.cross_entropy(model(window[None, :-1])[0], window[1:], reduction="sum").item()
            n_bytes += len(bpe.hf.decode(window[1:].tolist(), skip_special_tokens=False).encode("utf-8"))
    assert result.n_bytes == n_bytes and n_bytes > 1.5 * result.n_tokens             # BPE tokens hold bytes
    assert result.bits_per_byte == pytest.approx(nats / math.log(2) / n_bytes, rel=1e-6)


def test_save_to_disk_folders(tmp_path):
    import datasets

    rows = {"text": [f"saved document {i} " * 5 for i in range(12)], "id": list(range(12))}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "one"))
    assert bytes(load_splits(str(tmp_path / "one")).test).startswith(b"saved document 9 ")
    train = datasets.Dataset.from_dict(rows)
    other = datasets.Dataset.from_dict({"text": ["not read"] * 12, "id": list(range(12))})
    datasets.DatasetDict({"validation": other, "train": train}).save_to_disk(str(tmp_path / "dict"))
    splits = load_splits(str(tmp_path / "dict"))                           # the train split, alone
    assert bytes(splits.validation).startswith(b"saved document 4 ") and b"not read" not in bytes(splits.train)
    assert "train split" in splits.description
    datasets.DatasetDict({"test": train}).save_to_disk(str(tmp_path / "no-train"))
    with pytest.raises(UsageError, match="no train split"):
        load_splits(str(tmp_path / "no-train"))
    datasets.Dataset.from_dict({"body": ["x"] * 12}).save_to_disk(str(tmp_path / "no-text"))
    with pytest.raises(RelbenchError, match='no "text" column'):
        load_splits(str(tmp_path / "no-text"))


def test_stream_stops_at_the_budget(tmp_path, monkeypatch):
    docs = [f"document {i:03d} " + "word " * 40 for i in range(200)]          # 215 bytes + 1 separator each
    path = write_jsonl(tmp_path / "d.jsonl", docs)
    pulled = []
    texts = corpus._texts
    monkeypatch.setattr(corpus, "_texts", lambda rows, what: (pulled.append(t) or t for t in texts(rows, what)))
    monkeypatch.setattr(data, "CHUNK_CHARS", 1000)                            # about 5 documents per batch
    splits = load_splits(str(path), stream=True, max_train_tokens=3000)
    # 3000 tokens = 15 train documents (0-3, 5-8, 10-13, 15-17): block 10-19 is read to its end
    assert splits.train.size == 3000 and bytes(splits.train).startswith(b"document 000 ")
    assert bytes(splits.test).split(b"\x1e")[:-1] == [docs[9].encode(), docs[19].encode()]
    assert bytes(splits.validation).split(b"\x1e")[:-1] == [docs[4].encode(), docs[14].encode()]
    assert len(pulled) <= 30                                                  # the rest was never read
    assert "streamed" in splits.description
    again = load_run_splits({"data": {"dataset": str(path), "tokenizer": "bytes", "stream": True,
                                      "max_train_tokens": 3000}})
    np.testing.assert_array_equal(again.test, splits.test)                  # a run reopens the same data
    bpe = load_splits(str(path), "bpe:300", stream=True, max_train_tokens=1000)
    assert bpe.train.size == 1000 and bpe.tokenizer.decode(bpe.test).startswith("document 009 ")
    with pytest.raises(UsageError, match="needs --max-train-tokens"):
        load_splits(str(path), stream=True)
    with pytest.raises(UsageError, match="name one with --dataset"):
        load_splits(None, stream=True, max_train_tokens=10)


def test_max_train_tokens_without_a_stream_cuts_the_train_split_only(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", speeches(12, 3000))
    whole, cut = load_splits(str(path)), load_splits(str(path), max_train_tokens=5000)
    np.testing.assert_array_equal(cut.train, whole.train[:5000])
    np.testing.assert_array_equal(cut.test, whole.test)
    np.testing.assert_array_equal(cut.validation, whole.validation)
    with pytest.raises(UsageError, match="must be positive"):
        load_splits(str(path), max_train_tokens=0)


def test_hub_tokenizer_offline_fails_fast_in_one_line(tmp_path, monkeypatch):
    import huggingface_hub.constants

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, "0")                         # restored after the test
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(corpus, "hub_reachable", lambda timeout=3.0: False)
    start = time.perf_counter()
    with pytest.raises(RelbenchError, match='cannot reach the Hugging Face hub for tokenizer "gpt2"'):
        tokenizers.get_tokenizer("gpt2")
    one_line_error(run("train", "--preset", "tiny", "--variants", "alibi", "--tokenizer", "gpt2", "--run-dir",
                       tmp_path / "run"), 1, "gpt2", "not in the local cache")
    assert time.perf_counter() - start < 30


def test_a_hub_style_tokenizer_gets_the_separator_and_keeps_whole_documents():
    """As a hub tokenizer.json comes: its own special token, a truncation setting, no separator."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    hub = Tokenizer(models.BPE())
    hub.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hub.decoder = decoders.Sequence([decoders.ByteLevel()])
    hub.train_from_iterator(speeches(5, 2000), trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hub.enable_truncation(max_length=8)
    tok = tokenizers.ByteLevelTokenizer("local-hub", Tokenizer.from_str(hub.to_str()))
    assert tok.vocab_size == 321 and tok.separator == 320 and tok.token_bytes[tok.separator] == 1
    text = MULTILINGUAL[0] + " <|endoftext|> " + MULTILINGUAL[2]
    tokens = tok.encode(text)
    assert len(tokens) > 8 and tok.decode(tokens) == text                  # not truncated; special text is text
    assert int(tok.token_bytes[tokens].sum()) == len(text.encode())


def test_a_hub_style_tokenizer_must_be_byte_level():
    from tokenizers import Tokenizer, models, pre_tokenizers

    word_level = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    with pytest.raises(UsageError, match="not byte-level"):
        tokenizers.ByteLevelTokenizer("word-level", word_level)


@pytest.mark.parametrize("key", ["71432", "00000", "99999", "12345"])
def test_passkey_with_bpe_has_one_layout_for_every_key(bpe, key):
    stream = bpe.encode(" ".join(speeches(3, 3000)))
    tokens, answer = passkey.sequence(stream, passkey.Trial(key, 0.5, 10), 160, bpe)
    assert len(tokens) == 161 and answer == slice(160 - passkey.DIGITS, 160)
    assert bpe.decode(tokens[1:][answer]) == key
    assert bpe.decode(tokens).endswith(passkey.QUESTION + key)
    assert f"The pass key is {key}. Remember it. {key} is the pass key. " in bpe.decode(tokens)
    bare, _ = passkey.sequence(stream, passkey.Trial(key, 0.5, 10), passkey.min_length(bpe) - 1, bpe)   # no filler
    assert bpe.decode(bare) == passkey.STATEMENT.format(key=key) + passkey.QUESTION + key
    with pytest.raises(UsageError, match="at least"):
        passkey.sequence(stream, passkey.Trial(key, 0.5, 10), passkey.min_length(bpe) - 2, bpe)
    assert passkey.min_length(bpe) < passkey.min_length(ByteTokenizer())    # the phrases are merged


def test_tiny_bpe_run_trains_extrapolates_and_reports(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", speeches(30, 5000))
    run_dir = tmp_path / "run"
    result = run("train", "--preset", "tiny", "--variants", "alibi", "--tokenizer", "bpe:300", "--dataset", path,
                 "--stream", "--max-train-tokens", 30000, "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    config = json.loads((run_dir / "config.json").read_text())
    assert config["data"]["tokenizer"] == "bpe:300" and config["model"]["vocab_size"] == 300
    assert config["data"]["stream"] is True and config["data"]["max_train_tokens"] == 30000
    folder = rundir.checkpoint_dir(run_dir, "alibi", 0)
    assert checkpoints.read_meta(folder)["tokenizer"] == "bpe:300"
    result = run("extrapolate", "--run-dir", run_dir, "--lengths", 32, 128, "--task", "perplexity", "passkey", "copy",
                 "--trials", 1)
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(run_dir / "extrapolation.csv")
    assert len(rows) == 2 and (rows["status"] == "ok").all()
    assert np.allclose(rows["bits_per_byte"], rows["loss"] * rows["n_tokens"] / rows["n_bytes"] / math.log(2))
    assert (rows["n_bytes"] > 1.5 * rows["n_tokens"]).all()
    keys = pd.read_csv(run_dir / "passkey.csv")
    assert set(keys[keys["length"] == 128]["status"]) == {"ok"}              # passkey runs on BPE tokens
    assert set(pd.read_csv(run_dir / "copy.csv")["status"]) == {"ok"}           # and so does copy
    result = run("report", "--run-dir", run_dir)
    assert result.exit_code == 0, result.output
    report = (run_dir / "report.md").read_text()
    assert "## Bits per byte" in report and "compares tokenizers" in report and "tokenizer bpe:300" in report
    assert "bpb@128" in pd.read_csv(run_dir / "extrapolation_pivot.csv").columns
    # another tokenizer (and so another vocabulary) in the same run directory is refused
    one_line_error(run("train", "--preset", "tiny", "--variants", "alibi", "--dataset", path, "--stream",
                       "--max-train-tokens", 30000, "--run-dir", run_dir), 2, "different model and tokenizer")
    # a checkpoint trained with another tokenizer than its run's is refused
    meta = checkpoints.read_meta(folder)
    results.write_json(folder / checkpoints.META_FILE, {**meta, "tokenizer": "bytes"})
    one_line_error(run("extrapolate", "--run-dir", run_dir, "--lengths", 32, "--force"), 1,
                   "trained with tokenizer bytes", "reads bpe:300")
    results.write_json(folder / checkpoints.META_FILE, {**meta, "tokenizer_fingerprint": "bpe:300@0123"})
    one_line_error(run("extrapolate", "--run-dir", run_dir, "--lengths", 32, "--force"), 1, "rebuilt differently",
                   f"relbench train --run-dir {run_dir} --config {run_dir / 'config.toml'}")  # the run's own


def test_a_hub_stream_offline_fails_fast_in_one_line(tmp_path, monkeypatch):
    """The paper preset's data (a hub dataset streamed to a budget) on a machine without network:
    one line, within seconds, before any training; nothing but the lock is left in the run directory."""
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.setenv(name, "0")                         # restored after the test
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    monkeypatch.setattr(corpus, "hub_reachable", lambda timeout=3.0: False)
    start = time.perf_counter()
    result = run("train", "--preset", "tiny", "--variants", "alibi", "--dataset", "Skylion007/openwebtext", "--stream",
                 "--max-train-tokens", 100000, "--run-dir", tmp_path / "run")
    one_line_error(result, 1, "Skylion007/openwebtext", "cannot reach the Hugging Face hub")
    assert time.perf_counter() - start < 30
    assert not (tmp_path / "run" / "config.json").exists()
