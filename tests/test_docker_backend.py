"""The docker sandbox backend (package ``trajkit_docker``) against a real engine.

Needs a Docker-compatible engine and the local test images: ``bash scripts/engines/docker.sh start``
then ``bash scripts/engines/docker.sh images``. Without them these tests skip, unless
``TRAJKIT_REQUIRE_ENGINES`` names docker, as CI sets it, in which case they fail.
"""

from __future__ import annotations

import asyncio
import errno
import io
import os
import pathlib
import subprocess
import sys
import tarfile
import textwrap
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from importlib import metadata
from typing import Any

import pytest

from trajkit.sandbox import FileTooLarge, ImageUnavailable, SandboxBackend, SandboxSpec
from trajkit.testing.engines import exec_leaving_the_limit_full, need_engine, pids_cgroup
from trajkit.testing.sandbox_conformance import SandboxConformance, survivors

BUSYBOX = "trajkit-test/busybox:latest"
PYTHON = "trajkit-test/python:latest"
MISSING = "trajkit-test/does-not-exist:nope"
SETUP_HINT = "run: bash scripts/engines/docker.sh start && bash scripts/engines/docker.sh images"


def _unavailable(image: str) -> str | None:
    """Why the docker tests cannot run with ``image``, or None when they can."""
    try:
        import docker
        import docker.errors

        import trajkit_docker  # noqa: F401
    except ImportError as exc:
        return f"cannot import {exc.name} (pip install -e trajkit_docker)"
    try:
        client = docker.from_env(timeout=20)
    except docker.errors.DockerException as exc:
        return f"no engine: {exc}; {SETUP_HINT}"
    try:
        client.ping()
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return f"image {image} is missing; {SETUP_HINT}"
    except Exception as exc:
        return f"engine does not answer: {exc}; {SETUP_HINT}"
    finally:
        client.close()
    return None


UNAVAILABLE = _unavailable(BUSYBOX)


@pytest.fixture
def docker_engine() -> None:
    need_engine("docker", UNAVAILABLE)


@pytest.fixture
def client(docker_engine: None) -> Iterator[Any]:
    """A plain SDK client, to look at containers from outside the backend."""
    import docker

    sdk = docker.from_env()
    yield sdk
    sdk.close()


def make_backend(**options: str) -> Any:
    from trajkit_docker import DockerBackend

    return DockerBackend(options)


def run_labelled(run_id: str) -> list[str]:
    import docker

    sdk = docker.from_env()
    try:
        found = sdk.api.containers(all=True, filters={"label": f"trajkit.run={run_id}"})
        return [str(item["Id"]) for item in found]
    finally:
        sdk.close()


class DockerHarness:
    image: str | None = BUSYBOX

    def make_backend(self) -> SandboxBackend:
        backend: SandboxBackend = make_backend()
        return backend

    async def leftovers(self, backend: SandboxBackend, run_id: str) -> list[str]:
        return await asyncio.to_thread(run_labelled, run_id)


@pytest.mark.engine("docker")
class TestDockerConformance(SandboxConformance):
    @pytest.fixture
    def harness(self, docker_engine: None) -> DockerHarness:
        return DockerHarness()


def spec(image: str = BUSYBOX, **fields: Any) -> SandboxSpec:
    return SandboxSpec(run_id=f"test-{uuid.uuid4().hex[:8]}", work_id="w0", image=image, **fields)


def container_state(client: Any, container_id: str) -> str | None:
    """The container's state, or None once the engine no longer has it."""
    import docker.errors

    try:
        return str(client.api.inspect_container(container_id)["State"]["Status"])
    except docker.errors.APIError as exc:
        if exc.status_code == 404 or "no such container" in str(exc).lower():  # podman: 500 mid-removal
            return None
        raise


@pytest.mark.engine("docker")
def test_missing_image_fails_fast_without_pulling(docker_engine: None) -> None:
    async def body() -> None:
        backend = make_backend(pull="never")
        with pytest.raises(ImageUnavailable, match="not found locally"):
            await backend.verify_image(MISSING)
        await backend.aclose()

    started = time.monotonic()
    asyncio.run(body())
    assert time.monotonic() - started < 10


