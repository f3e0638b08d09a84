"""What a retrieval result decides between schemes: per length and for one summary number, every
pair of schemes compared over the seeds both learned (relbench/comparisons.py), the share of pairs
decided, tiers, and the spread within schemes against the spread between them.

Competence first: only the seeds that learned the task at the training length count (evaluation/
reach.py); a scheme with none has no tier ("not learned"), one with a single learned seed cannot be
tested (it is counted among the pairs, undecided). A scheme that cannot run beyond its training
length (a learned table of positions) counts 0% there. Each seed's value carries the binomial noise
of its trials, which bounds from below the spread a paired test may assume (comparisons.paired_test).

The summary number of a seed is its mean accuracy over the evaluated lengths beyond the training
length (4x-64x for the retrieval preset): with lengths spaced evenly in log length, the area under
accuracy against log length over that range, which does not hinge on a threshold as reach does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from relbench import comparisons as cmp
from relbench.evaluation.reach import Reach
from relbench.stats import summarize

SUMMARY = "beyond"   # the family of the summary number, beside the families of each length
PROJECTED_SEEDS = (10, 20)   # the decided table projects the share decided at these seeds per scheme


@dataclass
class Family:
    """One set of values decided together: a length, or the summary number."""
    key: str | int
    values: dict[str, dict[int, float]]          # scheme -> learned seed -> value
    comparisons: list[cmp.Comparison]
    tiers: dict[str, str]
    noise: dict[str, dict[int, float]] = field(default_factory=dict)   # scheme -> seed -> its trials' variance

    @property
    def decided(self) -> float:
        return cmp.decided_fraction(self.comparisons)

    def count(self, decision: str) -> int:
        return sum(c.decision == decision for c in self.comparisons)

    def projected(self, seeds: int) -> float:
        """The share of pairs decided with `seeds` seeds per scheme if every difference and spread held as
        observed: those decided now and those not separated whose seeds_needed is at most `seeds`
        (optimistic: a difference measured on few seeds tends to be larger than the true one)."""
        if not self.comparisons:
            return math.nan
        more = sum(c.decision == cmp.NOT_SEPARATED and c.seeds_needed is not None and c.seeds_needed <= seeds
                   for c in self.comparisons)
        return self.decided + more / len(self.comparisons)


@dataclass
class Decisions:
    task: str
    train_length: int
    beyond: list[int]                            # the lengths the summary number averages
    margin: float
    alpha: float
    families: dict[str | int, Family] = field(default_factory=dict)

    @property
    def summary(self) -> Family | None:
        return self.families.get(SUMMARY)


Z95 = 1.959964   # a Wilson 95% interval spans about 2 z sd of its trials' binomial noise


def measured(r: Reach, seed: int, length: int) -> tuple[float, float] | None:
    """A learned seed's accuracy at `length` and the variance of its trials (from the width of its
    Wilson interval); (0, 0) where the scheme cannot run (a learned table of positions beyond its
    length retrieves nothing there); None where it was not evaluated."""
    value = r.per_seed.get(seed, {}).get(length)
    if value is None:
        cannot = r.unsupported_beyond and r.reach is not None and length > r.reach
        return (0.0, 0.0) if cannot else None
    low, high = r.interval.get(seed, {}).get(length, (value, value))
    return value, ((high - low) / (2 * Z95)) ** 2


Measured = tuple[dict[str, dict[int, float]], dict[str, dict[int, float]]]   # (values, their variances)


def seed_values(reaches: dict[str, Reach], length: int) -> Measured:
    """Per scheme with a learned seed, its learned seeds' accuracy at `length` and the variance of
    each (seeds not evaluated there left out)."""
    values, noise = {}, {}
    for v, r in reaches.items():
        if r.competent:
            found = {s: m for s in r.learned_seeds if (m := measured(r, s, length)) is not None}
            values[v] = {s: m[0] for s, m in found.items()}
            noise[v] = {s: m[1] for s, m in found.items()}
    return values, noise


def beyond_lengths(reaches: dict[str, Reach], train_length: int) -> list[int]:
    """The lengths beyond training that any learned seed was evaluated at."""
    return sorted({n for r in reaches.values() for s in r.learned_seeds for n in r.per_seed.get(s, {})
                   if n > train_length})


def beyond_values(reaches: dict[str, Reach], lengths: list[int]) -> Measured:
    """Per scheme with a learned seed, each learned seed's mean accuracy over `lengths` and its
    variance (a seed not evaluated at one of them left out)."""
    values, noise = {}, {}
    for v, r in reaches.items():
        if r.competent and lengths:
            found = {s: [measured(r, s, n) for n in lengths] for s in r.learned_seeds}
            found = {s: m for s, m in found.items() if None not in m}
            values[v] = {s: sum(x for x, _ in m) / len(m) for s, m in found.items()}
            noise[v] = {s: sum(var for _, var in m) / len(m) ** 2 for s, m in found.items()}
    return values, noise


def family(key: str | int, measured_values: Measured, margin: float, alpha: float) -> Family:
    values, noise = measured_values
    comparisons = cmp.compare_all(values, margin, alpha, noise)
    return Family(key, values, comparisons, cmp.tiers(values, comparisons), noise)


def decide(reaches: dict[str, Reach], task: str, train_length: int, margin: float = cmp.MARGIN,
           alpha: float = cmp.ALPHA) -> Decisions:
    """Every family of a task's result: each evaluated length beyond training, and the summary number."""
    lengths = beyond_lengths(reaches, train_length)
    out = Decisions(task, train_length, lengths, margin, alpha)
    if lengths:
        out.families[SUMMARY] = family(SUMMARY, beyond_values(reaches, lengths), margin, alpha)
    for n in lengths:
        out.families[n] = family(n, seed_values(reaches, n), margin, alpha)
    return out


