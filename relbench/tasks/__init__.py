"""What a trained model is measured on, one module per task beside perplexity: `copy` (does the
model use a copy of the text d tokens back?), `passkey` (can it retrieve a key stated once, at any
depth of the window?) and `mqar` (can it recall the values of several keys stated once, each asked
for at the end?). Each module registers its `Task` (relbench/tasks/base.py): importing the package
registers them all, in this order."""

from relbench.tasks import copying, mqar, passkey  # noqa: F401  (importing a module registers its task)
from relbench.tasks.base import TASKS, Task, get_task, register_task, training_tasks  # noqa: F401
