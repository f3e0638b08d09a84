"""relbench: how position encodings behave far beyond their training length, and what they cost."""

import os

__version__ = "0.1.0"

# OpenMP threads that spin between parallel regions (the runtime's default) stall when the host
# deschedules a virtual CPU, and training slows severalfold (docs/performance.md, "CPU threads");
# sleeping threads cost a few microseconds per region on any host. Read once, when torch loads its OpenMP runtime, so it is set
# here, before anything imports torch; a value the user exported wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
