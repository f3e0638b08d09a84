"""Errors a user can act on. Library code raises these; only the CLI turns them into exit codes."""

from __future__ import annotations

import difflib


class RelbenchError(Exception):
    """A runtime problem with a message that says what is wrong and how to fix it (exit code 1)."""

    exit_code = 1
    prefix = "error: "  # how the CLI introduces the message


class UsageError(RelbenchError):
    """The user asked for something that cannot be done as asked (exit code 2)."""

    exit_code = 2


class NameTaken(ValueError):
    """A second class registered under a name that is taken (a programming error in the code that
    registers, not the user's input): `kind` ("position variant", "evaluation form", "task") and
    `name` say which, so a plugin loader can say whose name it was without parsing this text."""

    def __init__(self, kind: str, name: str):
        super().__init__(f"{kind} {name!r} registered twice")
        self.kind = kind
        self.name = name


def one_line(text: str) -> str:
    """`text` with every character that is not printable (newlines, tabs, record separators, NUL, ...)
    written as its escape, so a message that quotes user input stays on one line."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def did_you_mean(word: str, choices: list[str]) -> str:
    """' (did you mean "x"?)' for the closest of `choices`, or '' when none is close."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.5)
    return f' (did you mean "{close[0]}"?)' if close else ""


def unknown(kind: str, word: str, choices: list[str]) -> UsageError:
    """A UsageError for an unknown name that suggests the closest one and lists them all."""
    return UsageError(f'unknown {kind} "{word}"{did_you_mean(word, choices)}; choose from: {", ".join(choices)}')
