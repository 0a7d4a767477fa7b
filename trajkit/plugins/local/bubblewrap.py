"""The bubblewrap sandbox of a local session: what it may see and what it may do.

One bubblewrap process per session holds its namespaces (user, mount, PID, IPC, UTS, network
unless ``network=host``, cgroup) for the session's life; its PID 1 is the supervisor
(:mod:`trajkit.plugins.local.supervisor`) that runs every command. Nothing in it keeps privilege,
whoever runs trajkit:

- an unprivileged uid and gid (1000, named ``user``) through a user namespace that maps only
  them; when trajkit runs as root, bubblewrap itself runs as an unprivileged host user
  (``local.sandbox_uid``), so that user is all the sandbox is on the host: it cannot read what
  only root may (``/etc/shadow``, root's keys), and the working directory is handed to it;
- no capability at all (effective, permitted, bounding and ambient sets empty), ``no_new_privs``
  (no set-uid program regains any), no further user namespace;
- only the paths a command needs: the host's system directories read-only (``/usr``, ``/etc``
  and the ``/bin``, ``/sbin`` and ``/lib*`` links or directories, plus ``local.read_only``), the
  working directory read-write at the row's ``cwd`` (so no host path reaches the data), an empty
  private ``/tmp`` and ``/var/tmp``, a ``/dev`` of harmless devices and a ``/proc`` of its own
  PID namespace. No host home, no run directory, no other session's directory: they are simply
  not mounted, and the sandbox root is covered when it lies below a mounted directory;
- everything in it dies with it, and with the runner (``--die-with-parent``, even after
  ``kill -9``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

SYSTEM_DIRS = ("/usr", "/etc")
"""Bound read-only into every sandbox."""
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
"""Bound read-only where they are directories; made as the same symbolic links where they are links."""
PRIVATE_DIRS = ("/tmp", "/var/tmp")
"""Empty, private and writable in every sandbox."""
CONTROL_DIR = "/run/trajkit"
"""Where the supervisor finds its control directory (read-only: the pipes of the running commands)."""
INSIDE_UID = 1000
INSIDE_USER = "user"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class HostUser:
    """The host user a sandbox's processes are: bubblewrap runs as it (None: as this process)."""

    uid: int
    gid: int


class Confinement:
    """The bubblewrap options of one backend's sandboxes."""

    def __init__(
        self,
        sandbox_root: str,
        *,
        control_root: str = "",
        network: bool,
        read_only: Sequence[str] = (),
        host_user: HostUser | None = None,
        account_files: tuple[str, str] | None = None,
    ) -> None:
        """``account_files``: host files bound over ``/etc/passwd`` and ``/etc/group`` (the host's
        own plus the sandbox's user), made by :func:`write_account_files`; ``control_root``: the
        directory of the sessions' control directories, hidden as the sandbox root is."""
        self.sandbox_root = sandbox_root
        self.control_root = control_root
        self.network = network
        self.read_only = [os.path.normpath(path) for path in read_only]
        self.host_user = host_user
        self.account_files = account_files
        self._mounts = self._system_mounts()

    def check_cwd(self, cwd: str) -> str | None:
        """Why ``cwd`` cannot be a sandbox's working directory here, or None."""
        for directory in (*SYSTEM_DIRS, *SYSTEM_LINKS, *self.read_only, "/proc", "/dev", CONTROL_DIR):
            if _under(cwd, directory) or _under(directory, cwd):
                return f"the working directory {cwd} would hide or lie in {directory}, which sandboxes see read-only"
        return None

    def options(self, workdir: str, cwd: str, control: str, env: Mapping[str, str]) -> list[str]:
        """The options for one session: ``workdir`` (host) at ``cwd``, ``control`` at CONTROL_DIR."""
        argv = [
            "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--disable-userns", "--uid", str(INSIDE_UID), "--gid", str(INSIDE_UID), "--cap-drop", "ALL",
            "--die-with-parent", "--new-session", "--as-pid-1", "--hostname", "sandbox",
        ]  # fmt: skip
        if not self.network:
            argv.append("--unshare-net")
        argv += self._mounts
        argv += ["--bind", workdir, cwd, "--ro-bind", control, CONTROL_DIR, "--chdir", cwd, "--clearenv"]
        for key, value in env.items():
            argv += ["--setenv", key, value]
        return argv

    def _system_mounts(self) -> list[str]:
        argv: list[str] = []
        for path in SYSTEM_LINKS:
            if os.path.islink(path):
                argv += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                argv += ["--ro-bind", path, path]
        for path in SYSTEM_DIRS:
            argv += ["--ro-bind", path, path]
        if self.account_files:
            passwd, group = self.account_files
            argv += ["--ro-bind", passwd, "/etc/passwd", "--ro-bind", group, "/etc/group"]
        argv += ["--proc", "/proc", "--dev", "/dev"]
        for path in PRIVATE_DIRS:
            argv += ["--tmpfs", path]
        for path in self.read_only:  # after the private directories, which may hold them
            argv += ["--ro-bind", path, path]
        # The other sessions' directories stay out of sight even below a mounted directory.
        for hidden in (self.sandbox_root, self.control_root):
            if hidden and any(_under(hidden, d) for d in (*SYSTEM_DIRS, *self.read_only)):
                argv += ["--tmpfs", hidden]
        for socket in listening_sockets((*SYSTEM_DIRS, *self.read_only)):  # no way to a host service
            argv += ["--ro-bind", "/dev/null", socket]
        return argv


