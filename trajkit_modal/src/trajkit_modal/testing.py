"""A local stand-in for the part of the Modal SDK that ``ModalBackend`` uses, for tests without Modal.

``FakeModal()`` replaces the ``modal`` module: pass it as ``ModalBackend(options, sdk=FakeModal())``.
It offers the same class and method names, the same signatures and the same ``.aio`` coroutine
forms as the installed ``modal`` (``tests/test_modal_backend.py`` compares them), and raises the
real ``modal.exception`` classes. Only the ``.aio`` forms work; calling a blocking form raises.

How it imitates Modal:

- each sandbox is a temporary directory ("its root"); commands run as real local processes
  (``Sandbox.exec``) with the working directory mapped into that root, a clean environment and
  stdin as a pipe (``ContainerProcess.stdin``);
- paths given to the SDK (``workdir``, ``sb.filesystem``) are mapped into the root; since commands
  see the host's file system, the root's own host path names the same files (``pwd`` prints it);
- ``sb.filesystem`` resolves symlinks inside the root as a container would, and treats FIFOs and
  devices as the real file tools would (a FIFO blocks, a device never ends): see
  :mod:`trajkit_modal.fake_files`;
- an exec's ``timeout`` makes ``ContainerProcess.wait()`` return -1 and ends its output streams,
  as Modal does, and leaves the processes running (``kill_on_exec_timeout`` changes that);
- a sandbox's ``timeout`` (lifetime) is enforced lazily, whenever the fake is next used;
- ``terminate`` kills every process the sandbox started (found by an environment marker, so that
  processes which left their process group are found too) and deletes its root.

``FakeCloud`` holds the state tests inspect or steer: creation times, errors to raise on the next
creations, images that cannot be built, registry secrets that exist.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import itertools
import os
import posixpath
import shutil
import signal
import tempfile
import time
import types
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar, cast

from modal import exception
from modal.stream_type import StreamType
from modal.types import FileInfo

from trajkit_modal import fake_files

MARKER_VARIABLE = "FAKE_MODAL_SANDBOX_ID"
ARG_MAX_BYTES = 2**16
"""Modal refuses exec and entrypoint argument lists longer than this."""
READ_CHUNK = 64 * 1024
C = TypeVar("C", bound=type)


class _Aio:
    """A callable as the Modal SDK (synchronicity) presents it: ``f.aio(...)`` is the coroutine form."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.aio = function
        self.__name__ = getattr(function, "__name__", "function")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"the Modal fake offers only the async form: {self.__name__}.aio(...)")


class aio_method:
    """An instance method reachable as ``obj.method.aio(...)``; ``Class.method.aio`` keeps ``self``."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function

    def __get__(self, instance: object, owner: type | None = None) -> _Aio:
        if instance is None:
            return _Aio(self.function)
        return _Aio(types.MethodType(self.function, instance))


class aio_static:
    """A static SDK function (``Sandbox.create``) that the fake binds to its class, for the cloud."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function

    def __get__(self, instance: object, owner: type) -> _Aio:
        return _Aio(types.MethodType(self.function, owner))


class FakeCloud:
    """Everything the fake Modal knows, and the knobs tests turn."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="fake-modal-")) if root is None else root
        self.root.mkdir(parents=True, exist_ok=True)
        self.apps: dict[str, str] = {}
        self.sandboxes: dict[str, SandboxState] = {}
        self.secrets: set[str] = set()
        self.unavailable_images: set[str] = set()
        self.image_ids: dict[str, str] = {}
        self.builds: list[str] = []
        self.create_attempts: list[float] = []
        """``time.monotonic()`` of every ``Sandbox.create`` call, refused ones included."""
        self.create_errors: list[BaseException] = []
        """Raised, in order, by the next ``Sandbox.create`` calls."""
        self.kill_on_exec_timeout = False
        self._ids = itertools.count(1)

    def new_id(self, prefix: str) -> str:
        return f"{prefix}-fake{next(self._ids):06d}"

    def live(self, app_id: str | None = None, tags: dict[str, str] | None = None) -> list[SandboxState]:
        """Sandboxes still running, in an app and carrying at least ``tags``, like ``Sandbox.list``."""
        found = []
        for state in self.sandboxes.values():
            state.expire_if_due()
            if state.terminated or (app_id is not None and state.app_id != app_id):
                continue
            if all(state.tags.get(key) == value for key, value in (tags or {}).items()):
                found.append(state)
        return found

    def leftovers(self, tags: dict[str, str]) -> list[str]:
        """What still exists of sandboxes carrying ``tags``: running sandboxes, processes, directories."""
        remains = []
        for state in self.sandboxes.values():
            if not all(state.tags.get(key) == value for key, value in tags.items()):
                continue
            state.expire_if_due()
            if not state.terminated:
                remains.append(f"sandbox {state.sandbox_id}")
            remains += [f"process {pid} of {state.sandbox_id}" for pid in _marked_pids(state.marker)]
            if state.root.exists():
                remains.append(f"directory {state.root}")
        return remains

    async def aclose(self) -> None:
        """Terminate every sandbox and delete the cloud's directory."""
        for state in list(self.sandboxes.values()):
            await state.terminate()
        shutil.rmtree(self.root, ignore_errors=True)


