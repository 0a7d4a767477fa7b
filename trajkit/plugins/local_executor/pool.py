"""Sessions in worker processes of this machine (``--processes N``), as many as it has cores.

On the runner's one event loop a run's sessions use one core however many the machine has. Here
each worker process (:mod:`.worker`) runs its share of the sessions on a loop of its own, and the
runner keeps what only one process may do: admission (``--max_cost``), the ledger, the progress
display, the request limits (one :class:`~trajkit.model.shared_limiter.SharedLimiter`, asked
over the pipe).

- **Balance.** At most ``--num_workers`` sessions are in flight in all; each work order goes to
  the worker with the fewest in flight.
- **Nothing lost.** A worker that dies (killed, out of memory) is replaced by none: what it held
  goes back to the queue for the others, its attempts in flight reported as ``worker_lost``
  failures (not final), its permits given back.
- **Nothing left.** A worker whose runner goes away (even killed with ``kill -9``) sees its pipe
  close, stops its sessions, closes their sandboxes and exits.
- Workers load the plugins installed in the environment; a plugin this process registered by
  hand (not installed) is not theirs, and the run stops before any session saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trajkit.model.shared_limiter import LostHolder, SharedLimiter
from trajkit.plugins.local_executor.channel import Channel
from trajkit.run.executor import (
    Driver,
    Executor,
    Failed,
    Outcome,
    SessionPlan,
    WorkOrder,
    combined_statistics,
    hand_back,
)

if TYPE_CHECKING:
    from trajkit.manager import PluginHost

log = logging.getLogger("trajkit")

CLOSE_TIMEOUT = 120.0
"""Seconds a worker may take to stop its sessions, or to close, before it is killed."""


@dataclass(eq=False)
class _Worker:
    """The runner's view of one worker process."""

    number: int
    process: asyncio.subprocess.Process
    channel: Channel
    replies: asyncio.Queue[tuple[Any, ...]] = field(default_factory=asyncio.Queue)
    """Its answers to open, stop and close (or ``("lost",)``), in order."""
    alive: bool = True
    outstanding: dict[str, WorkOrder] = field(default_factory=dict)
    """Work sent to it that has not ended, by work id."""
    attempts: dict[str, int] = field(default_factory=dict)
    """The attempt each of those is at, once started."""
    statistics: dict[str, Any] = field(default_factory=dict)
    spent: float = 0.0
    reader: asyncio.Task[None] | None = None

    @property
    def holder(self) -> str:
        return f"worker {self.number} (pid {self.process.pid})"


