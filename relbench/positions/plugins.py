"""Position schemes from outside relbench: a file of the user's own (`--plugin mybias.py`, `plugins =
[...]` in an experiment file) or an installed package that declares an entry point in the group
`relbench.positions` (`pip install my-scheme` is enough). A plugin is an ordinary module: it
subclasses `PositionEncoding` (or `Form`) and decorates the class with `@register("name")` (or
`@register_form`), exactly as the built-in variants do; loading it registers them.

A run records each plugin it was trained with (`Plugin.record`: path, sha256, the names it
registered) in config.json; a command that reads the run later loads the same file and refuses, in
one line, one that is missing or has changed (`load_recorded`), unless told to accept the change.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relbench.errors import NameTaken, UsageError, one_line
from relbench.positions import base, forms

ENTRY_POINT_GROUP = "relbench.positions"
ENV = "RELBENCH_PLUGINS"   # the plugin files a child process (profile --memory) loads, os.pathsep-separated
TIMEOUT_ENV = "RELBENCH_PLUGIN_TIMEOUT"   # seconds a plugin's import may take (0: no limit)
DEFAULT_TIMEOUT = 60.0


class ImportTimeout(Exception):
    """A plugin's import ran past its time limit."""


def import_timeout() -> float:
    """The time limit of a plugin's import: RELBENCH_PLUGIN_TIMEOUT seconds, else 60."""
    text = os.environ.get(TIMEOUT_ENV, "")
    try:
        seconds = float(text) if text else DEFAULT_TIMEOUT
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise UsageError(f"{TIMEOUT_ENV} must be a number of seconds, 0 or more (0: no limit), got {text!r}")
    return seconds


@contextmanager
def time_limit(seconds: float, label: str) -> Iterator[None]:
    """Raise ImportTimeout in the block after `seconds` (a timer signal: POSIX, main thread only; elsewhere,
    and for 0, no limit). A plugin's import runs the user's code at module level, which may never return."""
    usable = seconds > 0 and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def expire(signum, frame) -> None:
        raise ImportTimeout(f"plugin {label} did not finish importing within {seconds:g} s: a plugin should only define "
                            f"and register its classes when imported; set {TIMEOUT_ENV}=SECONDS to wait longer")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class Plugin:
    path: str                       # the file, absolute ("" for an installed package's entry point)
    sha256: str                     # of the file's bytes ("" for an entry point)
    variants: tuple[str, ...]       # the variant names it registered
    forms: tuple[str, ...] = ()     # the evaluation-form names it registered
    entry_point: str = ""           # "name = module:attr" of an installed package
    distribution: str = ""          # that package, "name==version"

    @property
    def label(self) -> str:
        return self.path or f"{self.entry_point} ({self.distribution})"

    def record(self) -> dict[str, Any]:
        """What config.json and a checkpoint's meta keep of it."""
        out = {"variants": list(self.variants), "forms": list(self.forms)}
        if self.path:
            return {"path": self.path, "sha256": self.sha256, **out}
        return {"entry_point": self.entry_point, "distribution": self.distribution, **out}


@dataclass
class _Loaded:
    by_path: dict[str, Plugin] = field(default_factory=dict)
    installed: list[Plugin] | None = None

    def all(self) -> list[Plugin]:
        return list(self.by_path.values()) + list(self.installed or [])


_LOADED = _Loaded()


def builtin_names() -> set[str]:
    """The variant and form names relbench itself registers: every registered one no plugin brought."""
    brought = {n for p in _LOADED.all() for n in (*p.variants, *p.forms)}
    return (set(base.names()) | set(forms.form_names())) - brought


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _where(error: BaseException, path: Path) -> str:
    """"file:line" of the deepest frame of the traceback inside the plugin file (else the last frame)."""
    frames = traceback.extract_tb(error.__traceback__)
    mine = [f for f in frames if Path(f.filename).resolve() == path] or frames
    return f"{mine[-1].filename}:{mine[-1].lineno}" if mine else str(path)