def multiple(length: int, train_length: int) -> str:
    return f"{length // train_length}x" if length % train_length == 0 else str(length)


def summary_label(decisions: Decisions) -> str:
    b = decisions.beyond
    span = multiple(b[0], decisions.train_length) + (f"-{multiple(b[-1], decisions.train_length)}" if len(b) > 1 else "")
    return f"mean accuracy {span}"


def mean_cell(values: dict[int, float]) -> str:
    s = summarize(list(values.values()))
    if s.n == 0:
        return "-"
    return f"{s.mean:.0%}" + (f" ±{s.half_width:.0%}" if s.n > 1 else " (1 seed)")


def tier_table(decisions: Decisions, reaches: dict[str, Reach]) -> tuple[list[str], list[list[str]]]:
    """The result's answer, tiers first: per scheme its tier on the summary number (schemes that share a
    letter are not shown different), the summary number's mean and 95% interval over the learned seeds,
    the seeds that learned, and reach. Rows by mean, highest first (the letters, not the order, say what
    is separated); the schemes with no tier last."""
    top = decisions.summary
    header = ["variant", "tier", f"{summary_label(decisions)} (over learned seeds)", "learned", "reach"]
    rows = []
    for variant, r in reaches.items():
        values = top.values.get(variant, {}) if top and r.competent else {}
        tier = top.tiers.get(variant, "too few seeds") if values else ("not learned" if not r.competent else "-")
        reach = str(r.reach) if r.reach is not None else ("-" if not r.competent else f"< {min(r.accuracy)}")
        mean = summarize(list(values.values())).mean if values else math.nan
        lettered = variant in (top.tiers if top else {})
        order = (not lettered, -mean if mean == mean else math.inf)
        rows.append((order, [variant, tier, mean_cell(values) if values else "-",
                             f"{len(r.learned_seeds)}/{len(r.seeds)}", reach]))
    rows.sort(key=lambda row: row[0])
    return header, [row[1] for row in rows]


def decided_table(decisions: Decisions) -> tuple[list[str], list[list[str]]]:
    """Per family: pairs, how many are different, equivalent, not separated, untested, the share decided,
    and the spread of a scheme's seeds against the spread of the schemes' means."""
    header = ["family", "schemes", "pairs", "different", "equivalent", "not separated", "untested", "decided",
              f"if the differences held: decided at {' / '.join(map(str, PROJECTED_SEEDS))} seeds",
              "sd within / between schemes"]
    body = []
    for key, f in decisions.families.items():
        within, between = cmp.spread(f.values)
        label = summary_label(decisions) if key == SUMMARY else f"at {multiple(int(key), decisions.train_length)}"
        body.append([label, str(len(f.values)), str(len(f.comparisons)), str(f.count(cmp.DIFFERENT)),
                     str(f.count(cmp.EQUIVALENT)), str(f.count(cmp.NOT_SEPARATED)), str(f.count(cmp.UNTESTED)),
                     f"{f.decided:.0%}" if f.comparisons else "-",
                     " / ".join(f"{f.projected(n):.0%}" for n in PROJECTED_SEEDS) if f.comparisons else "-",
                     f"{within:.2f} / {between:.2f}" if within == within else "-"])
    return header, body


