"""Blocking calls to the Docker Engine API, with engine errors turned into trajkit's exceptions.

Everything here blocks, so the async layer runs each call in a worker thread. The ``docker`` SDK is
imported inside the functions that need it: importing this package (for example to list plugins)
must not require the SDK, nor pay for importing it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import posixpath
import re
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from trajkit.sandbox import CappedBuffer, ImageUnavailable, SandboxError
from trajkit_docker.archive import stream_entry

POOL_SIZE = 128
"""Connections kept to the engine; each running exec holds one for as long as it streams."""
HAND_OVER_SPOOL = 4 * 1024 * 1024
"""Bytes of a working directory's rewritten archive held in memory; more goes to a temporary file."""
FEED_CHUNK = 64 * 1024
REMOVE_WAIT = 15.0
"""Seconds to wait for a removal that the engine reports as already in progress."""


@contextmanager
def translated(action: str) -> Iterator[None]:
    """Turn SDK and transport failures into :class:`SandboxError` saying what was being done."""
    import docker.errors
    import requests.exceptions

    try:
        yield
    except docker.errors.APIError as exc:
        raise SandboxError(f"docker: {action} failed: {api_message(exc)}") from exc
    except docker.errors.DockerException as exc:
        raise SandboxError(f"docker: {action} failed: {without_host_paths(str(exc))}") from exc
    except requests.exceptions.RequestException as exc:
        raise SandboxError(
            f"docker: {action} failed, engine unreachable ({engine_address()}): {exc}"
        ) from exc


def api_message(exc: Any) -> str:
    """The engine's own words for an API error, without the SDK's URL noise."""
    explanation = getattr(exc, "explanation", None)
    if isinstance(explanation, bytes):
        explanation = explanation.decode("utf-8", "replace")
    return without_host_paths(str(explanation or exc).strip())


# The engine's words name its own host paths: the container's root is a directory of the engine's
# data root (``/var/lib/docker/overlay2/<id>/merged`` with overlay2, ``.../aufs/mnt/<id>``,
# ``.../btrfs/subvolumes/<id>``...). A path inside the container follows it.
_ENGINE_ROOT = re.compile(
    r"/(?:[^\s/'\"]+/)*(?:overlay2?|aufs|btrfs|zfs|vfs|fuse-overlayfs|devicemapper)/"
    r"(?:[^\s/'\"]+/)*?[0-9a-f]{12,}(?:-init)?(?:/(?:merged|diff|mnt|rootfs))?(?=/|[\s'\":]|$)"
)
_ENGINE_FILES = re.compile(r"/(?:[^\s/'\"]+/)*containers/[0-9a-f]{64}(?=/|[\s'\":]|$)")


def without_host_paths(text: str) -> str:
    """The engine's message with its own host directories cut, leaving paths as the container sees
    them (``lstat /var/lib/docker/overlay2/ab12.../merged/work/x`` -> ``lstat /work/x``)."""
    text = _ENGINE_ROOT.sub("", text)
    return _ENGINE_FILES.sub("<container>", text)


def path_error(message: str, path: str) -> OSError | None:
    """The file error an engine failure about ``path`` stands for (the engine says it only in
    words, and those words name its host directories, which must not reach the model): told with
    the sandbox's path alone. None when the failure is no file error."""
    message = message.lower()
    if "too many links" in message:
        return OSError(errno.ELOOP, "too many levels of symbolic links in the sandbox", path)
    if "not a directory" in message:
        return NotADirectoryError(errno.ENOTDIR, "a parent is not a directory in the sandbox", path)
    if "name too long" in message:
        return OSError(errno.ENAMETOOLONG, "a name in the path is too long for the sandbox", path)
    if "invalid argument" in message:
        return OSError(errno.EINVAL, "the sandbox cannot take this path", path)
    return None


def no_such_container(exc: Any) -> bool:
    """True for "not found", which podman may also report as a 500 while it removes a container."""
    import docker.errors

    return isinstance(exc, docker.errors.NotFound) or "no such container" in api_message(exc).lower()


def engine_address() -> str:
    return os.environ.get("DOCKER_HOST") or "default socket /var/run/docker.sock"


@dataclass(frozen=True)
class ContainerSummary:
    id: str
    labels: Mapping[str, str]
    state: str


