"""Who a sandbox's commands run as under Apptainer, and how they get there without privilege.

Run by an ordinary user, Apptainer runs a container as that user: nothing to do. Run by root (as
trajkit is in CI, in containers, on many cluster nodes), it runs the container as root, and a root
process keeps power over the host even with no capability: it owns ``/proc/sys``, ``/sys`` and
``/proc/sysrq-trigger``, which are the host's own. Apptainer can run a container as another uid
(``--security uid:N``) but not an exec into an instance that has a cgroup, and root's instances
always have one ("joining non-root instance with cgroups requires systemd as cgroups manager").

So, when trajkit runs as root (``singularity.user=auto``), every exec enters the instance as root
holding only ``CAP_SETUID`` and ``CAP_SETGID`` (``--no-privs --add-caps``, so ``no_new_privs`` too),
and the ``enter`` program (``programs/enter.sh``) at once becomes :data:`UID` (65534,
"nobody") through the image's own ``setpriv`` (util-linux) or ``su`` (BusyBox, util-linux), found
once per image by the ``probe`` program (``programs/probe.sh``). What runs after that has no
capability and cannot gain one; the instance's init stays root, so commands can neither signal it
nor read its environment. An image with neither tool is refused, naming ``singularity.user=caller``,
the visible opt-out that runs commands as whoever runs trajkit (root, without capabilities: the run
says so once, and what root can still reach).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from trajkit.sandbox import ImageUnavailable

UID = 65534
"""The user commands run as when trajkit runs as root: "nobody" in nearly every image."""
SWITCH_CAPS = "CAP_SETUID,CAP_SETGID"
"""The only capabilities an exec enters with, for the moment it takes to drop to :data:`UID`."""
KINDS = ("setpriv", "su")


@dataclass(frozen=True)
class Switch:
    """How an image's execs drop from root to :data:`UID`: which tool, where, as which name."""

    kind: str
    """``setpriv`` or ``su``."""
    tool: str
    """Its absolute path in the image (never looked up on a PATH the model could write to)."""
    name: str
    """The user's name in the image's /etc/passwd (``su`` needs one)."""
    drop: str
    """A ``setpriv`` that clears the capabilities ``su`` would leave inheritable, or ``-``."""

    def argv(self, command: list[str]) -> list[str]:
        """The ``enter`` program's arguments that run ``command`` as the user."""
        return [self.tool, self.kind, str(UID), str(UID), self.name, self.drop, *command]


def caller_is_root() -> bool:
    return os.geteuid() == 0


def probed_switch(image: str, returncode: int, output: str, reason: str) -> Switch | None:
    """The switch the ``probe`` program (``programs/probe.sh``) found, None when the image has none."""
    if returncode != 0:
        raise ImageUnavailable(f"{image}: cannot run a command in it to choose its user: {reason}")
    words = output.split()
    if len(words) == 4 and words[0] in KINDS and words[1].startswith("/"):
        return Switch(kind=words[0], tool=words[1], name=words[2], drop=words[3])
    return None


def no_switch(image: str) -> ImageUnavailable:
    return ImageUnavailable(
        f"{image}: has neither setpriv (util-linux) nor su for user {UID}, so its commands would run "
        "as root, which reaches the host's /proc/sys and /sys even without capabilities; use an image "
        "with one of them, run trajkit as an ordinary user, or set singularity.user=caller to accept it"
    )


@dataclass(frozen=True)
class Confinement:
    """What keeps one sandbox's processes without privilege: the options of its instance and execs."""

    switch: Switch | None
    """How execs become :data:`UID` (None: they run as the caller, an ordinary user or, with
    ``singularity.user=caller``, root)."""
    seccomp: str | None
    """Host path of the seccomp profile (``--security`` is root's alone), None without one."""
    root: bool
    """Whether trajkit (hence Apptainer) runs as root."""

    def start_options(self) -> list[str]:
        """For ``instance start``: no capability for root inside, the filter, a read-only /proc/sys."""
        options = ["--no-privs", *self._filter()]
        if self.root:
            options += ["--bind", "/proc/sys:/proc/sys:ro"]
        return options

    def exec_options(self) -> list[str]:
        """For every ``exec``: no capability but the two the switch needs, for its first moment."""
        caps = ["--add-caps", SWITCH_CAPS] if self.switch else []
        return ["--no-privs", *caps, *self._filter()]

    def _filter(self) -> list[str]:
        return ["--security", f"seccomp:{self.seccomp}"] if self.seccomp else []

    @property
    def owner(self) -> tuple[int, int] | None:
        """Who files the runner writes for the sandbox belong to, None to keep the runner's."""
        return (UID, UID) if self.switch else None
