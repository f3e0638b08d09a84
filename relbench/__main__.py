from relbench.cli import main

main()
