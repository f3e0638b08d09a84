"""The task tables in the report (copy distance, passkey and MQAR reach) and a retrieval task's decisions:
its tiers (which open the report), what the seeds decide per length, the pairs left open, and every pair in
<task>_comparisons.csv (relbench/evaluation/decisions.py)."""

from __future__ import annotations

from pathlib import Path

from relbench.evaluation import decisions
from relbench.evaluation import reach as reach_module
from relbench.evaluation.reach import Reach
from relbench.reporting import overview
from relbench.runs import results


def tier_title(decided: decisions.Decisions) -> str:
    return (f"{decided.task}: tiers on the {decisions.summary_label(decided)} over the seeds that learned (schemes "
            f"that share a letter are not shown different: paired t-tests by seed, Holm-corrected at "
            f"{decided.alpha:.0%}); the mean with its 95% interval over seeds")


def decided_title(decided: decisions.Decisions) -> str:
    return (f"{decided.task}: what the seeds decide, per length (different: Holm-corrected paired t-test at "
            f"{decided.alpha:.0%}; equivalent: the 95% interval of the difference within +-{decided.margin:.0%}; "
            f"untested: fewer than two seeds learned in common)")


def add_sections(run_dir: Path, found: dict[str, Reach], task: str, train_length: int, margin: float,
                 tiered: list, sections: list, written: dict[str, Path]) -> None:
    """Decide `task` over `found` and add its tables: the tiers to `tiered`, the rest to `sections`,
    the pairwise CSV to `written`; nothing when no length beyond training was evaluated."""
    decided = decisions.decide(found, task, train_length, margin)
    if decided.summary is None:
        return
    tiered.append((tier_title(decided), *decisions.tier_table(decided, found)))
    sections.append((decided_title(decided), *decisions.decided_table(decided)))
    pairs = decisions.open_pairs_table(decided)
    if pairs is not None:
        sections.append((f"{task}: pairs not separated on the {decisions.summary_label(decided)}, largest "
                         "difference first", *pairs))
    written[f"{task}_comparisons"] = Path(run_dir) / f"{task}_comparisons.csv"
    results.write_csv(written[f"{task}_comparisons"], decisions.comparison_rows(decided))


def task_sections(run_dir: Path, tasks: list[tuple[str, str]], config: dict, margin: float, tiered: list,
                  written: dict[str, Path]) -> list:
    """The sections of the task tables `tasks` (file name, title) the run holds: copy distance, and each
    retrieval task's reach followed by its decisions (`add_sections`: the tiers go to `tiered`, the
    pairwise CSV to `written`)."""
    sections: list = []
    for name, title in tasks:
        if name == "copy.csv":
            sections.append((title, *overview.copy_table(results.read_csv(run_dir / name))))
        else:
            found = reach_module.run_reach(run_dir, name)
            if found:
                sections.append((title, *reach_module.reach_table(found, name.split(".")[0])))
                add_sections(run_dir, found, name.split(".")[0], int(config["model"]["train_length"]), margin,
                             tiered, sections, written)
    return sections