class SandboxState:
    """One sandbox as the fake cloud keeps it; ``Sandbox`` objects are handles onto it."""

    def __init__(
        self,
        cloud: FakeCloud,
        app_id: str,
        *,
        tags: dict[str, str],
        timeout: int,
        workdir: str | None,
        env: dict[str, str | None],
        options: dict[str, Any],
    ) -> None:
        self.cloud = cloud
        self.sandbox_id = cloud.new_id("sb")
        self.app_id = app_id
        self.tags = dict(tags)
        self.timeout = timeout
        self.workdir = workdir
        self.env = env
        self.options = options
        self.created = time.monotonic()
        self.terminated = False
        self.root = cloud.root / self.sandbox_id
        self.root.mkdir()
        self.processes: list[tuple[asyncio.AbstractEventLoop, asyncio.subprocess.Process]] = []
        self.open_fds: set[int] = set()
        if workdir is not None:
            self.host_path(workdir).mkdir(parents=True, exist_ok=True)

    @property
    def marker(self) -> bytes:
        return f"{MARKER_VARIABLE}={self.sandbox_id}".encode()

    def host_path(self, remote_path: str) -> Path:
        """Where an absolute sandbox path lives on the host (the root's own host path is kept)."""
        path = posixpath.normpath(remote_path)
        root = str(self.root)
        if path == root or path.startswith(root + "/"):
            return Path(path)
        return self.root / path.lstrip("/")

    def check_running(self) -> None:
        self.expire_if_due()
        if self.terminated:
            raise exception.NotFoundError(
                "The Sandbox is unavailable. This Sandbox may have already shut down."
            )

    def expire_if_due(self) -> None:
        if not self.terminated and time.monotonic() > self.created + self.timeout:
            self.terminated = True
            for _ in range(3):
                if not _kill_marked(self.marker):
                    break
            self._release()

    async def terminate(self) -> None:
        if self.terminated:
            return
        self.terminated = True
        _kill_marked(self.marker)
        loop = asyncio.get_running_loop()
        for owner_loop, process in self.processes:
            if owner_loop is loop:
                with contextlib.suppress(TimeoutError, ProcessLookupError):
                    await asyncio.wait_for(process.wait(), 5)
        for _ in range(20):  # a process forking while we kill may leave a marked child behind
            if not _kill_marked(self.marker):
                break
            await asyncio.sleep(0.01)
        self._release()

    def _release(self) -> None:
        """Close the pipes nobody read and delete the sandbox's files."""
        for fd in list(self.open_fds):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.open_fds.clear()
        shutil.rmtree(self.root, ignore_errors=True)


class App:
    """``modal.App`` as far as ``App.lookup`` and ``app.app_id`` go."""

    _cloud: ClassVar[FakeCloud]

    def __init__(self, name: str, app_id: str) -> None:
        self._name = name
        self._app_id = app_id

    @property
    def app_id(self) -> str | None:
        return self._app_id

    @aio_static
    async def lookup(
        cls: type[App],
        name: str,
        *,
        client: Any = None,
        environment_name: str | None = None,
        create_if_missing: bool = False,
    ) -> App:
        cloud = cls._cloud
        if name not in cloud.apps:
            if not create_if_missing:
                raise exception.NotFoundError(f"App '{name}' not found")
            cloud.apps[name] = cloud.new_id("ap")
        return cls(name, cloud.apps[name])


class Secret:
    """``modal.Secret.from_name``: a lazy reference, resolved when an image build uses it."""

    _cloud: ClassVar[FakeCloud]

    def __init__(self, name: str) -> None:
        self.name = name

    @classmethod
    def from_name(
        cls,
        name: str,
        *,
        environment_name: str | None = None,
        required_keys: list[str] = [],  # noqa: B006 - mirrors the SDK's signature
        client: Any = None,
    ) -> Secret:
        return cls(name)


