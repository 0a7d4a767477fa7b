"""The sandbox contract every backend keeps.

A *backend* (local, docker, modal, singularity, ...) creates one fresh :class:`Sandbox` per prompt
from a :class:`SandboxSpec`. A sandbox offers three operations, ``exec``, ``read_file`` and
``write_file``, whose exceptions are part of the contract, and a lifecycle (``close``) kept apart.

Contract (checked by ``tests/test_sandbox_conformance.py`` against every backend):

- ``exec`` returns only when the command and every process it started are dead; on timeout the
  whole process tree is killed and ``ExecResult.timed_out`` is true (exit code 124 or the
  backend's own, never an exception).
- stdout and stderr are kept apart and capped *while they stream*: the head and the tail are kept
  and the cut is marked with :func:`truncation_marker`.
- files travel as bytes, never through a command line; a missing file raises
  :class:`FileNotFoundError`, a directory raises :class:`IsADirectoryError`.
- relative paths are relative to the sandbox's working directory.
- the model is hostile: file operations never follow a symlink or ``..`` out of the sandbox (the
  attempt raises :class:`OutsideSandbox`), touch only regular files (a device, FIFO or socket raises
  :class:`NotARegularFile` at once, never blocks), and a read holds at most ``limit`` bytes: a larger
  file raises :class:`FileTooLarge` carrying its real size, head and tail.
- a path no engine accepts (a NUL byte, text that is not valid UTF-8, more than
  :data:`PATH_MAX` bytes, a name of more than :data:`NAME_MAX` bytes) raises :class:`InvalidPath`
  (an OSError: the model is told, the session goes on), never :class:`SandboxError`; no file
  error names a host path (an engine's overlay directory, the runner's scratch directories).
- ``close`` is idempotent and leaves nothing behind.
- sandbox failures (could not start, engine gone) raise :class:`SandboxError`; an image that
  cannot be had raises :class:`ImageUnavailable`.
"""

from __future__ import annotations

import errno
import os
import re
import socket
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, ClassVar

from pydantic import BeforeValidator

from trajkit.config.settings import Configurable, Metavar, StrictSettings

if TYPE_CHECKING:
    from trajkit.sandbox.processes import SandboxProcess

DEFAULT_CWD = "/work"
"""Where a prompt's commands run when its row names no ``cwd``."""
DEFAULT_OUTPUT_CAP = 64 * 1024
DEFAULT_OUTPUT_KEPT = 200 * 1024
"""Bytes of a background process's output kept in the runner (head and tail)."""
DEFAULT_READ_LIMIT = 8 * 1024 * 1024
"""Most bytes one ``read_file`` holds in the runner; a larger file comes back as head and tail."""


class SandboxError(RuntimeError):
    """The sandbox itself failed (engine unreachable, container died, ...)."""

    error_class = "sandbox_error"


class ImageUnavailable(SandboxError):
    """The image a prompt asks for cannot be found, pulled or built."""

    error_class = "image_unavailable"


class OutsideSandbox(PermissionError):
    """A path, or a symlink on the way, leads out of what the sandbox may touch."""


class NotARegularFile(OSError):
    """The path names a device, FIFO or socket: file operations refuse it instead of blocking on it."""


class InvalidPath(OSError):
    """A path that no engine accepts (see :func:`check_path`): a file error, not a sandbox failure."""


PATH_MAX = 4096
"""Bytes of a path the kernel takes, its terminating NUL included."""
NAME_MAX = 255
"""Bytes of one name in a path."""


def check_path(path: str) -> str:
    """``path`` unchanged when every engine can take it, else :class:`InvalidPath` saying why.

    The message never repeats the path (it may be thousands of characters, or not printable).
    Backends check the absolute path they resolve (the working directory joined with what the
    model gave), the file tools the path as given.
    """
    if "\0" in path:
        raise InvalidPath(errno.EINVAL, "the path contains a NUL byte")
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidPath(errno.EILSEQ, "the path is not valid UTF-8 text") from None
    if len(encoded) >= PATH_MAX:
        raise InvalidPath(
            errno.ENAMETOOLONG, f"the path is {len(encoded)} bytes long; at most {PATH_MAX - 1}"
        )
    longest = max(len(name) for name in encoded.split(b"/"))
    if longest > NAME_MAX:
        raise InvalidPath(
            errno.ENAMETOOLONG, f"a name in the path is {longest} bytes long; at most {NAME_MAX}"
        )
    return path