class Engine:
    """One SDK client shared by a backend and all its sandboxes (the SDK client is thread-safe)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.api = client.api

    @classmethod
    def connect(cls) -> Engine:
        """Connect as ``docker`` would (DOCKER_HOST, or the default socket) and check it answers."""
        import docker

        with translated(f"connecting to the engine at {engine_address()}"):
            client = docker.from_env(max_pool_size=POOL_SIZE)
            try:
                client.ping()
            except BaseException:
                client.close()
                raise
        return cls(client)

    def close(self) -> None:
        self.client.close()

    # Images

    def image_digest(self, image: str) -> str | None:
        """The image's repo digest (or its id for local-only images); None when it is not present."""
        import docker.errors

        with translated(f"inspecting image {image!r}"):
            try:
                attrs = self.api.inspect_image(image)
            except docker.errors.ImageNotFound:
                return None
            except docker.errors.APIError as exc:
                if exc.status_code == 400:
                    raise ImageUnavailable(
                        f"image {image!r} is not a valid reference: {api_message(exc)}"
                    ) from exc
                raise
        digests = attrs.get("RepoDigests") or []
        return str(digests[0]) if digests else str(attrs.get("Id"))

    def pull(self, image: str, deadline: float) -> str | None:
        """Pull ``image``, stopping at ``deadline`` (monotonic); return the engine's error, if any.

        Progress is streamed so the deadline is checked between messages: a slow pull cannot keep
        a worker thread busy long past the point where its caller gave up.
        """
        import docker.errors

        error: str | None = None
        try:
            for message in self.api.pull(image, stream=True, decode=True):
                if isinstance(message, dict) and message.get("error"):
                    error = str(message["error"])
                if time.monotonic() > deadline:
                    return "pull timed out"
        except docker.errors.APIError as exc:
            return api_message(exc)
        except docker.errors.DockerException as exc:
            return str(exc)
        except OSError as exc:
            return f"engine unreachable: {exc}"
        return error

    # Containers

    def create_container(
        self, *, image: str, command: Sequence[str], config: Mapping[str, Any], files: bytes
    ) -> str:
        """Create and start a container, then extract ``files`` (a tar) at its root; remove it on failure.

        Raises ``docker.errors.ImageNotFound`` for a missing image: the engine never pulls here.
        """
        host_config = self.api.create_host_config(**config["host"])
        created = self.api.create_container(
            image,
            command=list(command),
            detach=True,
            host_config=host_config,
            **config["container"],
        )
        container_id = str(created["Id"])
        try:
            self.api.start(container_id)
            self.put_archive(container_id, "/", files)
        except BaseException:
            self.remove_container(container_id)
            raise
        return container_id

    def remove_container(self, container_id: str) -> bool:
        """Force-remove a container; True if it existed. Returns once the engine no longer lists it."""
        import docker.errors

        try:
            self.api.remove_container(container_id, force=True, v=True)
            return True
        except docker.errors.APIError as exc:
            if no_such_container(exc):
                return False
            if exc.status_code != 409:
                raise
        # 409: an auto-removal (the lifetime ran out) is already in progress; wait for it.
        give_up = time.monotonic() + REMOVE_WAIT
        while time.monotonic() < give_up:
            if not self.api.containers(all=True, filters={"id": container_id}):
                return True
            time.sleep(0.1)
        raise SandboxError(f"docker: container {container_id[:12]} is still being removed")

    def list_containers(self, labels: Sequence[str]) -> list[ContainerSummary]:
        found = self.api.containers(all=True, filters={"label": list(labels)})
        return [
            ContainerSummary(id=str(item["Id"]), labels=item.get("Labels") or {}, state=item.get("State", ""))
            for item in found
        ]

    # Exec

    def exec_create(
        self, container_id: str, argv: Sequence[str], env: Mapping[str, str], user: str | None = None
    ) -> str:
        """An exec of ``argv`` as ``user`` (None: the container's own user), not started yet."""
        created = self.api.exec_create(
            container_id,
            list(argv),
            stdout=True,
            stderr=True,
            stdin=False,
            tty=False,
            environment=[f"{key}={value}" for key, value in env.items()],
            user=user or "",
        )
        return str(created["Id"])

    def exec_stream(self, exec_id: str) -> Any:
        """Start an exec; returns an iterator of ``(stdout, stderr)`` chunks with a ``close()``."""
        return self.api.exec_start(exec_id, stream=True, demux=True)

    def exec_exit_code(self, exec_id: str, wait: float = 5.0) -> int:
        """The exit code once the engine has recorded it (shortly after the stream ends)."""
        give_up = time.monotonic() + wait
        while True:
            state = self.api.exec_inspect(exec_id)
            if not state.get("Running") and state.get("ExitCode") is not None:
                return int(state["ExitCode"])
            if time.monotonic() > give_up:
                raise SandboxError("docker: exec ended its output but the engine reports no exit code")
            time.sleep(0.02)

    def feed(self, container_id: str, argv: Sequence[str], data: bytes, user: str | None) -> int:
        """Run ``argv`` as ``user`` with ``data`` on its standard input, to its end; its exit code.

        The exec's stream is hijacked (as ``docker exec -i`` does): ``data`` is sent, the sending
        half closed, and whatever comes back read until the engine closes the stream. Reading is
        bounded by the client's socket timeout, so a program that never ends cannot hold this."""
        import socket

        created = self.api.exec_create(
            container_id, list(argv), stdin=True, stdout=True, stderr=True, tty=False, user=user or ""
        )
        stream = self.api.exec_start(created["Id"], socket=True)
        raw = getattr(stream, "_sock", stream)
        try:
            raw.sendall(data)
            raw.shutdown(socket.SHUT_WR)
            while raw.recv(FEED_CHUNK):
                pass
        except OSError as exc:
            raise SandboxError(f"docker: feeding a command failed: {exc}") from exc
        finally:
            stream.close()
        return self.exec_exit_code(str(created["Id"]))

    def run_helper(self, container_id: str, argv: Sequence[str], user: str | None = None) -> tuple[int, str]:
        """Run a short helper command to completion, as ``user``; its exit code and stdout."""
        exec_id = self.exec_create(container_id, argv, {}, user)
        stdout, _ = self.api.exec_start(exec_id, demux=True)
        return self.exec_exit_code(exec_id), (stdout or b"").decode("utf-8", "replace")

    # Files

    def put_archive(self, container_id: str, directory: str, archive: bytes) -> bool:
        """Extract ``archive`` into ``directory``; False if that directory does not exist.

        By default the engine silently replaces a directory (with all it holds) by a file of the same
        name; ``noOverwriteDirNonDir`` makes that an error instead. The SDK's ``put_archive`` cannot
        pass the parameter, hence the request is made with the SDK's own request helpers.
        """
        import docker.errors

        url = self.api._url("/containers/{0}/archive", container_id)
        params = {"path": directory, "noOverwriteDirNonDir": "true"}
        try:
            self.api._raise_for_status(self.api._put(url, params=params, data=archive))
        except docker.errors.NotFound:
            return False
        return True

    def hand_over(self, container_id: str, directory: str, uid: int, gid: int) -> int | None:
        """Make ``directory`` and everything in it belong to ``uid:gid``: its archive goes out and
        back in with the owners rewritten. The engine holds the container locked while an archive
        streams out, so the rewritten one is spooled (to disk past :data:`HAND_OVER_SPOOL` bytes)
        before it goes back in. The directory's mode when it held nothing, else None."""
        from trajkit_docker.users import write_owned_by

        archive = self.open_archive(container_id, directory)
        if archive is None:
            raise SandboxError(f"docker: the working directory {directory} is missing from the container")
        url = self.api._url("/containers/{0}/archive", container_id)
        params = {"path": posixpath.dirname(directory), "noOverwriteDirNonDir": "true"}
        with tempfile.SpooledTemporaryFile(HAND_OVER_SPOOL, prefix="trajkit-hand-over-") as spool:
            with contextlib.closing(archive):
                empty_mode = write_owned_by(archive.chunks(), uid, gid, spool)  # type: ignore[arg-type]
            spool.seek(0)
            self.api._raise_for_status(self.api._put(url, params=params, data=spool))
        return empty_mode

    def commit(self, container_id: str, repository: str, tag: str, labels: Mapping[str, str]) -> str:
        """Commit the container as ``repository:tag``, with ``labels``; the image's id."""
        changes = [f"LABEL {key}={json.dumps(value)}" for key, value in labels.items()]
        return str(self.api.commit(container_id, repository=repository, tag=tag, changes=changes)["Id"])

    def remove_image(self, image: str) -> None:
        """Remove an image this backend made; already gone is fine."""
        import docker.errors

        with contextlib.suppress(docker.errors.ImageNotFound, docker.errors.NotFound):
            self.api.remove_image(image, force=True)

    def list_images(self, label: str) -> list[tuple[str, Mapping[str, str]]]:
        """Ids and labels of the images carrying ``label``."""
        return [
            (str(item["Id"]), item.get("Labels") or {}) for item in self.api.images(filters={"label": label})
        ]

    def image_user(self, image: str) -> str:
        """The user the image names (its ``USER``), ``""`` when none."""
        with translated(f"inspecting image {image!r}"):
            return str((self.api.inspect_image(image).get("Config") or {}).get("User") or "")

    def read_file(self, container_id: str, path: str, limit: int) -> FileRead | None:
        """The stat of ``path`` and, for a regular file, its whole tar entry streamed into a buffer
        of ``limit`` bytes (which keeps head and tail should the file have grown). None if missing.

        The response is always read to its end: the engine mounts the container's file system for
        each archive request and unmounts it only when the request is done, and a request dropped
        halfway races with the next one (dockerd 20.10 then fails it with a mount error).
        """
        archive = self.open_archive(container_id, path)
        if archive is None:
            return None
        with contextlib.closing(archive):
            if file_kind(archive.stat) != "file":
                for _ in archive.chunks():  # one tar header: the entry itself, never what it names
                    pass
                return FileRead(archive.stat, None)
            buffer = CappedBuffer(limit)
            stream_entry(archive.chunks(), buffer)
            return FileRead(archive.stat, buffer)

    def stat_path(self, container_id: str, path: str) -> Mapping[str, Any] | None:
        """The stat of ``path`` (a symlink as itself), from a HEAD request; None if it does not exist."""
        from docker.utils import decode_json_header

        url = self.api._url("/containers/{0}/archive", container_id)
        response = self.api.head(url, params={"path": path}, timeout=self.api.timeout)
        if response.status_code >= 400:
            # A HEAD answer has no body, hence no reason (a missing path and a missing container are
            # both 404): ask again with GET for the engine's words. Either fails before any tar.
            archive = self.open_archive(container_id, path)
            if archive is None:
                return None
            archive.close()  # the path came into being meanwhile; whatever the engine's trouble was, say so
            raise SandboxError(f"docker: the engine could not stat {path!r} (HTTP {response.status_code})")
        encoded = response.headers.get("X-Docker-Container-Path-Stat")
        return decode_json_header(encoded) if encoded else {}

    def open_archive(self, container_id: str, path: str) -> Archive | None:
        """Start fetching the tar of ``path``; None if it does not exist.

        Only the response's headers (with the path's stat) have been read when this returns: the
        caller decides from the stat whether to stream the body, and must close the archive.
        The SDK's ``get_archive`` cannot hand back the response to close, hence the raw request.
        """
        import docker.errors
        from docker.utils import decode_json_header

        url = self.api._url("/containers/{0}/archive", container_id)
        headers = {"Accept-Encoding": "identity"}
        response = self.api._get(url, params={"path": path}, stream=True, headers=headers)
        try:
            self.api._raise_for_status(response)
        except docker.errors.NotFound as exc:
            response.close()
            if "no such container" in api_message(exc).lower():
                raise
            return None
        except docker.errors.APIError as exc:
            response.close()
            file_error = path_error(api_message(exc), path)
            if file_error is not None:
                raise file_error from None
            raise
        except BaseException:
            response.close()
            raise
        encoded = response.headers.get("X-Docker-Container-Path-Stat")
        return Archive(decode_json_header(encoded) if encoded else {}, response)