class Image:
    """``modal.Image.from_registry`` and ``image.build``; images named in the cloud's
    ``unavailable_images`` fail to build, as do references to secrets the cloud does not have."""

    _cloud: ClassVar[FakeCloud]

    def __init__(self, tag: str, secret: Secret | None) -> None:
        self.tag = tag
        self.secret = secret
        self._object_id: str | None = None

    @property
    def object_id(self) -> str | None:
        return self._object_id

    @classmethod
    def from_registry(
        cls,
        tag: str,
        secret: Secret | None = None,
        *,
        setup_dockerfile_commands: list[str] = [],  # noqa: B006 - mirrors the SDK's signature
        force_build: bool = False,
        add_python: str | None = None,
        **kwargs: Any,
    ) -> Image:
        return cls(tag, secret)

    @aio_method
    async def build(self, app: App | None = None) -> Image:
        cloud = self._cloud
        cloud.builds.append(self.tag)
        await asyncio.sleep(0)
        if app is not None and app.app_id is None:
            raise exception.InvalidError(
                "App has not been initialized yet. Use the context manager `app.run()`"
            )
        if self.secret is not None and self.secret.name not in cloud.secrets:
            raise exception.NotFoundError(f"Secret '{self.secret.name}' not found")
        image_id = cloud.image_ids.setdefault(self.tag, cloud.new_id("im"))
        if self.tag in cloud.unavailable_images:
            raise exception.ImageBuildError(
                f"Image build for {image_id} failed: {self.tag} not found", image_id
            )
        self._object_id = image_id
        return self


class StreamReader:
    """An exec's stdout or stderr: iterate it chunk by chunk, or ``read`` it whole, once."""

    def __init__(
        self, state: SandboxState, fd: int | None, deadline: float | None, text: bool, number: int
    ) -> None:
        self._state = state
        self._fd = fd
        self._deadline = deadline
        self._text = text
        self._number = number

    @property
    def file_descriptor(self) -> int:
        return self._number

    @aio_method
    async def read(self) -> str | bytes:
        parts = [part async for part in self]
        return "".join(parts) if self._text else b"".join(parts)

    async def __aiter__(self) -> AsyncIterator[Any]:
        fd, self._fd = self._fd, None
        if fd is None or fd not in self._state.open_fds:  # never piped, already read, or shut down
            return
        self._state.open_fds.discard(fd)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        reader = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
        )
        try:
            while chunk := await self._next_chunk(reader):
                yield decoder.decode(chunk) if self._text else chunk
            if self._text and (rest := decoder.decode(b"", final=True)):
                yield rest
        finally:
            transport.close()

    async def _next_chunk(self, reader: asyncio.StreamReader) -> bytes:
        """The next chunk, or nothing once the exec's deadline has passed (Modal ends the stream)."""
        if self._deadline is None:
            return await reader.read(READ_CHUNK)
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            return b""
        try:
            return await asyncio.wait_for(reader.read(READ_CHUNK), remaining)
        except TimeoutError:
            return b""


class StreamWriter:
    """An exec's stdin: ``write`` buffers, ``drain`` sends, ``write_eof`` closes after the next drain."""

    def __init__(self, state: SandboxState, fd: int) -> None:
        self._state = state
        self._fd: int | None = fd
        self._buffer = bytearray()
        self._eof = False

    def write(self, data: bytes | bytearray | memoryview | str) -> None:
        if self._eof:
            raise ValueError("Stdin is closed. Cannot write to it.")
        self._buffer += data.encode("utf-8") if isinstance(data, str) else data

    def write_eof(self) -> None:
        self._eof = True

    @aio_method
    async def drain(self) -> None:
        data, self._buffer = bytes(self._buffer), bytearray()
        if self._fd not in self._state.open_fds:
            if data:
                raise exception.ExecutionError("stdin of a finished process")
            return
        assert self._fd is not None
        try:
            await asyncio.to_thread(_write_all, self._fd, data)
        except BrokenPipeError:
            raise exception.ExecutionError("the process closed its stdin") from None
        if self._eof:
            self._close()

    def _close(self) -> None:
        """Called when the stream ends or its process exits; the sandbox may have closed it already."""
        fd, self._fd = self._fd, None
        if fd is not None and fd in self._state.open_fds:
            self._state.open_fds.discard(fd)
            os.close(fd)