class WorkerPool(Executor):
    """The sessions in ``count`` worker processes."""

    name = "local"

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count
        self.workers: list[_Worker] = []
        self.limiter = SharedLimiter()
        self.queue: deque[WorkOrder] = deque()
        self.driver: Driver | None = None
        self.changed = asyncio.Event()
        self.began: set[str] = set()
        """Work sent to a worker since it was last admitted whose first attempt has started."""
        self.chores: set[asyncio.Task[None]] = set()
        self.closing = False
        self.capacity = 1
        """Sessions in flight in all workers at most (``--num_workers``)."""
        self.starting: set[tuple[str, int, str]] | None = set()
        """The log records the workers have sent while they start; None once they have."""

    # -- start -------------------------------------------------------------------------------------

    async def start(self, plan: SessionPlan, host: PluginHost) -> None:
        self.capacity = plan.config.num_workers
        count = max(1, min(self.count, self.capacity))
        self.workers = list(await asyncio.gather(*(self._spawn(number) for number in range(count))))
        level = logging.getLogger("trajkit").getEffectiveLevel()
        for worker in self.workers:
            worker.channel.send("open", plan, level)
        for worker in self.workers:
            kind, *args = await worker.replies.get()
            if kind == "failed":  # the model client's check, a backend...: as the runner's loop says it
                error, text = args
                raise error if isinstance(error, BaseException) else RuntimeError(text)
            if kind == "lost":
                raise RuntimeError(f"{worker.holder} exited while it started")
            limits, plugins = args
            if limits is not None:
                self.limiter.configure(*limits)
            unknown = sorted(plugin_names(host) - set(plugins))
            if unknown:
                raise RuntimeError(
                    "worker processes load the installed plugins only, and these were "
                    f"registered in this process alone: {', '.join(unknown)} (install them, or run "
                    "the sessions here: --processes 0)"
                )
        self.starting = None
        log.info("%d worker processes run the sessions, up to %d in flight", count, self.capacity)

    async def _spawn(self, number: int) -> _Worker:
        ours, theirs = socket.socketpair()
        with theirs:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "trajkit.plugins.local_executor.worker",
                str(theirs.fileno()),
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=worker_environment(),
                start_new_session=True,  # a Ctrl-C reaches the runner, which stops its workers
            )
        worker = _Worker(number, process, await Channel.connect(ours))
        worker.reader = asyncio.create_task(self._read(worker))
        return worker

    # -- execute -----------------------------------------------------------------------------------

    async def execute(self, work: Sequence[WorkOrder], driver: Driver) -> None:
        self.queue = deque(work)
        self.driver = driver
        try:
            while True:
                self._dispatch(driver)
                live = [worker for worker in self.workers if worker.alive]
                idle = not any(worker.outstanding for worker in live)
                if idle and (not self.queue or driver.stopped() or not live):
                    break
                self.changed.clear()
                await self.changed.wait()
        finally:  # cancelled (the run was interrupted): so are the sessions, their sandboxes closed
            if any(worker.outstanding for worker in self.workers if worker.alive):
                await self._stop_sessions()  # what ended before they stopped is reported
            self.driver = None
        if self.queue and not driver.stopped():
            log.error("every worker process is lost; %d work items were not run", len(self.queue))

    def _dispatch(self, driver: Driver) -> None:
        """Send work to the least busy workers while sessions may start."""
        live = [worker for worker in self.workers if worker.alive]
        in_flight = sum(len(worker.outstanding) for worker in live)
        while live and self.queue and in_flight < self.capacity and driver.may_start():
            order = self.queue.popleft()
            worker = min(live, key=lambda w: len(w.outstanding))
            worker.outstanding[order.work_id] = order
            worker.channel.send("run", order)
            in_flight += 1

    async def _read(self, worker: _Worker) -> None:
        """Everything a worker says, until its pipe closes."""
        try:
            while (message := await worker.channel.receive()) is not None:
                self._handle(worker, message)
        except Exception as exc:  # a bug here must not leave the run waiting for this worker
            log.error("%s: %s: %s", worker.holder, type(exc).__name__, exc)
        finally:
            if worker.alive and not self.closing:
                self._lost(worker, f"{worker.holder} exited")
            worker.alive = False
            worker.replies.put_nowait(("lost",))

    def _handle(self, worker: _Worker, message: tuple[Any, ...]) -> None:
        kind, *args = message
        driver = self.driver  # None outside execute: what comes then is the workers' closing
        if kind == "outcome" and driver is not None:
            self._ended(worker, driver, args[0])
        elif kind == "started" and driver is not None:
            worker.attempts[args[0]] = args[1]
            self.began.add(args[0])
            driver.started(*args)
        elif kind == "paid":
            worker.statistics, worker.spent = args
            if driver is not None:
                driver.paid()  # saved by the runner at once
            self.changed.set()
        elif kind == "log":
            self._log(*args)
        elif kind in ("acquire", "release", "throttled", "tokens"):
            self._permits(worker, kind, *args)
        elif kind in ("opened", "failed", "stopped", "closed"):
            worker.replies.put_nowait(message)

    def _log(self, name: str, level: int, text: str) -> None:
        """A worker's log record, logged here; while they start, what every worker says (the model
        endpoint's check, sandboxes reaped) is said once."""
        if self.starting is not None:
            if (name, level, text) in self.starting:
                return
            self.starting.add((name, level, text))
        logging.getLogger(name).log(level, "%s", text)

    def _ended(self, worker: _Worker, driver: Driver, outcome: Outcome) -> None:
        worker.attempts.pop(outcome.work_id, None)
        if not isinstance(outcome, Failed) or outcome.final:
            worker.outstanding.pop(outcome.work_id, None)
            self.began.discard(outcome.work_id)
        driver.report(outcome)
        self.changed.set()

    def _lost(self, worker: _Worker, why: str) -> None:
        """A worker is gone: what it held runs again on the others."""
        worker.alive = False
        with contextlib.suppress(ProcessLookupError):
            worker.process.kill()  # at most once: if it still runs, it runs no more
        self._chore(self.limiter.forget(worker.holder, 0.0))
        lost = list(worker.outstanding.values())
        if self.driver is not None:  # else it held none: lost while starting or closing
            failure = ("worker_lost", f"the {worker.holder} running it was lost ({why}); run again")
            hand_back(self.driver, lost, worker.attempts, self.began, failure)
        worker.outstanding.clear()
        self.queue.extendleft(reversed(lost))
        log.warning("%s; %d work items go to the other workers", why, len(lost))
        self.changed.set()

    def _permits(self, worker: _Worker, kind: str, *args: Any) -> None:
        """A worker's model client asks the run's limiter."""
        if kind == "acquire":
            self._chore(self._grant(worker, *args))
        elif kind == "release":
            self._chore(self.limiter.release(worker.holder, *args))
        elif kind == "throttled":
            self._chore(self.limiter.throttled(*args))
        else:
            self.limiter.record_tokens(*args)

    async def _grant(self, worker: _Worker, number: int, estimated_tokens: int) -> None:
        try:
            granted = await self.limiter.acquire(worker.holder, estimated_tokens)
        except LostHolder:
            return
        worker.channel.send("permit", number, *granted)

    def _chore(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self.chores.add(task)
        task.add_done_callback(self.chores.discard)

    async def _stop_sessions(self) -> None:
        """Cancel what still runs in the workers (their sandboxes closed)."""
        live = [worker for worker in self.workers if worker.alive]
        for worker in live:
            worker.channel.send("stop")
        waits = [asyncio.ensure_future(worker.replies.get()) for worker in live]
        _, late = await asyncio.wait(waits, timeout=CLOSE_TIMEOUT)
        for task in late:
            task.cancel()

    # -- accounts ----------------------------------------------------------------------------------

    def statistics(self) -> dict[str, Any]:
        return combined_statistics(worker.statistics for worker in self.workers)

    def spent(self) -> float:
        return sum(worker.spent for worker in self.workers)

    # -- close -------------------------------------------------------------------------------------

    async def aclose(self) -> None:
        self.closing = True
        for worker in self.workers:
            if worker.alive:
                worker.channel.send("close")
        for worker in self.workers:
            try:
                await asyncio.wait_for(worker.process.wait(), CLOSE_TIMEOUT)
            except TimeoutError:
                log.warning("%s did not close in time", worker.holder)
                with contextlib.suppress(ProcessLookupError):
                    worker.process.kill()
                await worker.process.wait()
            if worker.reader is not None:
                await worker.reader
            await worker.channel.close()
        for chore in list(self.chores):
            chore.cancel()


def plugin_names(host: PluginHost) -> set[str]:
    """The names of the plugins registered in ``host``, however they were."""
    return {name for name, _ in host.pm.list_name_plugin()}


def worker_environment() -> dict[str, str]:
    """This process's environment (the model's key variables with it), and trajkit found where
    this process found it when that is not an installed package's place."""
    environment = dict(os.environ)
    import trajkit

    root = str(Path(trajkit.__file__).resolve().parents[1])
    if Path(root).name not in ("site-packages", "dist-packages"):
        path = environment.get("PYTHONPATH")
        environment["PYTHONPATH"] = os.pathsep.join([root, path] if path else [root])
    return environment
