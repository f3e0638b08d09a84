"""Tokenizers: raw UTF-8 bytes (the default), a byte-level BPE trained on the training split
(`bpe:N`), or a byte-level tokenizer from the Hugging Face hub (`gpt2`).

    tok = ByteTokenizer()                   # vocabulary 256, no training, no unknown tokens
    tok.encode("text"), tok.decode(ids), tok.join(documents)    # 1-D numpy arrays of token ids
    tok.token_bytes                          # (vocab_size,) UTF-8 bytes of each token id

Every tokenizer knows the exact bytes of each of its tokens, which is what bits per byte divides
by: bytes per token is 1 for `bytes`; a byte-level BPE's token is a string of bytes (GPT-2's
byte-to-character map undone), so decoding is lossless (a hub tokenizer with a normalizer, such as
NFC, gives back and counts the normalized text). Documents are joined with a separator token that
stands for the ASCII record separator byte 0x1E: the byte itself for `bytes`, a reserved special
token for BPE, counted as one byte by both, so every tokenizer counts the same bytes for the same
documents. Text that happens to spell the special token is tokenized as text.
"""

from __future__ import annotations

import abc
import hashlib
import json
import re
from collections.abc import Iterable
from functools import lru_cache

import numpy as np

from relbench.errors import RelbenchError, UsageError, did_you_mean

RECORD_SEPARATOR = 0x1E  # ASCII "record separator": joins documents in the byte stream
SEPARATOR_TOKEN = "<|record-separator|>"  # the reserved special token that joins documents for BPE
MIN_BPE = 256 + 1        # the 256 bytes and the separator
HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")   # a hub repository id: name or owner/name
CHOICES = "bytes, bpe:N (e.g. bpe:4096), or a byte-level hub tokenizer such as gpt2"


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest array type that holds every token id: uint8, uint16 or int32."""
    return np.dtype(np.uint8 if vocab_size <= 256 else np.uint16 if vocab_size <= 65535 else np.int32)


class Tokenizer(abc.ABC):
    """What every tokenizer has. Subclasses set the attributes and encode_batch / decode."""

    name: str               # what --tokenizer names: "bytes", "bpe:4096", "gpt2"
    fingerprint: str        # changes when the mapping changes (part of the token cache key)
    vocab_size: int         # the model's vocabulary
    separator: int          # token id that ends every document in a joined stream
    dtype: np.dtype         # of the token arrays (token_dtype)
    token_bytes: np.ndarray  # (vocab_size,) int64: UTF-8 bytes of each token id

    @abc.abstractmethod
    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """The token ids of every text."""

    @abc.abstractmethod
    def decode(self, tokens) -> str:
        """The text of token ids."""

    def encode(self, text: str) -> np.ndarray:
        return self.encode_batch([text])[0]

    def join(self, documents: list[str]) -> np.ndarray:
        """Every document followed by the separator, as one token stream."""
        separator = np.array([self.separator], dtype=self.dtype)
        parts = [part for tokens in self.encode_batch(list(documents)) for part in (tokens, separator)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=self.dtype)


class ByteTokenizer(Tokenizer):
    name = fingerprint = "bytes"
    vocab_size = 256
    separator = RECORD_SEPARATOR
    dtype = np.dtype(np.uint8)
    token_bytes = np.ones(256, dtype=np.int64)
    token_bytes.flags.writeable = False   # shared by every instance

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """(n_bytes,) uint8 tokens of each text's UTF-8 encoding."""
        return [np.frombuffer(text.encode("utf-8"), dtype=np.uint8) for text in texts]

    def decode(self, tokens) -> str:
        return bytes(np.asarray(tokens, dtype=np.uint8)).decode("utf-8", errors="replace")


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of the 256 byte values to printable characters (Radford et al. 2019,
    encoder.py), which byte-level BPE vocabularies are written in: the printable Latin-1 bytes map
    to themselves, the other 68 to chr(256 + n) in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    rest = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + n) for n, b in enumerate(rest)}}