class ContainerProcess:
    """``modal.container_process.ContainerProcess``: a command started by ``Sandbox.exec``."""

    def __init__(
        self,
        state: SandboxState,
        process: asyncio.subprocess.Process,
        stdin: StreamWriter,
        stdout: StreamReader,
        stderr: StreamReader,
        deadline: float | None,
    ) -> None:
        self._state = state
        self._process = process
        self._stdin = stdin
        self._stdout = stdout
        self._stderr = stderr
        self._deadline = deadline
        self._returncode: int | None = None

    @property
    def stdin(self) -> StreamWriter:
        return self._stdin

    @property
    def stdout(self) -> StreamReader:
        return self._stdout

    @property
    def stderr(self) -> StreamReader:
        return self._stderr

    @property
    def returncode(self) -> int:
        if self._returncode is None:
            raise exception.InvalidError("You must call wait() before accessing the returncode.")
        return self._returncode

    @aio_method
    async def poll(self) -> int | None:
        if self._returncode is None and self._process.returncode is not None:
            self._returncode = _exit_code(self._process.returncode)
            self._stdin._close()
        elif self._returncode is None and self._deadline is not None and time.monotonic() > self._deadline:
            self._returncode = -1
        return self._returncode

    @aio_method
    async def wait(self) -> int:
        if self._returncode is not None:
            return self._returncode
        remaining = None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
        try:
            self._returncode = _exit_code(await asyncio.wait_for(self._process.wait(), remaining))
            self._stdin._close()
        except TimeoutError:
            # Modal reports an exec's timeout as -1, not as an exception.
            if self._state.cloud.kill_on_exec_timeout:
                with contextlib.suppress(ProcessLookupError):
                    self._process.kill()
            self._returncode = -1
        return self._returncode


class SandboxFilesystem:
    """``sb.filesystem`` as in Modal 1.6: ``stat``, whole-file reads and writes by absolute path,
    resolved like a container would (see :mod:`trajkit_modal.fake_files`)."""

    def __init__(self, state: SandboxState) -> None:
        self._state = state

    @aio_method
    async def stat(self, remote_path: str) -> FileInfo:
        try:
            return fake_files.file_info(remote_path, self._target(remote_path, "stat", follow_last=False))
        except OSError as exc:
            raise fake_files.error_for(exc, remote_path, "stat") from None

    @aio_method
    async def read_bytes(self, remote_path: str) -> bytes:
        try:
            return await fake_files.read_whole(self._target(remote_path, "read_bytes", follow_last=True))
        except OSError as exc:
            raise fake_files.error_for(exc, remote_path, "read") from None

    @aio_method
    async def write_bytes(self, data: bytes | bytearray | memoryview, remote_path: str) -> None:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError("data must be bytes-like")
        try:
            target = self._target(remote_path, "write_bytes", follow_last=True, create_parents=True)
            await fake_files.write_whole(target, bytes(data))
        except OSError as exc:
            raise fake_files.error_for(exc, remote_path, "write") from None

    def _target(
        self, remote_path: str, operation: str, *, follow_last: bool, create_parents: bool = False
    ) -> Path:
        if not posixpath.isabs(remote_path):
            raise exception.InvalidError(
                f"Sandbox.filesystem.{operation}() currently only supports absolute remote_path values"
            )
        self._state.check_running()
        root = fake_files.Root(self._state.root)
        return root.resolve(remote_path, follow_last=follow_last, create_parents=create_parents)


