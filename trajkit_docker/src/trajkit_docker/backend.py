"""The ``docker`` sandbox backend: one fresh container per prompt, from the prompt's image.

Containers are made to die by themselves: their main process sleeps for the sandbox's lifetime and
the engine removes them when it exits, so a runner that crashes (or is killed with SIGKILL) leaves
nothing behind for long. Labels record the run, the owner process and the deadline, so that
:meth:`DockerBackend.reap` can clean up sooner at the start of the next run.

Works against dockerd and against podman's Docker-compatible service (``DOCKER_HOST=unix://...``).

Every ``trajkit`` command loads this module (through the plugin) to register the class, and a run on
another backend needs no more of it than the class's attributes and its settings. So the engine
client, the archives and the sandbox class are imported by the methods that use them, when the
backend is made and works; the ``docker`` SDK itself only when the engine is first reached.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import posixpath
import re
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from trajkit.sandbox import (
    DEFAULT_CWD,
    ImageUnavailable,
    SandboxBackend,
    SandboxError,
    SandboxInfo,
    SandboxSpec,
    owner_gone,
    owner_tag,
)
from trajkit.sandbox.shell import script
from trajkit_docker.settings import DockerSettings

if TYPE_CHECKING:
    from trajkit_docker.engine import ContainerSummary, Engine
    from trajkit_docker.sandbox import DockerSandbox
    from trajkit_docker.users import SandboxUser
    from trajkit_docker.workdirs import WorkingDirectories

log = logging.getLogger(__name__)
T = TypeVar("T")

CONTROL_THREADS = 32
"""Worker threads for short engine calls; exec streams have threads of their own."""

# Tools that the exec wrapper, the killer, PID 1 and large file reads (scripts/*.sh) need from the
# image besides /bin/sh.
REQUIRED_TOOLS = ("setsid", "kill", "sleep", "mv", "rm", "cat", "head", "tail")


class DockerBackend(SandboxBackend):
    """Sandboxes in Docker (or podman) containers, isolated from the network by default."""

    name: ClassVar[str] = "docker"
    image_based: ClassVar[bool] = True
    default_for_images: ClassVar[bool] = True
    description: ClassVar[str] = (
        "one container per prompt: no network, 4g of memory and 1024 processes by default"
    )
    Settings = DockerSettings
    settings: DockerSettings

    def __init__(self, settings: DockerSettings | Mapping[str, object] | None = None) -> None:
        from concurrent.futures import ThreadPoolExecutor

        super().__init__(settings)
        self._engine: Engine | None = None
        self._engine_lock: asyncio.Lock | None = None
        self._executor = ThreadPoolExecutor(CONTROL_THREADS, thread_name_prefix="trajkit-docker")
        self._digests: dict[str, str | None] = {}
        self._users: dict[str, SandboxUser] = {}
        """Image -> the user its sandboxes' commands run as, probed in its first sandbox."""
        self._workdirs: WorkingDirectories | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._owner = owner_tag()

    # Plumbing

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking engine call on a worker thread, keeping the event loop free."""
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))
        except RuntimeError as exc:
            raise SandboxError("docker: the backend is closed") from exc
        return await future

    def in_background(self, coro: Coroutine[Any, Any, T], what: str) -> asyncio.Task[T]:
        """Run ``coro`` without awaiting it, keeping it referenced and logging its failure."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)

        def done(finished: asyncio.Task[T]) -> None:
            self._background.discard(finished)
            if not finished.cancelled() and finished.exception() is not None:
                log.debug("%s failed: %s", what, finished.exception())

        task.add_done_callback(done)
        return task

    async def engine(self) -> Engine:
        """The shared engine client, connected on first use."""
        if self._engine is None:
            from trajkit_docker.engine import Engine

            if self._engine_lock is None:
                self._engine_lock = asyncio.Lock()
            async with self._engine_lock:
                if self._engine is None:
                    self._engine = await self.call(Engine.connect)
        return self._engine

    # Images

    async def verify_image(self, image: str) -> str | None:
        engine = await self.engine()
        digest = None
        if self.settings.pull != "always":
            digest = await self.call(engine.image_digest, image)
        if digest is None:
            digest = await self._pull(engine, image)
        self._digests[image] = digest
        return digest

    async def _pull(self, engine: Engine, image: str) -> str:
        """Pull per the policy; under ``always`` a failed pull falls back to a local copy."""
        local = await self.call(engine.image_digest, image) if self.settings.pull == "always" else None
        if self.settings.pull == "never":
            raise ImageUnavailable(
                f"image {image!r} not found locally and pulling is off (docker.pull=never)"
            )
        timeout = self.settings.pull_timeout
        log.info("pulling image %s (at most %.0fs)", image, timeout)
        try:
            error = await asyncio.wait_for(self.call(engine.pull, image, time.monotonic() + timeout), timeout)
        except TimeoutError:
            error = f"no result within {timeout:.0f}s (docker.pull_timeout)"
        digest = await self.call(engine.image_digest, image)
        if digest is not None:
            return digest
        if local is not None:
            log.warning("pulling %s failed (%s); using the local image", image, error)
            return local
        raise ImageUnavailable(
            f"image {image!r} not found locally and pull failed: {error or 'unknown error'}"
        )

    # Sandboxes

    async def create(self, spec: SandboxSpec) -> DockerSandbox:
        from trajkit_docker.sandbox import DockerSandbox

        if not spec.image:
            raise SandboxError("the docker backend needs an image: give the row an 'image' field")
        engine = await self.engine()
        if spec.image not in self._digests:
            await self.verify_image(spec.image)
        cwd = posixpath.normpath(posixpath.join("/", spec.cwd or DEFAULT_CWD))
        workdirs = self.workdirs()
        async with workdirs.first(spec.image, cwd):
            container_id, user = await self._start(engine, spec, cwd, workdirs)
        info = SandboxInfo(self.name, spec.image, self._digests.get(spec.image))
        return DockerSandbox(self, engine, container_id, cwd, info, user)

    def workdirs(self) -> WorkingDirectories:
        from trajkit_docker.workdirs import WorkingDirectories

        if self._workdirs is None:
            self._workdirs = WorkingDirectories(self.call, self._owner)
        return self._workdirs

    async def _start(
        self, engine: Engine, spec: SandboxSpec, cwd: str, workdirs: WorkingDirectories
    ) -> tuple[str, SandboxUser]:
        """A running container for ``spec``, its working directory handed to the commands' user."""
        from trajkit_docker.engine import translated

        assert spec.image is not None
        lifetime = max(1, math.ceil(spec.lifetime))
        config = self._container_config(spec, cwd, lifetime)
        command = [
            "/bin/sh",
            "-c",
            script("trajkit_docker", "keepalive.sh"),
            "trajkit-sandbox",
            str(lifetime),
        ]
        files = workdirs.at_start(spec.image, cwd, self._users.get(spec.image))
        source = workdirs.source(spec.image, cwd)
        creation = asyncio.ensure_future(self._create_container(engine, source, command, config, files))
        try:
            container_id = await asyncio.shield(creation)
        except asyncio.CancelledError:
            self.in_background(self._discard(engine, creation), "removing a container created too late")
            raise
        try:
            user = await self._user(engine, container_id, spec.image)
            with translated(f"handing {cwd} over to the sandbox's user"):
                await workdirs.hand_over(engine, container_id, spec.image, cwd, user, bool(files))
        except BaseException:
            await asyncio.shield(self.call(engine.remove_container, container_id))
            raise
        return container_id, user

    async def _user(self, engine: Engine, container_id: str, image: str) -> SandboxUser:
        """Who commands of ``image`` run as; probed once per image in its first sandbox, which also
        refuses images that lack what timeouts and cleanup depend on."""
        from trajkit_docker.engine import translated
        from trajkit_docker.users import commands_user, probed_user

        if image not in self._users:
            image_user = await self.call(engine.image_user, image)
            name = commands_user(self.settings.user, image_user)
            argv = ["/bin/sh", "-c", script("trajkit_docker", "probe.sh"), "trajkit-check", *REQUIRED_TOOLS]
            with translated(f"checking the tools of {image!r}"):
                _, output = await self.call(engine.run_helper, container_id, argv, name)
            self._users[image] = probed_user(name, image, output)
        return self._users[image]

    async def _create_container(
        self,
        engine: Engine,
        image: str,
        command: list[str],
        config: Mapping[str, Any],
        directories: list[tuple[str, int, tuple[int, int]]],
    ) -> str:
        """Create and start the container, with the state directory and ``directories`` (relative
        to the root: path, mode, owner) made in it."""
        import docker.errors

        from trajkit_docker.archive import pack_directories
        from trajkit_docker.engine import api_message, translated
        from trajkit_docker.sandbox import STATE_DIR

        files = pack_directories((STATE_DIR.lstrip("/"), 0o1777, (0, 0)), *directories)
        with translated(f"starting a container from {image!r}"):
            try:
                return await self.call(
                    engine.create_container, image=image, command=command, config=config, files=files
                )
            except docker.errors.ImageNotFound as exc:
                raise ImageUnavailable(f"image {image!r} is not present on the engine") from exc
            except docker.errors.APIError as exc:
                if "/bin/sh" in api_message(exc):
                    raise ImageUnavailable(
                        f"image {image!r} has no usable /bin/sh: {api_message(exc)}"
                    ) from exc
                raise

    async def _discard(self, engine: Engine, creation: asyncio.Future[str]) -> None:
        """Remove the container of a ``create`` whose caller was cancelled while the engine worked."""
        try:
            container_id = await creation
        except BaseException:
            return
        await self.call(engine.remove_container, container_id)

    def _container_config(self, spec: SandboxSpec, cwd: str, lifetime: int) -> dict[str, Any]:
        """Arguments for the engine's create call: labels, working dir, user, network and limits."""
        from trajkit_docker.users import keeper_user

        labels = {
            "trajkit": "1",
            "trajkit.run": spec.run_id,
            "trajkit.work": spec.work_id,
            "trajkit.owner": self._owner,
            "trajkit.deadline": str(int(time.time()) + lifetime),
        }
        # Nothing in the container keeps a capability or can gain one (setuid binaries, file
        # capabilities), whoever it runs as.
        host: dict[str, Any] = {
            "auto_remove": True,
            "network_mode": self.settings.network,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
        }
        if self.settings.cpus is not None:
            host["nano_cpus"] = int(self.settings.cpus * 1e9)
        if self.settings.memory is not None:
            # Swap included: without memswap_limit the engine lets a container swap as much again.
            host["mem_limit"] = self.settings.memory
            host["memswap_limit"] = self.settings.memory
        if self.settings.pids_limit is not None:
            host["pids_limit"] = self.settings.pids_limit
        container = {
            "labels": labels,
            "working_dir": cwd,
            "environment": dict(spec.env),
            "name": container_name(spec),
            "user": keeper_user(self.settings.user),
        }
        return {"host": host, "container": container}

    # Cleanup

    async def reap(self, run_id: str | None = None) -> int:
        from trajkit_docker.engine import translated

        engine = await self.engine()
        with translated("listing trajkit containers"):
            containers = await self.call(engine.list_containers, ["trajkit=1"])
        doomed = [c for c in containers if (run_id and c.labels.get("trajkit.run") == run_id) or abandoned(c)]
        with translated("removing leftover containers"):
            removed = await asyncio.gather(*(self.call(engine.remove_container, c.id) for c in doomed))
        if doomed:
            log.info("removed %d leftover container(s)", sum(removed))
        await self._reap_prepared(engine)
        return sum(removed)

    async def _reap_prepared(self, engine: Engine) -> None:
        """Remove the images prepared by backends whose process died (see :mod:`trajkit_docker.workdirs`)."""
        from trajkit_docker.engine import translated
        from trajkit_docker.workdirs import PREPARED_LABEL

        with translated("listing prepared images"):
            images = await self.call(engine.list_images, PREPARED_LABEL)
        orphans = [image for image, labels in images if owner_gone(labels.get("trajkit.owner", ""))]
        with translated("removing leftover prepared images"):
            await asyncio.gather(*(self.call(engine.remove_image, image) for image in orphans))

    async def aclose(self) -> None:
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self._engine is not None:
            engine, self._engine = self._engine, None
            if self._workdirs is not None:
                await self._workdirs.aclose(engine)
            await self.call(engine.close)
        self._executor.shutdown(wait=False, cancel_futures=True)


def abandoned(container: ContainerSummary, now: float | None = None) -> bool:
    """True if nobody will close ``container``: its deadline passed or its owner (on this host) died."""
    deadline = container.labels.get("trajkit.deadline", "")
    if deadline.isdigit() and int(deadline) < (now if now is not None else time.time()):
        return True
    return owner_gone(container.labels.get("trajkit.owner", ""))


def container_name(spec: SandboxSpec) -> str:
    """A readable, unique name (``trajkit-RUN-WORK-xxxxxxxx``) within the engine's allowed characters."""

    def slug(text: str) -> str:
        return re.sub(r"[^a-zA-Z0-9_.-]+", "-", text).strip("-.")[:40] or "x"

    return f"trajkit-{slug(spec.run_id)}-{slug(spec.work_id)}-{uuid.uuid4().hex[:8]}"