class ByteLevelTokenizer(Tokenizer):
    """A Hugging Face `tokenizers` byte-level tokenizer (a BPE trained here, or one from the hub),
    with the separator token added when it lacks it."""

    def __init__(self, name: str, tokenizer):
        from tokenizers import AddedToken

        if not _is_byte_level(tokenizer):
            raise UsageError(f'tokenizer "{name}" is not byte-level: its tokens have no exact bytes, so bits per byte '
                             f"would be approximate and decoding lossy; use {CHOICES}")
        tokenizer.no_truncation()   # hub files may truncate to a model's context; a corpus is not truncated
        tokenizer.no_padding()
        if tokenizer.token_to_id(SEPARATOR_TOKEN) is None:
            tokenizer.add_special_tokens([AddedToken(SEPARATOR_TOKEN, special=True, normalized=False)])
        tokenizer.encode_special_tokens = True   # text spelling a special token is text, not that token
        self.name, self.hf = name, tokenizer
        self.separator = tokenizer.token_to_id(SEPARATOR_TOKEN)
        self.pieces = _pieces(tokenizer)
        self.pieces[self.separator] = bytes([RECORD_SEPARATOR])
        self.vocab_size = len(self.pieces)
        self.dtype = token_dtype(self.vocab_size)
        self.token_bytes = np.array([len(p) for p in self.pieces], dtype=np.int64)
        self.fingerprint = f"{name}@{hashlib.sha256(tokenizer.to_str().encode()).hexdigest()[:16]}"

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of each text; the batch is encoded on all cores (the library's Rust threads)."""
        encodings = self.hf.encode_batch_fast(texts, add_special_tokens=False)   # ids only (tokenizers >= 0.20)
        return [np.asarray(e.ids, dtype=self.dtype) for e in encodings]

    def decode(self, tokens) -> str:
        return b"".join(self.pieces[int(t)] for t in np.asarray(tokens).ravel()).decode("utf-8", errors="replace")

    def to_str(self) -> str:
        return self.hf.to_str()


def _is_byte_level(tokenizer) -> bool:
    decoder = json.loads(tokenizer.to_str()).get("decoder") or {}
    return decoder.get("type") == "ByteLevel" or any(d.get("type") == "ByteLevel" for d in decoder.get("decoders", []))


def _pieces(tokenizer) -> list[bytes]:
    """The bytes of every token id: vocabulary tokens through GPT-2's map, added tokens as their text."""
    to_byte = {char: byte for byte, char in bytes_to_unicode().items()}
    added = {i: token.content for i, token in tokenizer.get_added_tokens_decoder().items()}
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    pieces = [b""] * (max(vocab.values()) + 1)
    for token, i in vocab.items():
        if i in added:
            pieces[i] = added[i].encode("utf-8")
        elif all(char in to_byte for char in token):
            pieces[i] = bytes(to_byte[char] for char in token)
        else:
            raise UsageError(f"token {token!r} of a byte-level tokenizer is not made of byte characters; use {CHOICES}")
    return pieces


def parse(name: str) -> tuple[str, int | str | None]:
    """("bytes", None), ("bpe", N) or ("hub", name) for a --tokenizer value; a UsageError for a bad one."""
    if name == "bytes":
        return "bytes", None
    if name == "bpe" or name.startswith("bpe:"):
        size = name.partition(":")[2]
        if not size.isdigit():
            raise UsageError(f'tokenizer "{name}": give the BPE vocabulary size as a whole number, e.g. bpe:4096')
        if not MIN_BPE <= int(size) < 2**31:
            raise UsageError(f'tokenizer "{name}" is too small: a byte-level BPE needs at least {MIN_BPE} tokens '
                             f"(the 256 bytes and the document separator); e.g. bpe:4096")
        return "bpe", int(size)
    if not HUB_NAME.fullmatch(name):
        raise UsageError(f'unknown tokenizer "{name}"{did_you_mean(name, ["bytes"])}; use {CHOICES}')
    return "hub", name


def get_tokenizer(name: str = "bytes") -> Tokenizer:
    """The tokenizer `name` when it needs no corpus: bytes, or a hub tokenizer (bpe:N is trained on a
    corpus: relbench.data.load_splits)."""
    kind, value = parse(name)
    if kind == "bytes":
        return ByteTokenizer()
    if kind == "hub":
        return from_hub(str(value))
    raise UsageError(f"{name} is trained on a corpus; load it with relbench.data.load_splits(dataset, \"{name}\")")


def planned_vocab_size(name: str) -> int:
    """The vocabulary `name` will have, without a corpus: 256 for bytes, at most N for bpe:N, the hub
    tokenizer's own size (from the local cache or the hub; a RelbenchError when neither has it)."""
    kind, value = parse(name)
    return 256 if kind == "bytes" else int(value) if kind == "bpe" else from_hub(str(value)).vocab_size


def train_bpe(texts: Iterable[str], vocab_size: int) -> ByteLevelTokenizer:
    """A byte-level BPE of at most `vocab_size` tokens (fewer when the text has fewer pairs to merge)
    learned from `texts` with Hugging Face `tokenizers`: GPT-2's pre-tokenizer, every byte in the
    initial alphabet (so any text encodes), the separator as special token 0. Deterministic: the
    trainer breaks ties between pair counts by the pair, and sums counts over threads."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = HFTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[SEPARATOR_TOKEN], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    return ByteLevelTokenizer(f"bpe:{vocab_size}", tokenizer)


def from_json(name: str, text: str) -> ByteLevelTokenizer:
    from tokenizers import Tokenizer as HFTokenizer

    return ByteLevelTokenizer(name, HFTokenizer.from_str(text))


def from_hub(name: str) -> ByteLevelTokenizer:
    """The hub tokenizer `name` (its tokenizer.json) from the local Hugging Face cache, downloaded
    first when the hub answers; without network, offline mode and one line if it is not cached."""
    from relbench.data import corpus

    online = corpus.hub_reachable()
    if not online:
        corpus.go_offline()
    from huggingface_hub import hf_hub_download

    try:
        path = hf_hub_download(name, "tokenizer.json")
    except Exception as error:  # offline, unknown repository, no tokenizer.json: all mean "not usable"
        hint = did_you_mean(name, ["bytes"])
        if not online:
            raise RelbenchError(f'cannot reach the Hugging Face hub for tokenizer "{name}"{hint} and it is not in the '
                                f"local cache; connect to the network, or use bytes or bpe:N (trained here, "
                                f"offline)") from None
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise RelbenchError(f'cannot load hub tokenizer "{name}"{hint}: {reason}; use {CHOICES}') from None
    from tokenizers import Tokenizer as HFTokenizer

    return ByteLevelTokenizer(name, HFTokenizer.from_file(path))
