"""The registry that names a kind of class (position variants, evaluation forms) and the typed
"key=value" options of a spec, shared by positions/base.py and positions/forms.py."""

from __future__ import annotations

import inspect
import math
from typing import Any

from relbench.errors import NameTaken, UsageError, one_line, unknown


class Registry:
    """Named classes of one kind (position variants; evaluation forms in positions/forms.py): a class
    decorator that registers, the sorted names, and a lookup that refuses an unknown name in one line."""

    def __init__(self, kind: str):
        self.kind = kind
        self._classes: dict[str, type] = {}
        self.base: type | None = None      # what every registered class must subclass (set once it exists)

    def register(self, name: str):
        def decorate(cls):
            if self.base is not None and not (isinstance(cls, type) and issubclass(cls, self.base)):
                raise UsageError(f'@register("{one_line(name)}") decorates {getattr(cls, "__name__", cls)!r}, '
                                 f"which is not a subclass of {self.base.__name__}")
            if name in self._classes:
                raise NameTaken(self.kind, name)
            cls.name = name
            self._classes[name] = cls
            return cls

        return decorate

    def unregister(self, name: str) -> None:
        """Forget `name` (a plugin whose import failed halfway, a test's own variant)."""
        self._classes.pop(name, None)

    def names(self) -> list[str]:
        return sorted(self._classes)

    def get(self, name: str) -> type:
        try:
            return self._classes[name]
        except KeyError:
            raise unknown(self.kind, name, self.names()) from None


def parse_options(text: str, allowed: dict[str, inspect.Parameter], spec: str, where: str, label: str) -> dict[str, Any]:
    """The typed options of "key=value,key=value" (`text`, from `spec`), each a parameter in `allowed`:
    a missing value ("... `where` needs a value"), an unknown key (`label`, with the allowed ones) and a
    bad value are each refused in one line."""
    options: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq:
            raise UsageError(f'option "{one_line(item)}" {where} needs a value: write {key}=VALUE')
        if key not in allowed:
            raise unknown(label, key, sorted(allowed) or ["(none)"])
        options[key] = convert_option(raw.strip(), allowed[key], spec)
    return options


def _annotated(annotation: Any) -> type:
    """bool, int or float when an annotation (a type, or a string under postponed evaluation) names
    one of them, else str."""
    names = annotation.replace(" ", "").split("|") if isinstance(annotation, str) else [getattr(annotation, "__name__", "")]
    return next((kind for kind in (bool, int, float) if kind.__name__ in names), str)


def convert_option(raw: str, param: inspect.Parameter, spec: str) -> Any:
    """`raw` as the type of `param`'s default (bool, int, float or str), or for a default of None as
    the type its annotation names ("float | None": float), or a UsageError naming `spec`."""
    default = param.default
    kind = type(default) if default not in (inspect.Parameter.empty, None) else _annotated(param.annotation)
    try:
        if kind is bool:
            if raw.lower() in {"1", "true", "yes", "on"}:
                return True
            if raw.lower() in {"0", "false", "no", "off"}:
                return False
            raise ValueError
        if kind is int:
            return int(raw)
        if kind is float:
            value = float(raw)
            if not math.isfinite(value):
                raise ValueError
            return value
        return raw
    except ValueError:
        raise UsageError(f'option {param.name}={raw} in variant "{spec}" is not a valid {kind.__name__}') from None
