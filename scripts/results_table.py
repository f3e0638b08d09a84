"""docs/results.md's full table, computed from the committed results by relbench's own code, so that it
cannot drift from them: tests/test_docs.py fails while docs/results.md holds another table.

    python scripts/results_table.py           # print the table
    python scripts/results_table.py --write   # replace the table in docs/results.md

One row per scheme of any of the three results, in name order: the language models of results/reference
(perplexity at the training length, its ratio at the longest length in both protocols, the copy ratio
inside the training length and at the farthest distance: report.md's overview columns, means over the
seeds ± the half-width of their 95% interval); passkey of results/retrieval (seeds learned, steps to
learn, the mean accuracy over the learned seeds at each length, the reach with each seed's own); MQAR of
results/mqar (the reach with each seed's own, then the accuracy at each length). "-": not in that result.
"""

from __future__ import annotations

import sys
from pathlib import Path

import marked_block

from relbench.evaluation.reach import Reach, run_reach, steps_to_learn
from relbench.reporting import overview, report
from relbench.runs import results

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- full table: scripts/results_table.py -->", "<!-- /full table -->"
LM_COLUMNS = ("ppl at", "x at", "copy d=")


def language_models(run_dir: Path) -> tuple[list[str], dict[str, list[str]]]:
    """(headers, cells per variant) of the overview columns LM_COLUMNS of a language-model run."""
    config = results.read_json(run_dir / results.CONFIG)
    summary = report.aggregate(report.load_rows(run_dir), config)
    header, body = overview.overview(run_dir, summary, int(config["model"]["train_length"]))
    keep = [i for i, name in enumerate(header) if name.startswith(LM_COLUMNS)]
    return [header[i] for i in keep], {row[0]: [row[i] for i in keep] for row in body}


def accuracies(r: Reach, lengths: list[int]) -> str:
    """"100% / 93% / 41% / 21%": the mean over the learned seeds at each of `lengths` ("-" where it was not
    evaluated), or "-" without a learned seed."""
    if not r.learned_seeds:
        return "-"
    return " / ".join(f"{100 * r.accuracy[n]:.0f}%" if n in r.accuracy else "-" for n in lengths)


def lengths_of(found: dict[str, Reach]) -> list[int]:
    return sorted({length for r in found.values() for length in r.accuracy})


def table(root: Path = ROOT) -> str:
    lm_header, lm = language_models(root / "results" / "reference")
    passkey = run_reach(root / "results" / "retrieval", "passkey.csv")
    mqar = run_reach(root / "results" / "mqar", "mqar.csv")
    at, mqar_at = lengths_of(passkey), lengths_of(mqar)
    header = (["variant"] + lm_header + ["passkey: seeds learned", "steps to learn",
              f"passkey at {' / '.join(map(str, at))} (mean over learned seeds)", "passkey reach (per seed)",
              f"MQAR reach (per seed); accuracy at {' / '.join(map(str, mqar_at))}"])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for variant in sorted(set(lm) | set(passkey) | set(mqar)):
        row = [f"`{variant}`"] + lm.get(variant, ["-"] * len(lm_header))
        r = passkey.get(variant)
        row += ([f"{len(r.learned_seeds)}/{len(r.seeds)}", steps_to_learn(r), accuracies(r, at), r.cell()] if r is not None
                else ["-"] * 4)
        m = mqar.get(variant)
        row.append("-" if m is None else m.cell() + ("" if not m.learned_seeds else f"; {accuracies(m, mqar_at)}"))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    marked_block.main(sys.argv[1:], ROOT / "docs" / "results.md", BEGIN, END, table)
