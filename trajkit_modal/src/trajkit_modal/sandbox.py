"""One Modal Sandbox: commands in process groups of their own, files through ``sb.filesystem``.

The sandbox's whole file system is the model's own (Modal runs it in a container of its own), so a
symlink is followed inside it; what must never happen is the runner holding an endless or huge file
or waiting forever on a FIFO, hence a stat before every file operation and capped reads.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import math
import os
import posixpath
import stat
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from trajkit.sandbox import (
    DEFAULT_OUTPUT_CAP,
    DEFAULT_READ_LIMIT,
    CappedBuffer,
    ExecResult,
    FileTooLarge,
    NotARegularFile,
    Sandbox,
    SandboxError,
    SandboxInfo,
    check_path,
    read_result,
)
from trajkit.sandbox.shell import script

if TYPE_CHECKING:
    from trajkit_modal.backend import ModalBackend

log = logging.getLogger(__name__)
T = TypeVar("T")

MODAL_EXEC_TIMED_OUT = -1
"""What Modal's ``ContainerProcess.wait()`` returns when the exec's own timeout expired."""
EXEC_GRACE = 30.0
"""How long past its timeout an exec may take before we stop waiting for Modal to report it."""
STREAM_GRACE = 5.0
"""How long output may keep streaming after the command exited (a stray process holds the pipe)."""
MAX_SYMLINKS = 16
"""Symlinks one file operation follows; a loop or a long chain ends in ELOOP."""


def _script(name: str) -> str:
    """``scripts/NAME`` of this package, as one line (:func:`trajkit.sandbox.shell.script`)."""
    return script("trajkit_modal", name)


@functools.cache
def _run_in_group() -> str:
    marked = script("trajkit.sandbox", "marked.sh")
    return f"{marked}; {_script('sweep.sh')}; {_script('run_in_group.sh')}"


INLINE_COMMAND_LIMIT = 32 * 1024
"""Longer commands travel through stdin: Modal refuses argument lists over 64 KiB."""

READ_NOT_REGULAR = 22
"""``scripts/read_ends.sh``'s exit status for anything but a regular file."""


class _Missing(Exception):
    """Nothing exists at the path (raised for the caller of a filesystem call to handle)."""


