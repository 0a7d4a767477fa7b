"""One prompt's container: commands run through ``docker exec``, files through the archive API."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import posixpath
import sys
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from trajkit.sandbox import (
    DEFAULT_OUTPUT_CAP,
    DEFAULT_READ_LIMIT,
    CappedBuffer,
    ExecResult,
    FileTooLarge,
    HostBridge,
    NotARegularFile,
    Sandbox,
    SandboxError,
    SandboxInfo,
    check_path,
    read_result,
)
from trajkit.sandbox.shell import script
from trajkit_docker.archive import resolve_link
from trajkit_docker.engine import Engine, file_kind, translated
from trajkit_docker.settings import BRIDGE_USER

if TYPE_CHECKING:
    from trajkit_docker.backend import DockerBackend
    from trajkit_docker.users import SandboxUser

log = logging.getLogger(__name__)
T = TypeVar("T")

STATE_DIR = "/.trajkit"
"""Created in every container (mode 1777) to hold the process-group id of each running exec
(``scripts/exec.sh``)."""

TIMEOUT_EXIT_CODE = 124
KILL_GRACE = 10.0
"""Seconds the output stream may stay open after the process group was killed."""
ABORT_GRACE = 5.0
MAX_SYMLINKS = 16
"""Symlinks one file operation follows; a loop or a long chain ends in ELOOP."""
FILE_TIMEOUT = 60.0
"""Seconds for the in-container part of a file read (the head or the tail of a large file)."""


def _script(name: str) -> str:
    """``scripts/NAME`` of this package, as one line (:func:`trajkit.sandbox.shell.script`)."""
    return script("trajkit_docker", name)


@functools.cache
def _exec_wrapper() -> str:
    return f"{_script('sweep_orphans.sh')}; {_script('exec.sh')}"


class DockerSandbox(Sandbox):
    def __init__(
        self,
        backend: DockerBackend,
        engine: Engine,
        container_id: str,
        cwd: str,
        info: SandboxInfo,
        user: SandboxUser,
    ) -> None:
        self._backend = backend
        self._engine = engine
        self.container_id = container_id
        self.cwd = cwd
        self.info = info
        self.user = user
        """Who commands run as and files belong to (see :mod:`trajkit_docker.users`)."""
        self._home = {"HOME": user.home} if user.home else {}
        self._closed = False
        self._files = asyncio.Lock()
        """One archive request at a time: the engine's mounts for concurrent ones race."""

    def __repr__(self) -> str:
        return f"DockerSandbox({self.container_id[:12]}, image={self.info.image!r})"

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._backend.call(fn, *args)

    def _resolve(self, path: str) -> str:
        """``path`` absolute in the container; InvalidPath for one the engine would choke on."""
        check_path(path)
        return check_path(posixpath.normpath(posixpath.join(self.cwd, path)))

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"docker: sandbox {self.container_id[:12]} is closed")

    async def exec(
        self,
        command: str,
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        output_cap: int = DEFAULT_OUTPUT_CAP,
    ) -> ExecResult:
        self._check_open()
        group_file = posixpath.join(STATE_DIR, f"exec-{uuid.uuid4().hex}")
        argv = ["/bin/sh", "-c", _exec_wrapper(), "trajkit-exec", group_file, command, self.cwd]
        run = ExecRun(
            self._engine, self.container_id, argv, {**self._home, **(env or {})}, output_cap, self.user.name
        )
        finished = run.start(asyncio.get_running_loop())
        try:
            exit_code = await asyncio.wait_for(asyncio.shield(finished), timeout)
        except TimeoutError:
            await self._kill_and_drain(run, finished, group_file)
            return run.result(TIMEOUT_EXIT_CODE, timed_out=True)
        except asyncio.CancelledError:
            self._start_killer(group_file)
            run.abort()
            finished.add_done_callback(_ignore_outcome)
            raise
        return run.result(exit_code, timed_out=False)

    def _start_killer(self, group_file: str) -> asyncio.Task[tuple[int, str]]:
        argv = ["/bin/sh", "-c", _script("kill.sh"), "trajkit-kill", group_file]
        return self._backend.in_background(
            self._call(self._engine.run_helper, self.container_id, argv, self.user.name),
            "killing an exec's process group",
        )

    async def _kill_and_drain(self, run: ExecRun, finished: asyncio.Future[int], group_file: str) -> None:
        """Kill the exec's process group, then wait (bounded) for its output stream to end."""
        self._start_killer(group_file)
        try:
            await asyncio.wait_for(asyncio.shield(finished), KILL_GRACE)
            return
        except TimeoutError:
            log.warning("%r: exec output still open %.0fs after kill; closing the stream", self, KILL_GRACE)
        except SandboxError:
            return
        run.abort()
        try:
            await asyncio.wait_for(asyncio.shield(finished), ABORT_GRACE)
        except TimeoutError:
            finished.add_done_callback(_ignore_outcome)
            raise SandboxError(f"docker: exec in {self.container_id[:12]} would not stop") from None
        except SandboxError:
            pass

    async def read_file(self, path: str, *, limit: int = DEFAULT_READ_LIMIT) -> bytes:
        """Stream the file's tar entry through a buffer of ``limit`` bytes, refusing all but regular files.

        The engine resolves the path inside the container (it never leaves the container's root);
        a symlink as the last component comes back as itself and is followed here, a bounded number
        of times. The stat comes first: a file over ``limit`` is never fetched whole, its head and
        tail come from ``head -c`` and ``tail -c`` in the container, which seek rather than read (a
        sparse file may claim exabytes).
        """
        self._check_open()
        target = self._resolve(path)
        async with self._files:
            for _ in range(MAX_SYMLINKS):
                with translated(f"reading {target!r}"):
                    stat = await self._call(self._engine.stat_path, self.container_id, target)
                if stat is None:
                    raise FileNotFoundError(errno.ENOENT, "no such file in the sandbox", target)
                kind = file_kind(stat)
                if kind == "symlink":
                    target = check_path(resolve_link(target, str(stat.get("linkTarget") or "")))
                    continue
                _check_kind(kind, target)
                size = int(stat.get("size", 0))
                if size > limit:
                    head = await self._in_container(["head", "-c", str(limit // 2), target], target)
                    tail = await self._in_container(["tail", "-c", str(limit - limit // 2), target], target)
                    raise FileTooLarge(target, size, head, tail)
                with translated(f"reading {target!r}"):
                    read = await self._call(self._engine.read_file, self.container_id, target, limit)
                if read is None:
                    raise FileNotFoundError(errno.ENOENT, "no such file in the sandbox", target)
                if read.buffer is None:
                    raise NotARegularFile(errno.EINVAL, "the file changed while it was read", target)
                return read_result(target, read.buffer)
        raise OSError(errno.ELOOP, "too many levels of symbolic links in the sandbox", self._resolve(path))

    async def _in_container(self, argv: list[str], target: str) -> bytes:
        """The output of a short reading command (``head -c N``), at most N bytes of it kept."""
        cap = int(argv[2])
        run = ExecRun(self._engine, self.container_id, argv, {}, cap, self.user.name)
        finished = run.start(asyncio.get_running_loop())
        try:
            exit_code = await asyncio.wait_for(asyncio.shield(finished), FILE_TIMEOUT)
        except TimeoutError:
            run.abort()
            finished.add_done_callback(_ignore_outcome)
            raise OSError(errno.ETIMEDOUT, f"`{argv[0]}` of the file timed out", target) from None
        if exit_code != 0:
            raise OSError(errno.EIO, f"`{argv[0]}` of the file failed: {run.stderr.text().strip()}", target)
        return bytes(run.stdout.head + run.stdout.tail)

    async def write_file(self, path: str, data: bytes) -> None:
        """Write as the sandbox's user would: a short program run as that user takes the content on
        its standard input (never on a command line), so what it may not write is refused, and
        symlinks resolve in the container as its own commands see them. A directory, a device, a
        FIFO or a socket is refused before it is opened."""
        self._check_open()
        target = self._resolve(path)
        if target == "/":
            raise IsADirectoryError(errno.EISDIR, "is a directory in the sandbox", "/")
        argv = ["/bin/sh", "-c", _script("write.sh"), "trajkit-write", target]
        with translated(f"writing {target!r}"):
            code = await self._call(self._engine.feed, self.container_id, argv, data, self.user.name)
        if code != 0:
            raise _write_error(code, target)

    def bridge(self, argv: Sequence[str]) -> HostBridge | None:
        """``argv`` run as :data:`~trajkit_docker.settings.BRIDGE_USER` by one exec of the engine,
        its standard streams copied by :mod:`trajkit_docker.bridge`: the container's network stays
        as it is (no port is published, nothing listens on the host) and its limits hold."""
        return HostBridge(
            (sys.executable, "-m", "trajkit_docker.bridge", self.container_id, BRIDGE_USER, *argv)
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with translated(f"removing container {self.container_id[:12]}"):
            await self._call(self._engine.remove_container, self.container_id)


class ExecRun:
    """One exec's output pump, on a thread of its own.

    Streaming occupies a thread for the whole life of the command, so it must not come from a
    bounded pool: a pool full of streams waiting to be killed would starve the kills themselves.
    The thread is a daemon and is always ended by the stream closing (normally, or by :meth:`abort`).
    """

    def __init__(
        self,
        engine: Engine,
        container_id: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        output_cap: int,
        user: str | None,
    ) -> None:
        self._engine = engine
        self._container_id = container_id
        self._argv = list(argv)
        self._env = dict(env)
        self._user = user
        self.stdout = CappedBuffer(output_cap)
        self.stderr = CappedBuffer(output_cap)
        self._stream: Any = None
        self._aborted = threading.Event()
        self._lock = threading.Lock()

    def start(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[int]:
        finished: asyncio.Future[int] = loop.create_future()
        thread = threading.Thread(
            target=self._main, args=(loop, finished), name="trajkit-docker-exec", daemon=True
        )
        thread.start()
        return finished

    def result(self, exit_code: int, *, timed_out: bool) -> ExecResult:
        return ExecResult(
            exit_code=exit_code,
            stdout=self.stdout.text(),
            stderr=self.stderr.text(),
            timed_out=timed_out,
            truncated=self.stdout.truncated or self.stderr.truncated,
        )

    def abort(self) -> None:
        """Close the output stream from another thread, ending the pump."""
        with self._lock:
            self._aborted.set()
            stream = self._stream
        if stream is not None:
            _close_quietly(stream)

    def _main(self, loop: asyncio.AbstractEventLoop, finished: asyncio.Future[int]) -> None:
        try:
            outcome: int | BaseException = self._pump()
        except BaseException as exc:
            outcome = exc
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is waiting any more
            loop.call_soon_threadsafe(_settle, finished, outcome)

    def _pump(self) -> int:
        with translated("running a command"):
            exec_id = self._engine.exec_create(self._container_id, self._argv, self._env, self._user)
            stream = self._engine.exec_stream(exec_id)
            with self._lock:
                self._stream = stream
                aborted = self._aborted.is_set()
            if aborted:
                _close_quietly(stream)
            for out, err in stream:
                if out:
                    self.stdout.feed(out)
                if err:
                    self.stderr.feed(err)
            if self._aborted.is_set():
                return -1
            return self._engine.exec_exit_code(exec_id)


def _settle(finished: asyncio.Future[int], outcome: int | BaseException) -> None:
    if finished.done():
        return
    if isinstance(outcome, BaseException):
        finished.set_exception(outcome)
    else:
        finished.set_result(outcome)


def _ignore_outcome(finished: asyncio.Future[int]) -> None:
    """Retrieve the outcome nobody waits for any more, so asyncio does not report it as lost."""
    if not finished.cancelled():
        finished.exception()


def _close_quietly(stream: Any) -> None:
    try:
        stream.close()
    except Exception as exc:
        log.debug("closing an exec stream failed: %s", exc)


def _check_kind(kind: str, target: str) -> None:
    """Refuse what is not a regular file: a directory, a device, a FIFO, a socket."""
    if kind == "dir":
        raise IsADirectoryError(errno.EISDIR, "is a directory in the sandbox", target)
    if kind != "file":
        raise NotARegularFile(
            errno.EINVAL, "not a regular file in the sandbox (device, FIFO or socket)", target
        )


def _write_error(code: int, target: str) -> OSError:
    """The file error behind the writer's exit code."""
    if code == 20:
        return NotADirectoryError(errno.ENOTDIR, "a parent is not a directory in the sandbox", target)
    if code == 21:
        return IsADirectoryError(errno.EISDIR, "is a directory in the sandbox", target)
    if code == 22:
        return NotARegularFile(
            errno.EINVAL, "not a regular file in the sandbox (device, FIFO or socket)", target
        )
    if code == 13:
        return PermissionError(errno.EACCES, "the sandbox's user may not write it", target)
    if code == 40:
        return OSError(errno.ELOOP, "too many levels of symbolic links in the sandbox", target)
    return OSError(errno.EIO, f"writing failed in the sandbox (exit {code})", target)
