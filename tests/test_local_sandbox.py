"""The local backend beyond the shared conformance suite: its shell option, its environment, and how
a command's process and pipes are cleaned up however ``exec`` ends."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from trajkit.plugins import local_command
from trajkit.plugins.local_sandbox import LocalBackend, LocalSandbox
from trajkit.sandbox import Sandbox, SandboxError, SandboxSpec
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