class ModalSandbox(Sandbox):
    """One Modal Sandbox. Commands run through ``/bin/sh -c`` in their own process group."""

    def __init__(self, backend: ModalBackend, handle: Any, cwd: str, info: SandboxInfo) -> None:
        self.backend = backend
        self.handle = handle
        self.cwd = cwd
        self.info = info
        self.closed = False

    async def locate_workdir(self) -> None:
        """Wait until the sandbox runs commands, and learn its working directory as it names it.

        Creation returns before a container may be usable; a first command that fails here is a
        sandbox failure rather than a failure of some later tool call in the middle of a session.
        """
        result = await self.exec("pwd", timeout=self.backend.settings.call_timeout)
        lines = result.stdout.splitlines()
        if result.exit_code != 0 or not lines or not lines[-1].startswith("/"):
            detail = result.stderr.strip()[:500] or f"exit code {result.exit_code}"
            raise SandboxError(f"modal: the sandbox cannot run commands in {self.cwd}: {detail}")
        self.cwd = lines[-1]

    async def exec(
        self,
        command: str,
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        output_cap: int = DEFAULT_OUTPUT_CAP,
    ) -> ExecResult:
        self._check_open()
        exec_id = uuid.uuid4().hex
        inline = len(command) <= INLINE_COMMAND_LIMIT
        start = self.handle.exec.aio(
            "/bin/sh",
            "-c",
            _run_in_group(),
            "trajkit-exec",
            command if inline else "",
            exec_id,
            "" if inline else "stdin",
            timeout=_whole_seconds(timeout),
            workdir=self.cwd,
            env=dict(env) if env else None,
            text=False,
        )
        process = await self.backend._bounded(start, self.backend.settings.call_timeout, "starting a command")
        if not inline:
            await self._send_command(process, command)
        stdout, stderr = CappedBuffer(output_cap), CappedBuffer(output_cap)
        exit_code = await self._collect(process, stdout, stderr, timeout + EXEC_GRACE)
        timed_out = exit_code == MODAL_EXEC_TIMED_OUT
        if timed_out:
            await self._kill(exec_id, env)
        return ExecResult(
            exit_code=124 if timed_out else exit_code,
            stdout=stdout.text(),
            stderr=stderr.text(),
            timed_out=timed_out,
            truncated=stdout.truncated or stderr.truncated,
        )

    async def _send_command(self, process: Any, command: str) -> None:
        process.stdin.write(command.encode("utf-8"))
        process.stdin.write_eof()
        drain = process.stdin.drain.aio()
        await self.backend._bounded(drain, self.backend.settings.call_timeout, "sending a long command")

    async def _collect(self, process: Any, stdout: CappedBuffer, stderr: CappedBuffer, limit: float) -> int:
        """Stream both outputs into their buffers while waiting for the exit code."""
        pumps = asyncio.gather(_pump(process.stdout, stdout), _pump(process.stderr, stderr))
        try:
            exit_code: int = await asyncio.wait_for(process.wait.aio(), limit)
        except TimeoutError:
            exit_code = MODAL_EXEC_TIMED_OUT
        except BaseException as exc:
            await _cancel(pumps)
            if isinstance(exc, Exception):
                raise self.backend._sandbox_error(exc, "waiting for a command", limit) from exc
            raise
        try:
            # Modal ends both streams when the command exits or its timeout expires; a process that
            # escaped the group may keep a pipe open, and its output is not worth waiting for.
            await asyncio.wait_for(pumps, STREAM_GRACE)
        except TimeoutError:
            pass
        except Exception as exc:
            raise self.backend._sandbox_error(exc, "reading a command's output", STREAM_GRACE) from exc
        return exit_code

    async def _kill(self, exec_id: str, env: Mapping[str, str] | None = None) -> None:
        """Kill a timed-out command's process group from a second exec, in the command's own
        environment (its ``TMPDIR`` says where the group's file is).

        Modal only stops waiting when an exec times out; it does not promise to kill what the
        command started, and the contract says nothing may outlive the call.
        """
        seconds = self.backend.settings.call_timeout
        try:
            start = self.handle.exec.aio(
                "/bin/sh",
                "-c",
                _script("kill_group.sh"),
                "trajkit-kill",
                exec_id,
                timeout=30,
                env=dict(env) if env else None,
            )
            process = await asyncio.wait_for(start, seconds)
            await asyncio.wait_for(process.wait.aio(), seconds)
        except Exception as exc:
            reason = self.backend._sandbox_error(exc, "killing a timed-out command", seconds)
            log.warning("%s", reason)

    async def read_file(self, path: str, *, limit: int = DEFAULT_READ_LIMIT) -> bytes:
        """The regular file ``path``: its stat first, then the whole of it or only its head and tail.

        ``sb.filesystem.read_bytes`` hands back a whole file, so it is only used for a regular file
        the stat shows to fit in ``limit``. A larger one is read by ``head -c`` and ``tail -c`` in
        the sandbox, streamed through a buffer of ``limit`` bytes; so is one whose stat names no file
        type (size 0, as devices and /proc files report), after the sandbox itself checked it is a
        regular file, since an endless device given to ``read_bytes`` would be held whole.
        """
        self._check_open()
        target, info = await self._stat_following(self._resolve(path))
        if info is None:
            raise FileNotFoundError(errno.ENOENT, "no such file in the sandbox", target)
        _check_type(info, target)
        size = int(info.size)
        if size > limit or not stat.S_IFMT(info.mode):
            return await self._read_in_sandbox(target, size, limit)
        data: bytes = await self._file_call(self.handle.filesystem.read_bytes.aio(target), target)
        if len(data) > limit:  # it grew since its stat
            buffer = CappedBuffer(limit)
            buffer.feed(data)
            return read_result(target, buffer)
        return data

    async def write_file(self, path: str, data: bytes) -> None:
        """Write to the end of the path's symlinks, a regular file or nothing yet; refuse anything else
        (writing a FIFO would block, a device has effects of its own)."""
        self._check_open()
        target, info = await self._stat_following(self._resolve(path))
        if info is not None:
            _check_type(info, target)
        # Modal's write_bytes creates missing parent directories itself.
        await self._file_call(self.handle.filesystem.write_bytes.aio(bytes(data), target), target)

    async def _stat_following(self, target: str) -> tuple[str, Any]:
        """``target``'s stat with symlinks as the last component followed (inside the sandbox, a bounded
        number of times), and where they lead; the stat is None when nothing is there."""
        not_found = self.backend.sdk.exception.SandboxFilesystemNotFoundError
        for _ in range(MAX_SYMLINKS):
            try:
                info = await self._file_call(self.handle.filesystem.stat.aio(target), target, not_found)
            except _Missing:
                return target, None
            if info.type.value != "symlink":
                return target, info
            link = str(info.symlink_target or "")
            target = check_path(posixpath.normpath(posixpath.join(posixpath.dirname(target), link)))
        raise OSError(errno.ELOOP, "too many levels of symbolic links in the sandbox", target)

    async def _read_in_sandbox(self, target: str, size: int, limit: int) -> bytes:
        """Head and tail (or all, when it fits) of the regular file ``target``, read by ``head``/``tail``
        in the sandbox and streamed through a buffer of ``limit`` bytes."""
        seconds = self.backend.settings.call_timeout
        start = self.handle.exec.aio(
            "/bin/sh",
            "-c",
            _script("read_ends.sh"),
            "trajkit-read",
            target,
            str(limit),
            timeout=_whole_seconds(seconds),
            text=False,
        )
        process = await self.backend._bounded(start, seconds, f"reading {target}")
        content, errors = CappedBuffer(limit + 1), CappedBuffer(4096)
        exit_code = await self._collect(process, content, errors, seconds + EXEC_GRACE)
        if exit_code == READ_NOT_REGULAR:
            raise NotARegularFile(
                errno.EINVAL, "not a regular file in the sandbox (device, FIFO or socket)", target
            )
        if exit_code != 0:
            raise OSError(errno.EIO, f"cannot read the file: {errors.text().strip()[:300]}", target)
        data = bytes(content.head + content.tail)
        if size > limit:
            raise FileTooLarge(target, size, data[: limit // 2], data[limit // 2 : limit])
        if content.total <= limit:
            return data
        # A file whose stat named no size (a /proc file), or one that grew, larger than the limit.
        raise FileTooLarge(target, content.total, data[: limit // 2], data[-(limit - limit // 2) :])

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.backend._open.discard(self)
        seconds = self.backend.settings.call_timeout
        try:
            await asyncio.wait_for(self.handle.terminate.aio(), seconds)
        except Exception as exc:
            # Its lifetime still ends it; the run must not fail because a cleanup call did.
            reason = self.backend._sandbox_error(exc, "terminating the sandbox", seconds)
            log.warning("modal: %s (sandbox %s)", reason, getattr(self.handle, "object_id", "?"))

    def _resolve(self, path: str) -> str:
        """``path`` absolute in the sandbox; InvalidPath for one Modal's file API would refuse."""
        check_path(path)
        return check_path(
            posixpath.normpath(path if path.startswith("/") else posixpath.join(self.cwd, path))
        )

    async def _file_call(
        self, call: Awaitable[T], path: str, missing: type[BaseException] | None = None
    ) -> T:
        """Await a filesystem call, mapping Modal's file errors onto Python's own (``missing`` onto
        :class:`_Missing`, for the caller to handle)."""
        seconds = self.backend.settings.call_timeout
        try:
            return await asyncio.wait_for(call, seconds)
        except Exception as exc:
            if missing is not None and isinstance(exc, missing):
                raise _Missing from exc
            raise self._file_error(exc, path, seconds) from exc

    def _file_error(self, exc: BaseException, path: str, seconds: float) -> BaseException:
        errors = self.backend.sdk.exception
        table: list[tuple[type[BaseException], Callable[..., OSError], int]] = [
            (errors.SandboxFilesystemNotFoundError, FileNotFoundError, errno.ENOENT),
            (errors.SandboxFilesystemIsADirectoryError, IsADirectoryError, errno.EISDIR),
            (errors.SandboxFilesystemNotADirectoryError, NotADirectoryError, errno.ENOTDIR),
            (errors.SandboxFilesystemPermissionError, PermissionError, errno.EACCES),
            (errors.SandboxFilesystemFileTooLargeError, OSError, errno.EFBIG),
            (errors.SandboxFilesystemError, OSError, errno.EIO),
        ]
        for modal_error, python_error, code in table:
            if isinstance(exc, modal_error):
                return python_error(code, os.strerror(code), path)
        return self.backend._sandbox_error(exc, f"accessing {path}", seconds)

    def _check_open(self) -> None:
        if self.closed:
            raise SandboxError("modal: sandbox is closed")


async def _pump(stream: Any, buffer: CappedBuffer) -> None:
    async for chunk in stream:
        buffer.feed(chunk if isinstance(chunk, bytes) else chunk.encode("utf-8"))


async def _cancel(future: asyncio.Future[Any]) -> None:
    """Cancel ``future`` and wait for it, without letting its outcome (or cancellation) escape."""
    future.cancel()
    await asyncio.wait([future])
    if not future.cancelled():
        future.exception()


def _check_type(info: Any, target: str) -> None:
    """Refuse what the stat shows is not a regular file. fs-tools reports three types (file,
    directory, symlink); its ``mode`` carries the full ``st_mode``, whose type bits tell a device,
    FIFO or socket apart from a regular file."""
    if info.type.value == "directory" or stat.S_ISDIR(info.mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory in the sandbox", target)
    if stat.S_IFMT(info.mode) and not stat.S_ISREG(info.mode):
        raise NotARegularFile(
            errno.EINVAL, "not a regular file in the sandbox (device, FIFO or socket)", target
        )


def _whole_seconds(timeout: float) -> int:
    """Modal takes exec timeouts in whole seconds; round up so a command never gets less time."""
    return max(1, math.ceil(timeout))
