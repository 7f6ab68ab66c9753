"""The worker of a VigilWorkerPool (docs/pull.md, "The worker").

`vigil-worker [--slots N] -- CMD ARGS...` runs CMD once per claimed task (vigil.worker.runner);
`vigil.worker.serve(handler)` runs `handler(task)` in-process instead (vigil.worker.handlers).
The bookkeeping of the pull protocol, pure, is vigil.worker.state.
"""

from __future__ import annotations

from vigil.worker.client import ConfigError
from vigil.worker.handlers import Handler, Task, TaskFailed, serve

__all__ = ["ConfigError", "Handler", "Task", "TaskFailed", "serve"]
