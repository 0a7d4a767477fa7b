"""In-memory tar archives for the engine's archive API.

Files travel into and out of containers as tar streams, never through a command line, so names with
quotes, spaces or ``$(...)`` are just names and binary content stays byte-exact.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
import time
from dataclasses import dataclass

FILE_MODE = 0o644
DIR_MODE = 0o755


def pack_file(relative_path: str, data: bytes) -> bytes:
    """A tar holding ``data`` at ``relative_path``, with an entry for each missing parent directory.

    Directory entries are only included for the components of ``relative_path`` itself: the caller
    extracts at the deepest directory that already exists, so existing directories keep their mode.
    """
    buffer = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        parts = relative_path.split("/")
        for depth in range(1, len(parts)):
            info = tarfile.TarInfo("/".join(parts[:depth]))
            info.type = tarfile.DIRTYPE
            info.mode = DIR_MODE
            info.mtime = now
            tar.addfile(info)
        info = tarfile.TarInfo(relative_path)
        info.size = len(data)
        info.mode = FILE_MODE
        info.mtime = now
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def pack_directory(relative_path: str, mode: int) -> bytes:
    """A tar holding one empty directory (extracted where it does not exist yet)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(relative_path)
        info.type = tarfile.DIRTYPE
        info.mode = mode
        info.mtime = time.time()
        tar.addfile(info)
    return buffer.getvalue()


@dataclass(frozen=True)
class Entry:
    """The single top-level entry of an archive fetched for one path."""

    kind: str
    """``file``, ``dir``, ``symlink`` or ``other``."""
    data: bytes = b""
    link_target: str = ""


def unpack_entry(archive: bytes) -> Entry:
    """Read the first member of ``archive``: the path that was asked for."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        member = tar.next()
        if member is None:
            return Entry("other")
        if member.isdir():
            return Entry("dir")
        if member.issym():
            return Entry("symlink", link_target=member.linkname)
        if member.isfile():
            extracted = tar.extractfile(member)
            return Entry("file", data=extracted.read() if extracted else b"")
        return Entry("other")


def resolve_link(link_path: str, target: str) -> str:
    """Where a symlink at ``link_path`` pointing at ``target`` leads, as an absolute path."""
    return posixpath.normpath(posixpath.join(posixpath.dirname(link_path), target))
