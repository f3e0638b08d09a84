"""`relbench inspect`: the diagnostics people ask for when a position bias does not help.

For every trained variant (one seed), on the first window of the test split:
- how large the position bias is next to the content logits q.k/sqrt(d), per layer and head. Both
  are measured as the standard deviation across the keys a query can see, averaged over queries:
  that is the spread the softmax acts on (a term constant along a row changes nothing);
- how far attention reaches: the mean distance sum_j p_ij (i - j), averaged over queries, per
  layer and head, at the training length and at 16x it;
- the gradient norm that reached each position parameter at the last training step (after
  clipping), recorded by `relbench train`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from relbench.model import GPT
from relbench.runs import checkpoints, rundir

INSPECT_CSV = "inspect.csv"


def _row_spread(values: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Per head: std over the visible keys of each query row, averaged over rows. values (B, H, L, L)."""
    count = visible.sum(-1).clamp(min=1)                                        # (L,)
    masked = values.masked_fill(~visible, 0.0)
    mean = masked.sum(-1) / count                                               # (B, H, L)
    var = ((values - mean[..., None]) ** 2).masked_fill(~visible, 0.0).sum(-1) / count
    return var.sqrt()[..., 1:].mean(dim=(0, -1))                                # (H,), row 0 has one key


@torch.no_grad()
def attention_layers(model: GPT, tokens: torch.Tensor, reduce):
    """Run `model` on tokens (B, L) through its own forward (reference attention) and call
    reduce(layer, logits, bias, weights) per layer, with the pre-softmax content logits q.k/sqrt(d) of
    shape (B, H, L, L), the position bias broadcastable to them, or None, and the attention weights of a
    scheme that replaces the softmax (stick-breaking), or None (the softmax of logits + bias); returns
    the list of results. One layer's (B, H, L, L) tensors live at a time."""
    out = []

    def observe(layer: int, q: torch.Tensor, k: torch.Tensor, plan) -> None:
        logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])              # (B, H, L, L)
        weights = model.position(layer).attention_weights(q, k)
        out.append(reduce(layer, logits, None if plan is None else plan.full(), weights))

    model(tokens, observe=observe, backend="reference")
    return out


def attention_logit_max(model: GPT, tokens: torch.Tensor) -> float:
    """The largest |logit| (content + position bias) any query gives any key it can see: the
    quantity that explodes first when training diverges."""
    was_training = model.training
    model.eval()
    L = tokens.shape[-1]
    visible = torch.ones(L, L, dtype=torch.bool, device=tokens.device).tril()

    def layer_max(_, logits, bias, _weights) -> float:
        total = logits if bias is None else logits + bias
        return float(total.masked_fill(~visible, 0).abs().max())

    largest = max(attention_layers(model, tokens, layer_max))
    model.train(was_training)
    return largest


@torch.no_grad()
def layer_statistics(model: GPT, tokens: torch.Tensor) -> list[dict[str, Any]]:
    """Per layer and head, for one window `tokens` (1, L): bias and logit spread, mean distance."""
    model.eval()
    L = tokens.shape[-1]
    visible = torch.ones(L, L, dtype=torch.bool, device=tokens.device).tril()   # (L, L)
    distance = torch.arange(L, device=tokens.device)[:, None] - torch.arange(L, device=tokens.device)[None, :]

    def per_head(layer, logits, bias, weights) -> list[dict[str, Any]]:
        bias = torch.zeros_like(logits) if bias is None else bias.expand_as(logits)
        probs = torch.softmax((logits + bias).masked_fill(~visible, float("-inf")), dim=-1) if weights is None else weights
        reach = (probs * distance).sum(-1).mean(dim=(0, -1))                     # (H,)
        logit_spread, bias_spread = _row_spread(logits, visible), _row_spread(bias, visible)
        return [{"layer": layer, "head": head, "logit_spread": float(logit_spread[head]),
                 "bias_spread": float(bias_spread[head]),
                 "bias_to_logit": float(bias_spread[head] / logit_spread[head].clamp(min=1e-12)),
                 "mean_distance": float(reach[head])} for head in range(logits.shape[1])]

    return [row for rows in attention_layers(model, tokens, per_head) for row in rows]


HARD_WINDOW_NATS = 30.0  # a key whose position term is this far below its row's best gets < 1e-13 of the
                        # weight whatever its content logit: beyond it, the head cannot see


