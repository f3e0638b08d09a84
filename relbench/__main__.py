"""`python -m relbench` and the installed `relbench` command both start here, so that a Ctrl-C while
torch and the rest load (about 2 s) ends in one line and 130, not in a traceback."""


def run() -> None:
    try:
        from relbench.cli import main
    except KeyboardInterrupt:   # Ctrl-C while torch and the rest load: nothing had started
        import sys
        sys.stderr.write("interrupted: nothing had started; run the same command again\n")
        raise SystemExit(130) from None
    main()


if __name__ == "__main__":   # a spawned child process (relbench/training/jobs.py) imports this module too
    run()
