"""Non-overlapping evaluation: every token scored once, the same tokens at every length."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from relbench.errors import UsageError
from relbench.evaluate import perplexity, position_bins, position_rows, scored_stream, validate_lengths, windows
from relbench.model import GPT, ModelConfig


@pytest.mark.parametrize("mode, stride", [("nonoverlap", None), ("sliding", 4), ("sliding", 5), ("sliding", 16)])
def test_windows_score_every_prediction_once(mode, stride):
    for n, length in [(64, 16), (64, 64), (70, 16), (5, 16)]:
        scored = []
        for w in windows(n, length, mode, stride):
            assert 1 <= w.size <= length and 0 <= w.score_from < w.size
            scored += list(range(w.start + w.score_from, w.start + w.size))
        assert scored == list(range(n))


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


def sliding_context_start(t, n, length, stride):
    """Where the context of prediction t (predicting token t + 1) starts, from the protocol's
    definition: the first window scores predictions 0..L-1; window k >= 1 ends at L + k * stride
    (or at n) and scores the predictions after the previous window's end."""
    if t < length:
        return 0
    k = -(-(t + 1 - length) // stride)
    end = min(length + k * stride, n)
    return end - length


@pytest.mark.parametrize("stride", [3, 8])
def test_sliding_perplexity_equals_token_by_token(stride):
    model = GPT(ModelConfig(d_model=16, n_layers=1, n_heads=2, train_length=32, position="alibi")).eval()
    stream = torch.randint(0, 256, (61,))
    n, length = 60, 16
    with torch.no_grad():
        result = perplexity(model, stream, length, max_batch_tokens=48, device="cpu", mode="sliding", stride=stride)
        total = 0.0
        for t in range(n):
            start = sliding_context_start(t, n, length, stride)
            context = stream[start: t + 1]
            assert len(context) <= length
            total -= F.log_softmax(model(context[None])[0, -1].double(), -1)[stream[t + 1]].item()
    assert result.n_tokens == n
    assert result.loss == pytest.approx(total / n, rel=1e-5)


def test_position_bins_recombine_to_the_overall_loss():
    model = GPT(ModelConfig(d_model=16, n_layers=1, n_heads=2, train_length=32, position="rope")).eval()
    stream = torch.randint(0, 256, (129,))
    for mode in ("nonoverlap", "sliding"):
        result = perplexity(model, stream, 32, 64, "cpu", mode=mode, stride=8)
        rows = position_rows(result, {"mode": mode})
        assert sum(r["n_tokens"] for r in rows) == 128
        assert sum(r["loss_sum"] for r in rows) / 128 == pytest.approx(result.loss, rel=1e-9)
    assert position_bins(32) == [(0, 1), (1, 2), (2, 4), (4, 8), (8, 16), (16, 32)]
    assert position_bins(24) == [(0, 1), (1, 2), (2, 4), (4, 8), (8, 16), (16, 24)]


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
