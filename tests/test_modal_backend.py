"""The Modal backend, against a local fake of the Modal SDK and, given credentials, against Modal itself.

The fake (``trajkit_modal.testing``) runs commands as local processes. It is only worth something
while it matches the real SDK, so its signatures and exceptions are compared with the installed
``modal`` here too.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import os
import subprocess
import sys
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("modal", reason="the modal SDK is not installed")

import modal
import modal.container_process
import modal.io_streams
import modal.sandbox.sandbox
import modal.types
import trajkit_modal.testing as fake_sdk
from modal.exception import InvalidError, ResourceExhaustedError
from trajkit_modal.backend import INLINE_COMMAND_LIMIT, MAX_LIFETIME, PRIVILEGE_NOTE, ModalBackend
from trajkit_modal.ratelimit import TokenBucket, backoff_delay
from trajkit_modal.testing import FakeModal, aio_method, aio_static

from trajkit.sandbox import (
    FileTooLarge,
    ImageUnavailable,
    NotARegularFile,
    SandboxBackend,
    SandboxError,
    SandboxSpec,
)
from trajkit.testing.sandbox_conformance import SandboxConformance

LIVE_APP = "trajkit-tests"
HAVE_MODAL_CREDENTIALS = bool(os.environ.get("MODAL_TOKEN_ID") and os.environ.get("MODAL_TOKEN_SECRET"))


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeModal]:
    sdk = FakeModal(tmp_path / "cloud")
    yield sdk
    asyncio.run(sdk.aclose())


def spec(run_id: str = "run", work_id: str = "w0", **fields: Any) -> SandboxSpec:
    return SandboxSpec(run_id=run_id, work_id=work_id, **fields)


# --- the conformance suite, on the fake and on Modal --------------------------------------------


class FakeHarness:
    image: str | None = "python:3.11-slim"
    # The fake runs commands as processes of this machine: they see its home directories and its
    # /proc as any local process would. What Modal's own containers hide is checked by the live suite
    # below; on the fake, the hostile secret case keeps to what goes through the backend's file calls.
    isolated = False

    def __init__(self, sdk: FakeModal, kill_on_exec_timeout: bool) -> None:
        self.sdk = sdk
        sdk.cloud.kill_on_exec_timeout = kill_on_exec_timeout
        self.host_paths = (str(sdk.cloud.root),)

    def make_backend(self) -> SandboxBackend:
        return ModalBackend({"create_rate": "50"}, sdk=self.sdk)

    async def leftovers(self, backend: SandboxBackend, run_id: str) -> list[str]:
        return self.sdk.cloud.leftovers({"trajkit.run": run_id})


class TestModalConformance(SandboxConformance):
    # Whether Modal kills a timed-out exec's own process is not documented: the suite runs both ways.
    @pytest.fixture(params=[False, True], ids=["timeout-leaves-process", "timeout-kills-process"])
    def harness(self, fake: FakeModal, request: pytest.FixtureRequest) -> FakeHarness:
        return FakeHarness(fake, request.param)


class LiveHarness:
    image: str | None = os.environ.get("TRAJKIT_MODAL_TEST_IMAGE") or None
    # Modal's SDK has no setting for a sandbox's user or capabilities: commands run as the image's
    # user (root in most images), inside gVisor. The privilege cases do not apply.
    unprivileged = False

    def make_backend(self) -> SandboxBackend:
        return ModalBackend({"app": LIVE_APP})

    async def leftovers(self, backend: SandboxBackend, run_id: str) -> list[str]:
        app = await asyncio.wait_for(modal.App.lookup.aio(LIVE_APP, create_if_missing=True), 60)

        async def listing() -> list[str]:
            tags = {"trajkit.run": run_id}
            return [sb.object_id async for sb in modal.Sandbox.list.aio(app_id=app.app_id, tags=tags)]

        return await asyncio.wait_for(listing(), 60)


@pytest.mark.skipif(
    not HAVE_MODAL_CREDENTIALS,
    reason="no Modal credentials: set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET to run the suite on Modal",
)
class TestModalLive(SandboxConformance):
    @pytest.fixture
    def harness(self) -> LiveHarness:
        return LiveHarness()


# --- the fake is the SDK's shape ----------------------------------------------------------------

COUNTERPARTS: list[tuple[type, Any]] = [
    (fake_sdk.App, modal.App),
    (fake_sdk.Image, modal.Image),
    (fake_sdk.Secret, modal.Secret),
    (fake_sdk.Sandbox, modal.Sandbox),
    (fake_sdk.SandboxFilesystem, modal.sandbox.sandbox.SandboxFilesystem),
    (fake_sdk.ContainerProcess, modal.container_process.ContainerProcess),
    (fake_sdk.StreamReader, modal.io_streams.StreamReader),
    (fake_sdk.StreamWriter, modal.io_streams.StreamWriter),
]


def parameters(function: Any) -> list[tuple[str, Any, Any]]:
    """Names, kinds and defaults: what decides whether a call binds (annotations do not)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


