"""The ``processes`` executor: sessions in worker processes of this machine (see :mod:`.executor`)."""

from __future__ import annotations

from trajkit import hookimpl
from trajkit.run.executor import Executor


@hookimpl
def trajkit_executors() -> list[type[Executor]]:
    from trajkit.plugins.processes.executor import ProcessExecutor

    return [ProcessExecutor]
