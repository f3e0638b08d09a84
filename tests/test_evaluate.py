"""Non-overlapping evaluation: every token scored once, the same tokens at every length."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from relbench.errors import UsageError
from relbench.evaluate import perplexity, scored_stream, validate_lengths, window_starts
from relbench.model import GPT, ModelConfig


def test_windows_cover_every_scored_token_once():
    for n, length in [(64, 16), (64, 64), (70, 16), (5, 16)]:
        covered = []
        for start, size in window_starts(n, length):
            assert 1 <= size <= length
            covered += list(range(start, start + size))
        assert covered == list(range(n))


def test_scored_stream_is_a_multiple_of_the_longest_length():
    test = np.arange(1000, dtype=np.uint8)
    stream = scored_stream(test, [16, 64], eval_tokens=300)
    assert stream.numel() - 1 == 256  # 300 rounded down to a multiple of 64
    assert scored_stream(test, [16, 64], eval_tokens=10).numel() - 1 == 64  # at least one longest window


def test_validate_lengths():
    assert validate_lengths([64, 16], 100) == [16, 64]
    for bad, message in [([0], "positive"), ([-4], "positive"), ([16, 16], "twice"), ([200], "longer than")]:
        with pytest.raises(UsageError, match=message):
            validate_lengths(bad, 100)


def brute_force_nll(model, stream, length):
    """Window by window, one forward per window, summed token by token."""
    total, n = 0.0, stream.numel() - 1
    for start in range(0, n, length):
        size = min(length, n - start)
        window = stream[start: start + size + 1]
        logits = model(window[None, :-1])[0]
        for t in range(size):
            total -= F.log_softmax(logits[t].double(), -1)[window[t + 1]].item()
    return total / n


@pytest.mark.parametrize("name", ["alibi", "rope", "learned"])
def test_perplexity_equals_brute_force(name):
    model = GPT(ModelConfig(d_model=16, n_layers=1, n_heads=2, train_length=32, position=name)).eval()
    stream = torch.randint(0, 256, (101,))
    for length in (16, 32):  # 100 tokens: 6 full windows + a tail of 4 at 16; 3 + a tail of 4 at 32
        with torch.no_grad():
            result = perplexity(model, stream, length, max_batch_tokens=48, device="cpu")
            expected = brute_force_nll(model, stream, length)
        assert result.n_tokens == 100
        assert result.loss == pytest.approx(expected, rel=1e-5)
        assert result.ppl == pytest.approx(math.exp(expected), rel=1e-5)
