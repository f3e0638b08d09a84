"""Evaluation tasks beside perplexity, one module per task: `copy` (does the model use a copy of the
text d tokens back?) and `passkey` (can it retrieve a key stated once, at any depth of the window?)."""

TASKS = ("perplexity", "copy", "passkey")
