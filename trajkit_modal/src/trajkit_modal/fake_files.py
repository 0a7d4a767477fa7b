"""How the Modal fake (:mod:`trajkit_modal.testing`) emulates a container's file system for ``sb.filesystem``.

A Modal sandbox resolves every path, symlinks included, inside its own root: a link to a host path
names a path of the container, which usually does not exist. The fake keeps each sandbox's files in
a host directory (its root), so its ``sb.filesystem`` walks paths one component at a time under that
root, re-rooting absolute link targets there, like a kernel under ``chroot``. ``/dev`` is the
host's, as a container's holds the same kinds of devices (``/dev/zero``, ``/dev/urandom``).

What the real file tools do with files that are not regular is emulated as the hazard it is: reading
a FIFO or writing one never returns, and reading an endless device would go on until the caller ran
out of memory (the fake stops at :data:`ENDLESS_GUARD` with an error that no backend may treat as a
mere file error). Commands (``Sandbox.exec``) still run as host processes and see the host's files.
"""

from __future__ import annotations

import asyncio
import grp
import os
import posixpath
import pwd
import stat
from pathlib import Path

from modal import exception
from modal.types import FileInfo, FileType

MAX_LINKS = 40
"""Symlinks one lookup follows before failing, as Linux does."""
ENDLESS_GUARD = 64 * 1024 * 1024
"""Bytes of a device the fake's ``read_bytes`` hands out before it calls the read a runaway."""
READ_SIZE_LIMIT = 64 * 1024 * 1024
"""Regular files larger than this make ``read_bytes`` fail with SandboxFilesystemFileTooLargeError,
as the real tool's (undocumented) read size limit does; the fake's value is a guess."""
DEVICES = "/dev"


class Root:
    """One sandbox's root: where its container paths live on the host."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def container_path(self, path: str) -> str:
        """``path`` as the container names it: the root's own host path stands for ``/``."""
        path = posixpath.normpath(path)
        root = str(self.root)
        if path == root or path.startswith(root + "/"):
            return "/" + path[len(root) :].lstrip("/")
        return path

    def host_path(self, container_path: str) -> Path:
        if container_path == DEVICES or container_path.startswith(DEVICES + "/"):
            return Path(container_path)
        return self.root / container_path.lstrip("/")

    def resolve(self, remote_path: str, *, follow_last: bool, create_parents: bool = False) -> Path:
        """The host path of ``remote_path`` with every symlink on the way resolved under the root.

        Raises FileNotFoundError, NotADirectoryError or OSError(ELOOP) as a lookup would; a missing
        last component is not an error (the path may be about to be created).
        """
        pending = self.container_path(remote_path).split("/")
        pending.reverse()
        resolved: list[str] = []
        links = 0
        while pending:
            part = pending.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if resolved:
                    resolved.pop()
                continue
            candidate = self.host_path("/" + "/".join([*resolved, part]))
            last = not any(p not in ("", ".") for p in pending)
            try:
                mode = os.lstat(candidate).st_mode
            except FileNotFoundError:
                if last:
                    return candidate
                if not create_parents:
                    raise
                os.mkdir(candidate, 0o755)
                mode = stat.S_IFDIR
            if stat.S_ISLNK(mode) and (follow_last or not last):
                links += 1
                if links > MAX_LINKS:
                    raise OSError(40, "Too many levels of symbolic links")
                target = self.container_path(os.readlink(candidate))
                if target.startswith("/"):
                    resolved = []
                pending.extend(reversed(target.split("/")))
                continue
            if not last and not stat.S_ISDIR(mode):
                raise NotADirectoryError(20, "Not a directory")
            resolved.append(part)
        return self.host_path("/" + "/".join(resolved))


def file_info(remote_path: str, host: Path) -> FileInfo:
    """What fs-tools' stat reports: three types, the full ``st_mode`` and the link's own target."""
    info = os.lstat(host)
    if stat.S_ISDIR(info.st_mode):
        kind = FileType.DIRECTORY
    elif stat.S_ISLNK(info.st_mode):
        kind = FileType.SYMLINK
    else:
        kind = FileType.FILE
    return FileInfo(
        name=posixpath.basename(remote_path.rstrip("/")) or "/",
        path=remote_path,
        type=kind,
        size=info.st_size,
        mode=info.st_mode,
        permissions=stat.filemode(info.st_mode)[1:],
        owner=_user(info.st_uid),
        group=_group(info.st_gid),
        modified_time=info.st_mtime,
        symlink_target=os.readlink(host) if kind is FileType.SYMLINK else None,
    )


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


async def read_whole(host: Path) -> bytes:
    """Read like the real tool: all of it, whatever it is (a FIFO blocks, a device never ends)."""
    mode = os.stat(host).st_mode
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        await _never()
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return await asyncio.to_thread(_read_device, host)
    if os.stat(host).st_size > READ_SIZE_LIMIT:
        raise exception.SandboxFilesystemFileTooLargeError(f"File too large: {host.name}")
    return await asyncio.to_thread(host.read_bytes)


async def write_whole(host: Path, data: bytes) -> None:
    try:
        mode = os.stat(host).st_mode
    except FileNotFoundError:
        mode = stat.S_IFREG
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        await _never()
    await asyncio.to_thread(host.write_bytes, data)


def _read_device(host: Path) -> bytes:
    with open(host, "rb", buffering=0) as device:
        data = device.read(ENDLESS_GUARD + 1)
    if len(data) > ENDLESS_GUARD:
        raise RuntimeError(
            f"Modal fake: read_bytes({host}) handed out {ENDLESS_GUARD} bytes of a device; the real "
            "Modal would go on until the runner runs out of memory"
        )
    return data


async def _never() -> None:
    """A FIFO without a peer: the real file tool's open never returns (until cancelled)."""
    await asyncio.Event().wait()


def error_for(exc: OSError, remote_path: str, operation: str) -> exception.SandboxFilesystemError:
    """The error Modal raises for ``exc``, as its file tools classify them for ``operation``."""
    if isinstance(exc, FileNotFoundError):
        return exception.SandboxFilesystemNotFoundError(f"No such file or directory: {remote_path}")
    if isinstance(exc, IsADirectoryError):
        return exception.SandboxFilesystemIsADirectoryError(f"Is a directory: {remote_path}")
    if isinstance(exc, NotADirectoryError | FileExistsError) and operation in ("write", "stat"):
        return exception.SandboxFilesystemNotADirectoryError(f"Not a directory: {remote_path}")
    if isinstance(exc, PermissionError):
        return exception.SandboxFilesystemPermissionError(f"Permission denied: {remote_path}")
    return exception.SandboxFilesystemError(f"{exc.strerror or exc}: {remote_path}")
