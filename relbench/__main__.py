"""`python -m relbench` and the installed `relbench` command both start here, so that a Ctrl-C while
torch and the rest load (about 2 s) ends in one line and 130, not in a traceback.

While the libraries load, SIGINT is not turned into a KeyboardInterrupt: raised inside an import,
the exception meets the imported libraries' own code first. torch imports numpy inside its own
start-up, and an interrupt there left a half-loaded numpy behind that the command went on with
(then a traceback about numpy, or training as if nothing had happened: the Ctrl-C was lost), and
one raised through torch's C++ start-up (pybind11) ended in `terminate` and SIGABRT. So the
entry point ends the process itself, at once: nothing has started, nothing is written. Once the
imports are done, a Ctrl-C is the command's (relbench.cli.main: training saves, then 130).

Before this module runs, the interpreter is its own: a SIGINT in its first tens of milliseconds
(before Python installs its handler, or while `site` reads the environment's .pth files) kills it
or ends in Python's "Fatal Python error: init_import_site", out of reach of any entry point."""

import os
import signal

INTERRUPTED = "interrupted: nothing had started; run the same command again"


def interrupted_while_loading(signum, frame) -> None:
    """SIGINT while the libraries load: one line on stderr and exit 130, with no exception to unwind
    through the importing libraries (see the module doc)."""
    os.write(2, (INTERRUPTED + "\n").encode())
    os._exit(130)


def run() -> None:
    """Load the command line with interrupts ending the process in one line, then run it. A SIGINT
    the caller ignores (a background job) stays ignored."""
    guarded = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if guarded:
        signal.signal(signal.SIGINT, interrupted_while_loading)
    from relbench.cli import main

    try:
        if guarded:
            signal.signal(signal.SIGINT, signal.default_int_handler)   # from here on, the command's
        main()
    except KeyboardInterrupt:   # in the few instructions before main() catches it itself
        import sys
        sys.stderr.write(INTERRUPTED + "\n")
        raise SystemExit(130) from None


if __name__ == "__main__":   # a spawned child process (relbench/training/jobs.py) imports this module too
    run()
