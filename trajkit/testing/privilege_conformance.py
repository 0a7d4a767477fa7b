"""Conformance cases for privilege: nothing a sandbox runs keeps any, whoever runs trajkit.

Part of the suite in :mod:`trajkit.testing.sandbox_conformance` (its ``SandboxConformance`` includes
these). They matter most where trajkit runs as root, as it does in CI, in most containers and on
many cluster nodes: a command that keeps a capability, or runs as root, can reach the host through
``mount``, ``/proc/sys`` or ``/sys``. So every command must run as a non-root user with no
capability and ``no_new_privs``, and each privileged operation below must be refused.

Attempts that would change the machine if they succeeded write back the value already there (a
kernel setting, the process's own cgroup), so a sandbox that fails these cases still leaves the
host as it was; the cases check from outside that it did.

Harness attributes read here (with getattr, so older harnesses keep working):
  isolated (default True) and unprivileged (default True): the cases run only when both hold. A
  backend that cannot drop privileges (Modal's SDK has no setting for it) says False and why.
  own_init (default False): PID 1 of a sandbox is the sandbox's own process, run as the sandbox's
  user with the sandbox's environment (the local sandbox's supervisor), not a container's init
  owned by root: tracing it or reading its environment reaches nothing outside the sandbox, so
  instead of refusing those, the case checks that PID 1 is indeed the sandbox user's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shlex
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from trajkit.sandbox import Sandbox


class _Harness(Protocol):
    image: str | None


def _setting(path: str) -> str:
    with contextlib.suppress(OSError):
        return Path(path).read_text()
    return ""


SAME_VALUE_WRITES = ("/proc/sys/kernel/randomize_va_space", "/sys/kernel/mm/transparent_hugepage/enabled")
"""Host settings the attempts write their own value back to, and which must stay as they were."""

PRIVILEGED_ATTEMPTS = {
    "mount": "mkdir -p trajkit-mnt && mount -t tmpfs none trajkit-mnt",
    "umount": 'for m in $(cut -d" " -f2 /proc/self/mounts | sort -r); do'
    ' if [ "$m" != / ] && { umount "$m" || umount -l "$m"; }; then exit 0; fi; done; exit 1',
    "unshare": "unshare -U true || unshare -m true || unshare -n true || unshare -p -f true",
    "nsenter": "nsenter -t 1 -m -p true",
    "chroot": "chroot / true",
    "capsh": "capsh --caps=cap_sys_admin+eip -- -c true",
    "mknod": "mknod trajkit-null c 1 3",
    "write to /proc/sys": 'f=/proc/sys/kernel/randomize_va_space; v=$(cat "$f") && echo "$v" > "$f"',
    "write to /sys": "f=/sys/kernel/mm/transparent_hugepage/enabled;"
    ' v=$(sed "s/.*\\[\\(.*\\)\\].*/\\1/" "$f") && [ -n "$v" ] && echo "$v" > "$f"',
    "cgroup write": "while IFS=: read -r _ controllers path; do"
    " d=/sys/fs/cgroup${controllers:+/${controllers%%,*}}$path;"
    ' if echo $$ > "$d/cgroup.procs"; then exit 0; fi;'
    ' if mkdir "$d/trajkit-probe"; then rmdir "$d/trajkit-probe"; exit 0; fi;'
    " done < /proc/self/cgroup;"
    " mkdir /sys/fs/cgroup/trajkit-probe && rmdir /sys/fs/cgroup/trajkit-probe",
}
"""What a hostile model tries, as a shell command that succeeds only if the sandbox let it."""

PID_1_ATTEMPTS = {
    "ptrace of PID 1": "exec 3< /proc/1/mem",
    "read /proc/1/environ": "cat /proc/1/environ > /dev/null",
}
"""What a hostile model tries on a sandbox's PID 1, where that is a container's init owned by root."""

PID_1_IS_OWN = 'if [ "$(awk \'/^Uid:/ {print $2}\' /proc/1/status)" != "$(id -u)" ]; then echo "ALLOWED: PID 1 is another user\'s"; fi'
"""Where PID 1 is the sandbox's own process: it runs as the sandbox's user, so reaching it is no
privilege."""


def attempts_script(harness: object) -> str:
    """The attempts for ``harness``'s sandboxes, each printing ``ALLOWED: what`` if it succeeded."""
    own_init = getattr(harness, "own_init", False)
    attempts = PRIVILEGED_ATTEMPTS if own_init else {**PRIVILEGED_ATTEMPTS, **PID_1_ATTEMPTS}
    lines = [
        f"if (sh -c {shlex.quote(command)}) >/dev/null 2>&1; then echo {shlex.quote(f'ALLOWED: {name}')}; fi"
        for name, command in attempts.items()
    ]
    return "\n".join([*lines, PID_1_IS_OWN] if own_init else lines)


