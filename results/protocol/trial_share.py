"""How much of the spread of a scheme's seeds is the trials' (the lever "trials per cell").

For each scheme and length beyond training, over the learned seeds: the variance of the seeds'
accuracies, and the binomial variance the trials alone would give (p (1 - p) / n per seed, averaged).
Their ratio summed over schemes says what share more trials could remove at most.

    python results/protocol/trial_share.py results/retrieval [passkey.csv] [128]
"""

from __future__ import annotations

import sys

from relbench.evaluation import reach


def main(run: str, table: str = "passkey.csv", train_length: int = 128) -> None:
    found = reach.run_reach(run, table)
    rows = reach.accuracy_by_length(reach.results.read_csv(f"{run}/{table}"), "queries" if "mqar" in table else "trials")
    trials = {(r.variant, int(r.seed), int(r.length)): int(r.n) for r in rows.itertuples()}
    lengths = sorted({n for r in found.values() for s in r.learned_seeds for n in r.per_seed[s] if n > train_length})
    print("length | seeds' variance (mean over schemes) | trials' variance | trials' share")
    for n in lengths:
        seed_var, trial_var = [], []
        for v, r in found.items():
            values = [(s, r.per_seed[s][n]) for s in r.learned_seeds if n in r.per_seed[s]]
            if len(values) < 2:
                continue
            mean = sum(a for _, a in values) / len(values)
            seed_var.append(sum((a - mean) ** 2 for _, a in values) / (len(values) - 1))
            trial_var.append(sum(a * (1 - a) / trials[(v, s, n)] for s, a in values) / len(values))
        total_seed, total_trial = sum(seed_var) / len(seed_var), sum(trial_var) / len(trial_var)
        print(f"{n // train_length}x | {total_seed:.4f} (sd {total_seed ** 0.5:.3f}) | {total_trial:.4f} "
              f"(sd {total_trial ** 0.5:.3f}) | {total_trial / total_seed:.0%}")


if __name__ == "__main__":
    main(*sys.argv[1:2], *sys.argv[2:3], *(int(x) for x in sys.argv[3:4]))
