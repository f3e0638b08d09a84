"""The evaluation protocol: the same predictions scored once at every length and in both modes, spread
over the whole test split, with the context sliding windows promise and a bootstrap interval."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from relbench.data.tokenizer import ByteTokenizer
from relbench.errors import UsageError
from relbench.evaluation.perplexity import (
    bootstrap_interval,
    perplexity,
    position_bins,
    position_rows,
    scored_text,
    validate_lengths,
    windows,
)
from relbench.model import GPT, ModelConfig


def text_of(n_test, lengths, eval_tokens, tokens=None):
    test = np.arange(n_test) % 256 if tokens is None else tokens
    return scored_text(test.astype(np.uint8), lengths, eval_tokens, ByteTokenizer.token_bytes)


@pytest.mark.parametrize("mode, stride", [("nonoverlap", None), ("sliding", 4), ("sliding", 5), ("sliding", 16)])
def test_windows_score_every_scored_prediction_once(mode, stride):
    for n_test, length, eval_tokens in [(1000, 16, 64), (1000, 64, 256), (300, 16, 70), (400, 16, 5)]:
        text = text_of(n_test, [length, 64], eval_tokens)
        expected = sorted(o + text.context + i for o in text.offsets for i in range(text.segment))
        scored = []
        for w in windows(text, length, mode, stride):
            assert 1 <= w.size <= length and 0 <= w.score_from < w.size and w.start >= 0
            scored += list(range(w.start + w.score_from, w.start + w.size))
        assert sorted(scored) == expected and len(set(scored)) == len(scored)


def test_sliding_predictions_all_have_their_context():
    """Every scored prediction in sliding mode sees at least L - S tokens, the first window included."""
    text = text_of(2000, [16, 64], 256)
    for w in windows(text, 16, "sliding", 4):
        assert w.size == 16 and w.score_from >= 16 - 4


def test_segments_are_spread_over_the_whole_test_split():
    text = text_of(10_000, [16, 64], eval_tokens=300)
    assert text.segment == 64 and text.context == 64 and text.n_tokens == 4 * 64   # 300 // 64 segments
    assert text.offsets[0] == 0 and text.offsets[-1] == 10_000 - 129               # first and last possible
    gaps = np.diff(text.offsets)
    assert gaps.min() >= 129 and gaps.max() - gaps.min() <= 1                        # even, no overlap
    assert text_of(10_000, [16, 64], eval_tokens=10).n_tokens == 64                 # at least one segment
    assert len(text_of(300, [16, 64], eval_tokens=10_000).offsets) == 2             # as many as fit
    with pytest.raises(UsageError, match="test split has 100"):
        text_of(100, [64], 64)


def test_bootstrap_interval_brackets_the_estimate_and_shrinks_with_more_windows():
    rng = np.random.default_rng(0)
    small_loss, big_loss = rng.normal(2.0, 0.3, 8) * 16, rng.normal(2.0, 0.3, 512) * 16
    low_s, high_s = bootstrap_interval(small_loss, np.full(8, 16.0))
    low_b, high_b = bootstrap_interval(big_loss, np.full(512, 16.0))
    assert low_s < math.exp(small_loss.sum() / 128) < high_s
    assert low_b < math.exp(big_loss.sum() / (512 * 16)) < high_b
    assert high_b - low_b < (high_s - low_s) / 4                                     # about 1/sqrt(64)
    low, high = bootstrap_interval(np.full(10, 32.0), np.full(10, 16.0))              # no spread: no width
    assert low == pytest.approx(math.exp(2)) and high == pytest.approx(math.exp(2))


def test_validate_lengths():
    assert validate_lengths([64, 16], 100) == [16, 64]
    for bad, message in [([0], "positive"), ([-4], "positive"), ([16, 16], "twice"), ([200], "longer than")]:
        with pytest.raises(UsageError, match=message):
            validate_lengths(bad, 100)


@pytest.mark.parametrize("stride", [3, 8])
def test_sliding_perplexity_equals_token_by_token(stride):
    """Each scored prediction, recomputed alone from the L - S (or more) tokens before it that the
    protocol promises, gives the same total loss."""
    model = GPT(ModelConfig(d_model=16, n_layers=1, n_heads=2, train_length=32, position="alibi")).eval()
    text = text_of(400, [16, 30], 60, tokens=torch.randint(0, 256, (400,)).numpy())
    length = 16
    with torch.no_grad():
        result = perplexity(model, text, length, max_batch_tokens=48, device="cpu", mode="sliding", stride=stride)
        total, count = 0.0, 0
        for w in windows(text, length, "sliding", stride):
            for p in range(w.start + w.score_from, w.start + w.size):   # prediction at input position p
                context = text.tokens[w.start: p + 1]
                assert len(context) >= length - stride + 1
                total -= F.log_softmax(model(context[None])[0, -1].double(), -1)[text.tokens[p + 1]].item()
                count += 1
    assert result.n_tokens == count == 2 * 30
    assert result.loss == pytest.approx(total / count, rel=1e-5)
    assert result.ppl_low < result.ppl < result.ppl_high


def test_position_bins_recombine_to_the_overall_loss():
    model = GPT(ModelConfig(d_model=16, n_layers=1, n_heads=2, train_length=32, position="rope")).eval()
    text = text_of(600, [32, 64], 128, tokens=torch.randint(0, 256, (600,)).numpy())
    for mode in ("nonoverlap", "sliding"):
        result = perplexity(model, text, 32, 64, "cpu", mode=mode, stride=8)
        rows = position_rows(result, {"mode": mode})
        assert sum(r["n_tokens"] for r in rows) == 128
        assert sum(r["loss_sum"] for r in rows) / 128 == pytest.approx(result.loss, rel=1e-9)
    assert position_bins(32) == [(0, 1), (1, 2), (2, 4), (4, 8), (8, 16), (16, 32)]
    assert position_bins(24) == [(0, 1), (1, 2), (2, 4), (4, 8), (8, 16), (16, 24)]


def brute_force_nll(model, text, length):
    """Segment by segment, window by window from the segment's first scored input, summed token by token."""
    total = 0.0
    for offset in text.offsets:
        first = offset + text.context
        for start in range(first, first + text.segment, length):
            size = min(length, first + text.segment - start)
            window = text.tokens[start: start + size + 1]
            logits = model(window[None, :-1])[0]
            for t in range(size):
                total -= F.log_softmax(logits[t].double(), -1)[window[t + 1]].item()
    return total / text.n_tokens


@pytest.mark.parametrize("name", ["alibi", "rope", "learned"])
def test_perplexity_equals_brute_force(name):
    model = GPT(ModelConfig(d_model=16, n_layers=1, n_heads=2, train_length=32, position=name)).eval()
    text = text_of(800, [16, 32, 50], 100, tokens=torch.randint(0, 256, (800,)).numpy())   # 2 segments of 50
    for length in (16, 32):  # 50 tokens: 3 full windows + a tail of 2 at 16; 1 + a tail of 18 at 32
        with torch.no_grad():
            result = perplexity(model, text, length, max_batch_tokens=48, device="cpu")
            expected = brute_force_nll(model, text, length)
        assert result.n_tokens == 100
        assert result.loss == pytest.approx(expected, rel=1e-5)
        assert result.ppl == pytest.approx(math.exp(expected), rel=1e-5)
