"""A bounded pool for the runner's blocking file operations that a hung call cannot take down.

``asyncio.to_thread`` uses the loop's default executor: a call stuck in the kernel (a FIFO, a dead
network file system) holds one of its threads for good, enough of them starve every session, and
the loop's shutdown waits for them forever. Here each call runs on a daemon thread of its own,
at most ``MAX_CALLS`` at once; a call that overruns its deadline is abandoned (its slot freed, its
caller told), and the process can still exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

MAX_CALLS = 16
DEADLINE_S = 120.0
MAX_ABANDONED = 64
"""Past this many abandoned calls, file operations fail at once instead of piling up threads."""

_slots: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}
_abandoned = 0


async def in_file_thread(fn: Callable[..., T], *args: object, deadline: float = DEADLINE_S) -> T:
    """``fn(*args)`` on a daemon thread; OSError(ETIMEDOUT) if it has not returned by ``deadline``."""
    global _abandoned
    if _abandoned >= MAX_ABANDONED:
        raise OSError(errno.EIO, f"{_abandoned} file operations hung; refusing more")
    loop = asyncio.get_running_loop()
    slots = _slots.get(loop)
    if slots is None:
        _slots.clear()  # one loop at a time in practice; a finished loop's semaphore is useless
        slots = _slots[loop] = asyncio.Semaphore(MAX_CALLS)
    async with slots:
        future: asyncio.Future[T] = loop.create_future()
        threading.Thread(target=_call, args=(loop, future, fn, args), daemon=True).start()
        try:
            return await asyncio.wait_for(asyncio.shield(future), deadline)
        except TimeoutError:
            _abandoned += 1
            future.add_done_callback(_forget)
            raise OSError(errno.ETIMEDOUT, f"file operation still blocked after {deadline:g}s") from None


def _call(
    loop: asyncio.AbstractEventLoop, future: asyncio.Future[T], fn: Callable[..., T], args: tuple
) -> None:
    outcome: T | BaseException
    try:
        outcome = fn(*args)
    except BaseException as exc:
        outcome = exc
    with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
        loop.call_soon_threadsafe(_settle, future, outcome)


def _settle(future: asyncio.Future[T], outcome: T | BaseException) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def _forget(future: asyncio.Future[T]) -> None:
    global _abandoned
    _abandoned -= 1
    if not future.cancelled():
        future.exception()
