"""MQAR layouts on relbench's GPT without filler text: the experiment behind attempts 30-31
(attempts.jsonl), which found why the first MQAR layout was never learned.

    teacher  the first layout of relbench/tasks/mqar.py: k1 v1 .. kn vn, pad, then the query block
             ka va kb vb .., each value the next input (teacher forcing), so a later query sees
             which values were asked already
    masked   the layout relbench ships now: the same, with a pad in place of each queried value
    zoology  Zoology's multiquery_ar: k1 v1 .. kn vn, then pad with the query keys at random even
             offsets; a value is the label at its key, never an input

Keys are the bytes 128-191, values 192-255 (the byte tokenizer's alphabet), the pad a space. The
model, optimiser (AdamW as relbench trains, weight decay 0.1 on matrices, gradient clip 1) and
initialisation are relbench's; the learning rate is constant after 200 warm-up steps. Accuracy is
over the queries of 512 fixed sequences, every 250 steps; it stops at 99%.

    OMP_NUM_THREADS=1 python results/retrieval/mqar_layouts.py masked alibi --pairs 8 --length 64
"""

import argparse
import json
import time

import numpy as np
import torch
import torch.nn.functional as F

from relbench.config import ModelConfig, TrainConfig
from relbench.model import GPT
from relbench.training.step import make_optimizer

KEYS, VALUES, PAD = np.arange(128, 192), np.arange(192, 256), ord(" ")


def batch(rng: np.random.Generator, count: int, layout: str, n: int, length: int):
    """Inputs, targets and loss weights (count, length): weight 1 at each query key, whose target is its value."""
    x = np.full((count, length), PAD, dtype=np.int64)
    y = np.full((count, length), PAD, dtype=np.int64)
    w = np.zeros((count, length), dtype=np.float32)
    for r in range(count):
        keys, values = rng.choice(KEYS, n, replace=False), rng.choice(VALUES, n)
        order = rng.permutation(n)
        x[r, 0:2 * n:2], x[r, 1:2 * n:2] = keys, values
        if layout == "zoology":
            slots = np.sort(rng.choice((length - 2 * n) // 2, n, replace=False))
            asked = 2 * n + 2 * slots
        else:
            asked = length - 2 * n + 1 + 2 * np.arange(n)          # the query block ends the window
            asked = asked[asked < length]
        x[r, asked] = keys[order][:len(asked)]
        if layout == "teacher":
            after = asked + 1
            x[r, after[after < length]] = values[order][:len(asked)][after < length]
        y[r, :-1] = x[r, 1:]                                      # next token ...
        y[r, asked] = values[order][:len(asked)]                  # ... but a value at each query key
        w[r, asked] = 1.0
    return torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(w)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("layout", choices=["teacher", "masked", "zoology"])
    parser.add_argument("variant")
    for name, default in (("pairs", 8), ("length", 64), ("d_model", 128), ("heads", 2), ("batch", 64),
                          ("steps", 10_000), ("seed", 0)):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    parser.add_argument("--lr", type=float, default=1e-3)
    a = parser.parse_args()
    torch.manual_seed(a.seed)
    model = GPT(ModelConfig(vocab_size=256, d_model=a.d_model, n_layers=2, n_heads=a.heads, train_length=a.length,
                            position=a.variant), seed=a.seed)
    optimizer = make_optimizer(model, TrainConfig(lr=a.lr))
    rng = np.random.default_rng(a.seed)
    vx, vy, vw = batch(np.random.default_rng(999), 512, a.layout, a.pairs, a.length)
    log, started = [], time.time()
    for step in range(1, a.steps + 1):
        for group in optimizer.param_groups:
            group["lr"] = a.lr * min(1.0, step / 200) * group.get("lr_scale", 1.0)
        x, y, w = batch(rng, a.batch, a.layout, a.pairs, a.length)
        model.train()
        loss = (F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="none") * w.flatten()).sum() / w.sum()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 250 == 0:
            model.eval()
            with torch.no_grad():
                accuracy = float(((model(vx).argmax(-1) == vy).float() * vw).sum() / vw.sum())
            log.append([step, round(accuracy, 3)])
            print(step, round(float(loss.detach()), 3), round(accuracy, 3), f"{time.time() - started:.0f}s", flush=True)
            if accuracy >= 0.99:
                break
    print(json.dumps({**vars(a), "steps": step, "seconds": round(time.time() - started), "log": log}))


if __name__ == "__main__":
    main()
