"""The sandbox conformance suite, shipped so every backend (ours or a third party's) runs the same tests.

Use it from a backend's test module::

    from trajkit.testing.sandbox_conformance import SandboxConformance

    class TestMyBackend(SandboxConformance):
        @pytest.fixture
        def harness(self):
            return MyHarness()

A harness says how to make the backend and how to see, from outside trajkit, what it left behind.
Each test runs its own event loop, so the backend is built inside it by ``make_backend``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Protocol, TypeVar

import pytest

from trajkit.sandbox import FileTooLarge, Sandbox, SandboxBackend, SandboxSpec
from trajkit.testing.privilege_conformance import PrivilegeConformance

T = TypeVar("T")


class BackendHarness(Protocol):
    image: str | None
    """Image for the specs the suite creates (None for backends without images)."""

    def make_backend(self) -> SandboxBackend:
        """A fresh backend; called inside the test's running event loop."""
        ...

    async def leftovers(self, backend: SandboxBackend, run_id: str) -> list[str]:
        """Whatever still exists of ``run_id``'s sandboxes (containers, directories...)."""
        ...


# Optional harness attributes, read with getattr so that older harnesses keep working:
#   host_paths (default ()): host directories behind the sandboxes (a scratch root) that no error
#     message may name.
#   isolated (default True): commands cannot see the runner's processes, /proc entries or
#     environment. Only the local backend's explicit ``isolation=none`` opt-out says False.
#   unprivileged (default True): commands run as a non-root user without capabilities, so the
#     privilege cases (trajkit.testing.privilege_conformance) apply.
#   processes_on_this_host (default True): the sandbox's processes run on this machine's kernel, so
#     the suite can check from outside that none outlives the sandbox.