class FileTooLarge(OSError):
    """The file is larger than the read's limit: only its head and tail were read."""

    def __init__(self, path: str, size: int, head: bytes, tail: bytes) -> None:
        super().__init__(f"{path}: {size} bytes, more than the {len(head) + len(tail)} bytes a read holds")
        self.path = path
        self.size = size
        self.head = head
        self.tail = tail


def read_result(path: str, buffer: CappedBuffer) -> bytes:
    """The whole file a :class:`CappedBuffer` of the read's limit was fed, or :class:`FileTooLarge`."""
    if buffer.truncated:
        raise FileTooLarge(path, buffer.total, bytes(buffer.head), bytes(buffer.tail))
    return bytes(buffer.head + buffer.tail)


@dataclass(frozen=True)
class SandboxSpec:
    """What one prompt's sandbox must look like."""

    run_id: str
    work_id: str
    image: str | None = None
    cwd: str | None = None
    lifetime: float = 3600.0
    """Seconds after which the backend itself destroys the sandbox, even if trajkit died."""
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SandboxInfo:
    """What the trajectory record says about the sandbox a prompt ran in."""

    backend: str
    image: str | None = None
    digest: str | None = None


@dataclass(frozen=True)
class HostBridge:
    """A command of the runner's host that runs a program inside a sandbox, the program's standard
    input and output being the host command's own (see :meth:`Sandbox.bridge`)."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables the host command needs besides the runner's environment (an engine's address)."""


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False


class Sandbox(ABC):
    """One prompt's isolated environment."""

    info: SandboxInfo
    cwd: str
    """Absolute working directory inside the sandbox; relative paths resolve against it."""

    @abstractmethod
    async def exec(
        self,
        command: str,
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        output_cap: int = DEFAULT_OUTPUT_CAP,
    ) -> ExecResult:
        """Run ``command`` with ``/bin/sh -c`` in the working directory."""

    @abstractmethod
    async def read_file(self, path: str, *, limit: int = DEFAULT_READ_LIMIT) -> bytes:
        """The content of the regular file ``path``.

        Raises :class:`FileTooLarge` (with the head and tail, ``limit`` bytes in all) when the file
        is larger than ``limit``; :class:`NotARegularFile`, :class:`OutsideSandbox`,
        :class:`FileNotFoundError`, :class:`IsADirectoryError` as the contract above says.
        """

    @abstractmethod
    async def write_file(self, path: str, data: bytes) -> None:
        """Write ``data`` to the regular file ``path`` (created if missing), creating parent directories.

        Never writes through a symlink out of the sandbox nor into a device, FIFO or socket.
        """

    @abstractmethod
    async def close(self) -> None:
        """Destroy the sandbox. Safe to call more than once."""

    def bridge(self, argv: Sequence[str]) -> HostBridge | None:
        """A host command that runs ``argv`` inside the sandbox, with its standard input and output
        those of the host command and nothing else of the host's: for a program driven over a pipe
        from the runner, such as a browser over its DevTools pipe. The program runs under the
        sandbox's limits and network, as a user other than the one commands run as where the
        backend can (so commands cannot read or write its pipe), and ends with the sandbox.

        None (the default) when the backend has no such command.
        """
        return None

    async def start_process(
        self, command: str, *, env: Mapping[str, str] | None = None, output_kept: int = DEFAULT_OUTPUT_KEPT
    ) -> SandboxProcess:
        """Start ``command`` (``/bin/sh -c`` in the working directory) in the background: it runs
        until it exits, is killed, or the sandbox closes; its standard input is a pipe the caller
        writes, its standard output and error one stream of which ``output_kept`` bytes are kept
        (head and tail).

        The default is built on :meth:`exec` and files inside the sandbox
        (:class:`trajkit.sandbox.processes.ExecProcess`), so every backend has it; backends that can stream
        the output override it.
        """
        from trajkit.sandbox.processes import ExecProcess

        process = ExecProcess(self, command, env, output_kept)
        await process.start()
        return process


