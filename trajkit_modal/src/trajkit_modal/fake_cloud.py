"""The fake Modal's cloud (:mod:`trajkit_modal.testing`): its state, sandboxes as it keeps them, apps,
secrets and images, and the ``.aio`` call forms of the SDK.

A sandbox's processes are found by an environment marker (:data:`MARKER_VARIABLE`), so that
processes which left their process group are found and killed too.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import posixpath
import shutil
import signal
import tempfile
import time
import types
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from modal import exception

MARKER_VARIABLE = "FAKE_MODAL_SANDBOX_ID"


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
        self._token = uuid.uuid4().hex[:8]
        """In every id of this cloud: a sandbox's processes are found (and killed) by an environment
        marker holding its id, across the whole host, where other clouds' sandboxes run too."""

    def new_id(self, prefix: str) -> str:
        return f"{prefix}-fake{self._token}{next(self._ids):06d}"

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
        self.tmp = self.root / "tmp"
        """The sandbox's own temporary directory (its ``TMPDIR``): commands run on the host, and
        the host's /tmp is shared with everything else on it."""
        self.tmp.mkdir()
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
