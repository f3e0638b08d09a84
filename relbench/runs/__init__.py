"""Run directories and what runs them: a run's files (results), checkpoints, processes
(distributed) and experiment tracking (tracking)."""
