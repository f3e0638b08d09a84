"""The panels shipped with relbench: committed retrieval results, one folder each, that
`relbench bench --against NAME` places a user's scheme among (relbench/runs/panels.py). Their files
are copies of results/NAME's, made by scripts/ship_panels.py."""
