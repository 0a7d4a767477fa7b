"""A host command whose standard input and output are those of a program in a container.

``python -m trajkit_docker.bridge CONTAINER USER ARGV...`` runs ``ARGV`` in ``CONTAINER`` as
``USER`` through one exec of the Engine API (the address the backend uses: ``DOCKER_HOST`` or the
default socket), copies its own standard input to the exec's and the exec's standard output and
error to its own, and exits with the program's status. Only these two streams pass: no port, no
file, no variable of the host reaches the container, so a container with ``--network none`` keeps
it. The program's standard input reaches end of file when the bridge's does or the bridge dies
(the engine closes the exec's input with the connection), which ends a browser driven over its
DevTools pipe. See :meth:`trajkit_docker.sandbox.DockerSandbox.bridge`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
from typing import Any

CHUNK = 64 * 1024
STREAMS = {1: 1, 2: 2}
"""The exec's stream number -> the bridge's own file descriptor it is copied to."""


def main(arguments: list[str]) -> int:
    if len(arguments) < 3:
        print("usage: python -m trajkit_docker.bridge CONTAINER USER ARGV...", file=sys.stderr)
        return 2
    import docker
    from docker.utils.socket import frames_iter

    container, user, *argv = arguments
    client = docker.from_env()
    api = client.api
    exec_id = api.exec_create(
        container, argv, stdin=True, stdout=True, stderr=True, tty=False, user=user, environment=[]
    )["Id"]
    connection = api.exec_start(exec_id, socket=True)
    raw: socket.socket = getattr(connection, "_sock", connection)
    threading.Thread(target=_send, args=(raw,), name="trajkit-bridge-input", daemon=True).start()
    try:
        for stream, data in frames_iter(connection, tty=False):
            _write_all(STREAMS.get(stream, 2), data)
    except (BrokenPipeError, ConnectionError):
        return 1
    code: Any = api.exec_inspect(exec_id).get("ExitCode")
    return code if isinstance(code, int) else 1


def _send(raw: socket.socket) -> None:
    """Copy standard input to the exec until end of file, then close the exec's input."""
    try:
        while data := os.read(0, CHUNK):
            raw.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        raw.shutdown(socket.SHUT_WR)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
