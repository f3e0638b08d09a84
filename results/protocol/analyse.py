"""Compare training protocols on what they let a result decide (the decisive-comparisons issue).

Each protocol is one or more run directories (the workers of explore.py, or merged) evaluated with
`relbench extrapolate --task passkey`. Per protocol and family (each length beyond training, and the
mean accuracy over them), over the seeds present in every protocol for a scheme (so protocols are
compared on the same models' seeds): the sd of a scheme's seeds (pooled), the sd of the schemes'
means, their ratio, the share of pairs decided and its parts, and per scheme the seeds' values.

    python results/protocol/analyse.py criterion=results/protocol/w1/criterion,results/protocol/w2/criterion \
        consolidated=results/protocol/w1/consolidated,results/protocol/w2/consolidated \
        committed=results/retrieval --pair=criterion,consolidated --pair=committed,criterion

A protocol named by a committed result (results/retrieval: the criterion protocol on other hosts)
paired with the criterion protocol here measures what the host's float order moves.
"""

from __future__ import annotations

import sys

from relbench import comparisons as cmp
from relbench.evaluation import decisions, reach


def reaches_of(folders: list[str], task: str) -> dict[str, reach.Reach]:
    out = {}
    for folder in folders:
        out.update(reach.run_reach(folder, f"{task}.csv"))
    return out


def restricted(found: dict[str, reach.Reach], seeds: dict[str, set[int]]) -> dict[str, reach.Reach]:
    """Each scheme's Reach with only the seeds in `seeds[scheme]`."""
    out = {}
    for v, r in found.items():
        keep = [s for s in r.seeds if s in seeds.get(v, set())]
        out[v] = reach.Reach(v, keep, {s: r.learned[s] for s in keep}, per_seed={s: r.per_seed[s] for s in keep},
                             interval={s: r.interval[s] for s in keep}, reach=r.reach,
                             unsupported_beyond=r.unsupported_beyond)
    return out


def main(argv: list[str]) -> None:
    task = "passkey"
    protocols, pairs = {}, []
    for arg in argv:
        if arg.startswith("--task="):
            task = arg.split("=", 1)[1]
            continue
        if arg.startswith("--pair="):
            pairs.append(arg.split("=", 1)[1].split(","))
            continue
        name, folders = arg.split("=", 1)
        protocols[name] = reaches_of(folders.split(","), task)
    train_length = 128 if task == "passkey" else 64
    schemes = set.intersection(*(set(p) for p in protocols.values()))
    seeds = {v: set.intersection(*(set(p[v].per_seed) for p in protocols.values())) for v in schemes}
    print(f"schemes: {sorted(schemes)}; seeds per scheme: { {v: sorted(s) for v, s in sorted(seeds.items())} }")
    for name, found in protocols.items():
        found = restricted({v: r for v, r in found.items() if v in schemes}, seeds)
        decided = decisions.decide(found, task, train_length)
        print(f"\n## {name}")
        print("family | sd within | sd between | between/within | decided | different | equivalent | not separated")
        for key, f in decided.families.items():
            within, between = cmp.spread(f.values)
            label = "mean beyond" if key == decisions.SUMMARY else f"{key // train_length}x"
            print(f"{label} | {within:.3f} | {between:.3f} | {between / within:.2f} | {f.decided:.0%} | "
                  f"{f.count(cmp.DIFFERENT)} | {f.count(cmp.EQUIVALENT)} | {f.count(cmp.NOT_SEPARATED)}")
        print("tiers (mean beyond):", decided.summary.tiers if decided.summary else "-")
        for v in sorted(found):
            r = found[v]
            cells = []
            for n in decided.beyond:
                cells.append(f"{n // train_length}x " + "/".join(f"{r.per_seed[s].get(n, float('nan')):.0%}"
                                                               for s in r.learned_seeds))
            steps = [r.learned[s].learned_step for s in r.learned_seeds]
            print(f"  {v}: learned {len(r.learned_seeds)}/{len(r.seeds)} at {steps}; " + "; ".join(cells))
    for a, b in pairs:
        paired({n: restricted({v: r for v, r in p.items() if v in schemes}, seeds) for n, p in protocols.items()},
               a, b, task, train_length)


def paired(protocols: dict[str, dict[str, reach.Reach]], a: str, b: str, task: str, train_length: int) -> None:
    """The same models' seeds under two protocols (or hosts): per family, the mean and sd of b - a over
    every (scheme, seed) both learned, against the seeds' own sd within a scheme under each."""
    schemes = set(protocols[a]) & set(protocols[b])
    print(f"\n## {b} - {a}, paired by scheme and seed")
    print("family | pairs | mean b - a | sd of b - a | sd within a | sd within b")
    decided = {name: decisions.decide({v: protocols[name][v] for v in schemes}, task, train_length) for name in (a, b)}
    for key in decided[a].families:
        if key not in decided[b].families:
            continue
        fa, fb = decided[a].families[key], decided[b].families[key]
        diffs = [fb.values[v][s] - fa.values[v][s] for v in fa.values if v in fb.values
                 for s in set(fa.values[v]) & set(fb.values[v])]
        if len(diffs) < 2:
            continue
        mean = sum(diffs) / len(diffs)
        sd = (sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)) ** 0.5
        label = "mean beyond" if key == decisions.SUMMARY else f"{key // train_length}x"
        print(f"{label} | {len(diffs)} | {mean:+.3f} | {sd:.3f} | {cmp.spread(fa.values)[0]:.3f} | "
              f"{cmp.spread(fb.values)[0]:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
