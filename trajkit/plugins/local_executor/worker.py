"""A worker process of the local executor's pool (:mod:`.pool`): many sessions on its own loop.

Started by the runner (``python -m trajkit.plugins.local_executor.worker FD``, FD its end of a socket
pair) and driven by it alone. It builds the session function from the run's
:class:`~trajkit.run.executor.SessionPlan` with the plugins installed here, runs the work orders it
is sent and sends back what happened: attempts started, outcomes, the model client's counters after
each answer, its log records. Request permits come from the runner's shared limiter when the model
client has limits. When the runner goes away (its end of the pipe closes, even after a ``kill -9``)
the worker stops its sessions, closes their sandboxes and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import threading
from typing import TYPE_CHECKING, Any

from trajkit.model.ratelimit import RequestLimiter, own_wait, shared_limits
from trajkit.plugins.local_executor.channel import Channel
from trajkit.plugins.local_executor.pool import plugin_names
from trajkit.run.executor import Failed, Outcome, SessionPlan, WorkOrder
from trajkit.run.heap import settle_for_sessions

if TYPE_CHECKING:
    from trajkit.run.attempt import Sessions

log = logging.getLogger("trajkit")

Limits = tuple[int | None, float | None, float | None]


class Worker:
    """The worker's side of the :class:`~trajkit.run.executor.Attempts` and of the limiter."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.sessions: Sessions | None = None
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.permits: dict[int, asyncio.Future[tuple[float, int, int]]] = {}
        self.next_permit = 0
        self.unpaid = False
        self.chores: set[asyncio.Task[None]] = set()

    # -- what the sessions report ------------------------------------------------------------------

    def started(self, work_id: str, attempt: int) -> None:
        self._send_paid()
        self.channel.send("started", work_id, attempt)

    def report(self, outcome: Outcome) -> None:
        self._send_paid()  # what the session's last answer cost reaches the runner before its outcome
        self.channel.send("outcome", outcome)

    def _paid(self) -> None:
        """A model answer was counted: its counters leave with the next message, or at the loop's
        next turn (one message for a burst of answers)."""
        if not self.unpaid:
            self.unpaid = True
            asyncio.get_running_loop().call_soon(self._send_paid)

    def _send_paid(self) -> None:
        if self.unpaid and self.sessions is not None:
            self.unpaid = False
            self.channel.send("paid", self.sessions.statistics(), self.sessions.spent())

    # -- the runner's messages ---------------------------------------------------------------------

    async def serve(self) -> None:
        """Answer the runner until it says close or goes away; then close everything."""
        try:
            while (message := await self.channel.receive()) is not None:
                kind, *args = message
                if kind == "run":
                    order: WorkOrder = args[0]
                    self.tasks[order.work_id] = asyncio.create_task(self._run(order))
                elif kind == "permit":
                    self._granted(*args)
                elif kind == "open":
                    self._chore(self._open(*args))
                elif kind == "stop":
                    self._chore(self._stop_and_say())
                elif kind == "close":
                    break
        finally:
            await self.close()

    def _chore(self, work: Any) -> None:
        """Work that may wait on the runner's answers (permits): the reading goes on meanwhile."""
        task = asyncio.create_task(work)
        self.chores.add(task)
        task.add_done_callback(self.chores.discard)

    async def _open(self, plan: SessionPlan, level: int) -> None:
        from trajkit.manager import load_plugins  # the plugins, the agent: only once the run starts
        from trajkit.run.attempt import Sessions

        try:
            host = load_plugins()  # what failed to load the runner has said already
            host.configure_toolsets(plan.config)
            forward_logs(self.channel, level)
            sessions = self.sessions = Sessions(plan, host)  # closed at the end even if opening fails
            limits: list[Limits] = []

            def limiter_of_the_run(
                max_concurrent: int | None, max_rpm: float | None, max_tpm: float | None
            ) -> RequestLimiter:
                if (max_concurrent, max_rpm, max_tpm) == (None, None, None):
                    return RequestLimiter()
                limits.append((max_concurrent, max_rpm, max_tpm))
                return ChannelLimiter(self, max_concurrent, max_rpm, max_tpm)

            with shared_limits(limiter_of_the_run):
                await sessions.open()
            sessions.listen(self._paid)
            settle_for_sessions()  # this process runs sessions until it exits
        except Exception as exc:
            self.channel.send("failed", *portable(exc))
            return
        self.channel.send("opened", limits[0] if limits else None, sorted(plugin_names(host)))

    async def _run(self, order: WorkOrder) -> None:
        assert self.sessions is not None, "opened first"
        try:
            await self.sessions.run(order, self)
        except Exception as exc:  # Sessions.run reports every failure; this is a bug, said once
            log.exception("session %s stopped", order.work_id)
            message = f"{type(exc).__name__}: {exc}"
            self.report(Failed(order.work_id, 1, "internal_error", message, final=True))
        finally:
            self.tasks.pop(order.work_id, None)

    async def _stop_and_say(self) -> None:
        await self.stop()
        self.channel.send("stopped")

    async def stop(self) -> None:
        """Cancel the sessions in flight (their sandboxes are closed)."""
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        """Stop what runs, close the model client, reap the run's sandboxes here."""
        await self.stop()
        for chore in list(self.chores):
            chore.cancel()
        if self.sessions is not None:
            await self.sessions.close()
        self.channel.send("closed")
        await self.channel.close()

    # -- permits -----------------------------------------------------------------------------------

    def ask_permit(self, estimated_tokens: int) -> asyncio.Future[tuple[float, int, int]]:
        self.next_permit += 1
        future: asyncio.Future[tuple[float, int, int]] = asyncio.get_running_loop().create_future()
        self.permits[self.next_permit] = future
        self.channel.send("acquire", self.next_permit, estimated_tokens)
        return future

    def _granted(self, number: int, waited: float, throttled: int, recovered: int) -> None:
        future = self.permits.pop(number, None)
        if future is None or future.done():  # its request was cancelled meanwhile: given back
            self.channel.send("release", False)
        else:
            future.set_result((waited, throttled, recovered))


