from relbench.cli import main

if __name__ == "__main__":   # a spawned child process (relbench/training/jobs.py) imports this module too
    main()