@pytest.mark.engine("docker")
def test_missing_image_fails_in_bounded_time_when_pulling(docker_engine: None) -> None:
    async def body() -> None:
        backend = make_backend()
        with pytest.raises(ImageUnavailable, match=f"'{MISSING}' not found locally and pull failed"):
            await backend.verify_image(MISSING)
        await backend.aclose()

    started = time.monotonic()
    asyncio.run(body())
    assert time.monotonic() - started < 60


@pytest.mark.engine("docker")
def test_verify_image_returns_a_digest_and_info_reports_it(docker_engine: None) -> None:
    async def body() -> None:
        backend = make_backend(pull="never")
        digest = await backend.verify_image(BUSYBOX)
        assert digest and "sha256:" in digest
        sandbox = await backend.create(spec())
        try:
            info = sandbox.info
            assert (info.backend, info.image, info.digest) == ("docker", BUSYBOX, digest)
        finally:
            await sandbox.close()
            await backend.aclose()

    asyncio.run(body())


CRASHING_RUNNER = textwrap.dedent(
    """
    import asyncio, sys
    from trajkit.sandbox import SandboxSpec
    from trajkit_docker import DockerBackend

    async def main():
        backend = DockerBackend()
        spec = SandboxSpec(run_id=sys.argv[1], work_id="w0", image=sys.argv[2], lifetime=600)
        sandbox = await backend.create(spec)
        print(sandbox.container_id, flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
    """
)


@pytest.mark.engine("docker")
def test_reap_removes_containers_of_a_killed_runner_only(client: Any) -> None:
    run_id = f"test-reap-{uuid.uuid4().hex[:8]}"
    runner = subprocess.Popen(
        [sys.executable, "-c", CRASHING_RUNNER, run_id, BUSYBOX], stdout=subprocess.PIPE, text=True
    )
    try:
        assert runner.stdout is not None
        orphan = runner.stdout.readline().strip()
    finally:
        runner.kill()
        runner.wait(timeout=30)
    assert orphan, "the runner did not create its sandbox"
    assert container_state(client, orphan) == "running"

    async def body() -> None:
        backend = make_backend()
        live = await backend.create(spec())
        try:
            assert await backend.reap() >= 1
            assert container_state(client, orphan) is None
            assert container_state(client, live.container_id) == "running"
        finally:
            await live.close()
            await backend.aclose()

    asyncio.run(body())


@pytest.mark.engine("docker")
def test_reap_of_a_run_removes_all_its_containers(client: Any) -> None:
    async def body() -> None:
        backend = make_backend()
        sandbox = await backend.create(spec())
        run_id = sandbox_run_id(client, sandbox.container_id)
        assert await backend.reap(run_id) >= 1
        assert run_labelled(run_id) == []
        await sandbox.close()
        await backend.aclose()

    asyncio.run(body())


def sandbox_run_id(client: Any, container_id: str) -> str:
    return str(client.api.inspect_container(container_id)["Config"]["Labels"]["trajkit.run"])


@pytest.mark.engine("docker")
def test_python_image_runs_python(docker_engine: None) -> None:
    need_engine("docker", _unavailable(PYTHON))

    async def body() -> None:
        backend = make_backend()
        sandbox = await backend.create(spec(PYTHON))
        try:
            result = await sandbox.exec("python3 -c 'print(1+1)'", timeout=60)
            assert (result.exit_code, result.stdout) == (0, "2\n")
            timed = await sandbox.exec("python3 -c 'import time; time.sleep(100)' & wait", timeout=1)
            assert timed.timed_out
        finally:
            await sandbox.close()
            await backend.aclose()

    asyncio.run(body())


@pytest.mark.engine("docker")
def test_container_removes_itself_when_its_lifetime_ends(client: Any) -> None:
    async def body() -> str:
        backend = make_backend()
        sandbox = await backend.create(spec(lifetime=3))
        await backend.aclose()
        return sandbox.container_id

    container_id = asyncio.run(body())
    give_up = time.monotonic() + 20
    while container_state(client, container_id) not in (None, "exited") and time.monotonic() < give_up:
        time.sleep(0.5)
    assert container_state(client, container_id) in (None, "exited")


