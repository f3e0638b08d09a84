"""The command group behind `relbench`: variadic options spread for click, and every error turned
into one line on stderr with an exit code (2 usage, 1 runtime, 130/143 interrupted)."""

from __future__ import annotations

import errno
import re
import sys

import typer
from rich.console import Console
from typer.core import TyperGroup

from relbench.errors import RelbenchError, one_line
from relbench.runs import distributed

err_console = Console(stderr=True, highlight=False, soft_wrap=True)

# options that take several values after one flag: `--lengths 256 1024 4096`
VARIADIC = ("--lengths", "--variants", "--attention", "--seeds", "--mode", "--grid", "--task")


def spread_variadic(args: list[str]) -> list[str]:
    """Rewrite `--lengths 1 2 3` (and `--lengths 1,2,3`) as `--lengths 1 --lengths 2 --lengths 3`,
    which click understands; a value may look like a negative number."""
    out: list[str] = []
    current = None
    for arg in args:
        if arg in VARIADIC:
            current = arg
            continue
        if current and (not arg.startswith("-") or re.fullmatch(r"-\d+(\.\d*)?", arg)):
            for value in (variant_values(arg) if current == "--variants" else filter(None, arg.split(","))):
                out += [current, value]
            continue
        if current and not any(o == current for o in out[-2:-1]):
            out.append(current)  # the flag with no value: let click report it
        current = None
        out.append(arg)
    if current and not any(o == current for o in out[-2:-1]):
        out.append(current)
    return out


def variant_values(arg: str) -> list[str]:
    """The variant specs of one --variants value: "xl,alibi" is two, but a comma followed by a
    key=value (no ":" before its "=") continues the spec before it, so "t5:num_buckets=8,max_distance=12"
    and "alibi:ssmax=true,ssmax_bias=false" stay one spec each; a value with a "*COUNT" is a layout,
    one spec whose commas separate its layers ("rope*3,none": positions/spec.py)."""
    if "*" in arg:
        return [arg]
    specs: list[str] = []
    for piece in filter(None, arg.split(",")):
        option = "=" in piece and ":" not in piece.split("=", 1)[0]
        if option and specs:
            specs[-1] += "," + piece
        else:
            specs.append(piece)
    return specs


def is_click_error(error: Exception) -> bool:
    """A click usage error (click's own, or the copy of click that newer Typer versions carry)."""
    return callable(getattr(error, "format_message", None)) and isinstance(getattr(error, "exit_code", None), int)


def _say(line: str, code: int) -> None:
    """One line on stderr. Under torchrun a usage error or an interrupt is the same on every rank
    and rank 0 says it; a runtime error (code 1) may be one rank's own (out of memory on its GPU),
    so every rank says its own, after its rank."""
    if distributed.is_main() or code == 1:
        err_console.print(one_line(distributed.label() + line), markup=False)


# the order `relbench --help` lists the commands in: the pipeline, the tools, your own scheme
ORDER = ("bench", "train", "tune-lr", "extrapolate", "finetune", "report", "merge", "verify", "variants", "presets",
         "profile", "inspect", "check", "new-variant")


INTERRUPTED = "interrupted: everything finished so far is kept; run the same command again to compute the rest"


def say_interrupted() -> None:
    """The one line a Ctrl-C ends with, wherever in the process it landed."""
    _say(INTERRUPTED, 130)


KEPT = "what was written before is kept (every file is written whole, then renamed into place)"


def environment_fault(error: OSError) -> str:
    """One line for an error of the file system or the machine: its cause, the file, and a fix."""
    where = f" ({error.filename})" if error.filename else ""
    cause = error.strerror or str(error)
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = f"free some space (or pass --run-dir on another disk) and run the same command again; {KEPT}"
    elif error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = f"make it writable (or pass --run-dir in a folder you can write) and run the same command again; {KEPT}"
    elif error.errno in (errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
        fix = "a file stands where a folder should be, or the reverse: move it, or pass another --run-dir"
    else:
        fix = f"run the same command again once the cause is fixed; {KEPT}"
    return f"error: {cause}{where}; {fix}"


def examples_kept(text: str) -> str:
    """A command's help with its "Example:" paragraph marked not to be rewrapped (click's \\b): one
    example per line, each copyable as it stands."""
    head, marker, tail = text.partition("Example:")
    if not marker or "\b" in text:
        return text
    lines = [line.strip() for line in tail.strip("\n").splitlines()]
    return f"{head}Examples:\n\n\b\n" + "\n".join(line for line in lines if line)


class Group(TyperGroup):
    """Errors become one line on stderr and an exit code: 2 for usage, 1 for runtime problems."""

    def get_command(self, ctx, cmd_name):
        command = super().get_command(ctx, cmd_name)
        if command is not None and command.help:
            command.help = examples_kept(command.help)
        return command

    def list_commands(self, ctx) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda n: ORDER.index(n) if n in ORDER else len(ORDER))

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        args = spread_variadic(list(sys.argv[1:] if args is None else args))
        interrupted_message_shown = False
        try:
            code = super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                                standalone_mode=False, **extra)
        except RelbenchError as error:
            code = error.exit_code
            _say(f"{error.prefix}{error}", code)
            interrupted_message_shown = True
        except typer.Abort:
            code = 130
            _say("interrupted", code)
        except OSError as error:       # the machine's fault, not relbench's: one line, what to do, nothing lost
            code = 1
            _say(environment_fault(error), code)
        except Exception as error:
            if not is_click_error(error):
                raise
            where = error.ctx.command_path if getattr(error, "ctx", None) else "relbench"
            message = " ".join(error.format_message().split())
            code = error.exit_code
            _say(f"error: {message} (see `{where} --help`)", code)
        code = code if isinstance(code, int) else 0
        if code == 130 and not interrupted_message_shown:
            _say(INTERRUPTED, code)
        if standalone_mode:
            sys.exit(code)
        return code