class Sandbox:
    """``modal.Sandbox``: create, exec, filesystem, tags, list and terminate."""

    _cloud: ClassVar[FakeCloud]

    def __init__(self, state: SandboxState) -> None:
        self._state = state
        self._filesystem = SandboxFilesystem(state)

    @property
    def object_id(self) -> str:
        return self._state.sandbox_id

    @property
    def filesystem(self) -> SandboxFilesystem:
        return self._filesystem

    @aio_static
    async def create(
        cls: type[Sandbox],
        *args: str,
        app: App | None = None,
        name: str | None = None,
        tags: dict[str, str] | None = None,
        image: Image | None = None,
        env: dict[str, str | None] | None = None,
        secrets: Collection[Secret] | None = None,
        network_file_systems: dict[Any, Any] = {},  # noqa: B006 - mirrors the SDK's signature
        timeout: int | None = 300,
        idle_timeout: int | None = None,
        workdir: str | None = None,
        gpu: str | None = None,
        cloud: str | None = None,
        region: str | Sequence[str] | None = None,
        cpu: float | tuple[float, float] | None = None,
        memory: int | tuple[int, int] | None = None,
        runtime: str | None = None,
        block_network: bool = False,
        outbound_cidr_allowlist: Sequence[str] | None = None,
        outbound_domain_allowlist: Sequence[str] | None = None,
        _experimental_outbound_policy: Any = None,
        inbound_cidr_allowlist: Sequence[str] | None = None,
        volumes: dict[Any, Any] = {},  # noqa: B006
        pty: bool = False,
        encrypted_ports: Sequence[int] = [],
        h2_ports: Sequence[int] = [],
        unencrypted_ports: Sequence[int] = [],
        custom_domain: str | None = None,
        proxy: Any = None,
        include_oidc_identity_token: bool = False,
        readiness_probe: Any = None,
        verbose: bool = False,
        experimental_options: dict[str, Any] | None = None,
        _experimental_enable_snapshot: bool = False,
        _experimental_persistent: bool = False,
        client: Any = None,
        environment_name: str | None = None,
        pty_info: Any = None,
        cidr_allowlist: Sequence[str] | None = None,
    ) -> Sandbox:
        fake = cls._cloud
        fake.create_attempts.append(time.monotonic())
        await asyncio.sleep(0)
        if fake.create_errors:
            raise fake.create_errors.pop(0)
        _check_create(args, app, timeout, workdir)
        if image is not None and image.tag in fake.unavailable_images:
            raise exception.ImageBuildError(f"Image build for {image.tag} failed", fake.new_id("im"))
        assert app is not None and app.app_id is not None and timeout is not None
        options: dict[str, Any] = {"image": image.tag if image else None, "cpu": cpu, "memory": memory}
        options |= {"block_network": block_network, "secrets": secrets, "name": name}
        state = SandboxState(
            fake,
            app.app_id,
            tags=tags or {},
            timeout=timeout,
            workdir=workdir,
            env=env or {},
            options=options,
        )
        fake.sandboxes[state.sandbox_id] = state
        return cls(state)

    @aio_static
    async def list(
        cls: type[Sandbox],
        *,
        app_id: str | None = None,
        tags: dict[str, str] | None = None,
        client: Any = None,
    ) -> AsyncIterator[Sandbox]:
        for state in cls._cloud.live(app_id, tags):
            yield cls(state)

    @aio_method
    async def get_tags(self) -> dict[str, str]:
        return dict(self._state.tags)

    @aio_method
    async def set_tags(self, tags: dict[str, str], *, client: Any = None) -> None:
        self._state.tags = dict(tags)

    @aio_method
    async def terminate(self, *, wait: bool = False) -> int | None:
        await self._state.terminate()
        return 137 if wait else None

    @aio_method
    async def exec(
        self,
        *args: str,
        stdout: StreamType = StreamType.PIPE,
        stderr: StreamType = StreamType.PIPE,
        timeout: int | None = None,
        workdir: str | None = None,
        env: dict[str, str | None] | None = None,
        secrets: Collection[Secret] | None = None,
        text: bool = True,
        bufsize: Literal[-1, 1] = -1,
        pty: bool = False,
        _pty_info: Any = None,
        pty_info: Any = None,
    ) -> ContainerProcess:
        state = self._state
        _check_exec(args, workdir)
        state.check_running()
        directory = state.host_path(workdir or state.workdir or "/")
        if not directory.is_dir():
            raise exception.InvalidError(f"workdir {workdir} does not exist in the sandbox")
        deadline = time.monotonic() + int(timeout) if timeout else None
        in_fd, stdin_writer = _stdin_pipe(state)
        out_fd, out_reader = _pipe_for(state, stdout, deadline, text, 1)
        err_fd, err_reader = _pipe_for(state, stderr, deadline, text, 2)
        try:
            process = await asyncio.create_subprocess_exec(
                *args,
                cwd=directory,
                env=self._environment(env),
                stdin=in_fd,
                stdout=out_fd,
                stderr=err_fd,
                start_new_session=True,
            )
        except OSError as exc:
            stdin_writer._close()
            raise exception.ExecutionError(f"could not start {args[0]!r}: {exc}") from None
        finally:
            for fd in (in_fd, out_fd, err_fd):
                os.close(fd)
        state.processes.append((asyncio.get_running_loop(), process))
        return ContainerProcess(state, process, stdin_writer, out_reader, err_reader, deadline)

    def _environment(self, extra: dict[str, str | None] | None) -> dict[str, str]:
        """A container's environment: nothing of the host's but PATH, plus the sandbox's and the exec's."""
        base: dict[str, str | None] = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            **self._state.env,
            **(extra or {}),
        }
        environment = {key: value for key, value in base.items() if value is not None}
        environment[MARKER_VARIABLE] = self._state.sandbox_id
        return environment


