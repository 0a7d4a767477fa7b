"""Tar archives for the engine's archive API: directories made in a container, files read out of it.

Files travel out of containers as tar streams, never through a command line, so names with quotes,
spaces or ``$(...)`` are just names and binary content stays byte-exact.
"""

from __future__ import annotations

import errno
import io
import posixpath
import tarfile
import time
from collections.abc import Iterable

from trajkit.sandbox import CappedBuffer, NotARegularFile


def pack_directories(*entries: tuple[str, int, tuple[int, int]]) -> bytes:
    """A tar holding directories, each ``(relative path, mode, (uid, gid))``: made where they do not
    exist yet, given that mode and owner where they do."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for relative_path, mode, owner in entries:
            info = tarfile.TarInfo(relative_path)
            info.type = tarfile.DIRTYPE
            info.mode = mode
            info.mtime = time.time()
            info.uid, info.gid = owner
            tar.addfile(info)
    return buffer.getvalue()


class ChunkReader:
    """A file object reading a stream of chunks in order, holding at most one chunk at a time."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._pending = memoryview(b"")

    def read(self, size: int = -1) -> bytes:
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return b""
            self._pending = memoryview(chunk)
        size = len(self._pending) if size < 0 else size
        piece, self._pending = self._pending[:size], self._pending[size:]
        return bytes(piece)


def stream_entry(chunks: Iterable[bytes], buffer: CappedBuffer) -> None:
    """Feed the content of the archive's first member, a regular file, to ``buffer``.

    The tar is read as a stream, so memory stays at ``buffer``'s cap plus a chunk however large the
    file. Raises :class:`NotARegularFile` when the member is anything else (the path changed since
    its stat was taken).
    """
    reader = ChunkReader(chunks)
    with tarfile.open(fileobj=reader, mode="r|") as tar:  # type: ignore[call-overload]
        member = tar.next()
        if member is None or not member.isfile():
            raise NotARegularFile(errno.EINVAL, "not a regular file in the sandbox")
        content = tar.extractfile(member)
        assert content is not None  # a regular member always has content
        while piece := content.read(READ_PIECE):
            buffer.feed(piece)
    while reader.read(READ_PIECE):
        pass  # the rest of the stream (padding, end blocks): the engine's request must finish


READ_PIECE = 64 * 1024


def resolve_link(link_path: str, target: str) -> str:
    """Where a symlink at ``link_path`` pointing at ``target`` leads, as an absolute path."""
    return posixpath.normpath(posixpath.join(posixpath.dirname(link_path), target))
