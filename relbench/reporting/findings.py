"""What one `relbench bench` found, in three lines, and how this machine's retrieval seeds sit among
a shipped panel's (relbench/panels, the committed result with several seeds per scheme).

One seed decides nothing between schemes (DESIGN.md, "What a number may claim"); what a fresh run can
do is check that this machine reproduces the committed result. So each scheme the run trained under
the panel's protocol is set beside the panel's learned seeds of the same scheme: the 95% prediction
interval for one more seed, mean ± t(0.975, n-1) · sqrt(sd² (1 + 1/n) + v) over the panel's n
learned seeds, where v is the variance of this seed's own trials (from its Wilson intervals: a scheme
whose panel seeds all read 0% still allows a fresh seed its binomial noise); Student's, the seeds'
summary numbers taken as roughly normal, clipped to [0, 1]. Each of this run's seeds is *within* it,
*above* or *below*. The answer the lines point to is the panel's:
its tiers, decided over its seeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from relbench.comparisons import t_quantile
from relbench.evaluation import decisions, reach
from relbench.runs import panels, results
from relbench.stats import summarize
from relbench.tasks import retrieval_tasks

PANEL = "retrieval"          # the shipped panel a bench's retrieval track is checked against
FINDINGS = "findings.md"     # where bench keeps its closing lines and the panel check


@dataclass(frozen=True)
class Check:
    """One scheme of this run beside the same scheme in the panel, on the panel's summary number."""
    variant: str
    here: dict[int, float]       # this run's learned seeds -> summary number
    noise: dict[int, float]      # this run's learned seeds -> the variance of its trials
    seeds_here: int              # this run's seeds of it, learned or not
    panel: dict[int, float]      # the panel's learned seeds -> summary number
    seeds_panel: int
    tier: str | None             # the panel's tier of it (None: fewer than two learned seeds there)

    def interval(self, seed: int | None = None) -> tuple[float, float] | None:
        """The 95% prediction interval for one more of the panel's seeds measured with the trials of this
        run's `seed` (None: without trial noise); None under two learned seeds in the panel."""
        return prediction_interval(list(self.panel.values()), self.noise.get(seed, 0.0))

    def verdict(self, seed: int) -> str:
        low, high = self.interval(seed) or (math.nan, math.nan)
        value = self.here[seed]
        return "within" if low <= value <= high else "above" if value > high else "below" if value < low else "-"

    def row(self) -> list[str]:
        panel = f"{decisions.mean_cell(self.panel)} ({len(self.panel)}/{self.seeds_panel} learned)" if self.panel \
            else f"not learned (0/{self.seeds_panel})"
        interval = self.interval()
        band = f"{interval[0]:.0%}-{interval[1]:.0%}" if interval else "- (under 2 learned seeds)"
        if not self.here:
            here, verdict = f"not learned (0/{self.seeds_here})", "-"
        else:
            here = ", ".join(f"{v:.0%}" for v in self.here.values()) + f" ({len(self.here)}/{self.seeds_here} learned)"
            verdict = ", ".join(self.verdict(s) for s in self.here) if interval else "-"
        return [self.variant, here, panel, band, self.tier or "-", verdict]


HEADER = ["scheme", "this run", "the panel (mean ± 95% over seeds)", "one more seed: 95% prediction*",
          "panel tier", "this run's seeds"]


def prediction_interval(values: list[float], trial_variance: float = 0.0) -> tuple[float, float] | None:
    """Where one more seed's value falls with 95% probability, from `values` (the panel's seeds) and the
    variance of the new seed's own trials; None under two values."""
    s = summarize(values)
    if s.n < 2:
        return None
    half = t_quantile(0.975, s.n - 1) * math.sqrt(s.std ** 2 * (1 + 1 / s.n) + trial_variance)
    return max(0.0, s.mean - half), min(1.0, s.mean + half)


def panel_checks(run_dir: Path, panel_dir: Path,
                 ours: dict[str, reach.Reach] | None = None) -> tuple[list[Check], decisions.Decisions]:
    """Each scheme of the retrieval run `run_dir` beside the panel's, on the panel's summary number
    (its task, its lengths beyond training); and the panel's decisions, whose tiers the checks carry.
    `ours`: the run's reach on that task when the caller has it already."""
    panel_config = results.read_json(panel_dir / results.CONFIG)
    task = panels.task_of(panel_config)
    table = panels.task_table(task)
    theirs = reach.run_reach(panel_dir, table)
    ours = reach.run_reach(run_dir, table) if ours is None else ours
    decided = decisions.decide(theirs, task, int(panel_config["model"]["train_length"]))
    top = decided.summary
    out = []
    for variant, mine in ours.items():
        values, noise = decisions.beyond_values({variant: mine}, decided.beyond)
        other = theirs.get(variant)
        there = decisions.beyond_values({variant: other}, decided.beyond)[0].get(variant, {}) if other else {}
        out.append(Check(variant, values.get(variant, {}), noise.get(variant, {}), len(mine.seeds), there,
                         len(other.seeds) if other else 0,
                         top.tiers.get(variant) if top is not None else None))
    return out, decided


def comparable(run_dir: Path, panel_dir: Path) -> str | None:
    """Why the run cannot be set beside the panel (its protocol differs: the first difference); None when it can."""
    ours, theirs = (results.read_json(Path(d) / results.CONFIG) for d in (run_dir, panel_dir))
    if ours.get("train", {}).get("task") != theirs.get("train", {}).get("task"):
        return f"it trained on {ours.get('train', {}).get('task')}, the panel on {theirs.get('train', {}).get('task')}"
    differs = panels.protocol_differences(theirs, ours)
    return differs[0] if differs else None