@pytest.mark.engine("docker")
def test_network_is_loopback_only_by_default(docker_engine: None) -> None:
    async def body() -> None:
        backend = make_backend()
        sandbox = await backend.create(spec())
        try:
            result = await sandbox.exec("cat /proc/net/dev", timeout=30)
            interfaces = [line.split(":")[0].strip() for line in result.stdout.splitlines() if ":" in line]
            assert interfaces == ["lo"]
        finally:
            await sandbox.close()
            await backend.aclose()

    asyncio.run(body())


@pytest.mark.engine("docker")
def test_limits_and_labels_reach_the_engine(client: Any) -> None:
    async def body() -> None:
        backend = make_backend(memory="256m", cpus="0.5", pids_limit="64")
        sandbox = await backend.create(spec(env={"FROM_SPEC": "yes"}))
        try:
            attrs = client.api.inspect_container(sandbox.container_id)
            host = attrs["HostConfig"]
            assert (host["Memory"], host["NanoCpus"], host["PidsLimit"]) == (256 * 1024**2, 500_000_000, 64)
            labels = attrs["Config"]["Labels"]
            assert labels["trajkit"] == "1" and labels["trajkit.work"] == "w0"
            assert labels["trajkit.owner"].endswith(f":{os.getpid()}")
            assert int(labels["trajkit.deadline"]) > time.time()
            result = await sandbox.exec('echo "$FROM_SPEC $PER_EXEC"', timeout=30, env={"PER_EXEC": "too"})
            assert result.stdout == "yes too\n"
        finally:
            await sandbox.close()
            await backend.aclose()

    asyncio.run(body())


@pytest.mark.engine("docker")
def test_memory_and_process_limits_are_on_by_default(client: Any) -> None:
    async def body() -> None:
        backend = make_backend(pids_limit="40")
        sandbox = await backend.create(spec())
        try:
            host = client.api.inspect_container(sandbox.container_id)["HostConfig"]
            assert (host["Memory"], host["MemorySwap"], host["PidsLimit"]) == (4 * 1024**3, 4 * 1024**3, 40)
            bomb = await sandbox.exec(
                "i=0; while [ $i -lt 80 ]; do sleep 1000 & i=$((i+1)); done", timeout=60
            )
            assert "Resource temporarily unavailable" in bomb.stderr, bomb
            after = await sandbox.exec("echo still usable; ls -d /proc/[0-9]* | wc -l", timeout=30)
            # The exec's end killed what the bomb left: PID 1, its sleep, this exec and `ls` remain.
            assert after.stdout.startswith("still usable\n") and int(after.stdout.split()[-1]) < 10, after
        finally:
            await sandbox.close()
            await backend.aclose()

    asyncio.run(body())


@pytest.mark.engine("docker")
def test_an_exec_that_leaves_the_process_limit_full_is_still_cleaned_up(client: Any) -> None:
    """The wrapper's cleanup after a command (its group's kill, the orphans' sweep) starts no process:
    a shell that cannot fork exits, and what the command left would outlive the exec."""

    async def body() -> None:
        backend = make_backend()
        sandbox = await backend.create(spec())
        try:
            container = client.api.inspect_container(sandbox.container_id)
            cgroup = pids_cgroup(container["State"]["Pid"])
            result, before, after = await exec_leaving_the_limit_full(sandbox, cgroup)
            assert (result.exit_code, result.timed_out) == (7, False), result
            assert after <= before
        finally:
            await sandbox.close()
            await backend.aclose()

    asyncio.run(body())


@pytest.mark.engine("docker")
def test_a_finished_exec_leaves_a_concurrent_one_running(docker_engine: None) -> None:
    async def body() -> None:
        backend = make_backend()
        sandbox = await backend.create(spec())
        try:
            slow = asyncio.ensure_future(sandbox.exec("sleep 3; echo slow done", timeout=60))
            await asyncio.sleep(1)
            quick = await sandbox.exec("env -i setsid sleep 88883 & echo quick done", timeout=60)
            assert (quick.stdout, quick.timed_out) == ("quick done\n", False)
            assert await survivors(sandbox, "8888") == []
            finished = await slow
            assert (finished.exit_code, finished.stdout) == (0, "slow done\n")
        finally:
            await sandbox.close()
            await backend.aclose()

    asyncio.run(body())


