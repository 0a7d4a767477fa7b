"""File operations confined beneath a directory, for sandboxes whose files live on the host.

A hostile command can plant symlinks (``ln -s /etc/passwd x``, ``ln -s / r``), FIFOs, huge sparse
files and ``..`` paths for the runner's own file tools to trip over. Here a path is walked one
component at a time, each opened relative to its parent's descriptor with ``O_NOFOLLOW``, so no
symlink is followed by the kernel. A symlink met on the way is resolved by hand, the way the
sandbox's commands would see it: an absolute target is read as a path of the sandbox's own view
(``view``, e.g. ``/work``) and is refused unless it lies beneath it; ``..`` never climbs above the
root. Only regular files are read or written: they are opened with ``O_NONBLOCK`` and checked with
``fstat`` before a byte moves, so a FIFO or a device is refused at once instead of blocking.
Reads check the size first and hold at most ``limit`` bytes (the head and the tail of a larger
file), so a 3 GB sparse file costs two small reads.

This is what ``openat2(RESOLVE_IN_ROOT)`` does in the kernel; Python does not expose it, and the
walk below keeps the mapping of absolute link targets to the sandbox's view, which that cannot.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from trajkit.sandbox import FileTooLarge, NotARegularFile, OutsideSandbox, check_path

MAX_LINKS = 40
"""Symlinks followed while resolving one path, as the kernel's own bound."""
MAX_STEPS = 4096
"""Components opened while walking one path, links and retries included."""
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class Beneath:
    """Paths of one sandbox: ``root`` on the host, seen as ``view`` by the sandbox's commands.

    ``owner`` (uid, gid): who the files and directories made here belong to, when the sandbox's
    commands run as another user than this process (they must be able to change them).
    """

    def __init__(self, root: str, view: str, owner: tuple[int, int] | None = None) -> None:
        self.root = root
        self.view = view.rstrip("/") or "/"
        self.owner = owner

    def relative(self, path: str, base: str = "") -> list[str]:
        """The components of ``path`` (absolute in the view, or relative to ``base``) below the root."""
        if path.startswith("/"):
            prefix = "" if self.view == "/" else self.view
            if path != prefix and not path.startswith(prefix + "/"):
                raise OutsideSandbox(f"{path}: outside the sandbox's working directory {self.view}")
            path = path[len(prefix) :]
        elif base:
            path = f"{base}/{path}"
        parts: list[str] = []
        for part in path.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                if not parts:
                    raise OutsideSandbox(f"{path}: '..' leads out of the sandbox")
                parts.pop()
            else:
                parts.append(part)
        return parts

    def read(self, path: str, limit: int) -> bytes:
        """The regular file ``path``, or :class:`FileTooLarge` with its head and tail."""
        return self.read_open(self.open_regular(path), path, limit)

    def open_regular(self, path: str) -> int:
        """A read-only descriptor of the regular file ``path``, for :meth:`read_open`."""
        return self._open_file(check_path(path), os.O_RDONLY, create=False)

    def read_open(self, fd: int, path: str, limit: int) -> bytes:
        """:meth:`read` of the descriptor ``fd`` (from :meth:`open_regular`), which it closes."""
        try:
            size = os.fstat(fd).st_size
            if size <= limit:
                data = _read_at_most(fd, limit + 1)
                if len(data) <= limit:
                    return data
                size = max(size, len(data))  # grew while being read
            head = os.pread(fd, limit // 2, 0)
            tail_size = limit - limit // 2
            tail = os.pread(fd, tail_size, max(size - tail_size, 0)) if tail_size else b""
            raise FileTooLarge(path, size, head, tail)
        finally:
            os.close(fd)

    def write(self, path: str, data: bytes) -> None:
        """Replace the content of the regular file ``path`` (created, with its parents, if missing)."""
        fd = self._open_file(check_path(path), os.O_WRONLY | os.O_CREAT, create=True)
        try:
            if self.owner is not None and os.fstat(fd).st_uid != self.owner[0]:
                os.fchown(fd, *self.owner)
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    # -- the walk ----------------------------------------------------------------------------------

    def _open_file(self, path: str, flags: int, *, create: bool) -> int:
        parts = self.relative(path)
        links = 0
        while True:
            if not parts:
                raise IsADirectoryError(f"{path}: is a directory")
            parent, where = self._walk(parts[:-1], path, create=create)
            try:
                fd = _open_at(parts[-1], flags, parent, path)
            except _SymlinkError:
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, "too many levels of symbolic links", path) from None
                parts = self.relative(os.readlink(parts[-1], dir_fd=parent), "/".join(where))
                continue
            finally:
                os.close(parent)
            return _regular(fd, path)

    def _walk(self, parts: list[str], path: str, *, create: bool) -> tuple[int, list[str]]:
        """A descriptor of the directory ``parts`` names, and its components with links resolved."""
        links = 0
        pending = list(parts)
        done: list[str] = []
        steps = 0
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            while pending:
                steps += 1
                if steps > MAX_STEPS:  # a directory made and removed again under us, forever
                    raise OSError(errno.EAGAIN, "the path keeps changing", path)
                part = pending.pop(0)
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise FileNotFoundError(errno.ENOENT, "no such file or directory", path) from None
                    _make_dir(part, fd, self.owner)
                    pending.insert(0, part)
                    continue
                except NotADirectoryError:
                    if not stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode):
                        raise NotADirectoryError(errno.ENOTDIR, "a parent is not a directory", path) from None
                    links += 1
                    if links > MAX_LINKS:
                        raise OSError(errno.ELOOP, "too many levels of symbolic links", path) from None
                    # Resolved from the root again: the target may climb with '..' or be absolute.
                    pending = self.relative(os.readlink(part, dir_fd=fd), "/".join(done)) + pending
                    done = []
                    os.close(fd)
                    fd = os.open(self.root, _DIR_FLAGS)
                    continue
                os.close(fd)
                fd = child
                done.append(part)
        except BaseException:
            os.close(fd)
            raise
        return fd, done


class _SymlinkError(Exception):
    """The last component is a symlink, to be resolved by hand."""


def _open_at(name: str, flags: int, parent: int, path: str) -> int:
    try:
        return os.open(name, flags | _FILE_FLAGS, 0o644, dir_fd=parent)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _SymlinkError from None
        if exc.errno == errno.ENXIO:  # a FIFO with no reader, or a socket
            raise NotARegularFile(f"{path}: not a regular file") from None
        if exc.errno == errno.EISDIR:
            raise IsADirectoryError(f"{path}: is a directory") from None
        if exc.errno == errno.ENOENT:
            raise FileNotFoundError(errno.ENOENT, "no such file", path) from None
        raise


def _regular(fd: int, path: str) -> int:
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode):
        return fd
    os.close(fd)
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(f"{path}: is a directory")
    raise NotARegularFile(f"{path}: not a regular file (a device, FIFO or socket)")


def _make_dir(name: str, parent: int, owner: tuple[int, int] | None) -> None:
    # Made meanwhile, or a symlink or a file by that name: the open that follows says which.
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o755, dir_fd=parent)
        if owner is not None:
            os.chown(name, *owner, dir_fd=parent, follow_symlinks=False)


def _read_at_most(fd: int, count: int) -> bytes:
    chunks = []
    while count > 0:
        chunk = os.read(fd, min(count, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)
