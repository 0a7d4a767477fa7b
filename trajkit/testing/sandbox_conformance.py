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
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Protocol, TypeVar

import pytest

from trajkit.sandbox import Sandbox, SandboxBackend, SandboxSpec

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


def run(coro_fn: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await coro_fn()

    return asyncio.run(main())


class SandboxConformance:
    """Tests every backend must pass. Subclasses provide a ``harness`` fixture."""

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
