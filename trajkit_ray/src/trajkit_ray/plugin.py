"""Registers the ``ray`` executor. Ray itself is imported only when a run uses it."""

from __future__ import annotations

from trajkit import hookimpl
from trajkit.run.executor import Executor
from trajkit_ray.executor import RayExecutor


@hookimpl
def trajkit_executors() -> list[type[Executor]]:
    return [RayExecutor]
