"""What a trained model is measured on, one module per task beside perplexity: `copy` (does the
model use a copy of the text d tokens back?), `passkey` (can it retrieve a key stated once, at any
depth of the window?), `mqar` (can it recall the values of several keys stated once, each asked
for at the end?), `flipflop` (does a read return the last write's bit, however far back?),
`tracking` (which variables hold a value, through a chain of assignments?) and `needles` (the value
of one key among distractor keys of the same form). Each module registers its `Task`
(relbench/tasks/base.py): importing the package registers them all, in this order."""

# importing a module registers its task; reports and evaluation take them in this order
from relbench.tasks import copying  # noqa: F401, I001
from relbench.tasks import passkey  # noqa: F401
from relbench.tasks import mqar  # noqa: F401
from relbench.tasks import flipflop  # noqa: F401
from relbench.tasks import tracking  # noqa: F401
from relbench.tasks import needles  # noqa: F401
from relbench.tasks.base import (TASKS, Answer, RetrievalTask, Task, get_task, register_task,  # noqa: F401
                                 retrieval_task, retrieval_tasks, training_tasks)
