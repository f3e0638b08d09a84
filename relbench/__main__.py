try:
    from relbench.cli import main
except KeyboardInterrupt:   # Ctrl-C while torch and the rest load: nothing had started
    import sys
    sys.stderr.write("interrupted: nothing had started; run the same command again\n")
    raise SystemExit(130) from None

if __name__ == "__main__":   # a spawned child process (relbench/training/jobs.py) imports this module too
    main()
