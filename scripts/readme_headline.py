"""The README's headline table, computed from the committed results by relbench's own code, so that it
cannot drift from them: tests/test_docs.py fails while README.md holds another table.

    python scripts/readme_headline.py           # print the table
    python scripts/readme_headline.py --write   # replace the table in README.md

Rows: every scheme of results/retrieval in its tier table's order (passkey retrieval, the mean
accuracy over 4x-64x with its 95% interval over the seeds that learned, tiers from paired tests with
Holm's correction); beside it the seeds that learned, the passkey reach, and the MQAR reach of
results/mqar (over its learned seeds; "-" where MQAR was not run for that scheme).
"""

from __future__ import annotations

import sys
from pathlib import Path

import marked_block

from relbench.evaluation import decisions
from relbench.evaluation.reach import Reach, run_reach
from relbench.runs import results

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- headline: scripts/readme_headline.py -->", "<!-- /headline -->"


def train_length(run_dir: Path) -> int:
    return int(results.read_json(run_dir / results.CONFIG)["model"]["train_length"])


def reach_word(r: Reach | None) -> str:
    if r is None:
        return "-"
    if not r.competent:
        return "not learned"
    return str(r.reach) if r.reach is not None else f"< {min(r.accuracy)}"


def table(root: Path = ROOT) -> str:
    passkey = run_reach(root / "results" / "retrieval", "passkey.csv")
    mqar = run_reach(root / "results" / "mqar", "mqar.csv")
    decided = decisions.decide(passkey, "passkey", train_length(root / "results" / "retrieval"))
    _, rows = decisions.tier_table(decided, passkey)
    lines = [f"| scheme | tier | passkey, {decisions.summary_label(decided)} | seeds learned | passkey reach | "
             "MQAR reach |", "|---|---|---:|---:|---:|---:|"]
    for variant, tier, mean, learned, reach in rows:
        lines.append(f"| `{variant}` | {tier} | {mean} | {learned} | {reach} | {reach_word(mqar.get(variant))} |")
    return "\n".join(lines)


if __name__ == "__main__":
    marked_block.main(sys.argv[1:], ROOT / "README.md", BEGIN, END, table)
