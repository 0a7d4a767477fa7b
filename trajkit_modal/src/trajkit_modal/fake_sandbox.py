"""The fake ``modal.Sandbox`` (:mod:`trajkit_modal.testing`): create, exec, filesystem, tags, list and
terminate, with the checks the SDK makes before it calls the server.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import time
from collections.abc import AsyncIterator, Collection, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from modal import exception
from modal.stream_type import StreamType
from modal.types import FileInfo

from trajkit_modal import fake_files
from trajkit_modal.fake_cloud import (
    MARKER_VARIABLE,
    App,
    FakeCloud,
    Image,
    SandboxState,
    Secret,
    aio_method,
    aio_static,
)
from trajkit_modal.fake_process import ContainerProcess, pipe_for, stdin_pipe

ARG_MAX_BYTES = 2**16
"""Modal refuses exec and entrypoint argument lists longer than this."""


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
        in_fd, stdin_writer = stdin_pipe(state)
        out_fd, out_reader = pipe_for(state, stdout, deadline, text, 1)
        err_fd, err_reader = pipe_for(state, stderr, deadline, text, 2)
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
        """A container's environment: nothing of the host's but PATH, a temporary directory of its
        own (a container's /tmp is its own), plus the sandbox's and the exec's."""
        base: dict[str, str | None] = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "TMPDIR": str(self._state.tmp),
            **self._state.env,
            **(extra or {}),
        }
        environment = {key: value for key, value in base.items() if value is not None}
        environment[MARKER_VARIABLE] = self._state.sandbox_id
        return environment


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
