"""File operations on the host directory bound as a sandbox's working directory.

The runner touches these files with its own (host) privileges while the model, root inside the
container, controls what they are. So no path is followed as a string: each component is opened
relative to its parent's descriptor with ``O_NOFOLLOW``, and a symlink anywhere raises
:class:`LeavesScratch` so that the caller hands the operation to the container, which resolves it
in its own file system. The last component is looked at with ``lstat`` before it is opened and
with ``fstat`` after (``O_NONBLOCK``, so a FIFO never blocks the open): only a regular file is ever
read or written; a device node the model made (``mknod``) names a host device and is refused.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from trajkit.sandbox import CappedBuffer, FileTooLarge, NotARegularFile, read_result

READ_CHUNK = 64 * 1024
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class LeavesScratch(Exception):
    """The path crosses a symlink, so only the container can resolve it."""


def read_beneath(root: Path, parts: list[str], shown: str, limit: int) -> bytes:
    """The regular file ``root/parts``, at most ``limit`` bytes of it (else :class:`FileTooLarge`)."""
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "is a directory in the sandbox", shown)
    try:
        parent = _open_parent(root, parts, create=False)
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(errno.ENOENT, "no such file in the sandbox", shown) from None
    try:
        _refuse_unless_regular(parts[-1], parent, shown, missing_ok=False)
        fd = _open_last(parts[-1], parent, os.O_RDONLY, shown)
    finally:
        os.close(parent)
    with contextlib.closing(_File(fd)):
        size = _checked_fstat(fd, shown).st_size
        if size > limit:
            raise _head_and_tail(fd, shown, size, limit)
        buffer = CappedBuffer(limit)
        while buffer.total <= limit and (chunk := os.read(fd, READ_CHUNK)):
            buffer.feed(chunk)
        if buffer.truncated:  # it grew since fstat: report what it is now
            raise _head_and_tail(fd, shown, max(os.fstat(fd).st_size, buffer.total), limit)
        return read_result(shown, buffer)


def write_beneath(
    root: Path, parts: list[str], shown: str, data: bytes, owner: tuple[int, int] | None = None
) -> None:
    """Write ``data`` to the regular file ``root/parts`` (created, with its parents, if missing);
    what it creates belongs to ``owner`` (uid, gid) when given, the sandbox's user."""
    if not parts:
        raise IsADirectoryError(errno.EISDIR, "is a directory in the sandbox", shown)
    parent = _open_parent(root, parts, create=True, owner=owner)
    try:
        _refuse_unless_regular(parts[-1], parent, shown, missing_ok=True)
        fd = _open_last(parts[-1], parent, os.O_WRONLY | os.O_CREAT, shown)
    finally:
        os.close(parent)
    with contextlib.closing(_File(fd)):
        _checked_fstat(fd, shown)
        if owner is not None:
            os.fchown(fd, *owner)
        os.ftruncate(fd, 0)  # only now: truncating at open would have emptied a file refused above
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]


class _File:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        os.close(self.fd)


def _open_parent(root: Path, parts: list[str], *, create: bool, owner: tuple[int, int] | None = None) -> int:
    """A directory fd for ``parts[:-1]`` below ``root``, following no symlink on the way; missing
    directories are made when ``create``, belonging to ``owner`` when given."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                    if owner is not None:
                        os.chown(part, *owner, dir_fd=fd, follow_symlinks=False)
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR) and _is_symlink(part, fd):
                    raise LeavesScratch from None
                raise
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _is_symlink(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _refuse_unless_regular(name: str, parent: int, shown: str, *, missing_ok: bool) -> None:
    """Look before opening: a device or FIFO is refused without ever being opened."""
    try:
        mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
    except FileNotFoundError:
        if missing_ok:
            return
        raise FileNotFoundError(errno.ENOENT, "no such file in the sandbox", shown) from None
    if stat.S_ISLNK(mode):
        raise LeavesScratch
    _check_mode(mode, shown)


def _open_last(name: str, parent: int, flags: int, shown: str) -> int:
    try:
        return os.open(name, flags | _OPEN_FLAGS, 0o644, dir_fd=parent)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise LeavesScratch from None
        if error.errno in (errno.ENOENT, errno.ENOTDIR):
            raise FileNotFoundError(errno.ENOENT, "no such file in the sandbox", shown) from None
        if error.errno == errno.EISDIR:
            raise IsADirectoryError(errno.EISDIR, "is a directory in the sandbox", shown) from None
        if error.errno == errno.ENXIO:  # a FIFO without a reader, a socket
            raise NotARegularFile(errno.ENXIO, "not a regular file in the sandbox", shown) from None
        raise


def _checked_fstat(fd: int, shown: str) -> os.stat_result:
    """Look again after opening: what was opened may not be what was looked at."""
    info = os.fstat(fd)
    _check_mode(info.st_mode, shown)
    return info


def _check_mode(mode: int, shown: str) -> None:
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory in the sandbox", shown)
    if not stat.S_ISREG(mode):
        raise NotARegularFile(
            errno.EINVAL, "not a regular file in the sandbox (device, FIFO or socket)", shown
        )


def _head_and_tail(fd: int, shown: str, size: int, limit: int) -> FileTooLarge:
    """Positional reads of both ends: nothing between them is read, however large the file."""
    head = os.pread(fd, limit // 2, 0)
    tail_size = limit - limit // 2
    tail = os.pread(fd, tail_size, max(0, size - tail_size))
    return FileTooLarge(shown, size, head, tail)
