"""Modal sandboxes: one Modal Sandbox per prompt, in one Modal app per run.

Settings (``--sandbox_option modal.KEY=VALUE``, ``[sandbox_options.modal]``): see
:class:`trajkit_modal.settings.ModalSettings` (app, environment, cpu, memory, block_network,
registry_secret, the pace and retries of creations, and bounds on every call to Modal).

Credentials come only from Modal's own configuration (``MODAL_TOKEN_ID``/``MODAL_TOKEN_SECRET`` or
``~/.modal.toml``); this module never reads them.

The SDK is imported on first use, so registering the plugin costs nothing when no row routes to
Modal, and it is used through its ``.aio`` forms only, so nothing blocks the event loop. The
sandbox class and the pacing are imported when the backend is made too: every ``trajkit`` command
loads this module to register the class, and a run on another backend needs only its attributes and
its settings.
"""

from __future__ import annotations

import asyncio
import logging
import math
import posixpath
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

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
from trajkit_modal.settings import ModalSettings

if TYPE_CHECKING:
    from trajkit_modal.sandbox import INLINE_COMMAND_LIMIT, ModalSandbox

__all__ = ["INLINE_COMMAND_LIMIT", "MAX_LIFETIME", "ModalBackend", "ModalSandbox", "ModalSettings"]

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_LIFETIME = 24 * 3600
"""Modal's upper bound on a sandbox's lifetime, in seconds."""
MAX_BACKOFF = 60.0
REAP_CONCURRENCY = 8

TAG_MARK = "trajkit"
TAG_RUN = "trajkit.run"
TAG_WORK = "trajkit.work"
TAG_OWNER = "trajkit.owner"

PRIVILEGE_NOTE = (
    "modal: sandbox commands run as the image's own user (root in most images) inside Modal's gVisor "
    "kernel: Modal's SDK has no setting for a sandbox's user or capabilities, so trajkit cannot drop "
    "them there as it does for docker and singularity"
)
AUTH_HINT = (
    "Modal rejected the credentials; configure them with `modal token set` or the "
    "MODAL_TOKEN_ID / MODAL_TOKEN_SECRET environment variables"
)