@pytest.mark.engine("docker")
def test_file_transfers_through_symlinks_stay_in_the_container(
    docker_engine: None, tmp_path: pathlib.Path
) -> None:
    """The archive API resolves a symlinked parent in the container's root, never on the host."""
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    (host_dir / "kept.txt").write_bytes(b"host")

    async def body() -> None:
        backend = make_backend()
        sandbox = await backend.create(spec())
        try:
            setup = f"mkdir -p real && echo inside > real/file && ln -s real/file link && ln -s {host_dir} dl && ln -s / rl"
            await sandbox.exec(setup, timeout=30)
            await sandbox.write_file("link", b"through the link")
            listing = await sandbox.exec("readlink link; cat real/file", timeout=30)
            assert listing.stdout == "real/file\nthrough the link"
            await sandbox.write_file(f"rl{host_dir}/kept.txt", b"container")
            await sandbox.write_file("dl/new.txt", b"container")
            await sandbox.exec("ln -s loop_b loop_a && ln -s loop_a loop_b", timeout=30)
            for operation in (sandbox.read_file("loop_a"), sandbox.write_file("loop_a", b"x")):
                with pytest.raises(OSError) as looped:
                    await operation
                assert looped.value.errno == errno.ELOOP
            inside = await sandbox.exec(f"cat {host_dir}/kept.txt; ls -a {host_dir}", timeout=30)
            assert inside.stdout.startswith("container")
            assert await sandbox.read_file(f"rl{host_dir}/kept.txt") == b"container"
        finally:
            await sandbox.close()
            await backend.aclose()
        assert sorted(os.listdir(host_dir)) == ["kept.txt"]
        assert (host_dir / "kept.txt").read_bytes() == b"host"

    asyncio.run(body())


@pytest.mark.engine("docker")
def test_a_huge_file_is_read_as_head_and_tail_in_bounded_memory(docker_engine: None) -> None:
    limit = 1 << 20

    async def body() -> None:
        backend = make_backend()
        sandbox = await backend.create(spec())
        try:
            made = await sandbox.exec(
                "printf HEAD > huge && dd if=/dev/zero of=huge bs=1 count=0 seek=1099511627776 2>/dev/null"
                " && printf TAIL >> huge && echo made",
                timeout=60,
            )
            assert "made" in made.stdout
            tracemalloc.start()
            try:
                with pytest.raises(FileTooLarge) as caught:
                    await sandbox.read_file("huge", limit=limit)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert caught.value.size == 1099511627776 + 4
            assert caught.value.head.startswith(b"HEAD") and caught.value.tail.endswith(b"TAIL")
            assert len(caught.value.head) + len(caught.value.tail) == limit
            assert peak < 4 * limit, f"reading a 1 TiB file held {peak} bytes"
        finally:
            await sandbox.close()
            await backend.aclose()

    asyncio.run(body())


@pytest.mark.engine("docker")
def test_cancelled_exec_kills_its_process_group(docker_engine: None) -> None:
    marker = str(uuid.uuid4().int % 90_000 + 10_000)

    async def body() -> None:
        backend = make_backend()
        sandbox = await backend.create(spec())
        try:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(sandbox.exec(f"sleep {marker}5 & wait", timeout=60), 1)
            give_up = time.monotonic() + 10
            while await survivors(sandbox, marker) and time.monotonic() < give_up:
                await asyncio.sleep(0.2)
            assert await survivors(sandbox, marker) == []
        finally:
            await sandbox.close()
            await backend.aclose()

    asyncio.run(body())