def public_members(cls: type) -> dict[str, Any]:
    return {
        name: member for name, member in vars(cls).items() if not name.startswith("_") or name == "__aiter__"
    }


@pytest.mark.parametrize(("fake_class", "real_class"), COUNTERPARTS, ids=lambda c: c.__name__)
def test_fake_has_the_signatures_of_the_installed_sdk(fake_class: type, real_class: Any) -> None:
    assert fake_class.__name__ == real_class.__name__
    for name, member in public_members(fake_class).items():
        where = f"{fake_class.__name__}.{name}"
        assert hasattr(real_class, name), f"{where} does not exist in modal {modal.__version__}"
        real = getattr(real_class, name)
        if isinstance(member, fake_sdk.aio_method | fake_sdk.aio_static):
            ours = getattr(fake_class, name).aio
            assert hasattr(real, "aio"), f"{where} has no .aio form in modal"
            assert parameters(ours) == parameters(real.aio), where
            if inspect.isasyncgenfunction(ours):
                assert "AsyncGenerator" in str(inspect.signature(real.aio).return_annotation), where
            else:
                assert inspect.iscoroutinefunction(ours) and inspect.iscoroutinefunction(real.aio), where
        elif isinstance(member, property):
            assert isinstance(inspect.getattr_static(real_class, name), property), where
        elif isinstance(member, classmethod | staticmethod) or inspect.isfunction(member):
            assert parameters(getattr(fake_class, name)) == parameters(real), where
        elif name != "__aiter__":
            raise AssertionError(f"{where}: a kind of member this test does not compare")


def test_fake_raises_the_sdks_own_exceptions() -> None:
    assert FakeModal.exception is modal.exception
    for name in ("ResourceExhaustedError", "AuthError", "SandboxFilesystemNotFoundError", "ImageBuildError"):
        assert getattr(fake_sdk.exception, name) is getattr(modal.exception, name)


