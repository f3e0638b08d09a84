"""The documentation stays true to the repository: every relative link in README.md and docs/
resolves (the file, and the heading when the link names one), and every `relbench ...` command
they show parses against the real command line (its command and options exist and take the
values given; nothing runs)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.main import get_command

from relbench.cli import app
from relbench.cli.group import is_click_error, spread_variadic

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, fenced = set(), False
    for line in path.read_text().splitlines():
        fenced ^= line.startswith("```")
        match = None if fenced else re.match(r"^#+ (.*)", line)
        if match:
            found.add(slug(match.group(1)))
    return found


def outside_code(text: str) -> str:
    """The text without fenced code blocks and inline code (links there are examples)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def dead_links(page: Path) -> list[str]:
    dead = []
    for target in LINK.findall(outside_code(page.read_text())):
        if re.match(r"^[a-z]+:", target):     # http:, https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists():
            dead.append(f"{page.name}: {target} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            dead.append(f"{page.name}: {target} (no such heading)")
    return dead


def commands(page: Path) -> list[str]:
    """Every `relbench ...` command of a page: the lines of its code blocks and its inline code."""
    text, found = page.read_text(), []
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            for part in re.split(r"&&|\|", line.split("  #")[0]):
                part = part.strip().removeprefix("$ ")
                part = re.sub(r"^([A-Z_]+=\S+ )+", "", part)     # OMP_NUM_THREADS=1 relbench ...
                if part.startswith("relbench "):
                    found.append(part)
    found += [c for c in re.findall(r"`(relbench [^`]+)`", outside_code_blocks(text)) if c != "relbench ..."]
    return found


def outside_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def parse(command: str) -> str | None:
    """Parse `command` as the relbench entry point would, without running it (click's contexts
    check the command, every option and each value's type): None, or click's message."""
    args = spread_variadic(shlex.split(command)[1:])
    group = get_command(app)
    if len(args) == 1 and not args[0].startswith("-"):     # `relbench finetune` named in prose: the command exists
        return None if args[0] in group.list_commands(None) else f"No such command '{args[0]}'"
    try:
        with group.make_context("relbench", list(args), resilient_parsing=False) as ctx:
            protected = getattr(ctx, "_protected_args", None) or getattr(ctx, "protected_args", [])
            rest = [*protected, *ctx.args]
            if rest:
                name, sub, remaining = group.resolve_command(ctx, rest)
                sub.make_context(name, remaining, parent=ctx)
    except Exception as error:
        if type(error).__name__ == "Exit":     # --help
            return None
        if not is_click_error(error):
            raise
        return " ".join(error.format_message().split())
    return None


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_resolves(page):
    assert dead_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_command_shown_parses(page):
    failures = [f"{command}: {message}" for command in commands(page) if (message := parse(command))]
    assert failures == []


def test_the_checks_fail_on_a_dead_link_and_a_bad_command(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\nSee [there](missing.md), [here](#title), [nowhere](#gone).\n\n"
                    "```bash\nrelbench train --no-such-option 3\nrelbench train --steps 5\n```\n")
    assert dead_links(page) == ["page.md: missing.md (no such file)", "page.md: #gone (no such heading)"]
    assert commands(page) == ["relbench train --no-such-option 3", "relbench train --steps 5"]
    assert "No such option: --no-such-option" in parse("relbench train --no-such-option 3")
    assert "No such command" in parse("relbench trian")
    assert "Invalid value for '--steps'" in parse("relbench train --steps five")
    assert parse("relbench finetune") is None and parse("relbench trian") is not None
    assert parse("relbench train --steps 5 --variants xl t5") is None


def test_every_image_in_the_readme_and_docs_exists():
    for page in PAGES:
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", outside_code(page.read_text())):
            assert (page.parent / target).is_file(), f"{page.name}: {target}"


def test_the_readme_is_short_and_its_headline_is_the_committed_results_own(monkeypatch):
    """A newcomer's page: at most 150 lines, and its headline table, at most six columns, exactly what
    scripts/readme_headline.py computes from results/ now (rerun it with --write after a regeneration)."""
    import importlib.util

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))     # the scripts import marked_block from their folder
    spec = importlib.util.spec_from_file_location("readme_headline", ROOT / "scripts" / "readme_headline.py")
    headline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(headline)
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    table = headline.table()
    assert f"{headline.BEGIN}\n{table}\n{headline.END}" in readme
    assert table.splitlines()[0].count("|") - 1 <= 6
    import marked_block

    assert marked_block.replace(readme.replace(table, "| stale |"), headline.BEGIN, headline.END, table) == readme


def test_the_full_results_table_is_the_committed_results_own(monkeypatch):
    """docs/results.md's table of every track is exactly what scripts/results_table.py computes from
    results/ now (rerun it with --write after a regeneration): one row per scheme of the three results,
    in name order, with every column it names."""
    import importlib.util

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location("results_table", ROOT / "scripts" / "results_table.py")
    full = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(full)
    page = (ROOT / "docs" / "results.md").read_text()
    table = full.table()
    assert f"{full.BEGIN}\n{table}\n{full.END}" in page
    rows = table.splitlines()[2:]
    names = [row.split("|")[1].strip().strip("`") for row in rows]
    assert names == sorted(names) and {"alibi", "rope", "xl", "t5", "none"} <= set(names)
    assert all(row.count("|") == table.splitlines()[0].count("|") for row in rows)
