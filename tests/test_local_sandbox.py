"""The local backend beyond the shared conformance suite: its shell option, its environment, and how
a command's process and pipes are cleaned up however ``exec`` ends."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from pydantic import ValidationError

from trajkit.plugins.local import bubblewrap
from trajkit.plugins.local import command as local_command
from trajkit.plugins.local.run import LocalSandbox
from trajkit.plugins.local.sandbox import (
    ACCOUNTS_DIR,
    CONTROL_PARENT,
    CONTROL_PREFIX,
    LocalBackend,
    LocalSettings,
)
from trajkit.sandbox import Sandbox, SandboxError, SandboxSpec
from trajkit.testing.engines import need_engine
from trajkit.testing.sandbox_conformance import survivors

T = TypeVar("T")


def in_sandbox(root: Path, body: Callable[[Sandbox], Awaitable[T]], **options: str) -> T:
    async def main() -> T:
        # The command machinery itself, unconfined; bubblewrap has its own cases below and the
        # conformance suite runs both.
        backend = LocalBackend({"root": str(root), "isolation": "none", **options})
        sandbox = await backend.create(SandboxSpec(run_id="local-test", work_id="w0"))
        try:
            return await body(sandbox)
        finally:
            await sandbox.close()
            await backend.aclose()

    return asyncio.run(main())


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("shell", ["/bin/sh", "sh"])
def test_shell_option_picks_the_shell(tmp_path: Path, shell: str) -> None:
    async def body(sb: Sandbox) -> str:
        return (await sb.exec('echo "${BASH_VERSION:-no bash}"', timeout=30)).stdout

    assert in_sandbox(tmp_path, body, shell=shell) == "no bash\n"
    assert in_sandbox(tmp_path, body) not in ("no bash\n", "\n")  # bash by default


@pytest.mark.parametrize("shell", ["/no/such/shell", "no-such-shell-here", "not-executable"])
def test_a_shell_that_cannot_run_is_a_clear_error(tmp_path: Path, shell: str) -> None:
    if shell == "not-executable":
        shell = str(tmp_path / "plain.txt")
        Path(shell).write_text("echo hi\n")
    with pytest.raises(SandboxError, match=f"local sandbox: shell '{shell}' is not an executable"):
        LocalBackend({"root": str(tmp_path), "shell": shell})


def test_environment_is_clean_and_utf8(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJKIT_TEST_API_KEY", "sk-must-not-leak")

    async def body(sb: Sandbox) -> None:
        listing = await sb.exec("env", timeout=30)
        assert "sk-must-not-leak" not in listing.stdout
        await sb.write_file("ünï 文字.txt", b"x")
        result = await sb.exec(
            'ls; x="ä文"; echo "${#x}"; printf "%s\\n" "é" | tr -d "\\n" | wc -m', timeout=30
        )
        assert result.stdout == "ünï 文字.txt\n2\n1\n"
        assert result.stderr == ""  # no locale warnings

    in_sandbox(tmp_path, body)


def test_exit_by_signal_and_output_larger_than_a_pipe(tmp_path: Path) -> None:
    async def body(sb: Sandbox) -> None:
        killed = await sb.exec("echo before; kill -TERM $$", timeout=30)
        assert (killed.exit_code, killed.stdout, killed.timed_out) == (-signal.SIGTERM, "before\n", False)
        # More than a pipe holds: written while the command runs, all of it read.
        big = await sb.exec(
            "head -c 300000 /dev/zero | tr '\\0' a; echo; echo end >&2", timeout=30, output_cap=10**6
        )
        assert (len(big.stdout), big.stderr, big.truncated) == (300001, "end\n", False)

    in_sandbox(tmp_path, body)


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "thread"])
def test_cancelled_exec_kills_the_tree_and_leaves_no_descriptors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pidfd: bool
) -> None:
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    marker = str(random.randint(10_000, 99_999))

    async def body(sb: Sandbox) -> None:
        await sb.exec("true", timeout=30)  # warm: whatever the loop opens once
        before = open_fds()
        task = asyncio.ensure_future(sb.exec(f"sleep {marker}1 & sleep {marker}2; echo never", timeout=60))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await survivors(sb, marker) == []
        for command in ("echo hi", f"sleep {marker}3 & echo bg", "sleep 5"):
            await sb.exec(command, timeout=0.3)
        assert open_fds() == before

    in_sandbox(tmp_path, body)


def test_a_session_cancelled_while_its_sandbox_starts_leaves_nothing(sandbox_root: Path) -> None:
    """bubblewrap starts from a worker thread and joins its cgroups from another: a session cut
    short at any point of that leaves no process and no descriptor behind."""
    need_engine("bwrap", bubblewrap.works())

    async def main() -> None:
        backend = LocalBackend({"root": str(sandbox_root), "isolation": "bwrap"})
        try:
            warm = await backend.create(SandboxSpec(run_id="cancel-start", work_id="warm"))
            await warm.exec("true", timeout=60)  # whatever the loop opens once
            await warm.close()
            before = open_fds()
            for index, delay in enumerate((0, 0, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3)):
                sandbox = await backend.create(SandboxSpec(run_id="cancel-start", work_id=f"w{index}"))
                task = asyncio.ensure_future(sandbox.exec("echo started", timeout=60))
                await asyncio.sleep(delay)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                await sandbox.close()
            assert open_fds() == before
            assert _children() == []
        finally:
            await backend.aclose()

    asyncio.run(main())


def _children() -> list[str]:
    found = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as handle:
            found += handle.read().split()
    return found


def test_a_process_that_left_the_group_cannot_hold_exec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_command, "ESCAPED_PIPE_GRACE", 0.3)

    async def body(sb: Sandbox) -> None:
        assert isinstance(sb, LocalSandbox)
        started = time.monotonic()
        result = await sb.exec(
            "setsid sh -c 'echo $$ > escaped.pid; exec sleep 60' & echo started", timeout=30
        )
        try:
            assert result.stdout == "started\n"
            assert time.monotonic() - started < 3  # the grace, not the sleep
        finally:
            for _ in range(100):
                pid_file = Path(sb.workdir) / "escaped.pid"
                if pid_file.exists():
                    os.kill(int(pid_file.read_text()), signal.SIGKILL)
                    break
                await asyncio.sleep(0.05)

    in_sandbox(tmp_path, body)


def host_processes(marker: str, settle: float = 5.0) -> list[int]:
    """Pids of this host's ``sleep MARKER...`` processes, once they had time to die."""
    deadline = time.monotonic() + settle
    while True:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if argv[0] == b"sleep" and argv[1].startswith(marker.encode()):
                    found.append(int(pid))
            except OSError:
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


