"""rlark: the training-side SDK for tasks that rlark runs.

    import rlark

    me = rlark.task()                       # who am I: ranks, head address (None outside a task)
    rlark.report(step=3, reward=1.5, loss=0.2)
    rlark.event("checkpoint", path="/ckpt/3")

Reports go to the control plane in the background (they never block the training loop)
and are listed with ``rlark reports task/NAME``. Outside an rlark task they are a no-op
with one warning. See sdk/python/rlark/README.md and docs/tasks.md ("Task reports").
"""

from ._reporter import (
    MAX_REPORT_BYTES,
    Reporter,
    ReportError,
    build_report,
    event,
    flush,
    report,
)
from ._task import Task, TaskEnvironmentError, task

__version__ = "0.1.0"

__all__ = [
    "MAX_REPORT_BYTES",
    "ReportError",
    "Reporter",
    "Task",
    "TaskEnvironmentError",
    "build_report",
    "event",
    "flush",
    "report",
    "task",
]
