"""Commands for a position scheme of the user's own: `relbench check` (the contract, property by
property) and `relbench new-variant` (a template that passes it as written)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from relbench import contract, positions
from relbench.cli.common import PluginFiles, app, console, use_plugins
from relbench.cli.templates import KINDS, template
from relbench.errors import RelbenchError, UsageError
from relbench.positions import plugins


def _target(target: str) -> tuple[str, list[str]]:
    """The variant `target` names, and the plugin variants it was chosen among: "mybias.py" (its one
    variant), "mybias.py:MyBias" (a class, or a registered name, of the file), or a registered name."""
    path, _, which = target.partition(":") if target.partition(":")[0].endswith(".py") else (target, "", "")
    if not path.endswith(".py"):
        positions.parse(target)             # a registered variant (a built-in or an installed plugin's)
        return target, []
    plugin = plugins.load_file(path)
    names = list(plugin.variants)
    if not names:
        raise UsageError(f"plugin {path} registers evaluation forms only ({', '.join(plugin.forms)}); check takes a "
                         f"variant")
    if which:
        by_class = {positions.get(n).__name__: n for n in names}
        if which in names or which in by_class:
            return (which if which in names else by_class[which]), names
        raise UsageError(f'plugin {path} has no variant or class "{which}"; it registers '
                         + ", ".join(f"{n} ({positions.get(n).__name__})" for n in names))
    if len(names) > 1:
        raise UsageError(f"plugin {path} registers {len(names)} variants ({', '.join(names)}): name one, e.g. "
                         f"`relbench check {path}:{names[0]}`")
    return names[0], names


@app.command("check")
def check_command(
    target: Annotated[str, typer.Argument(help="FILE.py (its one variant), FILE.py:Class (or :name), or the name of "
                                               "a registered variant, options included (\"xl:k=64\").")],
    only: Annotated[list[str] | None, typer.Option("--only", help="Run only these properties (as the table names "
                                                   "them).")] = None,
    plugin: PluginFiles = None,
) -> None:
    """Check a position scheme against the contract relbench's attention paths and commands rely on,
    property by property: shapes, queries as a suffix, causality inside a GPT, translation
    invariance where declared, each capability (declared or not) against behaviour, lengths beyond
    training, gradients, every attention backend it claims against the reference, initialisation
    inside a GPT and determinism per seed. Prints what each measured; exit 1 on a failure.

    Example: relbench check mybias.py
             relbench check mybias.py:MyBias
             relbench check alibi
    """
    use_plugins(plugin)
    spec, _ = _target(target)
    known = [name for name, _ in contract.PROPERTIES]
    for name in only or []:
        if name not in known:
            raise UsageError(f'unknown property "{name}"; the properties: {", ".join(known)}')
    contract.measure.cache_clear()
    started = time.perf_counter()
    findings = contract.run(spec, only)
    seconds = time.perf_counter() - started
    classes = ", ".join(f"{cls.__module__}.{cls.__name__}" for cls in positions.parse(spec).schemes)
    table = Table(title=f"Contract of {spec} ({classes})", title_justify="left")
    fixes = any(f.fix for f in findings)    # the fix column only where something failed
    for column in ("property", "result", "evidence", "fix")[: 4 if fixes else 3]:
        table.add_column(column, overflow="fold")
    for f in findings:
        result = "n/a" if f.passed is None else ("pass" if f.passed else "FAIL")
        table.add_row(escape(f.prop), result, escape(f.evidence), *([escape(f.fix)] if fixes else []))
    console.print(table)
    failed = [f.prop for f in findings if f.passed is False]
    applied = sum(f.passed is not None for f in findings)
    if failed:
        raise RelbenchError(f"{spec}: {len(failed)} of {applied} properties failed ({', '.join(failed)}) in "
                            f"{seconds:.0f} s")
    console.print(f"{spec}: all {applied} properties that apply hold ({len(findings) - applied} do not apply), "
                  f"{seconds:.0f} s", markup=False)


@app.command("new-variant")
def new_variant_command(
    name: Annotated[str, typer.Argument(help="The variant's name (lower case, digits, - and _), also the file's.")],
    kind: Annotated[str, typer.Option(help=f"What the template is: {', '.join(KINDS)} (bias: a learned function "
                                           "of the distance i - j; rotary: rotates q and k; data-dependent: a "
                                           "bias computed from the keys).")] = "bias",
    out: Annotated[Path | None, typer.Option("--out", help="The file to write (default: NAME.py here).")] = None,
    force: Annotated[bool, typer.Option(help="Overwrite the file if it exists.")] = False,
) -> None:
    """Write a documented, working position scheme to start from: it passes `relbench check` as
    written, and its comments say what to change.

    Example: relbench new-variant mybias && relbench check mybias.py
    """
    if not re.fullmatch(r"[a-z][a-z0-9_-]*", name):
        raise UsageError(f'variant name "{name}" must be lower case letters, digits, - and _, starting with a letter')
    if kind not in KINDS:
        from relbench.errors import unknown

        raise unknown("template kind", kind, list(KINDS))
    if name in positions.names():
        raise UsageError(f'"{name}" is already a registered variant; choose another name')
    path = out or Path(f"{name.replace('-', '_')}.py")
    if path.exists() and not force:
        raise UsageError(f"{path} exists; pass --force to overwrite it, or --out another file")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(template(name, kind), encoding="utf-8")
    console.print(f"wrote {path}: a {kind} scheme registered as {name}. Next:\n"
                  f"  relbench check {path}\n"
                  f"  relbench bench --plugin {path} --variants {name} --against retrieval   "
                  "(placed among the shipped panel)", markup=False)
