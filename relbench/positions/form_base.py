"""The base of an evaluation form (positions/forms.py registers them: YaRN, log-n scaling, ...): the
hooks a trained encoding calls to be read another way, each the identity here."""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

from torch import Tensor

from relbench.positions.base import PositionEncoding


def format_value(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


class Form:
    """An evaluation form (positions/forms.py registers them: YaRN, log-n scaling, ...): the hooks an
    encoding calls, the identity here. Subclasses override the hooks their method changes."""

    name: ClassVar[str] = ""
    applies_to: ClassVar[type[PositionEncoding]] = PositionEncoding   # the schemes (with subclasses) it fits
    formula: ClassVar[str] = ""           # one line, shown in the README and by `forms_table`
    places: ClassVar[bool] = False        # `placement` gives positions other than 0 .. L - 1 (drawn)

    @classmethod
    def applies(cls, scheme: type[PositionEncoding]) -> bool:
        return issubclass(scheme, cls.applies_to)

    @classmethod
    def options(cls) -> dict[str, inspect.Parameter]:
        return {n: p for n, p in inspect.signature(cls.__init__).parameters.items() if n != "self"}

    def check(self, enc: PositionEncoding) -> None:
        """Refuse (UsageError) an encoding of the right class whose options the form cannot read."""

    # ---- hooks --------------------------------------------------------------------------------------
    def logit_scale(self, enc: PositionEncoding, length: int) -> float:
        return 1.0

    def frequencies(self, enc: PositionEncoding, inv_freq: Tensor, length: int) -> Tensor:
        return inv_freq

    def distance_bias(self, enc: PositionEncoding, distance: Tensor, length: int) -> Tensor:
        return enc.distance_bias(distance)

    def horizon(self, enc: PositionEncoding, length: int) -> int | None:
        return enc.horizon()

    def placement(self, enc: PositionEncoding, tokens: Tensor) -> Tensor | None:
        """(B, L) positions at which the model places `tokens` (B, L), or None: 0 .. L - 1 (every form
        but `drawn`, which places them as randomized-positions training does)."""
        return None

    def max_length(self, enc: PositionEncoding) -> int | None:
        """The longest sequence the encoding can read under this form: the scheme's own."""
        return enc.max_length

    def for_variant(self, variant: str) -> Form:
        """The form as it reads the trained variant `variant` (its spec, training options included):
        itself, unless an option's default comes from how the variant was trained (`drawn`'s limit)."""
        return self

    def pinned(self, enc: PositionEncoding, length: int) -> Form:
        """The form to fine-tune under at `length`: options that default to following the evaluated
        length (a factor of 0) fixed at their value there. The base class has none: itself."""
        return self

    def text(self) -> str:
        """The form as a spec writes it: its name and the options that differ from their defaults."""
        given = [f"{n}={format_value(getattr(self, n))}" for n, p in self.options().items()
                 if getattr(self, n) != p.default]
        return self.name + (":" + ",".join(given) if given else "")

    def __repr__(self) -> str:
        values = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.options() if hasattr(self, k))
        return f"{self.name}({values})"