class FakeModal:
    """Stands in for the ``modal`` module: ``App``, ``Image``, ``Secret``, ``Sandbox``, ``exception``.

    Each instance is a separate cloud; its classes are bound to it, so tests do not share state.
    """

    exception = exception

    def __init__(self, root: Path | None = None) -> None:
        self.cloud = FakeCloud(root)
        self.App = _bound(App, self.cloud)
        self.Image = _bound(Image, self.cloud)
        self.Secret = _bound(Secret, self.cloud)
        self.Sandbox = _bound(Sandbox, self.cloud)

    async def aclose(self) -> None:
        await self.cloud.aclose()


def _bound(cls: C, cloud: FakeCloud) -> C:
    attributes = {"_cloud": cloud, "__module__": cls.__module__, "__qualname__": cls.__qualname__}
    return cast(C, type(cls.__name__, (cls,), attributes))


def _check_create(args: Sequence[str], app: App | None, timeout: int | None, workdir: str | None) -> None:
    """The checks ``modal.Sandbox.create`` makes before it calls the server."""
    _check_arguments(args)
    if app is None or app.app_id is None:
        raise exception.InvalidError("Sandbox.create needs an app (App.lookup(..., create_if_missing=True))")
    if timeout is None:
        raise exception.InvalidError(
            "`timeout=None` is only supported for experimental persistent Sandboxes."
        )
    if workdir is not None and not workdir.startswith("/"):
        raise exception.InvalidError(f"workdir must be an absolute path, got: {workdir}")


def _check_exec(args: Sequence[str], workdir: str | None) -> None:
    if not args:
        raise exception.InvalidError("exec needs a command")
    _check_arguments(args)
    if workdir is not None and not workdir.startswith("/"):
        raise exception.InvalidError(f"workdir must be an absolute path, got: {workdir}")


def _check_arguments(args: Sequence[str]) -> None:
    if not all(isinstance(arg, str) for arg in args):
        raise exception.InvalidError("All entrypoint arguments must be strings")
    total = sum(len(arg) for arg in args)
    if total > ARG_MAX_BYTES:
        raise exception.InvalidError(
            f"Total length of CMD arguments cannot exceed {ARG_MAX_BYTES} bytes (ARG_MAX). Got {total} bytes."
        )


def _stdin_pipe(state: SandboxState) -> tuple[int, StreamWriter]:
    """The read end for the process and a writer holding the other end."""
    read_end, write_end = os.pipe()
    state.open_fds.add(write_end)
    return read_end, StreamWriter(state, write_end)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _pipe_for(
    state: SandboxState, kind: StreamType, deadline: float | None, text: bool, number: int
) -> tuple[int, StreamReader]:
    """A write end for the process (-1 for /dev/null) and the reader of the other end.

    Plain pipes rather than asyncio's, so that waiting for the process never waits for a pipe that
    a background child still holds open.
    """
    if kind == StreamType.DEVNULL:
        return os.open(os.devnull, os.O_WRONLY), StreamReader(state, None, deadline, text, number)
    if kind != StreamType.PIPE:
        raise NotImplementedError(f"the Modal fake supports only PIPE and DEVNULL streams, not {kind}")
    read_end, write_end = os.pipe()
    state.open_fds.add(read_end)
    return write_end, StreamReader(state, read_end, deadline, text, number)


def _exit_code(returncode: int) -> int:
    """Modal reports death by signal N as 128 + N, like a shell."""
    return 128 - returncode if returncode < 0 else returncode


def _marked_pids(marker: bytes) -> list[int]:
    """Processes (not zombies) whose environment carries ``marker``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as file:
                environment = file.read()
        except OSError:
            continue
        if marker in environment.split(b"\0"):
            pids.append(int(entry))
    return pids


def _kill_marked(marker: bytes) -> bool:
    """SIGKILL every process carrying ``marker``; True if there were any."""
    pids = _marked_pids(marker)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return bool(pids)