RUNNER = """
import asyncio, sys
from trajkit.plugins.local.sandbox import LocalBackend
from trajkit.sandbox import SandboxSpec

async def main():
    backend = LocalBackend({"root": sys.argv[1], "isolation": sys.argv[2]})
    sandbox = await backend.create(SandboxSpec(run_id="killed", work_id="w0"))
    print("ready", flush=True)
    await sandbox.exec(sys.argv[3], timeout=600)

asyncio.run(main())
"""


@pytest.mark.parametrize("isolation", ["bwrap", "none"])
def test_kill_9_of_the_runner_leaves_no_process(sandbox_root: Path, isolation: str) -> None:
    if isolation == "bwrap":
        need_engine("bwrap", bubblewrap.works())
    tmp_path = sandbox_root
    marker = str(random.randint(10**8, 10**9))
    command = f"sleep {marker}1 & setsid sleep {marker}2 </dev/null >/dev/null 2>&1 & sleep {marker}3"
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(tmp_path), isolation, command], stdout=subprocess.PIPE, text=True
    )
    assert runner.stdout is not None and runner.stdout.readline() == "ready\n"
    deadline = time.monotonic() + 30
    while len(host_processes(marker, settle=0)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(host_processes(marker, settle=0)) == 3
    runner.kill()
    runner.wait()
    controls = list(Path(CONTROL_PARENT).glob(f"{CONTROL_PREFIX}{runner.pid}-*"))
    assert len(controls) == (1 if isolation == "bwrap" else 0), "the sessions' control directories"
    if isolation == "none":  # nothing dies with the runner: the next run's reaper kills them
        asyncio.run(LocalBackend({"root": str(tmp_path), "isolation": "none"}).reap())
    assert host_processes(marker) == []
    asyncio.run(LocalBackend({"root": str(tmp_path), "isolation": isolation}).reap())
    assert [p.name for p in tmp_path.iterdir()] in ([], [ACCOUNTS_DIR])
    assert not any(f"trajkit-{runner.pid}-" in p for p in _cgroup_dirs())
    assert not any(control.exists() for control in controls)


def _cgroup_dirs() -> list[str]:
    # os.walk passes over a directory removed while it walks (another run's cgroup going away).
    walk = os.walk("/sys/fs/cgroup")
    return [os.path.join(top, name) for top, dirs, _ in walk for name in dirs if name.startswith("trajkit-")]


def test_an_unconfined_commands_cgroup_is_emptied_before_the_next_uses_it(tmp_path: Path) -> None:
    """Unconfined, each command has a cgroup of its own below its sandbox's; once what it left
    (a process that left its group with setsid) is killed, the next command uses it again
    instead of waiting for the kernel to make a new one and remove the old."""
    marker = str(random.randint(10**8, 10**9))

    async def body(sb: Sandbox) -> None:
        assert isinstance(sb, LocalSandbox)
        if not sb.backend.cgroups:
            need_engine("cgroups", "no cgroup can be made here")
        cgroup_of = "grep -E ':pids:|^0::' /proc/self/cgroup"
        first = await sb.exec(f"setsid sleep {marker}1 </dev/null >/dev/null 2>&1 & {cgroup_of}", timeout=30)
        assert host_processes(marker) == []
        second = await sb.exec(cgroup_of, timeout=30)
        assert first.stdout.strip() and second.stdout == first.stdout
        assert len(sb.spare_cgroups) == 1
        beside = [sb.exec(f"sleep 0.5; {cgroup_of}", timeout=30) for _ in range(2)]
        at_once = {result.stdout for result in await asyncio.gather(*beside)}
        assert len(at_once) == 2, "commands running at once share no cgroup"

    in_sandbox(tmp_path, body)


def test_unconfined_first_commands_at_once_each_get_a_cgroup_of_their_own(tmp_path: Path) -> None:
    """A model's first turn may call several commands at once: each still gets a cgroup of its
    own, so none is killed when another one's leftovers are."""
    # Each command says its cgroup, then waits until all eight of its wave have: they run at once.
    together = "grep -E ':pids:|^0::' /proc/self/cgroup | tee {0}.{1}; until [ $(ls {0}.* | wc -l) -eq 8 ]; do sleep 0.05; done"

    async def body(sb: Sandbox) -> None:
        assert isinstance(sb, LocalSandbox)
        if not sb.backend.cgroups:
            need_engine("cgroups", "no cgroup can be made here")
        for wave in range(3):  # the first starts the sandbox's cgroups, the later ones reuse theirs
            results = await asyncio.gather(*(sb.exec(together.format(wave, i), timeout=30) for i in range(8)))
            assert [r.exit_code for r in results] == [0] * 8, results
            assert len({r.stdout for r in results}) == 8, "commands running at once share no cgroup"

    in_sandbox(tmp_path, body)


def test_a_fork_bomb_meets_its_sandboxs_limit_alone(tmp_path: Path) -> None:
    async def body(sb: Sandbox) -> None:
        assert isinstance(sb, LocalSandbox)
        if not sb.backend.cgroups:
            need_engine("cgroups", "no cgroup can be made here")
        neighbour = await sb.backend.create(SandboxSpec(run_id="local-test", work_id="w1"))
        try:
            bomb = asyncio.ensure_future(
                sb.exec("i=0; while [ $i -lt 100 ]; do sleep 30 & i=$((i+1)); done; echo spawned", timeout=20)
            )
            await asyncio.sleep(1.0)
            beside = await neighbour.exec("for i in 1 2 3 4 5; do sh -c 'echo ok' & done; wait", timeout=20)
            assert beside.stdout.count("ok") == 5
            result = await bomb
            assert "Resource temporarily unavailable" in result.stderr, result
        finally:
            await neighbour.close()

    in_sandbox(tmp_path, body, max_processes="20")


def test_memory_is_limited_per_sandbox(tmp_path: Path) -> None:
    async def body(sb: Sandbox) -> None:
        assert isinstance(sb, LocalSandbox)
        if not sb.backend.cgroups:
            need_engine("cgroups", "no cgroup can be made here")
        grab = "python3 -c 'x = bytearray(400 * 1024 * 1024); print(len(x))'"
        result = await sb.exec(grab, timeout=60)
        assert result.exit_code != 0 and "419430400" not in result.stdout

    in_sandbox(tmp_path, body, memory="64M")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"isolaton": "bwrap"}, r"isolaton\n  Extra inputs are not permitted"),
        ({"isolation": "chroot"}, r"isolation\n  Input should be 'auto', 'bwrap' or 'none'"),
        ({"network": "bridge"}, r"network\n  Input should be 'none' or 'host'"),
        ({"memory": "lots"}, r"memory\n  Value error, 'lots' is not a size"),
        ({"memory": "0"}, r"memory\n  Input should be greater than 0"),
        ({"max_processes": "-3"}, r"max_processes\n  Input should be greater than 0"),
        ({"max_processes": "many"}, r"max_processes\n  Input should be a valid integer"),
    ],
)
def test_bad_settings_are_errors_naming_the_key(
    tmp_path: Path, options: dict[str, str], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        LocalBackend({"root": str(tmp_path), **options})


def test_settings_take_text_from_the_command_line_and_typed_values_from_a_file(tmp_path: Path) -> None:
    from_flags = LocalBackend(
        {
            "root": str(tmp_path),
            "isolation": "none",
            "max_processes": "64",
            "memory": "512M",
            "network": "host",
        }
    ).settings
    from_file = LocalBackend(
        LocalSettings(
            root=str(tmp_path), isolation="none", max_processes=64, memory=512 * 1024**2, network="host"
        )
    ).settings
    assert from_flags == from_file
    assert (from_flags.max_processes, from_flags.memory) == (64, 512 * 1024**2)
    defaults = LocalSettings()
    assert (defaults.isolation, defaults.network, defaults.max_processes, defaults.memory) == (
        "auto",
        "none",
        1024,
        4 * 1024**3,
    )
    assert LocalSettings(memory="1.5g").memory == int(1.5 * 1024**3)


def test_the_sandbox_root_is_private_to_its_user(tmp_path: Path) -> None:
    root = tmp_path / "root"

    async def body(sb: Sandbox) -> None:
        assert oct(root.stat().st_mode & 0o777) == "0o700"

    in_sandbox(root, body)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    os.chown(foreign, 12345, 12345)
    if os.getuid() == 0:
        with pytest.raises(SandboxError, match="not a directory of this user's"):
            in_sandbox(foreign, body)


def test_the_reaper_reads_owner_and_deadline_from_the_name(tmp_path: Path) -> None:
    """Nothing but the prompt's files is made: a sandbox's directory is named after its owner and
    deadline, and the reaper removes one only once that owner is gone or the deadline passed."""
    backend = LocalBackend({"root": str(tmp_path), "isolation": "none"})
    sandbox = asyncio.run(backend.create(SandboxSpec(run_id="mine", work_id="w0", lifetime=600)))
    workdir = Path(sandbox.workdir)
    assert [p.name for p in tmp_path.iterdir()] == [workdir.name] and list(workdir.iterdir()) == []
    host, pid, deadline = re.fullmatch(r"mine\.([0-9a-f]{8})-(\d+)-(\d+)-[a-z0-9_]{8}", workdir.name).groups()
    assert (int(pid), abs(int(deadline) - time.time() - 600) < 30) == (os.getpid(), True)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    later = int(time.time()) + 3600
    names = {
        "owner-gone": f"other.{host}-{dead.stdout.strip()}-{later}-abcd1234",
        "owner-gone-tmp": f"other.{host}-{dead.stdout.strip()}-{later}-abcd1234.tmp",
        "past-deadline": f"other.{host}-{os.getppid()}-{int(time.time()) - 1}-efgh5678",
        "other-host": f"other.{int(host, 16) ^ 1:08x}-{dead.stdout.strip()}-{later}-ijkl9012",
        "owner-alive": f"other.{host}-{os.getppid()}-{later}-mnop3456",
        "not-a-sandbox": "notes-of-the-user",
    }
    for name in names.values():
        (tmp_path / name).mkdir()
    assert asyncio.run(backend.reap()) == 3
    left = {kind for kind, name in names.items() if (tmp_path / name).exists()}
    assert left == {"other-host", "owner-alive", "not-a-sandbox"}
    assert workdir.is_dir()  # this process's own, alive
    asyncio.run(sandbox.close())
    assert not workdir.exists()


def test_a_sandbox_of_the_earlier_layout_is_reaped_by_its_owner_file(tmp_path: Path) -> None:
    """Another run's reaper may list the root between a sandbox's directory and its owner file (or
    while that file is being written): it is not abandoned, unless it has stayed so for long."""
    backend = LocalBackend({"root": str(tmp_path), "isolation": "none"})
    making = tmp_path / "other-run-123-456.abcd1234"
    making.mkdir()
    writing = tmp_path / "other-run-123-456.efgh5678"
    writing.mkdir()
    (writing / "owner.json").write_bytes(b'{"owner": "this-ho')
    assert asyncio.run(backend.reap()) == 0
    assert making.is_dir() and writing.is_dir()
    long_ago = time.time() - 3600
    for base in (making, writing):
        os.utime(base, (long_ago, long_ago))
    assert asyncio.run(backend.reap()) == 2
    assert not making.exists() and not writing.exists()


def test_account_files_written_by_several_processes_at_once(tmp_path: Path) -> None:
    """Each worker process of a run prepares the same sandbox root as it opens its first sandbox."""
    errors: list[BaseException] = []

    def write_many() -> None:
        try:
            for _ in range(200):
                bubblewrap.write_account_files(str(tmp_path))
        except BaseException as exc:  # any failure of a writer is the finding
            errors.append(exc)

    writers = [threading.Thread(target=write_many) for _ in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert errors == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["group", "passwd"]
    assert f"{bubblewrap.INSIDE_USER}:x:" in (tmp_path / "passwd").read_text()
