"""Tokenizers. The default is raw UTF-8 bytes: vocabulary 256, no training, no unknown tokens."""

from __future__ import annotations

import numpy as np

from relbench.errors import unknown

RECORD_SEPARATOR = 0x1E  # ASCII "record separator": joins documents in the byte stream


class ByteTokenizer:
    name = "bytes"
    vocab_size = 256
    separator = RECORD_SEPARATOR

    def encode(self, text: str) -> np.ndarray:
        """(n_bytes,) uint8 tokens of `text`'s UTF-8 encoding."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

    def decode(self, tokens) -> str:
        return bytes(np.asarray(tokens, dtype=np.uint8)).decode("utf-8", errors="replace")

    def join(self, documents: list[str]) -> np.ndarray:
        """Every document followed by the separator, as one token stream."""
        parts = []
        for text in documents:
            parts.append(self.encode(text))
            parts.append(np.array([self.separator], dtype=np.uint8))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint8)


TOKENIZERS = {"bytes": ByteTokenizer}


def get_tokenizer(name: str = "bytes") -> ByteTokenizer:
    if name not in TOKENIZERS:
        raise unknown("tokenizer", name, list(TOKENIZERS))
    return TOKENIZERS[name]()