def test_plugin_registers_the_backend_without_importing_modal() -> None:
    code = (
        "import sys, trajkit_modal.plugin as p; print(p.trajkit_sandbox_backends(), 'modal' in sys.modules)"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert output.strip() == "[<class 'trajkit_modal.backend.ModalBackend'>] False"
    assert ModalBackend.name == "modal" and ModalBackend.image_based


# --- creation: pacing, retries, arguments -------------------------------------------------------


def test_creation_is_paced_and_every_sandbox_terminated(fake: FakeModal) -> None:
    rate, burst, count = 20.0, 5, 50

    async def body() -> None:
        backend = ModalBackend({"create_rate": str(rate), "create_burst": str(burst)}, sdk=fake)
        specs = [spec("paced", f"w{i}") for i in range(count)]
        sandboxes = await asyncio.gather(*(backend.create(s) for s in specs))
        assert len(fake.cloud.live(tags={"trajkit.run": "paced"})) == count
        await asyncio.gather(*(sb.close() for sb in sandboxes))
        await backend.aclose()

    asyncio.run(body())
    times = sorted(fake.cloud.create_attempts)
    assert len(times) == count
    for first in range(count):
        for last in range(first, count):
            allowed = burst + rate * (times[last] - times[first]) + 1  # one token of timing slack
            assert last - first + 1 <= allowed, (
                f"{last - first + 1} creations in {times[last] - times[first]:.3f} s"
            )
    assert times[-1] - times[0] >= 0.9 * (count - burst) / rate
    assert fake.cloud.live(tags={"trajkit.run": "paced"}) == []
    assert fake.cloud.leftovers({"trajkit.run": "paced"}) == []


def test_the_run_says_once_that_modal_keeps_the_image_s_user(
    fake: FakeModal, caplog: pytest.LogCaptureFixture
) -> None:
    """Modal's SDK has no setting for a sandbox's user or capabilities: said once per backend."""

    async def body() -> None:
        backend = ModalBackend({"create_rate": "50"}, sdk=fake)
        sandboxes = [await backend.create(spec("said", f"w{i}")) for i in range(3)]
        await asyncio.gather(*(sb.close() for sb in sandboxes))
        await backend.aclose()

    with caplog.at_level(logging.WARNING, logger="trajkit_modal"):
        asyncio.run(body())
    said = [r.getMessage() for r in caplog.records if "gVisor" in r.getMessage()]
    assert said == [PRIVILEGE_NOTE]


def test_rate_limit_refusals_are_retried_with_growing_delays(fake: FakeModal) -> None:
    fake.cloud.create_errors = [ResourceExhaustedError("Too many requests") for _ in range(3)]

    async def body() -> None:
        backend = ModalBackend({"create_rate": "100", "create_backoff": "0.05"}, sdk=fake)
        sandbox = await backend.create(spec())
        assert (await sandbox.exec("echo ok", timeout=30)).stdout == "ok\n"
        await sandbox.close()

    asyncio.run(body())
    times = fake.cloud.create_attempts
    assert len(times) == 4
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    # Retry n waits at least half of 0.05 * 2**n: lower bounds that a busy machine cannot break.
    assert all(gap >= 0.025 * 2**n for n, gap in enumerate(gaps)), gaps


def test_token_bucket_paces_and_pauses() -> None:
    now = [0.0]
    starts: list[float] = []

    async def sleep(seconds: float) -> None:
        now[0] += seconds

    async def body() -> None:
        bucket = TokenBucket(rate=2, burst=3, clock=lambda: now[0], sleep=sleep)
        for _ in range(7):
            await bucket.acquire()
            starts.append(now[0])
        bucket.pause(10)
        await bucket.acquire()
        starts.append(now[0])

    asyncio.run(body())
    assert starts[:7] == pytest.approx([0, 0, 0, 0.5, 1.0, 1.5, 2.0])
    assert starts[7] == pytest.approx(12.5)  # the pause, then a token refilled from empty


def test_backoff_grows_exponentially_with_jitter_and_a_cap() -> None:
    assert [backoff_delay(n, 1.0, 60, rng=lambda: 0.0) for n in range(4)] == [0.5, 1, 2, 4]
    assert [backoff_delay(n, 1.0, 60, rng=lambda: 1.0) for n in range(4)] == [1, 2, 4, 8]
    assert backoff_delay(20, 1.0, 60, rng=lambda: 1.0) == 60


def test_creation_gives_up_after_the_retries_and_never_retries_other_errors(fake: FakeModal) -> None:
    async def body() -> None:
        backend = ModalBackend(
            {"create_retries": "2", "create_backoff": "0.01", "create_rate": "100"}, sdk=fake
        )
        fake.cloud.create_errors = [ResourceExhaustedError("Too many requests") for _ in range(5)]
        with pytest.raises(SandboxError, match="refused 3 times"):
            await backend.create(spec())
        assert len(fake.cloud.create_attempts) == 3
        fake.cloud.create_errors = [InvalidError("bad request")]
        with pytest.raises(SandboxError, match="InvalidError: bad request"):
            await backend.create(spec())
        assert len(fake.cloud.create_attempts) == 4

    asyncio.run(body())


def test_create_passes_lifetime_resources_tags_and_workdir(fake: FakeModal) -> None:
    async def body() -> None:
        backend = ModalBackend({"cpu": "2", "memory": "4096", "app": "myapp"}, sdk=fake)
        sandbox = await backend.create(spec("r1", "w7", lifetime=1234.5, env={"A": "1"}))
        assert sandbox.cwd.endswith("/work")
        assert (await sandbox.exec('echo "$A"', timeout=30)).stdout == "1\n"
        state = fake.cloud.sandboxes[sandbox.handle.object_id]
        assert state.timeout == 1235
        assert state.workdir == "/work"
        assert state.options["cpu"] == 2.0 and state.options["memory"] == 4096
        assert state.options["block_network"] is True
        assert state.app_id == fake.cloud.apps["myapp"]
        assert state.tags == {
            "trajkit": "1",
            "trajkit.run": "r1",
            "trajkit.work": "w7",
            "trajkit.owner": backend.owner,
        }
        await sandbox.close()
        long_lived = await ModalBackend({"block_network": "false"}, sdk=fake).create(spec(lifetime=10**7))
        state = fake.cloud.sandboxes[long_lived.handle.object_id]
        assert state.timeout == MAX_LIFETIME and state.options["block_network"] is False
        await long_lived.close()

    asyncio.run(body())


def test_settings_take_text_or_typed_values_and_bad_ones_fail_up_front() -> None:
    from pydantic import ValidationError
    from trajkit_modal.settings import ModalSettings

    flags = {"cpu": "2", "memory": "4096", "block_network": "off", "create_retries": "0", "create_burst": "8"}
    typed = {"cpu": 2, "memory": 4096, "block_network": False, "create_retries": 0, "create_burst": 8}
    assert ModalBackend(flags).settings == ModalBackend(ModalSettings.model_validate(typed)).settings
    for text, value in [
        ("yes", True),
        ("1", True),
        ("on", True),
        ("no", False),
        ("0", False),
        ("False", False),
    ]:
        assert ModalSettings.model_validate({"block_network": text}).block_network is value
    defaults = ModalSettings()
    assert (defaults.app, defaults.block_network, defaults.create_rate, defaults.burst) == (
        "trajkit",
        True,
        4,
        4,
    )
    assert ModalSettings(create_rate=0.5).burst == 1
    bad: list[dict[str, object]] = [
        {"cpus": "2"},
        {"create_rate": "fast"},
        {"create_rate": "0"},
        {"block_network": "maybe"},
        {"create_burst": "0.5"},
        {"create_retries": "-1"},
        {"create_backoff": "-1"},
        {"call_timeout": "0"},
        {"memory": "4g"},
    ]
    for options in bad:
        with pytest.raises(ValidationError, match=next(iter(options))):
            ModalBackend(options)


# --- images --------------------------------------------------------------------------------------


def test_verify_image_builds_once_and_reports_unavailable_images(fake: FakeModal) -> None:
    fake.cloud.unavailable_images.add("nosuch/image:1")

    async def body() -> None:
        backend = ModalBackend({}, sdk=fake)
        digest = await backend.verify_image("python:3.11-slim")
        assert digest is not None and digest.startswith("im-")
        sandbox = await backend.create(spec(image="python:3.11-slim"))
        assert sandbox.info.digest == digest and sandbox.info.image == "python:3.11-slim"
        assert fake.cloud.sandboxes[sandbox.handle.object_id].options["image"] == "python:3.11-slim"
        await sandbox.close()
        with pytest.raises(ImageUnavailable, match="nosuch/image:1"):
            await backend.verify_image("nosuch/image:1")

    asyncio.run(body())
    assert fake.cloud.builds == ["python:3.11-slim", "nosuch/image:1"]


def test_registry_secret_is_used_for_private_images(fake: FakeModal) -> None:
    async def body() -> None:
        backend = ModalBackend({"registry_secret": "ghcr-creds"}, sdk=fake)
        with pytest.raises(ImageUnavailable, match="ghcr-creds"):
            await backend.verify_image("ghcr.io/org/private:1")
        fake.cloud.secrets.add("ghcr-creds")
        assert await backend.verify_image("ghcr.io/org/private:1")

    asyncio.run(body())


def test_environment_and_the_bounds_on_building_and_creating_reach_modal(
    fake: FakeModal, monkeypatch: pytest.MonkeyPatch
) -> None:
    environments: list[str | None] = []
    lookup = fake.App.lookup.aio

    async def spied_lookup(cls: type, name: str, **kwargs: Any) -> Any:
        environments.append(kwargs.get("environment_name"))
        return await lookup(name, **kwargs)

    async def endless(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(60)

    monkeypatch.setattr(fake, "App", type("App", (fake.App,), {"lookup": aio_static(spied_lookup)}))
    monkeypatch.setattr(fake, "Image", type("Image", (fake.Image,), {"build": aio_method(endless)}))
    monkeypatch.setattr(fake, "Sandbox", type("Sandbox", (fake.Sandbox,), {"create": aio_static(endless)}))
    settings = {
        "environment": "staging",
        "build_timeout": "0.2",
        "create_timeout": "0.2",
        "create_rate": "100",
    }

    async def body() -> None:
        backend = ModalBackend(settings, sdk=fake)
        started = time.monotonic()
        with pytest.raises(ImageUnavailable, match=r"took longer than 0\.2 s"):
            await backend.verify_image("python:3.11-slim")
        with pytest.raises(SandboxError, match=r"creating a sandbox took longer than 0\.2 s"):
            await backend.create(spec())
        assert time.monotonic() - started < 10
        assert environments == ["staging"]  # looked up once, in the configured environment

    asyncio.run(body())


# --- exec and files ------------------------------------------------------------------------------


def test_timeout_is_exit_code_124_and_the_sandbox_stays_usable(fake: FakeModal) -> None:
    async def body() -> None:
        sandbox = await ModalBackend({}, sdk=fake).create(spec())
        result = await sandbox.exec("echo before; sleep 30", timeout=1)
        assert (result.timed_out, result.exit_code, result.stdout) == (True, 124, "before\n")
        assert (await sandbox.exec("exit 7", timeout=30)).exit_code == 7
        # The timed-out command's bookkeeping is gone; only the listing's own file remains, in
        # the sandbox's own temporary directory (never the host's /tmp, shared with other tests).
        listing = await sandbox.exec("ls -a \"$TMPDIR\" | grep -c '^.trajkit-exec-' || true", timeout=30)
        assert listing.stdout == "1\n"
        where = await sandbox.exec('echo "$TMPDIR"; mktemp', timeout=30)
        assert all(line.startswith(str(fake.cloud.root) + "/") for line in where.stdout.splitlines())
        await sandbox.close()

    asyncio.run(body())


def test_a_timed_out_command_with_its_own_tmpdir_is_killed_too(fake: FakeModal, tmp_path: Path) -> None:
    """The group's file follows the command's TMPDIR, and the kill looks for it there."""
    own = tmp_path / "own-tmp"
    own.mkdir()

    async def body() -> None:
        sandbox = await ModalBackend({}, sdk=fake).create(spec())
        command = f"echo $$ > {own}/pid; exec sleep 60"
        result = await sandbox.exec(command, timeout=1, env={"TMPDIR": str(own)})
        assert result.timed_out
        status = Path(f"/proc/{(own / 'pid').read_text().strip()}/status")
        assert not status.exists() or "\nState:\tZ" in status.read_text(), "the command outlived its exec"
        assert not [p for p in own.iterdir() if p.name.startswith(".trajkit-exec-")]
        await sandbox.close()

    asyncio.run(body())


def test_closing_one_cloud_s_sandbox_leaves_another_cloud_s_alone(tmp_path: Path) -> None:
    """Fakes in other tests (in this process or another on the machine) are clouds of their own:
    a sandbox's processes are found by a marker no other cloud's sandbox carries."""
    clouds = [FakeModal(tmp_path / "a"), FakeModal(tmp_path / "b")]

    async def body() -> None:
        ours, theirs = [await ModalBackend({}, sdk=cloud).create(spec()) for cloud in clouds]
        running = asyncio.ensure_future(theirs.exec("sleep 2; echo survived", timeout=30))
        await asyncio.sleep(0.5)
        await ours.close()
        result = await running
        assert (result.exit_code, result.stdout) == (0, "survived\n")
        await theirs.close()
        for cloud in clouds:
            await cloud.aclose()

    asyncio.run(body())


def test_long_commands_travel_through_stdin(fake: FakeModal) -> None:
    payload = "x" * (2 * INLINE_COMMAND_LIMIT)

    async def body() -> None:
        sandbox = await ModalBackend({}, sdk=fake).create(spec())
        result = await sandbox.exec(f"cat > big.txt <<'EOF'\n{payload}\nEOF\nwc -c < big.txt", timeout=30)
        assert result.stdout.strip() == str(len(payload) + 1)
        assert await sandbox.read_file("big.txt") == payload.encode() + b"\n"
        await sandbox.close()

    asyncio.run(body())


def test_file_errors_map_to_python_errors(fake: FakeModal) -> None:
    async def body() -> None:
        sandbox = await ModalBackend({}, sdk=fake).create(spec())
        await sandbox.write_file("a/b.txt", b"data")
        with pytest.raises(NotADirectoryError):
            await sandbox.write_file("a/b.txt/c", b"x")
        with pytest.raises(IsADirectoryError):
            await sandbox.write_file("a", b"x")
        await sandbox.close()
        with pytest.raises(SandboxError, match="closed"):
            await sandbox.read_file("a/b.txt")

    asyncio.run(body())


def test_a_sandbox_that_cannot_run_commands_fails_creation_and_is_terminated(
    fake: FakeModal, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(self: Any, *args: str, **kwargs: Any) -> Any:
        raise modal.exception.ExecutionError("container failed to start")

    monkeypatch.setattr(fake.Sandbox, "exec", fake_sdk.aio_method(broken))

    async def body() -> None:
        with pytest.raises(SandboxError, match="container failed to start"):
            await ModalBackend({}, sdk=fake).create(spec("broken"))

    asyncio.run(body())
    assert len(fake.cloud.sandboxes) == 1
    assert fake.cloud.leftovers({"trajkit.run": "broken"}) == []


# --- cleanup -------------------------------------------------------------------------------------


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


async def set_owner(sandbox: Any, owner: str) -> None:
    tags = await sandbox.handle.get_tags.aio()
    await sandbox.handle.set_tags.aio({**tags, "trajkit.owner": owner})


def test_reap_removes_a_runs_sandboxes_and_those_of_dead_owners(fake: FakeModal) -> None:
    async def body() -> None:
        backend = ModalBackend({}, sdk=fake)
        mine = [await backend.create(spec("old-run", f"w{i}")) for i in range(2)]
        other = await backend.create(spec("other-run"))
        orphan = await backend.create(spec("crashed-run"))
        foreign = await backend.create(spec("elsewhere"))
        host = backend.owner.rpartition(":")[0]
        await set_owner(orphan, f"{host}:{dead_pid()}")
        await set_owner(foreign, f"other-host:{dead_pid()}")

        assert await ModalBackend({}, sdk=fake).reap("old-run") == 2
        remaining = {state.tags["trajkit.run"] for state in fake.cloud.live()}
        assert remaining == {"other-run", "crashed-run", "elsewhere"}
        # Without a run: only sandboxes whose owner process on this host is gone.
        assert await ModalBackend({}, sdk=fake).reap() == 1
        remaining = {state.tags["trajkit.run"] for state in fake.cloud.live()}
        assert remaining == {"other-run", "elsewhere"}
        for sandbox in [*mine, other, orphan, foreign]:
            await sandbox.close()

    asyncio.run(body())


def test_aclose_terminates_sandboxes_left_open(fake: FakeModal) -> None:
    async def body() -> None:
        backend = ModalBackend({}, sdk=fake)
        for i in range(3):
            await backend.create(spec("forgotten", f"w{i}"))
        await backend.aclose()

    asyncio.run(body())
    assert fake.cloud.leftovers({"trajkit.run": "forgotten"}) == []


def test_the_lifetime_ends_a_sandbox_even_without_close(fake: FakeModal) -> None:
    run_id = f"expiring-{uuid.uuid4().hex[:6]}"

    async def body() -> None:
        sandbox = await ModalBackend({}, sdk=fake).create(spec(run_id, lifetime=1))
        await asyncio.sleep(1.2)
        assert fake.cloud.leftovers({"trajkit.run": run_id}) == []
        with pytest.raises(SandboxError):
            await sandbox.exec("true", timeout=30)
        await sandbox.close()

    started = time.monotonic()
    asyncio.run(body())
    assert time.monotonic() - started < 20


# --- files: what the fake's file tools do, and what the backend makes of them ---------------------


def test_the_fakes_file_tools_are_as_hazardous_as_modals(fake: FakeModal) -> None:
    """A backend that handed paths straight to ``read_bytes`` would fail the hostile cases on the fake."""

    async def body() -> None:
        sandbox = await ModalBackend({}, sdk=fake).create(spec())
        made = (
            "ln -s /dev/zero zero && mkfifo fifo && dd if=/dev/zero of=big bs=1 count=0 seek=1G 2>/dev/null"
        )
        await sandbox.exec(made, timeout=30)
        files = sandbox.handle.filesystem
        with pytest.raises(RuntimeError, match="runs out of memory"):
            await files.read_bytes.aio(f"{sandbox.cwd}/zero")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(files.read_bytes.aio(f"{sandbox.cwd}/fifo"), 1)
        with pytest.raises(modal.exception.SandboxFilesystemFileTooLargeError):
            await files.read_bytes.aio(f"{sandbox.cwd}/big")
        info = await files.stat.aio(f"{sandbox.cwd}/zero")
        assert (info.type, info.symlink_target) == (modal.types.FileType.SYMLINK, "/dev/zero")
        await sandbox.close()

    asyncio.run(body())


def test_symlinks_resolve_inside_the_sandbox_and_writes_follow_them(fake: FakeModal, tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    (host / "kept.txt").write_bytes(b"host")

    async def body() -> None:
        sandbox = await ModalBackend({}, sdk=fake).create(spec())
        await sandbox.exec(
            f"mkdir real && echo inside > real/file && ln -s real/file link && ln -s {host} dl", timeout=30
        )
        await sandbox.write_file("link", b"through the link")
        listing = await sandbox.exec("readlink link; cat real/file", timeout=30)
        assert listing.stdout == "real/file\nthrough the link"
        await sandbox.write_file("dl/kept.txt", b"sandbox")
        assert await sandbox.read_file("dl/kept.txt") == b"sandbox"
        with pytest.raises(NotARegularFile):
            await sandbox.write_file("/dev/null", b"x")
        await sandbox.close()

    asyncio.run(body())
    assert (host / "kept.txt").read_bytes() == b"host" and os.listdir(host) == ["kept.txt"]


def test_a_huge_file_is_read_as_head_and_tail_in_bounded_memory(fake: FakeModal) -> None:
    limit = 1 << 20

    async def body() -> None:
        sandbox = await ModalBackend({}, sdk=fake).create(spec())
        await sandbox.exec("printf HEAD > huge && truncate -s 1T huge && printf TAIL >> huge", timeout=30)
        tracemalloc.start()
        try:
            with pytest.raises(FileTooLarge) as caught:
                await sandbox.read_file("huge", limit=limit)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert caught.value.size == (1 << 40) + 4
        assert caught.value.head.startswith(b"HEAD") and caught.value.tail.endswith(b"TAIL")
        assert len(caught.value.head) + len(caught.value.tail) == limit
        assert peak < 4 * limit, f"reading a 1 TiB file held {peak} bytes"
        await sandbox.close()

    asyncio.run(body())