def comparison_rows(decisions: Decisions) -> pd.DataFrame:
    """Every pair of every family, as the CSV keeps them."""
    out: list[dict[str, Any]] = []
    for key, f in decisions.families.items():
        for c in f.comparisons:
            t = c.test
            out.append({"task": decisions.task, "family": str(key), "a": c.a, "b": c.b,
                        "seeds": t.n if t else len(set(f.values[c.a]) & set(f.values[c.b])),
                        "mean_difference": t.mean if t else math.nan, "sd_difference": t.std if t else math.nan,
                        "low": t.low if t else math.nan, "high": t.high if t else math.nan,
                        "p": t.p if t else math.nan, "p_holm": c.p_adjusted, "decision": c.decision,
                        "seeds_to_separate": c.seeds_needed if c.seeds_needed is not None else math.nan,
                        "margin": decisions.margin, "alpha": decisions.alpha})
    return pd.DataFrame(out)


def open_pairs_table(decisions: Decisions, limit: int = 12) -> tuple[list[str], list[list[str]]] | None:
    """The summary family's pairs not separated, largest difference first, with the seeds that would
    separate each difference as observed; None when every pair is decided."""
    top = decisions.summary
    if top is None:
        return None
    pairs = sorted((c for c in top.comparisons if c.decision == cmp.NOT_SEPARATED),
                   key=lambda c: -abs(c.test.mean))
    if not pairs:
        return None
    header = ["pair", "difference (95% interval)", "seeds", "Holm p", "seeds that would separate it"]
    body = [[f"{c.a} - {c.b}", f"{c.test.mean:+.0%} ({c.test.low:+.0%}, {c.test.high:+.0%})", str(c.test.n),
             f"{c.p_adjusted:.3f}", str(c.seeds_needed) if c.seeds_needed is not None else "more than 1000"]
            for c in pairs[:limit]]
    if len(pairs) > limit:
        body.append([f"... {len(pairs) - limit} more", "", "", "", ""])
    return header, body


def placement(decisions: Decisions, variant: str) -> str:
    """One line: where `variant` stands among the other schemes on the summary number: its tier (from every
    pair of the result), its mean, and which schemes it is different from, equivalent to and not separated
    from, decided with its own pairs as the family (comparisons.compare_one: Holm over the schemes it is
    compared with, the claims this line makes)."""
    top = decisions.summary
    label = summary_label(decisions) if decisions.beyond else "lengths beyond training"
    if top is None or variant not in top.values or not top.values[variant]:
        return f"{variant}: not learned in any seed, so it has no place on the {label}"
    groups: dict[str, list[str]] = {}
    mine = cmp.compare_one(top.values, variant, decisions.margin, decisions.alpha, top.noise)
    for c in mine:
        sign = "" if c.test is None or c.decision != cmp.DIFFERENT else (" (above)" if c.test.mean > 0 else " (below)")
        groups.setdefault(c.decision, []).append(c.b + sign)
    parts = [f"{variant}: tier {top.tiers.get(variant, '- (too few seeds)')} on the {label} (among all "
             f"{len(top.comparisons)} pairs), {mean_cell(top.values[variant])} over {len(top.values[variant])} "
             f"learned seed(s); against each of the {len(mine)} other schemes (Holm over these {len(mine)} pairs)"]
    words = {cmp.DIFFERENT: "different from", cmp.EQUIVALENT: "equivalent to", cmp.NOT_SEPARATED: "not separated from",
             cmp.UNTESTED: "untested against (under two seeds in common)"}
    parts += [f"{words[d]} " + ", ".join(sorted(groups[d])) for d in words if groups.get(d)]
    return "; ".join(parts)
