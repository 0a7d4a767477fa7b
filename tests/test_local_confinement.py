"""A hostile model in the local sandbox, with trajkit run as root (as CI runs it): nothing a command
runs keeps privilege, no mount or namespace trick uncovers a host file, the runner or another
session, and nothing on the host changes.

Each attempt below was seen to work against the local sandbox before its confinement was rebuilt
(bubblewrap run by root kept almost every capability: ``umount /var/tmp && mount -o
remount,bind,rw /var`` changed a host file and ``umount /root`` uncovered the host's home).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from trajkit.plugins.local import bubblewrap
from trajkit.plugins.local.run import LocalSandbox
from trajkit.plugins.local.sandbox import LocalBackend
from trajkit.sandbox import ExecResult, SandboxSpec
from trajkit.testing.engines import need_engine

ESCAPED = "ESCAPED"
"""What an attempt prints when the step that should have been refused succeeded."""


@pytest.fixture(autouse=True)
def _bubblewrap() -> None:
    need_engine("bwrap", bubblewrap.works())


@asynccontextmanager
async def sandboxes(root: Path, count: int = 1, **options: str) -> AsyncIterator[list[LocalSandbox]]:
    backend = LocalBackend({"root": str(root), "isolation": "bwrap", **options})
    made = []
    try:
        for index in range(count):
            sandbox = await backend.create(SandboxSpec(run_id="confinement", work_id=f"w{index}"))
            assert isinstance(sandbox, LocalSandbox)
            made.append(sandbox)
        yield made
    finally:
        for sandbox in made:
            await sandbox.close()
        await backend.aclose()


async def attempt(sandbox: LocalSandbox, command: str) -> ExecResult:
    result = await sandbox.exec(command, timeout=60)
    assert ESCAPED not in result.stdout, (command, result)
    return result


def run(root: Path, body: object, **options: str) -> None:
    async def main() -> None:
        async with sandboxes(root, **options) as (sandbox,):
            await body(sandbox)  # type: ignore[operator]

    asyncio.run(main())


def test_commands_keep_no_privilege(sandbox_root: Path) -> None:
    async def body(sb: LocalSandbox) -> None:
        status = await attempt(sb, "grep -E '^(Cap|NoNewPrivs|Uid|Gid)' /proc/self/status; id -u")
        fields = dict(line.split(":", 1) for line in status.stdout.splitlines() if ":" in line)
        for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert fields[cap].strip() == "0000000000000000", status.stdout
        assert fields["NoNewPrivs"].strip() == "1"
        assert status.stdout.splitlines()[-1] != "0"
        # What the sandbox's user is on the host: not root, so root's own files stay closed.
        shadow = await attempt(sb, f"cat /etc/shadow && echo {ESCAPED}")
        assert shadow.exit_code != 0 and "Permission denied" in shadow.stderr

    run(sandbox_root, body)


@pytest.mark.parametrize(
    "command",
    [
        "mount -t tmpfs none /tmp",
        "mount -o remount,rw /usr",
        "mount --bind /usr /tmp",
        "umount /tmp",
        "umount -l /proc",
        "unshare -U true",
        "unshare -r true",
        "unshare -m true",
        "unshare -n true",
        "nsenter -t 1 -m -u -i -n -p true",
        "chroot / true",
        "capsh --caps=cap_sys_admin+eip -- -c true",
        "capsh --user=root -- -c true",
        "v=$(cat /proc/sys/vm/swappiness) && echo $v > /proc/sys/vm/swappiness",
        "echo 1 > /proc/sys/kernel/sysrq",
        "mkdir /sys/fs/cgroup/trajkit-escape",
        "echo $$ > /sys/fs/cgroup/cgroup.procs",
        "echo $$ > /sys/fs/cgroup/pids/cgroup.procs",
    ],
)
def test_privileged_operations_are_refused(sandbox_root: Path, command: str) -> None:
    async def body(sb: LocalSandbox) -> None:
        result = await attempt(sb, f"{command} && echo {ESCAPED}")
        assert result.exit_code != 0, result

    run(sandbox_root, body)


def test_the_supervisor_outlives_any_signal(sandbox_root: Path) -> None:
    async def body(sb: LocalSandbox) -> None:
        await attempt(sb, "for s in KILL TERM INT HUP STOP USR1 CHLD; do kill -s $s 1; done; kill -9 -1")
        after = await attempt(sb, "echo still here")
        assert after.stdout == "still here\n"

    run(sandbox_root, body)


def test_no_host_file_changes(sandbox_root: Path) -> None:
    name = f"trajkit-escape-{uuid.uuid4().hex}"
    targets = [f"/var/tmp/{name}", f"/tmp/{name}", f"/usr/{name}", f"/etc/{name}", f"/{name}"]

    async def body(sb: LocalSandbox) -> None:
        # The attempt seen to work before: uncover the host's /var and make it writable.
        await attempt(sb, f"umount /var/tmp; mount -o remount,bind,rw /var; echo X > /var/tmp/{name}")
        for target in targets:
            await attempt(sb, f"echo X > {target} 2>/dev/null && echo {ESCAPED}-{target} >/dev/null")

    try:
        run(sandbox_root, body)
        assert [t for t in targets if os.path.lexists(t)] == []
    finally:
        for target in targets:
            with contextlib.suppress(OSError):
                os.unlink(target)


def test_the_hosts_home_and_the_runners_directories_stay_hidden(sandbox_root: Path) -> None:
    canary = f"trajkit-canary-{uuid.uuid4().hex}"
    home_file = Path.home() / f".trajkit-confinement-{uuid.uuid4().hex}"
    home_file.write_text(canary)
    here = Path.cwd() / f".trajkit-confinement-{uuid.uuid4().hex}"
    here.write_text(canary)

    async def body(sb: LocalSandbox) -> None:
        for directory in ("/root", "/home", str(Path.home())):
            await attempt(sb, f"umount {directory}; umount -l {directory}")
        found = await attempt(
            sb,
            f"cat {home_file} {here} 2>/dev/null; ls -a /root /home {Path.home()} {Path.cwd()} 2>/dev/null; "
            f"grep -rs {canary} /root /home /tmp /var/tmp /run 2>/dev/null",
        )
        assert canary not in found.stdout and home_file.name not in found.stdout
        assert here.name not in found.stdout

    try:
        run(sandbox_root, body)
    finally:
        home_file.unlink()
        here.unlink()


def test_another_sessions_files_are_out_of_reach(sandbox_root: Path) -> None:
    """Also with the sandboxes' root below a directory the sandboxes see (a custom local.root)."""
    secret = f"trajkit-neighbour-{uuid.uuid4().hex}"

    async def main() -> None:
        async with sandboxes(sandbox_root, count=2) as (first, second):
            await first.write_file("secret.txt", secret.encode())
            await first.exec("echo more > mine.txt", timeout=30)
            running = await first.start_process(f"sleep 600 # {secret}")  # its request stays
            assert first.supervisor is not None
            control = first.supervisor.control
            assert any(secret.encode() in path.read_bytes() for path in Path(control).glob("*.x"))
            tries = [
                f"cat {first.workdir}/secret.txt {first.workdir}/mine.txt",
                f"ls -a {sandbox_root} {first.workdir}",
                f"ls -a {os.path.dirname(control)} {control} /dev/shm; cat {control}/*.x",
                f"test -e {os.path.dirname(control)} && echo {ESCAPED}",
                "umount /tmp; umount /var/tmp; umount /run/trajkit",
                f"cat {first.workdir}/secret.txt",
                f"grep -rs {secret} /tmp /var/tmp /run /work / --exclude-dir=proc --exclude-dir=usr "
                "--exclude-dir=sys --exclude-dir=dev 2>/dev/null",
            ]
            for command in tries:
                result = await attempt(second, f"{command} 2>&1")
                assert secret not in result.stdout, (command, result.stdout[:500])
            await running.kill()

    asyncio.run(main())