class ChannelLimiter(RequestLimiter):
    """A model client's limiter whose permits come from the runner's shared limiter.

    A request waits for its permit as long as the shared limiter makes it (the run's own wait: the
    session's deadline is paused); a request cancelled while it waits gives its permit back once
    granted.
    """

    def __init__(
        self, worker: Worker, max_concurrent: int | None, max_rpm: float | None, max_tpm: float | None
    ) -> None:
        super().__init__(max_concurrent, max_rpm, max_tpm)
        self.worker = worker

    async def acquire(self, estimated_tokens: int = 0) -> float:
        with own_wait():
            waited, throttled, recovered = await self.worker.ask_permit(estimated_tokens)
        self.active += 1
        self.stats.waited_s += waited
        self.stats.throttled, self.stats.recovered = throttled, recovered
        return waited

    async def release(self, *, success: bool = True) -> None:
        self.active -= 1
        self.worker.channel.send("release", success)

    async def throttled(self, retry_after: float | None) -> None:
        self.worker.channel.send("throttled", retry_after)

    def record_tokens(self, count: int) -> None:
        self.worker.channel.send("tokens", count)


class _Forward(logging.Handler):
    """Sends each record to the runner from the loop's thread (records of worker threads too)."""

    def __init__(self, channel: Channel) -> None:
        super().__init__()
        self.channel = channel
        self.loop = asyncio.get_running_loop()
        self.thread = threading.get_ident()

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
        message = ("log", record.name, record.levelno, text)
        if threading.get_ident() == self.thread:  # in order with what the loop sends next
            self.channel.send(*message)
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed: at exit, nothing to send on
            self.loop.call_soon_threadsafe(self.channel.send, *message)


def forward_logs(channel: Channel, level: int) -> None:
    """trajkit's log records go to the runner, which logs them where the run's logs go."""
    logger = logging.getLogger("trajkit")
    logger.handlers[:] = [_Forward(channel)]
    logger.setLevel(level)


def portable(exc: BaseException) -> tuple[Any, str]:
    """An exception the runner can raise again as it is, when it pickles; and its text."""
    import pickle

    text = f"{type(exc).__name__}: {exc}"
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return None, text
    return exc, text


async def main(fd: int) -> None:
    pipe = socket.socket(fileno=fd)
    pipe.set_inheritable(False)  # handed over inheritable; no program the worker starts may use it
    channel = await Channel.connect(pipe)
    await Worker(channel).serve()


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the runner stops its workers itself
    logging.getLogger("trajkit").addHandler(logging.NullHandler())
    logging.getLogger("trajkit").propagate = False  # until the run's handler forwards them
    asyncio.run(main(int(sys.argv[1])))
