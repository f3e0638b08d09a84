"""Evaluation tasks beside perplexity, one module per task: `copy` (does the model use a copy of the
text d tokens back?), `passkey` (can it retrieve a key stated once, at any depth of the window?) and
`mqar` (can it recall the values of several keys stated once, each asked for at the end?)."""

TASKS = ("perplexity", "copy", "passkey", "mqar")
