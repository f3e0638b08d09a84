"""Training batches: a function of (seed, step) alone, every window start reachable, passkey trials
built and weighted as configured."""

import numpy as np
import torch

from relbench.config import TrainConfig
from relbench.data.tokenizer import ByteTokenizer
from relbench.tasks import passkey
from relbench.training.batches import lm_batch, training_batch, validation_batches

TEXT = torch.from_numpy(np.frombuffer(("Some training text without digits. " * 200).encode(), "uint8").copy())


def test_lm_batches_are_recomputable_and_reach_the_last_window():
    tokens = torch.arange(10) % 256
    starts = set()
    for step in range(200):
        x, y = lm_batch(tokens, step, seed=3, batch_size=4, length=8)
        assert torch.equal(y[:, :-1], x[:, 1:])
        starts |= set(x[:, 0].tolist())
        assert torch.equal(x, lm_batch(tokens, step, seed=3, batch_size=4, length=8)[0])
    assert starts == {0, 1}                                  # a window of 9 tokens fits at 0 and at 1 = 10 - 9


def test_passkey_batches_weight_the_answer_and_follow_the_curriculum():
    tokenizer = ByteTokenizer()
    config = TrainConfig(task="passkey", batch_size=6, answer_weight=5.0, text_weight=0.5, depth_curriculum=100)
    x, y, w = training_batch(TEXT, 10, config, 200, tokenizer)
    again = training_batch(TEXT, 10, config, 200, tokenizer)
    assert torch.equal(x, again[0]) and x.shape == (6, 200) and torch.equal(y[:, :-1], x[:, 1:])
    assert (w[:, -5:] == 5.0).all() and (w[:, :-5] == 0.5).all()
    for row in range(6):
        text = tokenizer.decode(torch.cat([x[row], y[row, -1:]]).numpy())
        assert text.endswith(passkey.QUESTION + text[-5:]) and text.count(text[-5:]) >= 3   # stated twice, answered
        # at step 10 of a 100-step curriculum the key sits in the last 10% of the filler, near the question
        room = 201 - passkey.min_length(tokenizer)
        assert text.index("The pass key is") >= round(0.9 * room) - 1
    late = training_batch(TEXT, 5000, config, 200, tokenizer)[0]
    assert not torch.equal(late, x)
    val = validation_batches(TEXT, TrainConfig(task="passkey", batch_size=3, eval_batches=2), 200, tokenizer)
    assert len(val) == 2 and val[0][0].shape == val[0][1].shape == (3, 200) and (val[0][2][:, -5:] == 1).all()
    assert torch.equal(val[0][0][:, 1:], val[0][1][:, :-1])                          # targets: the inputs shifted
