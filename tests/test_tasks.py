"""The copy-distance and passkey tasks: sequences built as documented, scored at the right positions,
checked with oracle models that can do the task exactly (and fail it when one index is off)."""

import numpy as np
import pytest
import torch

from relbench.data.tokenizer import ByteTokenizer
from relbench.tasks import copying as copy_task
from relbench.tasks import passkey

TOKENIZER = ByteTokenizer()
STREAM = np.frombuffer(("Filler text of the test split, no digits here. " * 400).encode(), dtype=np.uint8)


class Oracle(torch.nn.Module):
    """Predicts the next token as the token `lag` positions before it (a perfect copier at distance
    `lag`), or, with `answers`, as the true next token of any sequence it was told about."""

    def __init__(self, lag=None, answers=None, vocab=256):
        super().__init__()
        self.lag, self.answers, self.vocab = lag, answers or {}, vocab

    def forward(self, tokens):
        B, L = tokens.shape
        logits = torch.zeros(B, L, self.vocab)
        for b in range(B):
            full = self.answers.get(tuple(tokens[b].tolist()))
            for p in range(L):
                if full is not None:
                    target = full[p + 1]
                elif self.lag is not None and p + 1 - self.lag >= 0:
                    target = tokens[b, p + 1 - self.lag]
                else:
                    continue
                logits[b, p, target] = 10.0
        return logits


def test_passkey_sequence_layout():
    trial = passkey.Trial("71432", 0.0, 100)
    tokens, answer = passkey.sequence(STREAM, trial, 200, TOKENIZER)
    text = TOKENIZER.decode(tokens)
    assert len(tokens) == 201 and text.startswith("The pass key is 71432. Remember it. 71432 is the pass key.")
    assert text.endswith("What is the pass key? The pass key is 71432")
    assert TOKENIZER.decode(tokens[1:][answer]) == "71432"                        # targets at the answer positions
    deep = TOKENIZER.decode(passkey.sequence(STREAM, passkey.Trial("71432", 1.0, 100), 200, TOKENIZER)[0])
    assert deep.index("71432 is the pass key. ") + len("71432 is the pass key. ") == deep.index(" What is the pass key?")
    middle = TOKENIZER.decode(passkey.sequence(STREAM, passkey.Trial("71432", 0.5, 100), 200, TOKENIZER)[0])
    room = 201 - len("The pass key is 71432. Remember it. 71432 is the pass key. ") - len(passkey.QUESTION) - 5
    assert middle.index("The pass key") == round(0.5 * room)
    assert passkey.min_length(TOKENIZER) == 201 - room


def test_passkey_trials_are_fixed_and_spread():
    a = passkey.trials(10_000, 200, [0.0, 0.5], 3, seed=0)
    assert a == passkey.trials(10_000, 200, [0.0, 0.5], 3, seed=0)
    assert [t.depth for t in a] == [0.0] * 3 + [0.5] * 3
    assert all(len(t.key) == 5 and t.key.isdigit() for t in a)
    assert len({t.key for t in a}) == 6 and max(t.filler_start for t in a) <= 10_000 - 201


def test_passkey_accuracy_scores_exactly_the_five_digits():
    trials = passkey.trials(STREAM.size, 160, [0.0, 1.0], 2)
    sequences = [passkey.sequence(STREAM, t, 160, TOKENIZER)[0] for t in trials]
    answers = {tuple(s[:-1].tolist()): s.tolist() for s in sequences}
    assert passkey.accuracy(Oracle(answers=answers), STREAM, trials, 160, TOKENIZER, "cpu") == [True] * 4
    wrong = dict(answers)
    key = tuple(sequences[2][:-1].tolist())
    wrong[key] = answers[key][:-1] + [ord("0") if answers[key][-1] != ord("0") else ord("1")]   # last digit off
    assert passkey.accuracy(Oracle(answers=wrong), STREAM, trials, 160, TOKENIZER, "cpu") == [True, True, False, True]


def test_copy_pair_puts_an_exact_copy_d_tokens_back_and_unrelated_text_in_the_control():
    stream = torch.arange(10_000) % 251
    control, copy = copy_task.pair(stream, 300, 200)
    n = copy_task.LEAD + 200 + copy_task.SEGMENT
    original = stream[300: 300 + n]
    assert len(control) == len(copy) == n
    target = slice(n - copy_task.SEGMENT, n)
    stretch = slice(copy_task.LEAD, copy_task.LEAD + copy_task.SEGMENT)
    assert torch.equal(copy[target], original[target]) and torch.equal(control[target], original[target])
    assert torch.equal(copy[stretch], original[target])
    for i in range(n - copy_task.SEGMENT, n):
        assert copy[i] == copy[i - 200]                                          # each target token, d back
    assert torch.equal(control[stretch], stream[5300: 5300 + copy_task.SEGMENT])   # half the stream away
    for seq in (control, copy):                                                # only the stretch differs
        differs = (seq != original).nonzero().flatten()
        assert differs.min() >= copy_task.LEAD and differs.max() < copy_task.LEAD + copy_task.SEGMENT
    assert copy_task.unrelated_start(10_000, 9_000) == 4_000                   # before it where the stream ends


def test_copy_ratio_reads_one_for_a_model_of_local_context_at_every_distance():
    """A model that predicts from the last 47 tokens only (periodic text, period 47 < the 64-token
    stretch) uses no copy: the ratio is exactly 1.00, also at d = 64, where the stretch it reads from
    is replaced in both sequences. A control that kept the original text would favour it there."""
    period = torch.randperm(256, generator=torch.Generator().manual_seed(0))[:47]
    stream = period.repeat(401)                                                # 18,847 tokens; half is not a period multiple
    for distance in (64, 200):
        result = copy_task.copy_losses(Oracle(lag=47), stream, distance, 8, "cpu")
        assert result.ratio == pytest.approx(1.0, abs=1e-9), distance
    assert copy_task.copy_losses(Oracle(lag=47), stream, 64, 8, "cpu").loss_copy.mean() > 1.0   # not trivially 0 / 0


def test_copy_distances_fill_each_length():
    assert copy_task.distances([256, 1024, 4096]) == [(64, 192), (128, 256), (896, 1024), (3968, 4096)]
    assert copy_task.distances([32, 128]) == [(64, 192)]


def test_copy_ratio_shows_a_copier_at_its_distance_only():
    stream = torch.from_numpy(np.random.default_rng(0).integers(0, 256, 20_000))
    at = copy_task.copy_losses(Oracle(lag=500), stream, 500, 8, "cpu")
    assert at.ratio < 0.05                                                      # copies: loss collapses
    low, high = at.interval()
    assert low <= at.ratio <= high
    off = copy_task.copy_losses(Oracle(lag=501), stream, 500, 8, "cpu")
    assert off.ratio == pytest.approx(1.0, abs=0.02)                           # one token off: no help
