"""Copy distance: does the model use a copy of the text it must predict, d tokens back?

For each trial, a stretch of test text ends in a 64-token target segment. The "copy" sequence puts
an exact copy of the target d tokens before it (over the text that stood there, after 65 tokens of
lead-in); the "control" sequence puts 64 tokens of unrelated text there instead (from half the
stream away), so the two differ only in whether that stretch is a copy: both lose the original text
the same way. Both are scored on the target's predictions after its first token (whose copy has the
same preceding token, so an induction-style lookup can use it). A ratio loss(copy) / loss(control)
well below 1 says the model looks d tokens back and copies; 1.00 says it does not use that context
at all, whatever its perplexity. (A control that kept the original text there read 1.03-1.06 at
d = 64 for models that copy nothing: they lose the text right before the target, not a copy.)

The distances: the copy right before the target (d = 64), and for each evaluated length L the
farthest copy a window of L holds (d = L - 128), so the "copy" row at L reads L tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from relbench.tasks.base import Task, register_task

SEGMENT = 64
LEAD = SEGMENT + 1        # text before the copy: a copy at the very start would have no context
TASK = register_task(Task("copy", "copy.csv", ("variant", "seed", "distance", "trials"), None,
                          "loss with an earlier copy of the text / with unrelated text there, per distance"))


@dataclass(frozen=True)
class CopyResult:
    loss_copy: np.ndarray   # (trials,) mean loss on the target with the earlier copy
    loss_control: np.ndarray  # (trials,) with unrelated text in its place

    @property
    def ratio(self) -> float:
        return float(self.loss_copy.sum() / self.loss_control.sum())

    def interval(self, samples: int = 1000, seed: int = 0) -> tuple[float, float]:
        """95% bootstrap interval of the ratio over trials (paired: a trial's two losses move together)."""
        n = len(self.loss_copy)
        picks = np.random.default_rng(seed).integers(0, n, size=(samples, n))
        ratios = self.loss_copy[picks].sum(1) / self.loss_control[picks].sum(1)
        low, high = np.percentile(ratios, [2.5, 97.5])
        return float(low), float(high)


def distances(lengths: list[int]) -> list[tuple[int, int]]:
    """(distance, input length) pairs: the adjacent copy, and the farthest copy each length holds."""
    out = {SEGMENT: LEAD + 2 * SEGMENT - 1}
    for length in lengths:
        d = length + 1 - LEAD - SEGMENT
        if d > SEGMENT:
            out[d] = length
    return sorted(out.items())


def trial_starts(stream_size: int, length: int, trials: int) -> list[int]:
    """Offsets of the trials' text, spread evenly over the stream (the same for every variant)."""
    last = stream_size - (length + 1)
    return np.linspace(0, max(0, last), trials + 2)[1:-1].round().astype(int).tolist()


def unrelated_start(stream_size: int, start: int) -> int:
    """Where a trial's control text comes from: half the stream away (after it, or before it where the
    stream ends), so it lies outside the trial's window whenever the window is under half the stream."""
    other = start + stream_size // 2
    return other if other + SEGMENT <= stream_size else start - stream_size // 2


def pair(stream: torch.Tensor, start: int, distance: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The control and the copy sequence ((length + 1,) tokens each) of one trial: the original text
    with its stretch at LEAD replaced by unrelated text, and by the target."""
    original = stream[start: start + LEAD + distance + SEGMENT]
    control, copy = original.clone(), original.clone()
    other = unrelated_start(stream.numel(), start)
    control[LEAD: LEAD + SEGMENT] = stream[other: other + SEGMENT]
    copy[LEAD: LEAD + SEGMENT] = original[-SEGMENT:]
    return control, copy


@torch.no_grad()
def copy_losses(model, stream: torch.Tensor, distance: int, trials: int, device,
                max_batch_tokens: int = 16384) -> CopyResult:
    """Per trial, the mean loss on the target's last SEGMENT - 1 predictions, with the copy and with the control."""
    model.eval()
    length = LEAD + distance + SEGMENT - 1
    starts = trial_starts(stream.numel(), length, trials)
    per_batch = max(1, max_batch_tokens // length)
    losses = {"control": [], "copy": []}
    for b in range(0, len(starts), per_batch):
        pairs = [pair(stream, s, distance) for s in starts[b: b + per_batch]]
        for which, tokens in (("control", [p for p, _ in pairs]), ("copy", [c for _, c in pairs])):
            tokens = torch.stack(tokens).to(device)                                        # (B, length + 1)
            logits = model(tokens[:, :-1])[:, -(SEGMENT - 1):]                            # (B, SEGMENT - 1, V)
            nll = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, -(SEGMENT - 1):].flatten(),
                                  reduction="none").view(len(pairs), -1)
            losses[which] += nll.double().mean(1).cpu().tolist()
    return CopyResult(np.array(losses["copy"]), np.array(losses["control"]))
