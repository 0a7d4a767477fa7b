"""One prompt's Apptainer instance: exec with a process-tree timeout, files through the scratch bind.

The working directory inside the instance is a directory of the host bound into it, so files under it
are read and written on the host directly, with no command line involved. Symlinks made inside the
sandbox must not lead such host access outside that directory: the path is walked one component at a
time with ``O_NOFOLLOW``, and a symlink anywhere hands the operation to the container, which resolves
it in its own file system (see :mod:`trajkit_singularity.files`). Paths elsewhere in the container go
through small reader and writer programs run inside it, the path passed as an argv element; a read
streams into a buffer of the read's limit, so no file makes the runner hold more.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import posixpath
import re
import secrets
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

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
)
from trajkit_singularity import scripts
from trajkit_singularity.engine import Apptainer, hide, kill_tree, spawn
from trajkit_singularity.files import LeavesScratch, read_beneath, write_beneath
from trajkit_singularity.instances import InstanceState, stop_watchdog
from trajkit_singularity.users import Confinement

TIMEOUT_EXIT_CODE = 124
KILL_TIMEOUT = 30.0
"""Seconds for the second exec that kills a timed-out command's processes."""
DRAIN_TIMEOUT = 10.0
"""Seconds to collect the last output of a killed exec."""
FILE_TIMEOUT = 300.0
"""Seconds for a file transfer through the container."""
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SingularitySandbox(Sandbox):
    def __init__(
        self,
        *,
        engine: Apptainer,
        state: InstanceState,
        watchdog: subprocess.Popen[bytes] | None,
        directory: Path,
        cwd: str,
        env: Mapping[str, str],
        info: SandboxInfo,
        confinement: Confinement,
    ) -> None:
        self.engine = engine
        self.confinement = confinement
        """Who commands run as and with what (see :mod:`trajkit_singularity.users`)."""
        self.state = state
        self._watchdog = watchdog
        self.directory = directory
        """Host directory of this sandbox: ``state.json``, ``work/`` (the working directory) and
        ``overlay/`` (writes elsewhere in the container, unless they go to a tmpfs)."""
        self.cwd = cwd
        self.env = dict(env)
        self.info = info
        self._closed = False

    @property
    def name(self) -> str:
        return self.state.name

    @property
    def work(self) -> Path:
        return self.directory / "work"

    async def exec(
        self,
        command: str,
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        output_cap: int = DEFAULT_OUTPUT_CAP,
    ) -> ExecResult:
        self._check_open()
        marker = secrets.token_hex(8)
        assignments = [f"{key}={value}" for key, value in _checked_env({**self.env, **(env or {})}).items()]
        process = await spawn(
            [
                self.engine.binary,
                *self._exec_prefix(),
                *scripts.program("launch", self.confinement.switch),
                command,
                *assignments,
            ],
            env={**self.engine.env, f"APPTAINERENV_{scripts.MARKER_VARIABLE}": marker},
        )
        assert process.stdout is not None and process.stderr is not None
        stdout, stderr = CappedBuffer(output_cap), CappedBuffer(output_cap)
        pumps = [
            asyncio.ensure_future(_pump(process.stdout, stdout)),
            asyncio.ensure_future(_pump(process.stderr, stderr)),
        ]
        finished = asyncio.ensure_future(process.wait())
        timed_out = False
        try:
            done, _ = await asyncio.wait([finished], timeout=timeout)
            timed_out = finished not in done
            if timed_out:
                await self._kill_exec(marker)
                await kill_tree(process)
            _, pending = await asyncio.wait(pumps, timeout=DRAIN_TIMEOUT)
            if pending:
                # Something that escaped the launcher's sweep still holds the output open.
                await self._kill_exec(marker)
        except BaseException:
            await asyncio.shield(self._abandon(marker, process))
            raise
        finally:
            for task in (*pumps, finished):
                task.cancel()
        returncode = process.returncode
        # Apptainer's own words (an exec it could not start) would name the runner's directories.
        said = hide(stderr.text(), self.engine.hidden)
        if not timed_out and returncode == 255 and not await self._alive():
            raise SandboxError(f"instance {self.name} is gone: {said.strip()[-500:]}")
        return ExecResult(
            exit_code=TIMEOUT_EXIT_CODE if timed_out else (returncode if returncode is not None else -1),
            stdout=stdout.text(),
            stderr=said,
            timed_out=timed_out,
            truncated=stdout.truncated or stderr.truncated,
        )

    async def read_file(self, path: str, *, limit: int = DEFAULT_READ_LIMIT) -> bytes:
        self._check_open()
        inside = self._resolve(path)
        relative = self._relative_to_work(inside)
        if relative is not None:
            with contextlib.suppress(LeavesScratch):
                return await asyncio.to_thread(read_beneath, self.work, relative, inside, limit)
        return await self._read_in_container(inside, limit)

    async def write_file(self, path: str, data: bytes) -> None:
        self._check_open()
        inside = self._resolve(path)
        relative = self._relative_to_work(inside)
        if relative is not None:
            with contextlib.suppress(LeavesScratch):
                await asyncio.to_thread(
                    write_beneath, self.work, relative, inside, data, self.confinement.owner
                )
                return
        result = await self.engine.run(
            *self._exec_prefix(),
            *scripts.program("write", self.confinement.switch),
            inside,
            timeout=FILE_TIMEOUT,
            input=data,
        )
        _raise_for_file_status(result.returncode, inside, result.reason())

    async def _read_in_container(self, inside: str, limit: int) -> bytes:
        """Read through the reader program: it checks the file, prints its size, then its content
        (the head and tail only when larger than ``limit``), which streams into a capped buffer."""
        process = await spawn(
            [
                self.engine.binary,
                *self._exec_prefix(),
                *scripts.program("read", self.confinement.switch),
                inside,
                str(limit),
            ],
            env=self.engine.env,
        )
        assert process.stdout is not None and process.stderr is not None
        content, errors = CappedBuffer(limit), CappedBuffer(4096)
        try:
            size_line, _, returncode = await asyncio.wait_for(
                asyncio.gather(
                    _size_then_content(process.stdout, content), _pump(process.stderr, errors), process.wait()
                ),
                FILE_TIMEOUT,
            )
        except BaseException:
            await asyncio.shield(kill_tree(process))
            raise
        _raise_for_file_status(returncode, inside, hide(errors.text(), self.engine.hidden).strip())
        size = int(size_line) if size_line.isdigit() else content.total
        data = bytes(content.head + content.tail)
        if size <= limit and not content.truncated:
            return data
        if content.truncated:  # the file grew past the limit between the size and the read
            raise FileTooLarge(inside, max(size, content.total), bytes(content.head), bytes(content.tail))
        raise FileTooLarge(inside, size, data[: limit // 2], data[limit // 2 :])

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._watchdog is not None:
            await asyncio.to_thread(stop_watchdog, self._watchdog)
        try:
            await self.engine.stop(self.name)
        finally:
            await asyncio.to_thread(remove_tree, self.directory)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.name} is closed")

    def _exec_prefix(self) -> list[str]:
        return [
            "--silent", "exec", "--cleanenv", *self.confinement.exec_options(), "--pwd", self.cwd,
            f"instance://{self.name}",
        ]  # fmt: skip

    def _resolve(self, path: str) -> str:
        """``path`` as an absolute, normalised path inside the container; InvalidPath for one that
        no file system (nor the argv of the in-container programs) can take."""
        if not path:
            raise FileNotFoundError(errno.ENOENT, "empty path")
        check_path(path)
        return check_path(posixpath.normpath(posixpath.join(self.cwd, path)))

    def _relative_to_work(self, inside: str) -> list[str] | None:
        """Components of ``inside`` below the working directory, or None if it lies elsewhere."""
        if inside == self.cwd:
            return []
        prefix = self.cwd.rstrip("/") + "/"
        if not inside.startswith(prefix):
            return None
        return inside[len(prefix) :].split("/")

    async def _kill_exec(self, marker: str) -> None:
        """Kill, from a second exec, every process of the exec tagged ``marker``."""
        with contextlib.suppress(SandboxError):
            await self.engine.run(
                *self._exec_prefix(),
                *scripts.program("kill", self.confinement.switch),
                marker,
                timeout=KILL_TIMEOUT,
            )

    async def _abandon(self, marker: str, process: asyncio.subprocess.Process) -> None:
        """Cancelled mid-exec: leave no process behind, inside or out."""
        await self._kill_exec(marker)
        await kill_tree(process)

    async def _alive(self) -> bool:
        try:
            return self.name in await self.engine.instances()
        except SandboxError:
            return False


async def _pump(stream: asyncio.StreamReader, buffer: CappedBuffer) -> None:
    while chunk := await stream.read(65536):
        buffer.feed(chunk)


def _checked_env(env: Mapping[str, str]) -> dict[str, str]:
    for key in env:
        if not _ENV_NAME.match(key):
            raise ValueError(f"invalid environment variable name {key!r}")
    return {key: str(value) for key, value in env.items()}


async def _size_then_content(stream: asyncio.StreamReader, buffer: CappedBuffer) -> str:
    """The reader's first line (the file's size), then the rest into ``buffer``."""
    line = await stream.readline()
    await _pump(stream, buffer)
    return line.decode("ascii", "replace").strip()


def _raise_for_file_status(returncode: int, path: str, reason: str) -> None:
    if returncode == scripts.READER_NOT_REGULAR:
        raise NotARegularFile(
            errno.EINVAL, "not a regular file in the sandbox (device, FIFO or socket)", path
        )
    if returncode == scripts.READER_MISSING:
        raise FileNotFoundError(errno.ENOENT, "no such file in the sandbox", path)
    if returncode == scripts.READER_IS_DIRECTORY:
        raise IsADirectoryError(errno.EISDIR, "is a directory in the sandbox", path)
    if returncode != 0:
        raise OSError(errno.EIO, f"cannot access the file in the sandbox: {reason}", path)


def remove_tree(path: Path) -> None:
    """Remove ``path`` entirely, even where the sandbox took away write or search permission."""

    def make_writable(function: Callable[[str], object], failed: str, _info: object) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed), 0o700)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, 0o700)
        function(failed)

    if path.is_symlink() or path.exists():
        shutil.rmtree(path, onerror=make_writable)