def run(coro_fn: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await coro_fn()

    return asyncio.run(main())


HOSTILE_DEADLINE = 30.0
"""Seconds a refused file operation may take: it must fail at once, never hang on a FIFO or device."""
SPARSE_SIZE = 3 * 1024**3


class HostileConformance(PrivilegeConformance):
    """A hostile model's attempts to leave its sandbox, each of which every backend must stop.

    Host files are made in a fresh host directory the sandbox has no business seeing; for container
    backends those paths do not exist inside the container, for the local backend they are real
    host paths next to the sandbox.
    """

    def sandbox(
        self, harness: BackendHarness, *, cwd: str | None = None
    ) -> contextlib.AbstractAsyncContextManager[Sandbox]:
        raise NotImplementedError  # SandboxConformance.sandbox

    @asynccontextmanager
    async def hostile(self, harness: BackendHarness) -> AsyncIterator[tuple[Sandbox, str]]:
        with tempfile.TemporaryDirectory(prefix="trajkit-host-") as host:
            with open(os.path.join(host, "secret.txt"), "w") as handle:
                handle.write("HOST-SECRET-CONTENT\n")
            async with self.sandbox(harness) as sb:
                yield sb, host
            with open(os.path.join(host, "secret.txt")) as handle:
                assert handle.read() == "HOST-SECRET-CONTENT\n", "a host file was changed"
            assert sorted(os.listdir(host)) == ["secret.txt"], "a file was created on the host"

    def test_symlinks_do_not_lead_out(self, harness: BackendHarness) -> None:
        async def body() -> None:
            async with self.hostile(harness) as (sb, host):
                secret = f"{host}/secret.txt"
                await sb.exec(
                    f"ln -s {secret} file_link; ln -s {host} dir_link; ln -s / root_link", timeout=30
                )
                for path in (
                    "file_link",
                    "dir_link/secret.txt",
                    f"root_link{secret}",
                    f"{'../' * 12}{secret}",
                ):
                    assert b"HOST-SECRET" not in await _read_or_refused(sb, path), path
                    await _write_or_refused(sb, path, b"pwned")
                await _write_or_refused(sb, "dir_link/new.txt", b"pwned")
                await _write_or_refused(sb, f"{'../' * 12}{host}/new.txt", b"pwned")

        run(body)

    def test_devices_and_fifos_are_refused_at_once(self, harness: BackendHarness) -> None:
        async def body() -> None:
            async with self.hostile(harness) as (sb, _):
                made = await sb.exec("ln -s /dev/zero zero; mkfifo fifo && echo made", timeout=30)
                assert "made" in made.stdout, made
                for path in ("zero", "/dev/zero", "fifo", "/dev/urandom"):
                    with pytest.raises(OSError):
                        await asyncio.wait_for(sb.read_file(path), HOSTILE_DEADLINE)
                with pytest.raises(OSError):
                    await asyncio.wait_for(sb.write_file("fifo", b"x"), HOSTILE_DEADLINE)

        run(body)

    def test_reads_hold_at_most_their_limit(self, harness: BackendHarness) -> None:
        async def body() -> None:
            async with self.hostile(harness) as (sb, _):
                made = await sb.exec(
                    f"dd if=/dev/zero of=sparse bs=1 count=0 seek={SPARSE_SIZE} 2>/dev/null && echo made",
                    timeout=60,
                )
                assert "made" in made.stdout, made
                with pytest.raises(FileTooLarge) as caught:
                    await asyncio.wait_for(sb.read_file("sparse", limit=65536), HOSTILE_DEADLINE * 4)
                assert caught.value.size == SPARSE_SIZE
                assert len(caught.value.head) + len(caught.value.tail) <= 65536
                text = b"".join(b"line %06d\n" % i for i in range(20000))
                await sb.write_file("lines.txt", text)
                with pytest.raises(FileTooLarge) as caught:
                    await sb.read_file("lines.txt", limit=4096)
                assert text.startswith(caught.value.head) and text.endswith(caught.value.tail)
                assert caught.value.size == len(text)
                assert await sb.read_file("lines.txt", limit=len(text)) == text

        run(body)

    def test_no_secret_of_the_runner_is_reachable(self, harness: BackendHarness) -> None:
        canary = f"trajkit-canary-{uuid.uuid4().hex}"

        async def body() -> None:
            async with self.hostile(harness) as (sb, _):
                with contextlib.suppress(OSError):
                    assert canary not in (await sb.read_file("/proc/self/environ")).decode("latin-1")
                await sb.exec("ln -s /proc/self/environ env_link", timeout=30)
                assert canary.encode() not in await _read_or_refused(sb, "env_link")
                if not getattr(harness, "isolated", True):
                    return
                home_key = os.path.expanduser("~/.trajkit-conformance-key")
                if os.access(os.path.dirname(home_key), os.W_OK):
                    with open(home_key, "w") as handle:
                        handle.write(canary)
                    try:
                        found = await sb.exec(
                            f"cat {home_key} 2>/dev/null; ls ~ /root /home 2>/dev/null", timeout=30
                        )
                    finally:
                        os.unlink(home_key)
                    assert canary not in found.stdout and ".trajkit-conformance-key" not in found.stdout
                listing = await sb.exec(
                    "for p in /proc/[0-9]*; do cat $p/environ $p/cmdline; echo; done 2>/dev/null | tr '\\0' ' '",
                    timeout=60,
                    output_cap=4 * 1024 * 1024,
                )
                assert canary not in listing.stdout

        # In this process's environment (a sandbox must not inherit it), and in the starting
        # environment and command line of a process of the runner's (what /proc/PID shows).
        os.environ["TRAJKIT_CONFORMANCE_CANARY"] = canary
        stand_in = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(300)", canary], stdin=subprocess.DEVNULL
        )
        try:
            run(body)
        finally:
            del os.environ["TRAJKIT_CONFORMANCE_CANARY"]
            stand_in.kill()
            stand_in.wait()

    def test_paths_no_engine_takes_are_file_errors(self, harness: BackendHarness) -> None:
        """A NUL byte, 8,000 characters, an over-long name, text that is no UTF-8: each is a file
        error (OSError, which the model is told), never a failure of the sandbox, and no message
        names a host path; the sandbox goes on working."""

        async def body() -> None:
            async with self.sandbox(harness) as sb:
                for what, path in UNUSABLE_PATHS.items():
                    for write in (False, True):
                        operation = sb.write_file(path, b"x") if write else sb.read_file(path)
                        try:
                            await asyncio.wait_for(operation, HOSTILE_DEADLINE)
                        except OSError as refused:
                            assert_no_host_path(str(refused), harness, what)
                        else:
                            raise AssertionError(f"a path with {what} was taken")
                result = await sb.exec("echo still usable", timeout=30)
                assert result.stdout == "still usable\n"

        run(body)

    def test_file_tools_tell_the_model_of_unusable_paths(self, harness: BackendHarness) -> None:
        """What the model sees: a tool error for each such path, on every backend, naming no host path."""
        from trajkit.plugins.files.tools import FILE
        from trajkit.tools import ToolContext, ToolError

        tools = {tool.name: tool for tool in FILE.tools}
        calls = [
            ("read_file", {}),
            ("write_file", {"content": "x"}),
            ("patch", {"old_string": "a", "new_string": "b"}),
        ]

        async def body() -> None:
            async with self.sandbox(harness) as sb:
                context = ToolContext(sb)
                for what, path in UNUSABLE_PATHS.items():
                    for name, arguments in calls:
                        with pytest.raises(ToolError) as told:
                            await tools[name].run({"path": path, **arguments}, context)
                        message = str(told.value)
                        assert_no_host_path(message, harness, what)
                        assert len(message) < 600, f"{name} with {what}: {len(message)} characters"

        run(body)

    def test_daemons_die_with_their_exec(self, harness: BackendHarness) -> None:
        marker = str(random.randint(10_000, 99_999))

        async def body() -> None:
            async with self.hostile(harness) as (sb, _):
                await sb.exec(
                    f"setsid sleep {marker}6 </dev/null >/dev/null 2>&1 & "
                    f"(setsid sh -c 'sleep {marker}7' </dev/null >/dev/null 2>&1 &) ; echo started",
                    timeout=60,
                )
                assert await survivors(sb, marker) == []
                if getattr(harness, "processes_on_this_host", True):
                    assert await _host_processes(marker) == []
            if getattr(harness, "processes_on_this_host", True):
                assert await _host_processes(marker) == []

        run(body)


