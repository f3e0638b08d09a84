"""relbench: how position encodings behave far beyond their training length, and what they cost."""

__version__ = "0.1.0"