@dataclass(frozen=True)
class FileRead:
    stat: Mapping[str, Any]
    buffer: CappedBuffer | None
    """The content for a regular file, else None."""


@dataclass(frozen=True)
class Archive:
    """A path's stat and the not yet read response that carries its tar."""

    stat: Mapping[str, Any]
    response: Any

    def chunks(self) -> Iterator[bytes]:
        """The tar, in pieces of at most :data:`ARCHIVE_CHUNK` bytes, so memory per read is bounded."""
        chunks: Iterator[bytes] = self.response.iter_content(ARCHIVE_CHUNK)
        return chunks

    def close(self) -> None:
        """Drop the connection, whatever is left unread (the engine stops tarring)."""
        self.response.close()


ARCHIVE_CHUNK = 64 * 1024
# Bits of the Go file mode (``io/fs.FileMode``) that the engine reports in an archive's stat header.
GO_MODE_DIR = 1 << 31
GO_MODE_SYMLINK = 1 << 27
GO_MODE_TYPE = GO_MODE_DIR | GO_MODE_SYMLINK | 1 << 26 | 1 << 25 | 1 << 24 | 1 << 21 | 1 << 19
"""Directory, symlink, device, named pipe, socket, character device, irregular: not a regular file."""


def file_kind(stat: Mapping[str, Any]) -> str:
    """``dir``, ``symlink``, ``file`` (regular) or ``other`` (device, FIFO, socket...) from a stat header."""
    mode = int(stat.get("mode", 0))
    if mode & GO_MODE_DIR:
        return "dir"
    if mode & GO_MODE_SYMLINK:
        return "symlink"
    return "other" if mode & GO_MODE_TYPE else "file"