@pytest.mark.engine("docker")
def test_files_in_odd_places(docker_engine: None) -> None:
    async def body() -> None:
        backend = make_backend()
        sandbox = await backend.create(spec(cwd="rel/dir"))
        try:
            assert sandbox.cwd == "/rel/dir"
            await sandbox.write_file("/tmp/deep/new/file.txt", b"x")
            mode = await sandbox.exec("stat -c %a /tmp; ls -l /tmp/deep/new/file.txt", timeout=30)
            assert mode.stdout.startswith("1777\n"), "writing below /tmp changed its mode"
            await sandbox.exec("ln -s /tmp/deep/new/file.txt link", timeout=30)
            assert await sandbox.read_file("link") == b"x"
            await sandbox.write_file("empty", b"")
            assert await sandbox.read_file("empty") == b""
            with pytest.raises(NotADirectoryError):
                await sandbox.write_file("empty/child", b"y")
            with pytest.raises(IsADirectoryError):
                await sandbox.write_file("/tmp/deep", b"y")
        finally:
            await sandbox.close()
            await backend.aclose()

    asyncio.run(body())


@pytest.fixture
def image_without_shell(client: Any) -> Iterator[str]:
    """An image holding one text file and nothing else, made locally and removed afterwards."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"hi\n"))
    tag = uuid.uuid4().hex[:8]
    client.api.import_image_from_data(buffer.getvalue(), repository="trajkit-test/no-shell", tag=tag)
    yield f"trajkit-test/no-shell:{tag}"
    client.images.remove(f"trajkit-test/no-shell:{tag}", force=True)


@pytest.fixture
def image_without_setsid(client: Any) -> Iterator[str]:
    """The python image less setsid (Debian's BusyBox would run its applet even without the link)."""
    need_engine("docker", _unavailable(PYTHON))
    tag = uuid.uuid4().hex[:8]
    donor = client.containers.run(PYTHON, ["rm", "-f", "/usr/bin/setsid"], detach=True)
    donor.wait(timeout=30)
    donor.commit(repository="trajkit-test/no-setsid", tag=tag)
    donor.remove(force=True)
    yield f"trajkit-test/no-setsid:{tag}"
    client.images.remove(f"trajkit-test/no-setsid:{tag}", force=True)


@pytest.mark.engine("docker")
@pytest.mark.parametrize(
    ("image_fixture", "reason"),
    [("image_without_shell", "/bin/sh"), ("image_without_setsid", "lacks setsid")],
)
def test_images_without_the_needed_tools_are_refused(
    request: pytest.FixtureRequest, image_fixture: str, reason: str
) -> None:
    image = request.getfixturevalue(image_fixture)

    async def body() -> None:
        backend = make_backend(pull="never")
        sandbox_spec = spec(image)
        try:
            with pytest.raises(ImageUnavailable, match=reason):
                await backend.create(sandbox_spec)
            assert run_labelled(sandbox_spec.run_id) == []
        finally:
            await backend.reap(sandbox_spec.run_id)
            await backend.aclose()

    asyncio.run(body())


ENGINE_WORDS = (
    "lstat /var/lib/trajkit-docker/data/overlay2/4d63fed789d600d45be65738201ecfe1b56abf950bf27eab142927400ffc72fd"
    "/merged/work/bad name.txt: invalid argument"
)


def test_engine_words_lose_the_engine_s_host_directories() -> None:
    engine = pytest.importorskip("trajkit_docker.engine")
    assert engine.without_host_paths(ENGINE_WORDS) == "lstat /work/bad name.txt: invalid argument"
    for words, expected in [
        ("open /var/lib/docker/overlay2/0123456789abcdef-init/diff/etc/x: denied", "open /etc/x: denied"),
        ("mkdir /data/docker/aufs/mnt/0123456789abcdef0123/srv: exists", "mkdir /srv: exists"),
        (f"read /var/lib/docker/containers/{'a' * 64}/hostname: busy", "read <container>/hostname: busy"),
        ("no such container: 0123456789ab", "no such container: 0123456789ab"),
    ]:
        assert engine.without_host_paths(words) == expected


@pytest.mark.engine("docker")
def test_engine_errors_about_paths_are_file_errors_naming_no_host_directory(docker_engine: None) -> None:
    """Beneath the sandbox's own path checks: the engine refusing a path is an OSError in the
    sandbox's terms, and a SandboxError keeps the engine's words without its directories."""
    import docker.errors
    from trajkit_docker.engine import translated

    from trajkit.sandbox import SandboxError

    with pytest.raises(SandboxError) as failed, translated("reading"):
        raise docker.errors.APIError("500 Server Error", explanation=ENGINE_WORDS)
    assert str(failed.value) == "docker: reading failed: lstat /work/bad name.txt: invalid argument"

    async def body() -> None:
        backend = make_backend()
        sandbox = await backend.create(spec())
        try:
            engine, container = sandbox._engine, sandbox.container_id
            for path in ("/work/bad\0name", "/work/" + "n" * 300):
                with pytest.raises(OSError) as refused:
                    await asyncio.to_thread(engine.stat_path, container, path)
                assert "overlay2" not in str(refused.value) and "/var/lib" not in str(refused.value)
            with pytest.raises(OSError) as refused:
                await asyncio.to_thread(engine.read_file, container, "/work/x\0y/" + "z" * 5000, 10)
            assert "overlay2" not in str(refused.value)
        finally:
            await sandbox.close()
            await backend.aclose()

    asyncio.run(body())


def test_settings_are_checked() -> None:
    settings = pytest.importorskip("trajkit_docker.settings")
    from pydantic import ValidationError

    DockerSettings = settings.DockerSettings
    parsed = DockerSettings.model_validate(
        {"memory": "1.5g", "cpus": "2", "pids_limit": "100", "pull": "NEVER"}
    )
    assert (parsed.memory, parsed.cpus, parsed.pids_limit) == (int(1.5 * 1024**3), 2.0, 100)
    assert (parsed.pull, parsed.network) == ("never", "none")
    typed = DockerSettings.model_validate(
        {"memory": 1610612736, "cpus": 2, "pids_limit": 100, "pull": "never"}
    )
    assert typed == parsed  # a configuration file's typed values mean what the flags' text means
    defaults = DockerSettings()
    assert (defaults.memory, defaults.pids_limit, defaults.network, defaults.pull) == (
        4 * 1024**3,
        1024,
        "none",
        "missing",
    )
    assert defaults.pull_timeout == 600 and defaults.cpus is None
    lifted = DockerSettings.model_validate({"memory": "none", "pids_limit": "None"})
    assert (lifted.memory, lifted.pids_limit) == (None, None)
    assert DockerSettings.model_validate({"memory": "512m", "network": " Host "}).memory == 512 * 1024**2
    bad_options = [
        {"network": "macvlan"},
        {"memory": "lots"},
        {"memory": "0"},
        {"pids_limit": "-1"},
        {"cpus": "0"},
        {"pull": "sometimes"},
        {"pull_timeout": "soon"},
        {"unknown": "1"},
    ]
    for bad in bad_options:
        with pytest.raises(ValidationError, match=next(iter(bad))):
            DockerSettings.model_validate(bad)
    backend = pytest.importorskip("trajkit_docker.backend")
    assert backend.DockerBackend.Settings is DockerSettings
    with pytest.raises(ValidationError, match="network"):
        backend.DockerBackend({"network": "macvlan"})


def test_abandoned_containers_are_recognised() -> None:
    backend = pytest.importorskip("trajkit_docker.backend")
    engine = pytest.importorskip("trajkit_docker.engine")
    import socket

    def summary(**labels: str) -> Any:
        return engine.ContainerSummary(id="c", labels=labels, state="running")

    host, now = socket.gethostname(), time.time()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    later, earlier = str(int(now) + 100), str(int(now) - 1)

    def abandoned(owner: str, deadline: str) -> bool:
        return bool(backend.abandoned(summary(**{"trajkit.owner": owner, "trajkit.deadline": deadline}), now))

    assert abandoned(f"{host}:{os.getpid()}", earlier)
    assert abandoned(f"{host}:{dead.pid}", later)
    assert not abandoned(f"{host}:{os.getpid()}", later)
    assert not abandoned(f"elsewhere:{dead.pid}", later)


def test_plugin_is_registered_as_an_entry_point() -> None:
    try:
        metadata.distribution("trajkit-docker")
    except metadata.PackageNotFoundError:
        pytest.skip("trajkit-docker is not installed")
    entry = {ep.name: ep for ep in metadata.entry_points(group="trajkit")}.get("docker")
    assert entry is not None and entry.value == "trajkit_docker.plugin"
    plugin = entry.load()
    assert [backend.name for backend in plugin.trajkit_sandbox_backends()] == ["docker"]
