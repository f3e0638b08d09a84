"""A generated block of a Markdown page: the lines between two HTML comments, which a script computes
from the committed results (scripts/readme_headline.py, scripts/results_table.py) and tests/test_docs.py
compares with what is committed. The scripts import it from their own folder (Python puts a script's
folder first on its path; the tests put it there)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path


def replace(page: str, begin: str, end: str, new: str) -> str:
    """`page` with the lines between `begin` and `end` replaced by `new`; exits naming the markers when
    the page has no such block."""
    pattern = re.compile(re.escape(begin) + r"\n(?:.*?\n)?" + re.escape(end), re.S)
    if not pattern.search(page):
        raise SystemExit(f"no {begin} ... {end} block to replace")
    return pattern.sub(lambda _: f"{begin}\n{new}\n{end}", page)


def main(argv: list[str], path: Path, begin: str, end: str, table: Callable[[], str]) -> None:
    """Print the table; with --write, also put it in `path` between the markers."""
    new = table()
    if "--write" in argv:
        path.write_text(replace(path.read_text(encoding="utf-8"), begin, end, new), encoding="utf-8")
    print(new)
