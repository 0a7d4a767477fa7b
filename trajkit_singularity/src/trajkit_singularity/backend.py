"""The Apptainer/Singularity sandbox backend: one isolated instance per prompt.

Each sandbox is ``apptainer instance start --containall --no-home --net --network none --overlay DIR
--memory BYTES --pids-limit N`` of the prompt's image (or ``--writable-tmpfs`` instead of the
overlay), with a fresh host directory bound as its working directory. ``--containall`` gives it its
own PID namespace and a clean environment (nothing of the runner's). The limits need cgroups the
engine can use; where it cannot, the run says so once and goes on without them, unless the user asked
for limits explicitly.
The instance is stopped when the prompt ends; a detached watchdog stops it when its lifetime is over
even if trajkit died; and the reaper at the next start removes whatever a crash left behind.

Host directories, all under the cache directory unless configured otherwise: ``<cache>/*.sif`` (remote
references converted once), ``<cache>/locks/``, ``<cache>/digests/``, ``<cache>/apptainer/`` (Apptainer's
own layer cache), ``<cache>/tmp/`` (build scratch), ``<cache>/programs-*/`` (the in-container helper
programs) and ``<cache>/sandboxes/<instance>/`` (one per live sandbox: ``state.json``, ``work/`` and
``overlay/``).

Every ``trajkit`` command loads this module (through the plugin) to register the class, and a run on
another backend needs no more of it than the class's attributes, its settings and :meth:`owns_image`.
So the engine client, images, instances, scripts and the sandbox class are imported by the methods
that use them, when the backend is made and works.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import posixpath
import re
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from trajkit.sandbox import (
    DEFAULT_CWD,
    ImageUnavailable,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxInfo,
    SandboxSpec,
)
from trajkit_singularity.settings import SingularitySettings

if TYPE_CHECKING:
    import subprocess

    from trajkit_singularity.engine import Apptainer, CliResult
    from trajkit_singularity.instances import InstanceState
    from trajkit_singularity.users import Confinement, Switch

log = logging.getLogger(__name__)
INSPECT_TIMEOUT = 60.0
MAX_CONCURRENT_STARTS = 8
"""Instance starts at once: each mounts an image and forks a starter; a burst of hundreds thrashes."""
_CWD_UNSAFE = re.compile(r"[,:\0]")


class ResolvedImage(NamedTuple):  # not a dataclass: making one costs 0.7 ms at every import
    path: Path
    """What ``instance start`` is given: a SIF file or a sandbox directory."""
    digest: str | None
    switch: Switch | None
    """How its commands become an unprivileged user, when trajkit runs as root (else None)."""


class SingularityBackend(SandboxBackend):
    name: ClassVar[str] = "singularity"
    image_based: ClassVar[bool] = True
    description: ClassVar[str] = (
        "Apptainer/Singularity instance per prompt (SIF files, sandbox directories, docker:// and other "
        "remote references converted once into cached SIFs)"
    )

    Settings = SingularitySettings
    settings: SingularitySettings

    def __init__(self, settings: SingularitySettings | Mapping[str, object] | None = None) -> None:
        super().__init__(settings)
        self._engine: Apptainer | None = None
        self._resolved: dict[str, ResolvedImage] = {}
        self._image_locks: dict[str, asyncio.Lock] = {}
        self._start_slots: asyncio.Semaphore | None = None
        self._programs: Path | None = None
        self._limits_usable = True
        """False once an instance start showed that the engine cannot apply cgroup limits here."""
        self._seccomp_usable = True
        """False once an instance start showed that the engine cannot apply a seccomp filter."""
        self._said_root = False

    @property
    def engine(self) -> Apptainer:
        """The engine client, found on first use so that merely loading the plugin needs no binary."""
        if self._engine is None:
            from trajkit_singularity.engine import Apptainer, client_environment

            settings = self.settings
            binds = [settings.cache_dir, settings.tmp_dir, settings.scratch_dir]
            self._engine = Apptainer(
                settings.resolve_binary(),
                client_environment(
                    {
                        "APPTAINER_CACHEDIR": str(settings.cache_dir / "apptainer"),
                        "APPTAINER_TMPDIR": str(settings.tmp_dir),
                        # Read by scripts/engines/apptainer.sh's wrapper, which runs Apptainer in a
                        # rootfs of its own: these host paths must be visible there.
                        "TRAJKIT_APPTAINER_BINDS": ":".join(str(path) for path in binds),
                    }
                ),
                # The runner's directories behind the sandboxes: errors say where in them, not where.
                {
                    str(settings.scratch_dir): "<sandboxes>",
                    str(settings.tmp_dir): "<build scratch>",
                    str(settings.cache_dir): "<cache>",
                },
            )
        return self._engine

    @classmethod
    def owns_image(cls, image: str) -> bool:
        from trajkit_singularity import images

        return images.is_remote(image) or images.is_sif_path(image) or images.is_sandbox_dir(image)

    async def verify_image(self, image: str) -> str | None:
        return (await self._resolve(image)).digest

    async def create(self, spec: SandboxSpec) -> Sandbox:
        from trajkit_singularity.instances import InstanceState, instance_name, start_watchdog
        from trajkit_singularity.sandbox import SingularitySandbox

        if not spec.image:
            raise SandboxError(
                "the singularity backend needs an image: a .sif file, a sandbox directory or a remote "
                "reference such as docker://python:3.12-slim"
            )
        image = await self._resolve(spec.image)
        cwd = _container_cwd(spec.cwd)
        engine = self.engine
        programs = await self._programs_dir()
        state = InstanceState.new(
            instance_name(spec.run_id, spec.work_id), spec.run_id, spec.work_id, spec.image, spec.lifetime
        )
        directory = self.settings.scratch_dir / state.name
        confinement = self._confinement(image.switch, programs)
        await asyncio.to_thread(_prepare_directory, directory, state, confinement.owner)
        started = False
        watchdog: subprocess.Popen[bytes] | None = None
        try:
            async with self._starts():
                confinement = await self._start_instance(
                    state.name, image.path, directory, cwd, programs, confinement
                )
            started = True
            watchdog = await asyncio.to_thread(
                start_watchdog, spec.lifetime, engine.binary, state.name, directory, engine.env
            )
            state = state.with_watchdog(watchdog.pid)
            await asyncio.to_thread(state.write, directory)
        except BaseException:
            await asyncio.shield(self._discard(engine, state, directory, started, watchdog))
            raise
        return SingularitySandbox(
            engine=engine,
            state=state,
            watchdog=watchdog,
            directory=directory,
            cwd=cwd,
            env=spec.env,
            info=SandboxInfo(backend=self.name, image=spec.image, digest=image.digest),
            confinement=confinement,
        )

    async def _programs_dir(self) -> Path:
        from trajkit_singularity import scripts

        if self._programs is None:
            self._programs = await asyncio.to_thread(scripts.install, self.settings.cache_dir)
        return self._programs

    def _confinement(self, switch: Switch | None, programs: Path) -> Confinement:
        from trajkit_singularity import scripts
        from trajkit_singularity.users import Confinement, caller_is_root

        root = caller_is_root()
        seccomp = str(programs / scripts.SECCOMP_FILE) if root and self._seccomp_usable else None
        if root and switch is None and not self._said_root:
            self._said_root = True
            log.warning(
                "singularity.user=caller: sandbox commands run as root (without capabilities, with a "
                "read-only /proc/sys), and root still owns parts of the host's /sys and /proc; run "
                "trajkit as an ordinary user or use singularity.user=auto to have them run as user 65534"
            )
        return Confinement(switch=switch, seccomp=seccomp, root=root)

    async def reap(self, run_id: str | None = None) -> int:
        """Remove the sandboxes under this backend's scratch root whose run is ``run_id``, whose owner
        died, or whose lifetime is over: stop the instance, end its watchdog, remove its directory.

        Only sandboxes with a directory here are considered: an instance named ``trajkit-...`` without
        one belongs to another scratch root (another user's setup, another concurrent configuration)
        and is left alone; its own watchdog ends it when its lifetime is over.
        """
        from trajkit_singularity.instances import kill_watchdog
        from trajkit_singularity.sandbox import remove_tree

        engine = self.engine
        running = await engine.instances()
        now = time.time()
        root = self.settings.scratch_dir
        removed = 0
        for name, state in sorted((await asyncio.to_thread(_read_states, root)).items()):
            if state is not None and not state.is_leftover(run_id, now):
                continue
            if state is not None:
                kill_watchdog(state.watchdog, name)
            if name in running:
                await engine.stop(name)
            await asyncio.to_thread(remove_tree, root / name)
            removed += 1
        return removed

    async def _resolve(self, image: str) -> ResolvedImage:
        """Check (and for remote references, build) ``image`` once per backend; ImageUnavailable if not."""
        from trajkit_singularity import images

        lock = self._image_locks.setdefault(image, asyncio.Lock())
        async with lock:
            if image not in self._resolved:
                if images.is_remote(image):
                    path = await self._cached_sif(image)
                else:
                    path = images.local_path(image)
                    await self._check_local(image, path)
                digest = None
                if path.is_file():
                    digest = await asyncio.to_thread(images.sif_digest, path, self.settings.cache_dir)
                self._resolved[image] = ResolvedImage(path, digest, await self._switch(image, path))
            return self._resolved[image]

    async def _switch(self, image: str, path: Path) -> Switch | None:
        """How ``image``'s commands become user 65534 when trajkit runs as root: probed once, by
        trying it (see :mod:`trajkit_singularity.users`). None when there is nothing to switch."""
        from trajkit_singularity import scripts
        from trajkit_singularity.engine import CliTimeout
        from trajkit_singularity.users import SWITCH_CAPS, caller_is_root, no_switch, probed_switch

        if self.settings.user == "caller" or not caller_is_root():
            return None
        programs = await self._programs_dir()
        try:
            result = await self._engine_for(path).run(
                "--silent", "exec", "--containall", "--no-home", "--no-privs", "--add-caps", SWITCH_CAPS,
                "--bind", f"{programs}:{scripts.MOUNT}:ro", str(path), *scripts.program("probe"),
                timeout=INSPECT_TIMEOUT,
            )  # fmt: skip
        except CliTimeout as error:
            raise ImageUnavailable(f"{image}: {error}") from error
        switch = probed_switch(
            image, result.returncode, result.stdout.decode("utf-8", "replace"), result.reason()
        )
        if switch is None:
            raise no_switch(image)
        return switch

    async def _check_local(self, image: str, path: Path) -> None:
        from trajkit_singularity import images
        from trajkit_singularity.engine import CliTimeout

        if not path.exists():
            raise ImageUnavailable(f"{image}: no such file or directory")
        if path.is_dir() and not (path / images.SANDBOX_MARKER).is_dir():
            raise ImageUnavailable(
                f"{image}: a directory but not an Apptainer sandbox (no {images.SANDBOX_MARKER}); "
                f"make one with `apptainer build --sandbox DIR SOURCE`"
            )
        engine = self._engine_for(path)
        try:
            result = await engine.run("inspect", str(path), timeout=INSPECT_TIMEOUT)
        except CliTimeout as error:
            raise ImageUnavailable(f"{image}: {error}") from error
        if not result.ok:
            raise ImageUnavailable(f"{image}: not a usable Apptainer image: {result.reason()}")

    async def _cached_sif(self, reference: str) -> Path:
        """The cached SIF of a remote reference, built under a lock shared by every process."""
        from trajkit_singularity import images

        settings = self.settings
        target = settings.cache_dir / images.cached_sif_name(reference)
        if target.is_file():
            return target
        lock = settings.cache_dir / "locks" / f"{target.name}.lock"
        try:
            async with images.file_lock(lock, settings.build_timeout + INSPECT_TIMEOUT):
                if target.is_file():
                    return target
                await self._build(reference, target)
        except TimeoutError as error:
            raise ImageUnavailable(f"{reference}: {error} (another process is building it)") from error
        return target

    async def _build(self, reference: str, target: Path) -> None:
        import secrets

        from trajkit_singularity.engine import CliTimeout

        settings = self.settings
        await asyncio.to_thread(settings.tmp_dir.mkdir, parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{secrets.token_hex(4)}.partial")
        try:
            result = await self.engine.run("build", str(partial), reference, timeout=settings.build_timeout)
            if not result.ok:
                raise ImageUnavailable(f"{reference}: cannot convert it to a SIF: {result.reason()}")
            partial.replace(target)
        except CliTimeout as error:
            raise ImageUnavailable(f"{reference}: {error}") from error
        finally:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()

    def _engine_for(self, path: Path) -> Apptainer:
        """The engine client, with ``path``'s directory made visible to a wrapped Apptainer."""
        from trajkit_singularity.engine import Apptainer

        engine = self.engine
        env = dict(engine.env)
        env["TRAJKIT_APPTAINER_BINDS"] = f"{env['TRAJKIT_APPTAINER_BINDS']}:{path.parent}"
        return Apptainer(engine.binary, env, engine.hidden)

    @contextlib.asynccontextmanager
    async def _starts(self) -> AsyncIterator[None]:
        """Bound the instance starts in flight (the semaphore is made inside the running loop)."""
        if self._start_slots is None:
            self._start_slots = asyncio.Semaphore(MAX_CONCURRENT_STARTS)
        async with self._start_slots:
            yield

    async def _start_instance(
        self, name: str, image: Path, directory: Path, cwd: str, programs: Path, confinement: Confinement
    ) -> Confinement:
        """Start the instance; the confinement it runs with (without the seccomp filter when the
        engine showed it cannot apply one: the run says so once)."""
        from trajkit_singularity import scripts

        settings = self.settings
        network = [] if settings.network == "host" else ["--net", "--network", settings.network]
        writable = (
            ["--writable-tmpfs"]
            if settings.writable == "tmpfs"
            else ["--overlay", str(directory / "overlay")]
        )
        start = ["instance", "start", "--containall", "--no-home", *confinement.start_options()]
        args = [
            *start, *network, *writable,
            "--bind", f"{directory / 'work'}:{cwd}", "--bind", f"{programs}:{scripts.MOUNT}:ro", str(image), name,
        ]  # fmt: skip
        if confinement.seccomp and not self._seccomp_usable:
            return await self._start_instance(
                name, image, directory, cwd, programs, dataclasses.replace(confinement, seccomp=None)
            )
        limits = self._limit_options()
        result = await self._run_start(name, [*args[:2], *limits, *args[2:]], image)
        if not result.ok and limits and _cgroups_unusable(result) and not settings.limits_required:
            if self._limits_usable:  # starts in flight may all fail alike: say it once
                self._limits_usable = False
                log.warning(
                    "apptainer cannot enforce memory and process limits here (%s); sandboxes run "
                    "without them. Give Apptainer usable cgroups (root with cgroupfs, or cgroups v2 "
                    "delegated through systemd) to have them, or set singularity.memory=none and "
                    "singularity.pids_limit=none to silence this.",
                    result.reason(),
                )
            result = await self._run_start(name, args, image)
        if not result.ok and confinement.seccomp and _seccomp_unusable(result):
            if self._seccomp_usable:
                self._seccomp_usable = False
                log.warning(
                    "apptainer cannot apply a seccomp filter here (%s); sandboxes run without it, so "
                    "their commands may make user namespaces",
                    result.reason(),
                )
            return await self._start_instance(
                name, image, directory, cwd, programs, dataclasses.replace(confinement, seccomp=None)
            )
        if not result.ok:
            raise SandboxError(f"cannot start an instance of {image}: {result.reason()}")
        return confinement

    def _limit_options(self) -> list[str]:
        """``--memory`` and ``--pids-limit`` as configured, unless the engine showed it cannot."""
        if not self._limits_usable:
            return []
        memory, pids = self.settings.memory, self.settings.pids_limit
        return [
            *(["--memory", str(memory)] if memory is not None else []),
            *(["--pids-limit", str(pids)] if pids is not None else []),
        ]

    async def _run_start(self, name: str, args: list[str], image: Path) -> CliResult:
        from trajkit_singularity.engine import CliTimeout

        try:
            return await self._engine_for(image).run(*args, timeout=self.settings.start_timeout)
        except CliTimeout as error:
            raise SandboxError(f"instance {name}: {error}") from error

    async def _discard(
        self,
        engine: Apptainer,
        state: InstanceState,
        directory: Path,
        started: bool,
        watchdog: subprocess.Popen[bytes] | None,
    ) -> None:
        """Undo a half-made sandbox."""
        from trajkit_singularity.instances import stop_watchdog
        from trajkit_singularity.sandbox import remove_tree

        if watchdog is not None:
            await asyncio.to_thread(stop_watchdog, watchdog)
        with contextlib.suppress(SandboxError):
            if started or state.name in await engine.instances():
                await engine.stop(state.name)
        await asyncio.to_thread(remove_tree, directory)


def _seccomp_unusable(result: CliResult) -> bool:
    """Whether an instance start failed because the engine has no seccomp support."""
    return "seccomp" in result.stderr.decode("utf-8", "replace").lower()


def _cgroups_unusable(result: CliResult) -> bool:
    """Whether an instance start failed because the engine could not set up cgroups for its limits."""
    return "cgroup" in result.stderr.decode("utf-8", "replace").lower()


def _container_cwd(cwd: str | None) -> str:
    """The working directory inside the container: absolute, normalised, bindable."""
    path = posixpath.normpath(cwd or DEFAULT_CWD)
    if not path.startswith("/") or path == "/" or _CWD_UNSAFE.search(path):
        raise SandboxError(f"cwd {cwd!r}: must be an absolute directory other than / without ',' or ':'")
    return path


def _prepare_directory(directory: Path, state: InstanceState, owner: tuple[int, int] | None) -> None:
    """Make the sandbox's directory with its state file in place from the first moment it exists
    under its name, so a reaper never finds one without knowing its owner. The working directory
    belongs to ``owner`` (the commands' user) when given."""
    partial = directory.with_name(f".partial-{directory.name}")
    (partial / "work").mkdir(parents=True)
    if owner is not None:
        os.chown(partial / "work", *owner)
    (partial / "overlay").mkdir()
    os.chmod(partial, 0o700)
    state.write(partial)
    partial.rename(directory)


def _read_states(root: Path) -> dict[str, InstanceState | None]:
    """Every sandbox directory under ``root`` by name, with its state (None when unreadable)."""
    from trajkit_singularity.instances import PREFIX, InstanceState

    if not root.is_dir():
        return {}
    return {
        entry.name: InstanceState.read(entry)
        for entry in root.iterdir()
        if entry.is_dir() and entry.name.startswith(PREFIX)
    }