def listening_sockets(directories: Sequence[str]) -> list[str]:
    """Host paths of this network namespace's listening unix sockets below ``directories``."""
    try:
        with open("/proc/net/unix") as handle:
            lines = handle.read().splitlines()[1:]
    except OSError:
        return []
    found = set()
    for line in lines:
        fields = line.split(maxsplit=7)
        if len(fields) < 8 or not fields[7].startswith("/"):
            continue  # unnamed or abstract: a network namespace of its own has none of them
        path = os.path.realpath(fields[7])
        if any(_under(path, d) for d in directories) and os.path.exists(path):
            found.add(path)
    return sorted(found)


def write_account_files(directory: str) -> tuple[str, str]:
    """``passwd`` and ``group`` in ``directory``: the host's, plus the sandbox's user and group,
    so that programs that look the user up (``whoami``, ``git``, ``pip``) find it."""
    made = []
    for name, line in (
        ("passwd", f"{INSIDE_USER}:x:{INSIDE_UID}:{INSIDE_UID}:sandbox user:/tmp:/bin/sh\n"),
        ("group", f"{INSIDE_USER}:x:{INSIDE_UID}:\n"),
    ):
        try:
            with open(f"/etc/{name}") as handle:
                host = [entry for entry in handle.read().splitlines(keepends=True) if _keeps(entry)]
        except OSError:
            host = []
        if host and not host[-1].endswith("\n"):
            host[-1] += "\n"
        path = os.path.join(directory, name)
        # A name of its own: the run's worker processes write the same files at the same moment.
        descriptor, partial = tempfile.mkstemp(prefix=f"{name}.", suffix=".new", dir=directory)
        with os.fdopen(descriptor, "w") as handle:
            handle.write("".join(host) + line)
        os.chmod(partial, 0o644)
        os.replace(partial, path)
        made.append(path)
    return made[0], made[1]


def _keeps(entry: str) -> bool:
    """A host account line that names neither the sandbox's id nor its name."""
    fields = entry.split(":")
    return len(fields) > 2 and fields[0] != INSIDE_USER and fields[2] != str(INSIDE_UID)


def works(host_user: HostUser | None = None) -> str | None:
    """None if bubblewrap can make a sandbox here, else why not (in words a person can act on)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    probe = [
        "bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--disable-userns", "--uid",
        str(INSIDE_UID), "--gid", str(INSIDE_UID), "--cap-drop", "ALL", "--die-with-parent", "--as-pid-1",
        "--ro-bind", "/", "/", "--proc", "/proc", "true",
    ]  # fmt: skip
    prefix, user = as_user(host_user)
    try:
        done = subprocess.run(
            [*prefix, *probe],
            capture_output=True,
            timeout=30,
            check=False,
            cwd="/",
            **user,  # type: ignore[call-overload]
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap cannot run: {exc}"
    if done.returncode != 0:
        reason = done.stderr.decode(errors="replace").strip()
        who = f" as uid {host_user.uid}" if host_user else ""
        return f"bubblewrap cannot create an unprivileged sandbox here{who}: {reason}"
    return None


def as_user(host_user: HostUser | None) -> tuple[list[str], dict[str, object]]:
    """How to start a program as ``host_user``: a prefix of its argv and ``subprocess`` keyword
    arguments (neither for None).

    ``setpriv`` where it is installed: ``subprocess`` changes users only in a forked copy of the
    runner (milliseconds of the runner's CPU for each sandbox), whereas a program it starts with
    ``vfork`` costs it a fraction of that.
    """
    if host_user is None:
        return [], {}
    setpriv = _setpriv()
    if setpriv:
        ids = ["--reuid", str(host_user.uid), "--regid", str(host_user.gid)]
        return [setpriv, *ids, "--clear-groups", "--"], {}
    return [], {"user": host_user.uid, "group": host_user.gid, "extra_groups": []}


@functools.cache
def _setpriv() -> str | None:
    return shutil.which("setpriv")


def hand_over(path: str, host_user: HostUser | None) -> None:
    """Give ``path`` to the sandbox's host user (nothing to do when it is this process's user)."""
    if host_user is not None:
        with contextlib.suppress(FileNotFoundError):
            os.chown(path, host_user.uid, host_user.gid, follow_symlinks=False)


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")