def _import(label: str, run, resolved: Path | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Run `run()` (which imports the plugin) and return the variant and form names it registered; on
    any failure every name it registered is forgotten again and a one-line UsageError says why."""
    variants_before, forms_before = set(base.names()), set(forms.form_names())

    def rollback() -> None:
        for name in set(base.names()) - variants_before:
            base.unregister(name)
        for name in set(forms.form_names()) - forms_before:
            forms.unregister_form(name)

    try:
        with time_limit(import_timeout(), label):
            run()
    except ImportTimeout as error:
        rollback()
        raise UsageError(str(error)) from None
    except NameTaken as error:
        rollback()
        owner = "a built-in" if error.name in builtin_names() else "an already loaded plugin's"
        raise UsageError(f'plugin {label} registers "{error.name}", the name of {owner} {error.kind}: '
                         "give its @register another name") from None
    except UsageError as error:    # e.g. @register on a class that is not a PositionEncoding
        rollback()
        raise UsageError(f"plugin {label}: {error}") from None
    except BaseException as error:   # SyntaxError, ImportError, NameError ...: the plugin's own bug
        rollback()
        if isinstance(error, KeyboardInterrupt):
            raise
        where = f"{error.filename}:{error.lineno}" if isinstance(error, SyntaxError) else (
            _where(error, resolved) if resolved else label)
        message = one_line(str(error.msg if isinstance(error, SyntaxError) else error)) or "(no message)"
        raise UsageError(f"plugin {label} failed to import: {type(error).__name__}: {message} ({where})") from None
    variants = tuple(sorted(set(base.names()) - variants_before))
    added_forms = tuple(sorted(set(forms.form_names()) - forms_before))
    return variants, added_forms


def load_file(path: str | Path) -> Plugin:
    """Import a plugin file once (loading the same file again returns its first load) and return what
    it registered. Refused in one line: a missing file, one that is not Python, one that raises on
    import (its last traceback line, file:line), one that registers nothing, a name a built-in or
    another plugin already has, a registered class that is not a PositionEncoding (or Form)."""
    given = Path(path).expanduser()
    if not given.is_file():
        raise UsageError(f"plugin file {given} not found" if not given.exists() else f"plugin {given} is not a file")
    if given.suffix != ".py":
        raise UsageError(f"plugin {given} is not a Python file (.py)")
    resolved = given.resolve()
    sha = digest(resolved)
    known = _LOADED.by_path.get(str(resolved))
    if known is not None:
        if known.sha256 != sha:
            raise UsageError(f"plugin {resolved} changed after it was loaded in this process; run the command again")
        return known
    module_name = f"relbench_plugin_{resolved.stem}_{sha[:12]}"

    def run() -> None:
        spec = importlib.util.spec_from_file_location(module_name, resolved)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {resolved}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module    # dataclasses and pickling look the module up by name
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(module_name, None)
            raise

    variants, added_forms = _import(str(given), run, resolved)
    if not variants and not added_forms:
        raise UsageError(f"plugin {given} registers no position variant: decorate a PositionEncoding subclass with "
                         f'@register("NAME") (from relbench.positions import register); `relbench new-variant NAME` '
                         f"writes one that works")
    plugin = Plugin(str(resolved), sha, variants, added_forms)
    _LOADED.by_path[str(resolved)] = plugin
    return plugin


def load_files(paths: list[str | Path] | None) -> list[Plugin]:
    return [load_file(p) for p in paths or []]


def load_installed() -> list[Plugin]:
    """Load every entry point of the group `relbench.positions` (once per process): each names a
    module (or an object in one) whose import registers the package's variants."""
    if _LOADED.installed is not None:
        return _LOADED.installed
    found: list[Plugin] = []
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(point, "dist", None)
        distribution = f"{dist.name}=={dist.version}" if dist is not None else "?"
        label = f'entry point "{point.name} = {point.value}" of {distribution}'
        variants, added_forms = _import(label, point.load)
        found.append(Plugin("", "", variants, added_forms, f"{point.name} = {point.value}", distribution))
    _LOADED.installed = found
    return found


_COMMAND: dict[str, Any] = {"given": [], "accept_change": False}


def set_command_options(given: list[str | Path] | None, accept_change: bool = False) -> list[Plugin]:
    """A command's --plugin files (loaded now) and --accept-plugin-change, which `require_run`
    applies to the plugins a run it reads was trained with."""
    _COMMAND.update(given=list(given or []), accept_change=accept_change)
    return load_files(given)


def command_options() -> tuple[list[str | Path], bool]:
    return _COMMAND["given"], _COMMAND["accept_change"]


def forget() -> None:
    """Forget every plugin: unregister what each registered and drop the records (tests, and a
    process that must load a run's plugins afresh)."""
    for plugin in _LOADED.all():
        for name in plugin.variants:
            base.unregister(name)
        for name in plugin.forms:
            forms.unregister_form(name)
    _LOADED.by_path.clear()
    _LOADED.installed = None
    _COMMAND.update(given=[], accept_change=False)


def loaded() -> list[Plugin]:
    """Every plugin loaded in this process (files first, then installed packages)."""
    return _LOADED.all()


def of_variant(name: str) -> Plugin | None:
    """The plugin that registered variant `name` ("mybias" of "mybias:k=3"), or None for a built-in."""
    name = name.partition("@")[0].partition(":")[0].strip()
    return next((p for p in _LOADED.all() if name in p.variants), None)


def records_for(specs: list[str]) -> list[dict[str, Any]]:
    """The records of the plugins `specs` need, in load order, each once (a run records only these)."""
    needed = {id(p): p for p in (of_variant(s) for s in specs) if p is not None}
    return [p.record() for p in _LOADED.all() if id(p) in needed]


def load_recorded(records: list[dict[str, Any]], run_dir: Path, given: list[str | Path] | None = None,
                  accept_change: bool = False) -> list[dict[str, Any]]:
    """Load the plugins a run was trained with. `given` (--plugin) are loaded first: a file given
    there with the recorded sha256 stands in for a recorded one that moved. Returns the records as
    they are now (an accepted change carries the new sha256 and the old one under "previous");
    refuses in one line a recorded file that is missing or changed, saying how to go on."""
    extra = load_files(given)
    by_sha = {p.sha256: p for p in extra}
    out = []
    for record in records:
        if "entry_point" in record:
            installed = {p.entry_point: p for p in load_installed()}
            if record["entry_point"] not in installed:
                raise UsageError(f"run {run_dir} was trained with the installed plugin {record['entry_point']} "
                                 f"({record.get('distribution', '?')}), which is not installed now: install it")
            out.append(record)
            continue
        path = Path(record["path"])
        if record["sha256"] in by_sha:
            out.append(record)
            continue
        if not path.is_file():
            raise UsageError(f"run {run_dir} was trained with plugin {path} (sha256 {record['sha256'][:12]}), which is "
                             f"missing: restore it, or pass --plugin FILE if it moved")
        now = digest(path)
        if now != record["sha256"] and not accept_change:
            raise UsageError(f"plugin {path} changed since run {run_dir} was trained (sha256 {record['sha256'][:12]} "
                             f"then, {now[:12]} now): restore it, or pass --accept-plugin-change to use it as it "
                             f"is now (recorded in the run)")
        plugin = load_file(path)
        if now != record["sha256"]:
            record = {**record, "sha256": now, "previous": [*record.get("previous", []), record["sha256"]],
                      "variants": list(plugin.variants), "forms": list(plugin.forms)}
        out.append(record)
    return out
