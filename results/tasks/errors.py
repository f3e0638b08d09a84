"""Where a needles or tracking model errs (results/tasks/README.md, the attempts), at the training
length on fresh seeded trials (not the evaluation's), teacher-forced as the evaluator scores them:

- needles: each answer by whether a distractor needle stands between the asked one and the question
  (a nearer distractor), each wrong answer by whether it is a distractor's value (a needle found,
  not the asked one) or another; and each wrong digit of the others by its place and whether a
  distractor has that digit there (a digit borrowed from another needle); and every digit after
  the first by whether the digit before it recurs in a distractor's value (an induction head on one
  token then has two candidates) and, where it does, whether the model gave the digit that follows
  it there;
- tracking: each asked variable by hop, each wrong one by whether it is the distractor chain's
  variable of the same hop, another letter of a distractor chain, a letter of the asked chain (out of
  order), or another letter.

    python results/tasks/errors.py runs/n5/run/checkpoints/xl-seed0 --trials 200

If the errors are the nearer distractor's, the model reads the right form but lets the nearer statement
win: position against content.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from relbench.data import load_run_splits
from relbench.runs import checkpoints, results
from relbench.tasks import needles, tracking


def predicted(model, tokens: np.ndarray, positions: np.ndarray, tokenizer) -> list[str]:
    """The text of the argmax at each of `positions` (input indices), the window's last token left out."""
    with torch.no_grad():
        best = model(torch.from_numpy(tokens[None, :-1]))[0].argmax(-1)
    return [tokenizer.decode([int(best[p])]) for p in positions]


def needles_errors(model, stream, length, tokenizer, count, n_digits, distinct=False) -> Counter:
    table: Counter = Counter()
    for trial in needles.trials(stream.size, length, [k for k in needles.AXIS if k], count, n_digits, 7, distinct):
        tokens, answer, _ = needles.sequence(stream, trial, length, tokenizer)
        got = "".join(predicted(model, tokens, np.arange(length)[answer], tokenizer))
        others = [v for j, v in enumerate(trial.values) if j != trial.asked]
        kind = "right" if got == trial.values[trial.asked] else \
            "a distractor's value" if got in others else "another value"
        nearer = "a distractor nearer" if trial.asked < len(trial.names) - 1 else "none nearer"   # window order
        table[(f"{trial.distractors} distractors, {nearer}", kind)] += 1
        induction(table, trial, got, others)
        if kind == "another value":   # digit by digit (teacher-forced: each digit after the right ones)
            for place, (mine, want) in enumerate(zip(got, trial.values[trial.asked])):
                if mine != want:
                    borrowed = any(v[place] == mine for v in others)
                    table[(f"{trial.distractors} distractors, a wrong digit", f"digit {place + 1}, "
                           + ("a distractor's there" if borrowed else "no needle's there"))] += 1
    return table


def induction(table: Counter, trial, got: str, others: list[str]) -> None:
    """Each digit after the first by whether the digit before it (right: teacher-forced) stands in a
    distractor's value too, followed there by another digit: where it does, a head that copies what
    followed the previous token (an induction head) has two candidates. Counts the digit right, the
    digit that follows it in a distractor, or another."""
    want = trial.values[trial.asked]
    for place in range(1, len(want)):
        after = {v[i + 1] for v in others for i in range(len(v) - 1) if v[i] == want[place - 1]} - {want[place]}
        case = "the digit before recurs in a distractor" if after else "the digit before in no distractor"
        kind = "right" if got[place] == want[place] else "what follows it there" if got[place] in after else "another"
        table[(f"{trial.distractors} distractors, digit {place + 1}, {case}", kind)] += 1


def tracking_errors(model, stream, length, tokenizer, count, chains, digits=tracking.DIGITS,
                    text_digits=False) -> Counter:
    table: Counter = Counter()
    for trial in tracking.trials(stream.size, length, list(tracking.HOPS), count, chains, 7, digits, text_digits):
        tokens, targets, _ = tracking.sequence(stream, trial, length, tokenizer)
        for j, got in enumerate(predicted(model, tokens, targets, tokenizer)):
            same_hop = {names[j] for names in trial.names[1:]}
            other = {n for names in trial.names[1:] for n in names}
            kind = "right" if got == trial.names[0][j] else "the distractor's of this hop" if got in same_hop \
                else "another distractor letter" if got in other else \
                "the asked chain's, out of order" if got in trial.names[0] else "another"
            table[(f"{trial.hops} hops, variable {j}", kind)] += 1
    return table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path, help="a checkpoint folder: RUN/checkpoints/VARIANT-seedN")
    parser.add_argument("--trials", type=int, default=200, help="trials per condition")
    args = parser.parse_args()
    config = results.read_json(args.folder.parent.parent / results.CONFIG)
    splits = load_run_splits(config)
    model = checkpoints.load_model(args.folder)
    length, options = int(config["model"]["train_length"]), config["train"].get("task_options") or {}
    task, stream, tokenizer = config["train"]["task"], splits.validation, splits.tokenizer
    if task == "needles":
        table = needles_errors(model, stream, length, tokenizer, args.trials, int(options.get("digits", needles.DIGITS)),
                               bool(options.get("distinct", False)))
    elif task == "tracking":
        table = tracking_errors(model, stream, length, tokenizer, args.trials,
                                int(options.get("distractors", tracking.DISTRACTORS)) + 1,
                                int(options.get("digits", tracking.DIGITS)), bool(options.get("text_digits", False)))
    else:
        raise SystemExit(f"{args.folder} was trained on {task}; this script reads needles and tracking models")
    digits = {c for c, _ in table if c.endswith("a wrong digit")}
    places = {c for c, _ in table if ", digit " in c}
    for conditions, what in ((sorted({c for c, _ in table} - digits - places), "answers"),
                             (sorted(digits), "wrong digits"), (sorted(places), "digits")):
        kinds = sorted({k for c, k in table if c in conditions}, key=lambda k: (k != "right", k))
        print(f"condition | {what} | " + " | ".join(kinds))
        for condition in conditions:
            total = sum(table[(condition, k)] for k in kinds)
            print(f"{condition} | {total} | " + " | ".join(f"{table[(condition, k)] / total:.0%}" for k in kinds))


if __name__ == "__main__":
    main()