def lm_line(lm_dir: Path) -> str | None:
    """The language-model track in one line: each scheme's perplexity at 16x the training length over
    1x, lowest first (the first evaluation protocol); None without one."""
    from relbench.reporting import report

    if not (lm_dir / "extrapolation.csv").is_file():
        return None
    config = results.read_json(lm_dir / results.CONFIG)
    summary = report.aggregate(report.load_rows(lm_dir), config)
    far = 16 * int(config["model"]["train_length"])
    first = summary[(summary["protocol"] == summary["protocol"].iloc[0]) & (summary["length"] == far)
                    & (summary["status"] == "ok")]
    if first.empty:
        return None
    ratios = sorted((float(r.ratio_mean), str(r.variant)) for r in first.itertuples())
    shown = [f"{v} x{x:.2f}" for x, v in ratios]
    if len(shown) > 8:
        shown = shown[:4] + ["..."] + shown[-3:]
    seeds = len(config.get("seeds", [0]))
    return (f"Language models ({config.get('preset', 'custom')}, {seeds} seed(s)): perplexity at {far} (16x) over "
            f"{far // 16}, lowest first: {', '.join(shown)}.")


def run_task_reach(run_dir: Path) -> dict[str, reach.Reach]:
    """The reach of every variant of a retrieval run on its own task; empty for another run."""
    task = results.read_json(run_dir / results.CONFIG).get("train", {}).get("task")
    return reach.run_reach(run_dir, panels.task_table(task)) if task in {t.name for t in retrieval_tasks()} else {}


def retrieval_line(run_dir: Path, found: dict[str, reach.Reach] | None = None) -> str | None:
    """The retrieval track's reach in one line, schemes grouped by reach, the not learned named apart
    (`found`: run_task_reach's, when the caller has it)."""
    config = results.read_json(run_dir / results.CONFIG)
    task = config.get("train", {}).get("task")
    found = run_task_reach(run_dir) if found is None else found
    if not found:
        return None
    groups: dict[str, list[str]] = {}
    for variant, r in found.items():
        key = "not learned" if not r.competent else str(r.reach) if r.reach is not None else f"< {min(r.accuracy)}"
        groups.setdefault(key, []).append(variant)
    order = sorted((k for k in groups if k != "not learned"), key=lambda k: -int(k.lstrip("< ")))
    parts = [f"{k} {', '.join(groups[k])}" for k in order]
    if "not learned" in groups:
        parts.append(f"not learned at {config['model']['train_length']}: {', '.join(groups['not learned'])}")
    moments = int(config.get("train", {}).get("moments", 1) or 1)
    measured = f", each measured over {moments} moments" if moments > 1 else ""
    return (f"{task.capitalize()} ({len(config.get('seeds', [0]))} seed(s), trained to criterion at "
            f"{config['model']['train_length']}{measured}): reach (the longest length at >= 90%) {'; '.join(parts)}.")


def panel_line(checks: list[Check], label: str) -> str:
    """How this run's seeds sit among the panel's, and where the answer is."""
    placed = [(c, s) for c in checks if c.interval() for s in c.here]
    outside = [f"{c.variant} ({c.verdict(s)})" for c, s in placed if c.verdict(s) != "within"]
    ranked = sorted((c for c in checks if c.tier), key=lambda c: -summarize(list(c.panel.values())).mean)
    tiers = ", ".join(f"{c.variant} {c.tier}" for c in ranked)
    said = (f"{len(placed) - len(outside)} of this run's {len(placed)} learned seed(s) fall within the panel's 95% "
            f"prediction interval for one more seed" + (f" (outside: {', '.join(outside)})" if outside else ""))
    return (f"Against the shipped panel {label}: {said}. A seed or two decide little; the panel's seeds do: "
            f"tiers {tiers or '-'} (a shared letter: not shown different; README). Your own scheme: "
            f"relbench bench --plugin FILE --variants NAME --against {label}.")


def findings(lm_dir: Path | None, retrieval_dir: Path | None,
             panel: str = PANEL) -> tuple[list[str], tuple[list[str], list[list[str]]] | None]:
    """(the closing lines, the panel check's table or None): what a bench run found."""
    found = run_task_reach(retrieval_dir) if retrieval_dir else {}
    lines = [line for line in (lm_line(lm_dir) if lm_dir else None,
                               retrieval_line(retrieval_dir, found) if retrieval_dir else None) if line]
    if retrieval_dir is None:
        return lines, None
    label, panel_dir = panels.locate(panel)
    why = comparable(retrieval_dir, panel_dir)
    if why is not None:
        lines.append(f"Not set beside the shipped panel {label}: this run's protocol differs ({why}).")
        return lines, None
    checks, _ = panel_checks(retrieval_dir, panel_dir, found)
    lines.append(panel_line(checks, label))
    return lines, (HEADER, [c.row() for c in checks])


def write(run_dir: Path, lines: list[str], table: tuple[list[str], list[list[str]]] | None) -> Path:
    """findings.md in `run_dir`: the closing lines and the panel check, written whole (atomically)."""
    from relbench.reporting.report import markdown_table

    text = "# What this run found\n\n" + "\n\n".join(lines) + "\n"
    if table is not None:
        text += ("\n## This machine's seeds beside the shipped panel's\n\n" + markdown_table(*table) + "\n\n* the "
                 "panel's seeds' spread, without this run's trial noise (each seed's verdict adds it)\n")
    path = Path(run_dir) / FINDINGS
    results.atomic_write_text(path, text)
    return path