class SandboxBackend(Configurable, ABC):
    """Creates sandboxes of one kind. One instance per run, made by the runner.

    ``name`` is how rows (``"backend": "docker"``) and flags (``--sandbox``) select it.
    ``image_based`` says whether rows with an ``image`` may route to it.
    """

    name: ClassVar[str]
    image_based: ClassVar[bool] = False
    default_for_images: ClassVar[bool] = False
    """Rows with an image that name no backend (and no ``--image_backend`` or route) go here."""
    description: ClassVar[str] = ""
    Settings: ClassVar[type[StrictSettings]] = StrictSettings
    """The backend's settings (``--sandbox_option NAME.KEY=VALUE``, ``--NAME.KEY``, the
    configuration file's ``[sandbox_options.NAME]``); none by default."""

    @classmethod
    def owns_image(cls, image: str) -> bool:
        """True if ``image`` is a reference only this backend understands (e.g. ``*.sif``).

        A class method: routing asks every installed backend before any of them is made.
        """
        return False

    async def verify_image(self, image: str) -> str | None:
        """Make ``image`` usable (present locally, pulled or built) before any model call.

        Called once per distinct image, before sessions start. Returns the image's digest when
        known. Raises :class:`ImageUnavailable` with a reason a person can act on.
        """
        return None

    @abstractmethod
    async def create(self, spec: SandboxSpec) -> Sandbox:
        """Create and start a fresh sandbox. Raises :class:`SandboxError`."""

    async def reap(self, run_id: str | None = None) -> int:
        """Remove sandboxes left behind by dead runs (all of ``run_id``'s when given).

        Returns how many were removed. Called at the start of every run.
        """
        return 0

    async def aclose(self) -> None:
        """Release clients and connections at the end of a run."""


def owner_tag() -> str:
    """``host:pid`` of this process, to label sandboxes so a later reaper can tell their owner died."""
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_gone(owner: str) -> bool:
    """True if ``owner`` (an :func:`owner_tag`) is a process of this host that no longer runs.

    Another host's owner, our own process, or a malformed tag count as alive: a reaper must never
    remove what it cannot prove abandoned.
    """
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def truncation_marker(omitted: int) -> str:
    return f"\n[... {omitted} bytes truncated ...]\n"


class CappedBuffer:
    """Keeps the first and last ``cap // 2`` bytes of a stream fed chunk by chunk.

    Memory stays bounded by ``cap`` however much the stream produces.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap // 2 - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            excess = len(self.tail) - (self.cap - self.cap // 2)
            if excess > 0:
                del self.tail[:excess]

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def text(self) -> str:
        head = self.head.decode("utf-8", "replace")
        tail = self.tail.decode("utf-8", "replace")
        if self.truncated:
            return head + truncation_marker(self.total - len(self.head) - len(self.tail)) + tail
        return head + tail


def cap_text(text: str, cap: int) -> str:
    """Cap an already complete string the same way :class:`CappedBuffer` caps a stream."""
    data = text.encode("utf-8", "replace")
    if len(data) <= cap:
        return text
    buffer = CappedBuffer(cap)
    buffer.feed(data)
    return buffer.text()


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)b?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def size_in_bytes(value: object) -> object:
    """A size given as text (``512m``, ``4G``, ``1.5g``, ``100000`` for bytes) as a number of bytes.

    For a settings field's ``BeforeValidator``: other values (an int from a configuration file) pass
    through for pydantic to check; a text that is no size raises ValueError saying what is expected.
    """
    if not isinstance(value, str):
        return value
    match = _SIZE.match(value)
    if match is None:
        raise ValueError(f"{value!r} is not a size: expected bytes, or a number with K, M, G or T (512m, 4G)")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def none_lifts(value: object) -> object:
    """``none`` (any case) as None, the value that lifts a limit; for a ``BeforeValidator``."""
    return None if isinstance(value, str) and value.strip().lower() == "none" else value


def size_or_none(value: object) -> object:
    """:func:`size_in_bytes`, with ``none`` lifting the limit."""
    value = none_lifts(value)
    return None if value is None else size_in_bytes(value)


def lowered(value: object) -> object:
    """A choice compared without case or surrounding blanks; for a ``BeforeValidator``."""
    return value.strip().lower() if isinstance(value, str) else value


ByteSize = Annotated[int, BeforeValidator(size_in_bytes), Metavar("SIZE")]
"""A number of bytes that a setting may also give as ``512m`` or ``4G``; bound it with ``Field(gt=0)``."""
ByteLimit = Annotated[int | None, BeforeValidator(size_or_none), Metavar("SIZE|none")]
"""A limit in bytes (``512m``, ``4G``...) that ``none`` lifts; bound it with ``Field(gt=0)``."""
CountLimit = Annotated[int | None, BeforeValidator(none_lifts), Metavar("INTEGER|none")]
"""A limit on a count that ``none`` lifts; bound it with ``Field(gt=0)``."""