UNUSABLE_PATHS = {
    "a NUL byte": "bad\0name.txt",
    "8,000 characters": "x" * 8000,
    "an over-long name": "dir/" + "n" * 300 + ".txt",
    "text that is no UTF-8": "caf\udce9.txt",
    "500 levels": "/".join(["abcdefghij"] * 500),
}
"""Paths no engine accepts, as a model can send them (JSON escapes give lone surrogates too)."""
HOST_PATH_MARKS = ("overlay2", "/merged/", "/var/lib/docker", "/.cache/trajkit")


def assert_no_host_path(message: str, harness: BackendHarness, what: str) -> None:
    """``message`` names none of the host's paths behind the sandbox: an engine's directories, or
    what the harness lists as ``host_paths`` (its scratch directories)."""
    for mark in (*HOST_PATH_MARKS, *getattr(harness, "host_paths", ())):
        assert mark not in message, f"a path with {what}: the message names {mark!r}: {message[:300]}"


async def _read_or_refused(sb: Sandbox, path: str) -> bytes:
    """What a read of ``path`` gave, or b"" when the sandbox refused it (any OSError)."""
    try:
        return await asyncio.wait_for(sb.read_file(path, limit=1 << 20), HOSTILE_DEADLINE)
    except (OSError, FileTooLarge):
        return b""


async def _write_or_refused(sb: Sandbox, path: str, data: bytes) -> None:
    with contextlib.suppress(OSError):
        await asyncio.wait_for(sb.write_file(path, data), HOSTILE_DEADLINE)


async def _host_processes(marker: str, settle: float = 5.0) -> list[str]:
    """Command lines of this host's processes that carry ``marker``, after giving them time to die."""
    deadline = time.monotonic() + settle
    while True:
        found = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    line = handle.read().replace(b"\0", b" ").decode("utf-8", "replace")
            except OSError:
                continue
            if f"sleep {marker}" in line:
                found.append(line)
        if not found or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.2)