class ModalBackend(SandboxBackend):
    """Creates Modal sandboxes; ``sdk`` replaces the ``modal`` module (tests pass a fake)."""

    name = "modal"
    image_based = True
    description = "one Modal sandbox per prompt, creation rate-limited, no network by default"

    Settings = ModalSettings
    settings: ModalSettings

    def __init__(self, settings: ModalSettings | Mapping[str, object] | None = None, sdk: Any = None) -> None:
        from trajkit_modal.ratelimit import TokenBucket

        super().__init__(settings)
        self._sdk: Any = sdk
        self._app: Any = None
        self._app_lock = asyncio.Lock()
        self._images: dict[str, Any] = {}
        self._digests: dict[str, str | None] = {}
        self._bucket = TokenBucket(self.settings.create_rate, self.settings.burst)
        self._open: set[ModalSandbox] = set()
        self._said_privilege = False
        self.owner = owner_tag()

    @property
    def sdk(self) -> Any:
        if self._sdk is None:
            import modal

            self._sdk = modal
        return self._sdk

    async def verify_image(self, image: str) -> str | None:
        app = await self._lookup_app()
        timeout = self.settings.build_timeout
        try:
            built = self.sdk.Image.from_registry(image, secret=self._registry_secret())
            await asyncio.wait_for(built.build.aio(app), timeout)
        except TimeoutError:
            raise ImageUnavailable(
                f"modal: building image {image!r} took longer than {timeout:g} s"
            ) from None
        except Exception as exc:
            if isinstance(exc, self.sdk.exception.Error) and not self._is_service_failure(exc):
                raise ImageUnavailable(f"modal could not build image {image!r}: {_describe(exc)}") from exc
            raise self._sandbox_error(exc, f"building image {image!r}", timeout) from exc
        self._images[image] = built
        self._digests[image] = getattr(built, "object_id", None)
        return self._digests[image]

    async def create(self, spec: SandboxSpec) -> ModalSandbox:
        from trajkit_modal.sandbox import ModalSandbox

        cwd = _absolute_cwd(spec.cwd)
        if not self._said_privilege:
            self._said_privilege = True
            log.warning(PRIVILEGE_NOTE)
        app = await self._lookup_app()
        handle = await self._create_paced(self._create_arguments(spec, app, cwd))
        info = SandboxInfo(backend=self.name, image=spec.image, digest=self._digests.get(spec.image or ""))
        sandbox = ModalSandbox(self, handle, cwd, info)
        self._open.add(sandbox)
        try:
            await sandbox.locate_workdir()
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    async def reap(self, run_id: str | None = None) -> int:
        """Terminate ``run_id``'s sandboxes, or (without it) those whose owning process on this host died.

        Other hosts' sandboxes are left to their owners and to their lifetime.
        """
        app = await self._lookup_app()
        timeout = self.settings.call_timeout
        wanted = {TAG_MARK: "1"} if run_id is None else {TAG_MARK: "1", TAG_RUN: run_id}
        handles = await self._bounded(self._list(app.app_id, wanted), timeout, "listing sandboxes")
        limit = asyncio.Semaphore(REAP_CONCURRENCY)

        async def reap_one(handle: Any) -> bool:
            async with limit:
                if run_id is None:
                    tags = await self._bounded(handle.get_tags.aio(), timeout, "reading sandbox tags")
                    if not _owner_is_dead(tags):
                        return False
                await self._bounded(handle.terminate.aio(), timeout, "terminating a sandbox")
                return True

        results = await asyncio.gather(*(reap_one(handle) for handle in handles), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                log.warning("modal: could not reap a sandbox: %s", result)
        return sum(result is True for result in results)

    async def aclose(self) -> None:
        """Terminate whatever the run left open, then forget the app."""
        await asyncio.gather(*(sandbox.close() for sandbox in list(self._open)))
        self._app = None

    async def _lookup_app(self) -> Any:
        """The run's Modal app, looked up (or created) once and shared by every sandbox."""
        async with self._app_lock:
            if self._app is None:
                lookup = self.sdk.App.lookup.aio(
                    self.settings.app, create_if_missing=True, environment_name=self.settings.environment
                )
                what = f"looking up app {self.settings.app!r}"
                self._app = await self._bounded(lookup, self.settings.call_timeout, what)
            return self._app

    def _registry_secret(self) -> Any:
        name = self.settings.registry_secret
        if name is None:
            return None
        return self.sdk.Secret.from_name(name, environment_name=self.settings.environment)

    def _image(self, image: str | None) -> Any:
        """The image object verified earlier, or a fresh reference that Modal builds on creation."""
        if image is None:
            return None
        if image not in self._images:
            self._images[image] = self.sdk.Image.from_registry(image, secret=self._registry_secret())
        return self._images[image]

    def _create_arguments(self, spec: SandboxSpec, app: Any, cwd: str) -> dict[str, Any]:
        arguments: dict[str, Any] = {
            "app": app,
            "image": self._image(spec.image),
            # Always explicit: Modal's default lifetime (300 s) is shorter than most sessions.
            "timeout": _lifetime_seconds(spec.lifetime),
            "workdir": cwd,
            "block_network": self.settings.block_network,
            # Tagged at creation, not afterwards, so no sandbox ever exists that reap cannot find.
            "tags": {TAG_MARK: "1", TAG_RUN: spec.run_id, TAG_WORK: spec.work_id, TAG_OWNER: self.owner},
            "env": dict(spec.env) or None,
        }
        if self.settings.cpu is not None:
            arguments["cpu"] = self.settings.cpu
        if self.settings.memory is not None:
            arguments["memory"] = self.settings.memory
        return arguments

    async def _create_paced(self, arguments: dict[str, Any]) -> Any:
        """Create a sandbox at no more than the configured rate, retrying when Modal says "slow down"."""
        from trajkit_modal.ratelimit import backoff_delay

        refused = self.sdk.exception.ResourceExhaustedError
        timeout = self.settings.create_timeout
        attempt = 0
        while True:
            await self._bucket.acquire()
            try:
                return await asyncio.wait_for(self.sdk.Sandbox.create.aio(**arguments), timeout)
            except refused as exc:
                if attempt >= self.settings.create_retries:
                    raise SandboxError(
                        f"modal: sandbox creation refused {attempt + 1} times (rate limit or capacity): {exc}"
                    ) from exc
                delay = backoff_delay(attempt, self.settings.create_backoff, MAX_BACKOFF)
                log.info("modal: sandbox creation refused (%s); retrying in %.1f s", exc, delay)
                self._bucket.pause(delay)
                attempt += 1
            except Exception as exc:
                raise self._sandbox_error(exc, "creating a sandbox", timeout) from exc

    async def _list(self, app_id: str, tags: dict[str, str]) -> list[Any]:
        return [handle async for handle in self.sdk.Sandbox.list.aio(app_id=app_id, tags=tags)]

    async def _bounded(self, call: Awaitable[T], seconds: float, what: str) -> T:
        """Await one SDK call, never longer than ``seconds``, turning its failures into SandboxError."""
        try:
            return await asyncio.wait_for(call, seconds)
        except SandboxError:
            raise
        except Exception as exc:
            raise self._sandbox_error(exc, what, seconds) from exc

    def _is_service_failure(self, exc: BaseException) -> bool:
        """Failures of Modal itself or of our access to it, as opposed to failures of the request."""
        errors = self.sdk.exception
        return isinstance(exc, errors.AuthError | errors.ConnectionError | errors.ServiceError)

    def _sandbox_error(self, exc: BaseException, what: str, seconds: float) -> SandboxError:
        if isinstance(exc, SandboxError):
            return exc
        if isinstance(exc, TimeoutError):
            return SandboxError(f"modal: {what} took longer than {seconds:g} s")
        if isinstance(exc, self.sdk.exception.AuthError):
            return SandboxError(f"modal: {what} failed: {AUTH_HINT}")
        return SandboxError(f"modal: {what} failed: {_describe(exc)}")


def _absolute_cwd(cwd: str | None) -> str:
    if not cwd:
        return DEFAULT_CWD
    return posixpath.normpath(cwd if cwd.startswith("/") else f"{DEFAULT_CWD}/{cwd}")


def _lifetime_seconds(lifetime: float) -> int:
    return max(1, min(MAX_LIFETIME, math.ceil(lifetime)))


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _owner_is_dead(tags: Mapping[str, str]) -> bool:
    """True if the tags name a process on this host (not ourselves) that no longer exists."""
    return owner_gone(tags.get(TAG_OWNER, ""))


def __getattr__(name: str) -> Any:
    """``ModalSandbox`` and ``INLINE_COMMAND_LIMIT``, re-exported from :mod:`trajkit_modal.sandbox`
    when first asked for."""
    if name in ("INLINE_COMMAND_LIMIT", "ModalSandbox"):
        from trajkit_modal import sandbox

        return getattr(sandbox, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
