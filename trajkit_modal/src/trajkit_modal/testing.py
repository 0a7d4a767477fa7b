"""A local stand-in for the part of the Modal SDK that ``ModalBackend`` uses, for tests without Modal.

``FakeModal()`` replaces the ``modal`` module: pass it as ``ModalBackend(options, sdk=FakeModal())``.
It offers the same class and method names, the same signatures and the same ``.aio`` coroutine
forms as the installed ``modal`` (``tests/test_modal_backend.py`` compares them), and raises the
real ``modal.exception`` classes. Only the ``.aio`` forms work; calling a blocking form raises.

How it imitates Modal:

- each sandbox is a temporary directory ("its root"); commands run as real local processes
  (``Sandbox.exec``) with the working directory mapped into that root, a clean environment whose
  ``TMPDIR`` is the root's ``tmp`` (a container's /tmp is its own; the host's is shared with
  everything else on the machine) and stdin as a pipe (``ContainerProcess.stdin``);
- paths given to the SDK (``workdir``, ``sb.filesystem``) are mapped into the root; since commands
  see the host's file system, the root's own host path names the same files (``pwd`` prints it);
- ``sb.filesystem`` resolves symlinks inside the root as a container would, and treats FIFOs and
  devices as the real file tools would (a FIFO blocks, a device never ends): see
  :mod:`trajkit_modal.fake_files`;
- an exec's ``timeout`` makes ``ContainerProcess.wait()`` return -1 and ends its output streams,
  as Modal does, and leaves the processes running (``kill_on_exec_timeout`` changes that);
- a sandbox's ``timeout`` (lifetime) is enforced lazily, whenever the fake is next used;
- ``terminate`` kills every process the sandbox started (found by an environment marker, so that
  processes which left their process group are found too) and deletes its root.

``FakeCloud`` holds the state tests inspect or steer: creation times, errors to raise on the next
creations, images that cannot be built, registry secrets that exist.

The fake lives in :mod:`trajkit_modal.fake_cloud` (the cloud, apps, secrets, images),
:mod:`trajkit_modal.fake_sandbox` (``Sandbox`` and ``sb.filesystem``), :mod:`trajkit_modal.fake_process`
(``ContainerProcess`` and its streams) and :mod:`trajkit_modal.fake_files`; this module puts it
together and is the one tests import.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar, cast

from modal import exception

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
from trajkit_modal.fake_process import READ_CHUNK, ContainerProcess, StreamReader, StreamWriter
from trajkit_modal.fake_sandbox import ARG_MAX_BYTES, Sandbox, SandboxFilesystem

__all__ = [
    "ARG_MAX_BYTES",
    "MARKER_VARIABLE",
    "READ_CHUNK",
    "App",
    "ContainerProcess",
    "FakeCloud",
    "FakeModal",
    "Image",
    "Sandbox",
    "SandboxFilesystem",
    "SandboxState",
    "Secret",
    "StreamReader",
    "StreamWriter",
    "aio_method",
    "aio_static",
    "exception",
]

C = TypeVar("C", bound=type)


class FakeModal:
    """Stands in for the ``modal`` module: ``App``, ``Image``, ``Secret``, ``Sandbox``, ``exception``.

    Each instance is a separate cloud; its classes are bound to it, so tests do not share state.
    """

    exception = exception

    def __init__(self, root: Path | None = None) -> None:
        self.cloud = FakeCloud(root)
        self.App = _bound(App, self.cloud)
        self.Image = _bound(Image, self.cloud)
        self.Secret = _bound(Secret, self.cloud)
        self.Sandbox = _bound(Sandbox, self.cloud)

    async def aclose(self) -> None:
        await self.cloud.aclose()


def _bound(cls: C, cloud: FakeCloud) -> C:
    attributes = {"_cloud": cloud, "__module__": cls.__module__, "__qualname__": cls.__qualname__}
    return cast(C, type(cls.__name__, (cls,), attributes))
