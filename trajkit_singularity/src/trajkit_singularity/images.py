"""What counts as an Apptainer image reference, where remote ones are cached, and their digests.

A remote reference (``docker://``, ``oras://``...) is converted once into a SIF in the cache and every
prompt of every run on the machine shares it. Concurrent runs coordinate through a file lock beside
the SIF, so the conversion happens once even when many processes verify the same image at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

REMOTE_SCHEMES = frozenset(
    {"docker", "docker-archive", "docker-daemon", "oci-archive", "oras", "library", "shub"}
)
"""Sources Apptainer converts into a SIF (``apptainer build``)."""
SANDBOX_MARKER = ".singularity.d"
"""What makes a directory an Apptainer sandbox rather than any folder."""
_LOCK_POLL = 0.2


def scheme(image: str) -> str:
    """The ``scheme`` of ``scheme://rest`` ('' for a plain path)."""
    from spython.utils import split_uri  # on first use, not when trajkit loads the plugin

    return str(split_uri(image)[0]).lower()


def is_remote(image: str) -> bool:
    return scheme(image) in REMOTE_SCHEMES


def is_sif_path(image: str) -> bool:
    return not scheme(image) and image.endswith(".sif")


def is_sandbox_dir(image: str) -> bool:
    path = Path(image).expanduser()
    return not scheme(image) and (path / SANDBOX_MARKER).is_dir()


def local_path(image: str) -> Path:
    """A local image's absolute path (``file://`` accepted); Apptainer runs elsewhere than the caller."""
    if image.startswith("file://"):
        image = image[len("file://") :]
    return Path(image).expanduser().absolute()


def cached_sif_name(reference: str) -> str:
    """The cache's file name for ``reference``: readable, and unique through a hash of the whole."""
    readable = "".join(c if c.isalnum() or c in "-_." else "_" for c in reference.split("://", 1)[-1])
    digest = hashlib.sha256(reference.encode()).hexdigest()[:16]
    return f"{readable[-60:].strip('_.')}-{digest}.sif"


@contextlib.asynccontextmanager
async def file_lock(path: Path, timeout: float) -> AsyncIterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (made if missing), waiting at most ``timeout`` seconds.

    ``flock`` locks belong to an open file description, so two holders in one process exclude each
    other too. The wait polls instead of blocking a thread: nothing is left hanging on cancellation.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path} stayed locked for {timeout:g} s") from None
                await asyncio.sleep(_LOCK_POLL)
        yield
    finally:
        os.close(fd)


def sif_digest(path: Path, cache_dir: Path) -> str:
    """``sha256:<hex>`` of the SIF at ``path``; remembered in ``cache_dir`` while size and mtime hold.

    Blocking (reads the whole file the first time): call it in a worker thread.
    """
    stat = path.stat()
    key = hashlib.sha256(str(path).encode()).hexdigest()[:32]
    record = cache_dir / "digests" / f"{key}.json"
    stamp = {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    with contextlib.suppress(OSError, ValueError):
        known = json.loads(record.read_text())
        if {k: known.get(k) for k in stamp} == stamp and isinstance(known.get("sha256"), str):
            return f"sha256:{known['sha256']}"
    hasher = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            hasher.update(chunk)
    with contextlib.suppress(OSError):
        record.parent.mkdir(parents=True, exist_ok=True)
        partial = record.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(json.dumps({**stamp, "sha256": hasher.hexdigest()}))
        partial.replace(record)
    return f"sha256:{hasher.hexdigest()}"
