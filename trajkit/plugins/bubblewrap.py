"""The bubblewrap command line that isolates one command of a local sandbox.

What the command gets: the host's directories read-only but for the home directories (where keys
and credentials live: hidden), the prompt's directory writable at the row's ``cwd`` (so no host
path reaches the data), private /tmp, /var/tmp, /run and /dev, its own
/proc of its own PID namespace (the runner's processes, environment and command line are not there,
and everything it starts dies with it: ``--die-with-parent`` even after ``kill -9`` of the runner),
no network, and no way to the host's services: every unix socket listening on a host path is
covered, and so is the sandbox root holding the other prompts' directories.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Mapping

PRIVATE_DIRS = ("/tmp", "/var/tmp", "/run")
"""Empty, private and writable in every sandbox; /run holds most of a host's service sockets."""
SOCKET_REFRESH_S = 10.0
"""How long the list of the host's listening unix sockets is reused before it is read again."""


class Bubblewrap:
    """Builds the argv of isolated commands for one sandbox root."""

    def __init__(self, sandbox_root: str, *, network: bool) -> None:
        self.sandbox_root = sandbox_root
        self.network = network
        self._sockets: list[str] = []
        self._sockets_read = 0.0

    def argv(
        self, workdir: str, cwd: str, env: Mapping[str, str], command: list[str]
    ) -> tuple[list[str], int]:
        """bubblewrap's argv and the descriptor it reads its options from, to pass on and then close.

        The options travel in a memory file (``--args``), not on the command line: bubblewrap is
        the sandbox's PID 1, and its command line, readable from inside, would name host paths.
        """
        options = self._options(workdir, cwd, env)
        fd = os.memfd_create("bwrap-args", os.MFD_CLOEXEC)
        os.write(fd, b"\0".join(option.encode() for option in options) + b"\0")
        os.lseek(fd, 0, os.SEEK_SET)
        return ["bwrap", "--args", str(fd), "--", *command], fd

    def _options(self, workdir: str, cwd: str, env: Mapping[str, str]) -> list[str]:
        argv = ["--die-with-parent", "--new-session", "--unshare-all"]
        if self.network:
            argv.append("--share-net")
        argv += _host_root_binds(cwd)
        argv += ["--dev", "/dev", "--proc", "/proc"]
        for directory in PRIVATE_DIRS:
            if not _under(cwd, directory) and (directory.count("/") == 1 or os.path.isdir(directory)):
                argv += ["--tmpfs", directory]
        for home in _homes():  # keys, tokens and credentials live there (the runner's own included)
            if not _under(home, cwd):
                argv += ["--tmpfs", home]
        if not any(_under(self.sandbox_root, d) for d in (*PRIVATE_DIRS, "/dev")):
            argv += ["--tmpfs", self.sandbox_root]
        for socket in self._host_sockets():
            argv += ["--ro-bind", "/dev/null", socket]
        argv += ["--bind", workdir, cwd, "--chdir", cwd, "--clearenv"]
        for key, value in env.items():
            argv += ["--setenv", key, value]
        return argv

    def _host_sockets(self) -> list[str]:
        now = time.monotonic()
        if now - self._sockets_read > SOCKET_REFRESH_S:
            self._sockets = listening_sockets(self.sandbox_root)
            self._sockets_read = now
        return self._sockets


def listening_sockets(sandbox_root: str) -> list[str]:
    """Host paths of this network namespace's unix sockets that a sandbox would otherwise see."""
    try:
        with open("/proc/net/unix") as handle:
            lines = handle.read().splitlines()[1:]
    except OSError:
        return []
    hidden = (*PRIVATE_DIRS, "/dev", "/proc", sandbox_root)
    found = set()
    for line in lines:
        fields = line.split(maxsplit=7)
        if len(fields) < 8 or not fields[7].startswith("/"):
            continue  # unnamed or abstract: the sandbox's own network namespace has none of them
        path = os.path.realpath(fields[7])  # /var/run/x is /run/x on most hosts, already private
        if not any(_under(path, d) for d in hidden) and os.path.exists(path):
            found.add(path)
    return sorted(found)


def works() -> str | None:
    """None if bubblewrap can isolate a command here, else why not (in words a person can act on)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    probe = ["bwrap", "--die-with-parent", "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "true"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap cannot run: {exc}"
    if done.returncode != 0:
        return f"bubblewrap cannot create namespaces here: {done.stderr.decode(errors='replace').strip()}"
    return None


def _homes() -> list[str]:
    """The host's home directories, hidden from every sandbox behind an empty tmpfs."""
    found = {"/root", "/home", os.path.expanduser("~")}
    return sorted(path for path in found if path != "/" and os.path.isdir(path) and not os.path.islink(path))


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _host_root_binds(cwd: str) -> list[str]:
    """Bind the host's top-level directories read-only onto bubblewrap's empty root.

    The working directory's top-level directory is left out, so that its path can be created in
    the sandbox's own (writable, private) root whether or not it exists on the host.
    """
    top = cwd.strip("/").split("/")[0]
    argv: list[str] = []
    for entry in sorted(os.listdir("/")):
        path = f"/{entry}"
        if entry in {top, "proc", "dev", "tmp", "run"}:
            continue
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    return argv