@torch.no_grad()
def window_diagnostics(model: GPT, tokens: torch.Tensor) -> dict[str, float]:
    """How far a trained model looks, on windows `tokens` (B, L) at the training length: the mean
    attention distance sum_j p_ij (i - j) (over queries, heads and layers), the largest |logit|
    (content + position), and the heads whose position term alone closes a hard window inside L:
    for the last query of a window, the smallest distance from which every key's position term is
    HARD_WINDOW_NATS or more below the row's largest (so no content logit can reach it)."""
    model.eval()
    L = tokens.shape[-1]
    visible = torch.ones(L, L, dtype=torch.bool, device=tokens.device).tril()
    distance = (torch.arange(L, device=tokens.device)[:, None] - torch.arange(L, device=tokens.device)[None, :]).float()
    limits: list[int] = []

    def layer_window(_, logits, bias, weights) -> tuple[float, float, int]:
        bias_full = torch.zeros_like(logits) if bias is None else bias.expand_as(logits).float()
        total = (logits + bias_full).masked_fill(~visible, float("-inf"))
        probs = torch.softmax(total, -1) if weights is None else weights
        reach = float((probs * distance).sum(-1).mean())
        largest = float((logits + bias_full).masked_fill(~visible, 0).abs().max())
        last = bias_full[..., -1, :]                                                 # (B, H, L): the last query's row
        drop = last.max(-1, keepdim=True).values - last >= HARD_WINDOW_NATS           # (B, H, L) over keys 0..L-1
        # key j sits at distance L-1-j: hidden from distance d on means keys 0 .. L-1-d all hidden
        hidden_prefix = drop.long().cumprod(-1).bool()                                # (B, H, L)
        rows = hidden_prefix.flatten(0, 1)
        limits.extend(L - int(row.sum()) for row in rows if bool(row[0]))            # distances it can still see
        return reach, largest, rows.shape[0]

    layers = attention_layers(model, tokens, layer_window)
    reach, heads = [r for r, _, _ in layers], sum(n for _, _, n in layers)
    largest = max(m for _, m, _ in layers)
    return {"mean_distance": sum(reach) / len(reach), "max_logit": largest, "hard_heads": len(limits) / max(1, tokens.shape[0]),
            "heads": heads / max(1, tokens.shape[0]), "hard_window": float(min(limits)) if limits else float("nan")}


def inspect_run(run_dir: Path, specs: list[str], seed: int, lengths: list[int], test: torch.Tensor,
                device: torch.device) -> pd.DataFrame:
    out = []
    for spec in specs:
        folder = rundir.checkpoint_dir(run_dir, spec, seed)
        model = checkpoints.load_model(folder, device)
        grads = (checkpoints.read_meta(folder) or {}).get("summary", {}).get("position_grad_norms")
        for length in lengths:
            base = {"variant": spec, "seed": seed, "length": length}
            if model.max_length is not None and length > model.max_length:
                out.append({**base, "status": "unsupported"})
                continue
            tokens = test[:length].long()[None].to(device)
            out += [{**base, "status": "ok", **row} for row in layer_statistics(model, tokens)]
        for name, norm in (grads or {}).items():
            out.append({"variant": spec, "seed": seed, "status": "ok", "parameter": name, "grad_norm": norm})
    return pd.DataFrame(out)


def tables(frame: pd.DataFrame, lengths: list[int]) -> list[tuple[str, list[str], list[list[str]]]]:
    """One table per variant: layer/head rows; bias-to-logit ratio and mean distance per length."""
    out = []
    stats = frame[frame["status"] == "ok"].dropna(subset=["head"]) if "head" in frame else frame.iloc[0:0]
    for variant, mine in stats.groupby("variant", sort=False):
        header = ["layer", "head"] + [f"bias/logit L={n}" for n in lengths] + [f"mean distance L={n}" for n in lengths]
        body = []
        for (layer, head), rows in mine.groupby(["layer", "head"]):
            by_length = rows.set_index("length")
            ratio = [f"{by_length.loc[n, 'bias_to_logit']:.3f}" if n in by_length.index else "-" for n in lengths]
            reach = [f"{by_length.loc[n, 'mean_distance']:.1f}" if n in by_length.index else "-" for n in lengths]
            body.append([str(int(layer)), str(int(head))] + ratio + reach)
        out.append((f"{variant}: position bias vs content logits (row spread), and how far attention reaches",
                    header, body))
    if "grad_norm" in frame:
        grads = frame.dropna(subset=["grad_norm"])
        if not grads.empty:
            out.append(("Gradient norm reaching position parameters at the last step (after clipping)",
                        ["variant", "parameter", "grad norm"],
                        [[r.variant, r.parameter, f"{r.grad_norm:.3e}"] for r in grads.itertuples()]))
    return out
