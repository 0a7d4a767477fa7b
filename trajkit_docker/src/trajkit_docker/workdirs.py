"""Working directories handed to the sandbox's user, paid for once per image and directory.

Commands run as a non-root user (see :mod:`trajkit_docker.users`), so the working directory, and
whatever the image put there (a project to fix, its tests), must belong to that user. A root
without capabilities cannot ``chown``, so the engine does it: the directory's archive goes out of
the container and back in with its owners rewritten. That costs time in proportion to what the
directory holds (about a second for 10 MB in 600 files here), so it is paid once per image and
directory, by the first sandbox:

- a directory the image leaves empty (or lacks: the engine makes it) is remembered with its
  mode, and later sandboxes get one directory entry, in the request that makes the state
  directory when it sits at the root (``/work``), else in one request of its own;
- a directory with content is handed over in the first sandbox's container, which is then
  committed as an image of its own (labelled ``trajkit.prepared``, named for no registry): later
  sandboxes start from it with the work already done. These images are removed when the backend
  closes, and by the reaper at a later start when their owner died.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from trajkit_docker.engine import Engine
    from trajkit_docker.users import SandboxUser

T = TypeVar("T")
Call = Callable[..., Awaitable[Any]]
DirectoryEntry = tuple[str, int, tuple[int, int]]
"""A directory to make in a container: its path relative to where the archive goes, mode, owner."""

PREPARED_LABEL = "trajkit.prepared"
PREPARED_REPOSITORY = "trajkit-prepared"


class WorkingDirectories:
    """What a backend knows of each (image, working directory) it has handed over."""

    def __init__(self, call: Call, owner: str) -> None:
        self._call = call
        self._owner = owner
        self._empty: dict[tuple[str, str], int] = {}
        """(image, directory) -> its mode, for directories the image leaves empty."""
        self._prepared: dict[tuple[str, str], str] = {}
        """(image, directory) -> the image committed with the directory handed over."""
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    @contextlib.asynccontextmanager
    async def first(self, image: str, cwd: str) -> AsyncIterator[None]:
        """Held while a sandbox of a pair not handed over yet is made, so that the others of the
        pair wait for its outcome rather than all paying for it."""
        key = (image, cwd)
        if key in self._empty or key in self._prepared:
            yield
            return
        async with self._locks.setdefault(key, asyncio.Lock()):
            yield

    def source(self, image: str, cwd: str) -> str:
        """The image to start a sandbox from: the prepared one when there is one."""
        return self._prepared.get((image, cwd), image)

    def at_start(self, image: str, cwd: str, user: SandboxUser | None) -> list[DirectoryEntry]:
        """The working directory as an entry of the archive put at the root when the container
        starts: when the image is known to leave it empty and it sits at the root."""
        mode = self._empty.get((image, cwd))
        if user is None or user.root or mode is None or cwd == "/" or posixpath.dirname(cwd) != "/":
            return []
        return [(cwd.lstrip("/"), mode, (user.uid, user.gid))]

    async def hand_over(
        self, engine: Engine, container_id: str, image: str, cwd: str, user: SandboxUser, made: bool
    ) -> None:
        """Give ``cwd`` and what it holds to ``user`` in a container of ``image`` (``made``: the
        archive that started the container did already)."""
        from trajkit_docker.archive import pack_directories

        key = (image, cwd)
        if made or key in self._prepared or user.root or cwd == "/":
            return
        if key in self._empty:
            entry = pack_directories((posixpath.basename(cwd), self._empty[key], (user.uid, user.gid)))
            await self._call(engine.put_archive, container_id, posixpath.dirname(cwd), entry)
            return
        empty_mode = await self._call(engine.hand_over, container_id, cwd, user.uid, user.gid)
        if empty_mode is not None:
            self._empty[key] = empty_mode
            return
        labels = {"trajkit": "1", PREPARED_LABEL: "1", "trajkit.owner": self._owner}
        tag = uuid.uuid4().hex[:12]
        self._prepared[key] = await self._call(engine.commit, container_id, PREPARED_REPOSITORY, tag, labels)

    async def aclose(self, engine: Engine) -> None:
        """Remove the images this backend prepared."""
        prepared, self._prepared = list(self._prepared.values()), {}
        await asyncio.gather(*(self._call(engine.remove_image, image) for image in prepared))
