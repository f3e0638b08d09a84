"""One optimisation step of training, shared by `relbench train`, `relbench finetune`, the dry run
and the benchmarks: the learning-rate schedule, the optimiser's parameter groups (the position
parameters with their own multiplier), the (weighted) loss and this process's part of it under
torchrun, the validation loss, and forward + backward + clipping of one batch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from relbench import positions
from relbench.config import TrainConfig
from relbench.model import GPT
from relbench.runs import distributed
from relbench.training.stopping import Diverged


def lr_at(step: int, config: TrainConfig, consolidate_from: int | None = None) -> float:
    """Linear warm-up to the peak, then cosine decay to peak * min_lr_ratio at the last step; with
    `decay_steps` the rate holds at the peak until the last decay_steps steps and decays over them
    (warm-up, stable, decay), so a run that stops before them never sees the decay.

    `consolidate_from`: the step at which a run trained to criterion met it; from there the rate
    decays (cosine) over `consolidate_steps` steps from the rate it had to peak * consolidate_lr_ratio
    (or holds, if it was already lower); with `moments` it holds at the rate it had."""
    if consolidate_from is not None and step >= consolidate_from:
        start = lr_at(consolidate_from - 1, config) if consolidate_from > 0 else config.lr
        floor = start if config.moments > 1 else min(start, config.lr * config.consolidate_lr_ratio)
        progress = min(1.0, (step - consolidate_from) / max(1, config.consolidate_steps - 1))
        return floor + 0.5 * (start - floor) * (1 + math.cos(math.pi * progress))
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    start = config.steps - config.decay_steps if config.decay_steps else config.warmup_steps
    if step < start:
        return config.lr
    span = max(1, config.steps - start - 1)
    progress = min(1.0, (step - start) / span)
    floor = config.lr * config.min_lr_ratio
    return floor + 0.5 * (config.lr - floor) * (1 + math.cos(math.pi * progress))


def position_lr(spec: str, config: TrainConfig) -> tuple[float, str]:
    """The learning-rate multiplier of `spec`'s position parameters and where it comes from: the
    spec's own option ("xl:position_lr_scale=10"), else the run-wide --position-lr-scale, else the
    variant's entry in `position_lr_scales` (a sweep's choice, `relbench tune-lr`), else 1."""
    parsed = positions.parse(spec)
    if parsed.position_lr_scale is not None:
        return float(parsed.position_lr_scale), "variant option"
    if config.position_lr_scale is not None:
        return float(config.position_lr_scale), "run option"
    for key in parsed.scale_keys:
        if key in config.position_lr_scales:
            return float(config.position_lr_scales[key]), "tuned"
    return 1.0, "default"


def make_optimizer(model: GPT, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on weight matrices only. Position parameters are not decayed and
    learn `config.position_lr_scale` times faster (1 when unset; see `position_lr`)."""
    position = list(model.positions.parameters())
    position_ids = {id(p) for p in position}
    decay = [p for p in model.parameters() if p.dim() >= 2 and id(p) not in position_ids]
    rest = [p for p in model.parameters() if p.dim() < 2 and id(p) not in position_ids]
    groups = [{"params": decay, "weight_decay": config.weight_decay, "lr_scale": 1.0},
              {"params": rest, "weight_decay": 0.0, "lr_scale": 1.0},
              {"params": position, "weight_decay": 0.0, "lr_scale": config.position_lr_scale or 1.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=config.lr, betas=(0.9, 0.95), eps=1e-8)


def optimizer_step(model: GPT, optimizer: torch.optim.Optimizer) -> None:
    """One optimiser step, then the position schemes' constraints (projected gradient descent)."""
    optimizer.step()
    model.project_parameters()


def weighted_loss(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None,
                  reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of logits (B, L, V) against targets (B, L): the mean, or with (B, L) weights the
    weighted mean (reduction "sum": the weighted sum)."""
    nll = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")
    if weights is not None:
        nll = nll * weights.flatten().to(nll.device)
    total = nll.sum()
    if reduction == "sum":
        return total
    return _divide(total, loss_denominator(targets, weights))


def loss_denominator(targets: torch.Tensor, weights: torch.Tensor | None) -> int | torch.Tensor:
    """What the sum of a batch's (weighted) losses is divided by for its mean: the number of
    predictions (an int), or the sum of their weights (a tensor)."""
    return targets.numel() if weights is None else weights.sum()


def _divide(total: torch.Tensor, denominator: int | torch.Tensor) -> torch.Tensor:
    # an int divides as a scalar, as the loss always has (CUDA divides by a scalar through its reciprocal)
    return total / (denominator.to(total.device) if isinstance(denominator, torch.Tensor) else denominator)


def rank_loss(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor | None,
              denominator: int | torch.Tensor) -> torch.Tensor:
    """This process's part of the global batch's mean loss: the (weighted) sum over its rows divided
    by the WHOLE batch's `denominator`, so that the parts add up to the global mean even when the
    ranks' rows carry different weight sums (a mean per rank, averaged, would not). In one process
    it is the batch's mean, computed exactly as `weighted_loss` computes it."""
    return _divide(weighted_loss(logits, targets, weights, reduction="sum"), denominator)


@torch.no_grad()
def validation_loss(model: GPT, batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]],
                    device: torch.device) -> float:
    """The (weighted) mean loss over fixed validation batches. Under torchrun each rank scores its
    share of every batch and the sums are added up (in float64), so every rank gets the same value."""
    model.eval()
    total, count = 0.0, 0.0
    for inputs, targets, weights in batches:
        inputs, targets = distributed.share(inputs).to(device), distributed.share(targets).to(device)
        weights = distributed.share(weights)
        total += float(weighted_loss(model(inputs), targets, weights, reduction="sum"))
        count += float(loss_denominator(targets, weights))
    model.train()
    total, count = distributed.sum_all(torch.tensor([total, count], dtype=torch.float64, device=device)).tolist()
    return total / count


def forward_backward(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                     weights: torch.Tensor | None, device: torch.device, config: TrainConfig,
                     step: int, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward, backward and gradient clipping of this rank's share of step `step`'s global batch
    (x, y, weights: the whole batch, on every rank); returns the batch's mean loss, the same on
    every rank, which is why all raise Diverged together when it is not finite (before backward),
    and the gradient norm before clipping. `positions` (B, L): the sequences' randomized positions
    (VARIANT:random_positions=N), shared out as the batch is; None: 0 .. L - 1."""
    inputs, targets = distributed.share(x).to(device), distributed.share(y).to(device)   # (B / world, L)
    given = {} if positions is None else {"positions": distributed.share(positions).to(device)}
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.precision == "bf16"):
        logits = model(inputs, **given)                                        # (B / world, L, V)
    part = rank_loss(logits, targets, distributed.share(weights), loss_denominator(y, weights))
    loss = distributed.sum_all(part)
    if not torch.isfinite(loss):
        raise Diverged(step, loss.item())
    optimizer.zero_grad(set_to_none=True)
    # DDP averages the ranks' gradients; world x each part makes that average the batch mean's gradient
    (part * distributed.world()).backward()
    return loss, torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