def test_the_runner_is_out_of_reach(sandbox_root: Path) -> None:
    pid = os.getpid()

    async def body(sb: LocalSandbox) -> None:
        listing = await attempt(sb, "for p in /proc/[0-9]*; do echo ${p#/proc/}; done")
        pids = {int(p) for p in listing.stdout.split()}
        assert max(pids) < 100, "the sandbox sees more than its own processes"
        for command in (
            f"kill -0 {pid}",
            f"strace -p {pid} -e trace=none -o /dev/null",
            f"gdb -p {pid} -batch -ex detach",
            f"cat /proc/{pid}/environ",
            f"ls /proc/{pid}/root/",
        ):
            result = await attempt(sb, f"timeout 10 {command} && echo {ESCAPED}")
            assert result.exit_code != 0, (command, result)
        # Its own PID 1 is the supervisor, whose environment holds nothing of the runner's.
        environ = await attempt(sb, "cat /proc/1/environ")
        names = {entry.partition("=")[0] for entry in environ.stdout.split("\0") if entry}
        assert names <= {
            "PATH",
            "HOME",
            "PWD",
            "LC_CTYPE",
            "TERM",
            "USER",
            "LOGNAME",
            "TRAJKIT_SUPERVISOR",
        }, names

    run(sandbox_root, body)


def test_a_custom_root_below_a_directory_closed_to_others_is_a_clear_error(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root hands its sandboxes to another user")
    with pytest.raises(Exception, match=r"out of its sandboxes' reach.*chmod o\+x"):
        LocalBackend({"root": str(tmp_path / "sandboxes"), "isolation": "bwrap"})


def test_the_sandboxes_host_user_owns_what_they_make(sandbox_root: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root hands its sandboxes to another user")

    async def body(sb: LocalSandbox) -> None:
        await sb.write_file("by-tool/notes.txt", b"from the file tool\n")
        made = await attempt(sb, "id -u; echo more >> by-tool/notes.txt && echo x > by-command.txt")
        assert made.stdout == f"{bubblewrap.INSIDE_UID}\n", made
        for path in ("by-tool", "by-tool/notes.txt", "by-command.txt", "."):
            assert (Path(sb.workdir) / path).stat().st_uid == 12345, path
        assert (Path(sb.workdir) / "by-tool/notes.txt").read_text() == "from the file tool\nmore\n"

    run(sandbox_root, body, sandbox_uid="12345")


def test_read_only_directories_are_seen_and_never_written(sandbox_root: Path) -> None:
    shared = Path(tempfile.mkdtemp(prefix="trajkit-shared-"))
    os.chmod(shared, 0o755)
    (shared / "data.txt").write_text("shared data\n")

    async def body(sb: LocalSandbox) -> None:
        seen = await attempt(sb, f"cat {shared}/data.txt; touch {shared}/new && echo {ESCAPED}")
        assert seen.stdout == "shared data\n"
        assert "Read-only file system" in seen.stderr

    try:
        run(sandbox_root, body, read_only=f"{shared}")
        assert sorted(p.name for p in shared.iterdir()) == ["data.txt"]
    finally:
        shutil.rmtree(shared)