def _privileged_cases(harness: object) -> None:
    if not getattr(harness, "isolated", True) or not getattr(harness, "unprivileged", True):
        pytest.skip("the harness says its commands are not isolated or cannot drop privileges")


class PrivilegeConformance:
    """No capability, no root, no way back to either, and every privileged operation refused."""

    def sandbox(
        self, harness: Any, *, cwd: str | None = None
    ) -> contextlib.AbstractAsyncContextManager[Sandbox]:
        raise NotImplementedError  # SandboxConformance.sandbox

    @contextlib.asynccontextmanager
    async def unprivileged(self, harness: _Harness) -> AsyncIterator[Sandbox]:
        """A sandbox; afterwards, the host's settings that the attempts write back are unchanged."""
        before = {path: _setting(path) for path in SAME_VALUE_WRITES}
        async with self.sandbox(harness) as sb:
            yield sb
        assert {path: _setting(path) for path in SAME_VALUE_WRITES} == before, "a host setting changed"

    def test_commands_keep_no_privilege(self, harness: _Harness) -> None:
        _privileged_cases(harness)

        async def body() -> None:
            async with self.unprivileged(harness) as sb:
                result = await sb.exec(
                    "id -u; id -g; grep -E '^(Cap|NoNewPrivs)' /proc/self/status", timeout=30
                )
                lines = result.stdout.split()
                uid, gid, status = lines[0], lines[1], dict(zip(lines[2::2], lines[3::2], strict=False))
                assert uid != "0" and gid != "0", f"commands run as root: {result.stdout}"
                for field in ("CapInh:", "CapPrm:", "CapEff:", "CapAmb:"):
                    assert int(status[field], 16) == 0, f"{field} {status[field]}"
                assert status.get("NoNewPrivs:") == "1", result.stdout

        asyncio.run(body())

    def test_privileged_operations_are_refused(self, harness: _Harness) -> None:
        _privileged_cases(harness)

        async def body() -> None:
            async with self.unprivileged(harness) as sb:
                result = await sb.exec(f"{attempts_script(harness)}\n{_runner_attempt()}", timeout=120)
                assert "ALLOWED" not in result.stdout, result.stdout
                assert result.exit_code == 0, result

        asyncio.run(body())

    def test_another_session_is_out_of_reach(self, harness: _Harness) -> None:
        """Another session's processes cannot be seen, signalled or traced, nor its files found."""
        _privileged_cases(harness)
        marker = str(random.randint(10_000, 99_999))
        secret = f"trajkit-secret-{uuid.uuid4().hex}"

        async def body() -> None:
            async with self.unprivileged(harness) as first, self.unprivileged(harness) as second:
                await first.write_file(f"{secret}.txt", b"mine")
                running = asyncio.ensure_future(first.exec(f"sleep {marker}8", timeout=60))
                try:
                    await asyncio.sleep(1.0)
                    probe = (
                        f"for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"
                        f" | grep 'sleep {marker}8' | grep -v grep;"
                        f" ls -a {shlex.quote(first.cwd)} 2>/dev/null | grep {secret}; exit 0"
                    )
                    seen = await second.exec(probe, timeout=60)
                    assert seen.stdout == "", seen.stdout
                finally:
                    running.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await running

        asyncio.run(body())


def _runner_attempt() -> str:
    """Tracing the runner (this process): refused, or the runner is not there to be named."""
    cmdline = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    pid = os.getpid()
    command = (
        f'[ "$(tr "\\0" " " < /proc/{pid}/cmdline)" = {shlex.quote(cmdline)} ]'
        f" && {{ exec 3< /proc/{pid}/mem || cat /proc/{pid}/environ; }}"
    )
    return f"if (sh -c {shlex.quote(command)}) >/dev/null 2>&1; then echo 'ALLOWED: ptrace of the runner'; fi"