class SandboxConformance(HostileConformance):
    """Tests every backend must pass, hostile cases included. Subclasses provide a ``harness`` fixture."""

    @asynccontextmanager
    async def sandbox(self, harness: BackendHarness, *, cwd: str | None = None) -> AsyncIterator[Sandbox]:
        backend = harness.make_backend()
        run_id = f"conformance-{uuid.uuid4().hex[:8]}"
        spec = SandboxSpec(run_id=run_id, work_id="w0", image=harness.image, cwd=cwd, lifetime=600)
        if harness.image:
            await backend.verify_image(harness.image)
        sandbox = await backend.create(spec)
        try:
            yield sandbox
        finally:
            await sandbox.close()
            await backend.aclose()

    def test_exit_code_and_streams_apart(self, harness: BackendHarness) -> None:
        async def body() -> None:
            async with self.sandbox(harness) as sb:
                result = await sb.exec("echo out; echo err >&2; exit 3", timeout=30)
                assert result.exit_code == 3
                assert result.stdout == "out\n"
                assert result.stderr == "err\n"
                assert not result.timed_out

        run(body)

    def test_cwd_and_env(self, harness: BackendHarness) -> None:
        async def body() -> None:
            async with self.sandbox(harness, cwd="/opt/proj") as sb:
                assert sb.cwd.endswith("/opt/proj")
                result = await sb.exec('pwd; echo "$GREETING"', timeout=30, env={"GREETING": "hi there"})
                assert result.stdout.splitlines() == [sb.cwd, "hi there"]

        run(body)

    def test_timeout_kills_the_whole_tree(self, harness: BackendHarness) -> None:
        marker = str(random.randint(10_000, 99_999))

        async def body() -> None:
            async with self.sandbox(harness) as sb:
                started = time.monotonic()
                result = await sb.exec(
                    f"sleep {marker}1 & sh -c 'sleep {marker}2 & sleep {marker}3' & wait", timeout=1.5
                )
                assert result.timed_out
                assert time.monotonic() - started < 20
                assert await survivors(sb, marker) == []

        run(body)

    def test_background_children_do_not_outlive_exec(self, harness: BackendHarness) -> None:
        marker = str(random.randint(10_000, 99_999))

        async def body() -> None:
            async with self.sandbox(harness) as sb:
                started = time.monotonic()
                result = await sb.exec(f"sleep {marker}4 & echo started", timeout=60)
                assert result.stdout == "started\n"
                assert time.monotonic() - started < 20, "exec waited for a background child"
                assert await survivors(sb, marker) == []

        run(body)

    def test_commands_beside_each_other_run_to_their_end(self, harness: BackendHarness) -> None:
        async def body() -> None:
            async with self.sandbox(harness) as sb:
                slow = asyncio.ensure_future(sb.exec("sleep 2; echo survived", timeout=60))
                await asyncio.sleep(0.3)
                quick = await asyncio.gather(*(sb.exec(f"echo {i}", timeout=30) for i in range(5)))
                assert [r.stdout for r in quick] == [f"{i}\n" for i in range(5)]
                result = await slow
                assert (result.exit_code, result.stdout) == (0, "survived\n")

        run(body)

    def test_output_is_capped_keeping_head_and_tail(self, harness: BackendHarness) -> None:
        async def body() -> None:
            async with self.sandbox(harness) as sb:
                command = "echo BEGIN; i=0; while [ $i -lt 20000 ]; do echo 0123456789abcdef; i=$((i+1)); done; echo END"
                result = await sb.exec(command, timeout=60, output_cap=4096)
                assert result.truncated
                assert len(result.stdout) < 4096 + 200
                assert result.stdout.startswith("BEGIN\n")
                assert result.stdout.endswith("END\n")
                assert "bytes truncated" in result.stdout

        run(body)

    def test_binary_files_round_trip_with_odd_names(self, harness: BackendHarness) -> None:
        payload = os.urandom(3 * 1024 * 1024) + bytes(range(256))
        name = "dir with space/ünï 'q\"uote $(touch pwned) ;.bin"

        async def body() -> None:
            async with self.sandbox(harness) as sb:
                await sb.write_file(name, payload)
                assert await sb.read_file(name) == payload
                assert await sb.read_file(f"{sb.cwd}/{name}") == payload
                listing = await sb.exec("ls; test -e pwned && echo INJECTED || true", timeout=30)
                assert "INJECTED" not in listing.stdout
                await sb.write_file("plain.txt", b"hello\n")
                assert (await sb.exec("cat plain.txt", timeout=30)).stdout == "hello\n"

        run(body)

    def test_missing_files_are_clear_errors(self, harness: BackendHarness) -> None:
        async def body() -> None:
            async with self.sandbox(harness) as sb:
                with pytest.raises(FileNotFoundError):
                    await sb.read_file("does/not/exist.txt")
                await sb.exec("mkdir -p adir", timeout=30)
                with pytest.raises(IsADirectoryError):
                    await sb.read_file("adir")

        run(body)

    def test_close_is_idempotent_and_leaves_nothing(self, harness: BackendHarness) -> None:
        async def body() -> None:
            backend = harness.make_backend()
            run_id = f"conformance-{uuid.uuid4().hex[:8]}"
            if harness.image:
                await backend.verify_image(harness.image)
            sb = await backend.create(SandboxSpec(run_id=run_id, work_id="w0", image=harness.image))
            await sb.write_file("data.bin", b"x" * 1000)
            assert await harness.leftovers(backend, run_id) != []
            await sb.close()
            await sb.close()
            assert await harness.leftovers(backend, run_id) == []
            await backend.aclose()

        run(body)

    def test_sandboxes_do_not_see_each_other(self, harness: BackendHarness) -> None:
        async def body() -> None:
            async with self.sandbox(harness) as first, self.sandbox(harness) as second:
                await first.write_file("secret.txt", b"mine")
                with pytest.raises(FileNotFoundError):
                    await second.read_file("secret.txt")
                assert "secret.txt" not in (await second.exec("ls -a", timeout=30)).stdout

        run(body)


async def survivors(sandbox: Sandbox, marker: str) -> list[str]:
    """Command lines of processes, seen from inside the sandbox, that carry ``marker``."""
    listing = await sandbox.exec(
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done", timeout=30
    )
    return [line for line in listing.stdout.splitlines() if f"sleep {marker}" in line and "/proc" not in line]
