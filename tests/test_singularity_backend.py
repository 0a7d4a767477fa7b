"""The singularity sandbox backend (package ``trajkit_singularity``) against a real Apptainer.

Needs Apptainer and the local test images: ``bash scripts/engines/apptainer.sh start`` then
``bash scripts/engines/apptainer.sh images``. Without them these tests skip, unless
``TRAJKIT_REQUIRE_ENGINES`` names apptainer, as CI sets it, in which case they fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from trajkit.sandbox import ImageUnavailable, SandboxBackend, SandboxError, SandboxSpec
from trajkit.testing.engines import exec_leaving_the_limit_full, need_engine, pids_cgroup
from trajkit.testing.sandbox_conformance import SandboxConformance, survivors

IMAGES = Path(os.environ.get("TRAJKIT_APPTAINER_IMAGES", "/var/lib/trajkit-apptainer/images"))
SIF = IMAGES / "busybox.sif"
SANDBOX_DIR = IMAGES / "busybox-sandbox"
ROOTFS_DIR = IMAGES / "busybox-rootfs"
DOCKER_ARCHIVE = IMAGES / "busybox-docker.tar"
SETUP_HINT = "run: bash scripts/engines/apptainer.sh start && bash scripts/engines/apptainer.sh images"


def _binary() -> str | None:
    return shutil.which("apptainer") or shutil.which("singularity")


def _unavailable() -> str | None:
    """Why the apptainer tests cannot run, or None when they can."""
    try:
        import trajkit_singularity  # noqa: F401
    except ImportError as exc:
        return f"cannot import {exc.name} (pip install -e trajkit_singularity)"
    if _binary() is None:
        return f"no apptainer or singularity on PATH; {SETUP_HINT}"
    missing = [str(path) for path in (SIF, SANDBOX_DIR, DOCKER_ARCHIVE) if not path.exists()]
    if missing:
        return f"test images missing ({', '.join(missing)}); {SETUP_HINT}"
    return None


UNAVAILABLE = _unavailable()


@pytest.fixture
def apptainer() -> None:
    need_engine("apptainer", UNAVAILABLE)


@pytest.fixture
def cache_dir(tmp_path: Path) -> Iterator[Path]:
    """The backend's cache for one test; the test must leave no sandbox directory in it."""
    cache = tmp_path / "cache"
    yield cache
    leaked = [path.name for path in (cache / "sandboxes").glob("trajkit-*")]
    assert leaked == [], f"sandbox directories left behind: {leaked}"


def make_backend(cache_dir: Path, **options: str) -> Any:
    from trajkit_singularity import SingularityBackend

    return SingularityBackend({"cache_dir": str(cache_dir), **options})


def spec(image: str = str(SIF), **fields: Any) -> SandboxSpec:
    return SandboxSpec(run_id=f"test-{uuid.uuid4().hex[:8]}", work_id="w0", image=image, **fields)


def running_instances() -> dict[str, int]:
    """Instance name -> pid, asked of Apptainer directly rather than through the backend."""
    binary = _binary()
    assert binary is not None
    listing = subprocess.run(
        [binary, "instance", "list", "--json"], capture_output=True, check=True, timeout=60
    )
    return {item["instance"]: item["pid"] for item in json.loads(listing.stdout)["instances"]}


def run_leftovers(cache_dir: Path, run_id: str) -> list[str]:
    from trajkit_singularity.instances import instance_prefix

    prefix = instance_prefix(run_id)
    instances = [name for name in running_instances() if name.startswith(prefix)]
    directories = [str(path) for path in (cache_dir / "sandboxes").glob(f"{prefix}*")]
    return instances + directories


class SingularityHarness:
    def __init__(self, image: str, cache_dir: Path) -> None:
        self.image: str | None = image
        self.cache_dir = cache_dir
        self.host_paths = (str(cache_dir),)

    def make_backend(self) -> SandboxBackend:
        backend: SandboxBackend = make_backend(self.cache_dir)
        return backend

    async def leftovers(self, backend: SandboxBackend, run_id: str) -> list[str]:
        return await asyncio.to_thread(run_leftovers, self.cache_dir, run_id)


@pytest.mark.engine("apptainer")
class TestSingularityConformance(SandboxConformance):
    @pytest.fixture
    def harness(self, apptainer: None, cache_dir: Path) -> SingularityHarness:
        return SingularityHarness(str(SIF), cache_dir)


@pytest.mark.engine("apptainer")
def test_sandbox_directory_image_works(apptainer: None, cache_dir: Path) -> None:
    async def body() -> None:
        backend = make_backend(cache_dir)
        assert await backend.verify_image(str(SANDBOX_DIR)) is None  # a directory has no file digest
        sandbox_spec = spec(str(SANDBOX_DIR))
        sb = await backend.create(sandbox_spec)
        try:
            await sb.write_file("note.txt", b"from the host\n")
            result = await sb.exec("cat note.txt; echo made > made.txt; echo $((6 * 7))", timeout=30)
            assert (result.exit_code, result.stdout) == (0, "from the host\n42\n")
            assert await sb.read_file("made.txt") == b"made\n"
        finally:
            await sb.close()
        assert await asyncio.to_thread(run_leftovers, cache_dir, sandbox_spec.run_id) == []
        # The image itself stays untouched: writes went to the scratch bind and the tmpfs overlay.
        assert not (SANDBOX_DIR / "work" / "made.txt").exists()

    asyncio.run(body())


@pytest.mark.engine("apptainer")
def test_verify_image_returns_the_sif_digest_and_info_reports_it(apptainer: None, cache_dir: Path) -> None:
    import hashlib

    expected = "sha256:" + hashlib.sha256(SIF.read_bytes()).hexdigest()

    async def body() -> None:
        backend = make_backend(cache_dir)
        assert await backend.verify_image(str(SIF)) == expected
        sb = await backend.create(spec())
        try:
            assert sb.info.backend == "singularity"
            assert (sb.info.image, sb.info.digest) == (str(SIF), expected)
        finally:
            await sb.close()

    asyncio.run(body())


@pytest.mark.engine("apptainer")
@pytest.mark.parametrize(
    "image, reason",
    [
        ("/nonexistent/missing.sif", "no such file"),
        (str(ROOTFS_DIR), "not an Apptainer sandbox"),
        ("docker://nonexistent/x", "docker://nonexistent/x"),
    ],
)
def test_unusable_images_fail_verify_in_bounded_time(
    apptainer: None, cache_dir: Path, image: str, reason: str
) -> None:
    async def body() -> None:
        backend = make_backend(cache_dir, build_timeout="60")
        started = time.monotonic()
        with pytest.raises(ImageUnavailable, match=reason):
            await backend.verify_image(image)
        assert time.monotonic() - started < 90
        with pytest.raises(ImageUnavailable):
            await backend.create(spec(image))

    asyncio.run(body())
    assert not any(path.name.endswith(".partial") for path in cache_dir.glob("*"))


def counting_binary(tmp_path: Path) -> tuple[Path, Path]:
    """An apptainer that logs each `build` before running the real one: counts conversions."""
    log = tmp_path / "builds.log"
    script = tmp_path / "counting-apptainer"
    script.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            [ "$1" = build ] && echo "$$" >> {log}
            exec {_binary()} "$@"
            """
        )
    )
    script.chmod(0o755)
    return script, log


@pytest.mark.engine("apptainer")
def test_concurrent_verifies_of_a_remote_reference_build_it_once(
    apptainer: None, cache_dir: Path, tmp_path: Path
) -> None:
    binary, log = counting_binary(tmp_path)
    reference = f"docker-archive://{DOCKER_ARCHIVE}"

    async def body() -> None:
        # Separate backends share nothing in memory: only the cache's file lock keeps them apart.
        backends = [make_backend(cache_dir, binary=str(binary)) for _ in range(3)]
        digests = await asyncio.gather(*(backend.verify_image(reference) for backend in backends))
        assert len(set(digests)) == 1 and digests[0].startswith("sha256:")
        assert await make_backend(cache_dir, binary=str(binary)).verify_image(reference) == digests[0]
        sb = await backends[0].create(spec(reference))
        try:
            assert (await sb.exec("echo from docker-archive", timeout=30)).stdout == "from docker-archive\n"
        finally:
            await sb.close()

    asyncio.run(body())
    assert len(log.read_text().splitlines()) == 1
    assert len(list(cache_dir.glob("*.sif"))) == 1


def test_file_lock_excludes_holders_and_gives_up_in_time(tmp_path: Path) -> None:
    from trajkit_singularity.images import file_lock

    lock = tmp_path / "locks" / "x.lock"
    inside: list[int] = []
    overlaps: list[int] = []

    async def hold(n: int) -> None:
        async with file_lock(lock, timeout=30):
            if inside:
                overlaps.append(n)
            inside.append(n)
            await asyncio.sleep(0.1)
            inside.remove(n)

    async def body() -> None:
        await asyncio.gather(*(hold(n) for n in range(4)))
        async with file_lock(lock, timeout=30):
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                async with file_lock(lock, timeout=0.5):
                    pass
            assert time.monotonic() - started < 5

    asyncio.run(body())
    assert overlaps == []


OWNER = textwrap.dedent(
    """\
    import asyncio, sys
    from trajkit.sandbox import SandboxSpec
    from trajkit_singularity import SingularityBackend

    async def main():
        backend = SingularityBackend({"cache_dir": sys.argv[1]})
        sb = await backend.create(SandboxSpec(run_id=sys.argv[2], work_id="w0", image=sys.argv[3]))
        print(sb.name, flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
    """
)


def start_owner(cache_dir: Path, run_id: str) -> tuple[subprocess.Popen[str], str]:
    """A separate process that creates a sandbox, prints its instance name and waits to be killed."""
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(cache_dir), run_id, str(SIF)], stdout=subprocess.PIPE, text=True
    )
    assert owner.stdout is not None
    name = owner.stdout.readline().strip()
    assert name, "the owner process did not create its sandbox"
    return owner, name


def watchdog_pids(name: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"trajkit-watchdog" in argv and name.encode() in argv:
                pids.append(int(entry.name))
    return pids


@pytest.mark.engine("apptainer")
def test_reap_stops_the_instances_of_a_killed_owner_only(
    apptainer: None, cache_dir: Path, tmp_path: Path
) -> None:
    run_id = f"reap-{uuid.uuid4().hex[:8]}"
    owner, orphan = start_owner(cache_dir, run_id)
    assert orphan in running_instances()
    assert watchdog_pids(orphan)
    owner.send_signal(signal.SIGKILL)
    owner.wait(timeout=30)

    async def body() -> None:
        # A backend with another scratch root does not own the orphan, whatever its name says.
        assert await make_backend(tmp_path / "other-cache").reap(run_id) == 0
        assert orphan in running_instances()
        backend = make_backend(cache_dir)
        live = await backend.create(SandboxSpec(run_id=run_id, work_id="w1", image=str(SIF)))
        try:
            assert await backend.reap() == 1
            assert orphan not in running_instances()
            assert not (cache_dir / "sandboxes" / orphan).exists()
            assert watchdog_pids(orphan) == []
            assert live.name in running_instances(), "a live owner's sandbox was reaped"
            assert (await live.exec("echo alive", timeout=30)).stdout == "alive\n"
            assert await backend.reap() == 0
            # Reaping a run removes its sandboxes whoever owns them.
            assert await backend.reap(run_id) == 1
            assert await asyncio.to_thread(run_leftovers, cache_dir, run_id) == []
        finally:
            await live.close()

    asyncio.run(body())


@pytest.mark.engine("apptainer")
def test_instance_dies_when_its_lifetime_ends(apptainer: None, cache_dir: Path) -> None:
    async def body() -> None:
        backend = make_backend(cache_dir)
        sb = await backend.create(spec(lifetime=2))
        name = sb.name
        try:
            assert name in running_instances()
            deadline = time.monotonic() + 60
            while name in running_instances() and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            assert name not in running_instances()
            with pytest.raises(SandboxError):
                await sb.exec("true", timeout=30)
        finally:
            await sb.close()

    asyncio.run(body())
    assert list((cache_dir / "sandboxes").iterdir()) == []


@pytest.mark.engine("apptainer")
@pytest.mark.parametrize("writable", ["overlay", "tmpfs"])
def test_writes_outside_the_working_directory_stay_in_the_sandbox(
    apptainer: None, cache_dir: Path, writable: str
) -> None:
    async def body() -> None:
        # As root (user=caller), which may write in /usr: where such writes land is what is tested.
        backend = make_backend(cache_dir, writable=writable, user="caller")
        first, second = await backend.create(spec()), await backend.create(spec())
        try:
            result = await first.exec(
                "dd if=/dev/zero of=/usr/big bs=1M count=80 2>/dev/null && ls /usr", timeout=60
            )
            assert result.exit_code == 0 and "big" in result.stdout.split()
            overlay_files = [path.name for path in (cache_dir / "sandboxes").rglob("big")]
            assert overlay_files == (["big"] if writable == "overlay" else [])
            assert "big" not in (await second.exec("ls /usr", timeout=30)).stdout.split()
        finally:
            await first.close()
            await second.close()

    asyncio.run(body())


@pytest.mark.engine("apptainer")
def test_network_is_loopback_only_by_default(apptainer: None, cache_dir: Path) -> None:
    async def body() -> None:
        backend = make_backend(cache_dir)
        sb = await backend.create(spec())
        try:
            result = await sb.exec("ls /sys/class/net", timeout=30)
            assert result.stdout.split() == ["lo"]
        finally:
            await sb.close()

    asyncio.run(body())


@pytest.mark.engine("apptainer")
def test_files_outside_the_working_directory_and_through_symlinks(apptainer: None, cache_dir: Path) -> None:
    async def body() -> None:
        # As root (user=caller), which may write in /opt and /etc: the paths' handling is what is tested.
        backend = make_backend(cache_dir, user="caller")
        sb = await backend.create(spec())
        try:
            await sb.write_file("/opt/deep/dir/data.bin", b"\0\1\2")
            assert await sb.read_file("/opt/deep/dir/data.bin") == b"\0\1\2"
            assert (await sb.exec("cat /opt/deep/dir/data.bin | od -An -tx1", timeout=30)).stdout.split() == [
                "00",
                "01",
                "02",
            ]
            # A symlink in the working directory resolves inside the container, never on the host.
            await sb.exec("ln -s /etc escape && ln -s /opt/deep/dir/data.bin link", timeout=30)
            assert await sb.read_file("link") == b"\0\1\2"
            assert b"root:x:0:0" in await sb.read_file("escape/passwd")
            await sb.write_file("escape/trajkit-probe", b"inside only")
            assert not Path("/etc/trajkit-probe").exists()
            assert (await sb.exec("cat /etc/trajkit-probe", timeout=30)).stdout == "inside only"
            with pytest.raises(FileNotFoundError):
                await sb.read_file("/opt/deep/missing")
            with pytest.raises(IsADirectoryError):
                await sb.read_file("/opt/deep")
            with pytest.raises(IsADirectoryError):
                await sb.read_file(".")
        finally:
            await sb.close()

    asyncio.run(body())


@pytest.mark.engine("apptainer")
def test_daemons_that_clear_their_environment_die_with_their_exec(apptainer: None, cache_dir: Path) -> None:
    async def body() -> None:
        backend = make_backend(cache_dir)
        sb = await backend.create(spec())
        try:
            concurrent = asyncio.ensure_future(sb.exec("sleep 3; echo slow done", timeout=60))
            await asyncio.sleep(1)
            result = await sb.exec("env -i setsid sleep 88881 & echo started", timeout=60)
            assert (result.stdout, result.timed_out) == ("started\n", False)
            assert await survivors(sb, "8888") == []
            assert (await concurrent).stdout == "slow done\n", "an exec's sweep killed a concurrent exec"
        finally:
            await sb.close()

    asyncio.run(body())


@pytest.mark.engine("apptainer")
def test_process_limit_reaches_the_instance(apptainer: None, cache_dir: Path) -> None:
    async def body() -> None:
        backend = make_backend(cache_dir, pids_limit="40")
        sb = await backend.create(spec())
        try:
            counted = pids_cgroup(running_instances()[sb.name]) / "pids.current"
            before = int(counted.read_text())
            bomb = await sb.exec("i=0; while [ $i -lt 80 ]; do sleep 1000 & i=$((i+1)); done", timeout=60)
            assert "Resource temporarily unavailable" in bomb.stderr, bomb
            # Its processes are reaped, not only killed, when the exec returns: zombies would still
            # count against the limit, and the next exec's own starter could not start.
            assert int(counted.read_text()) <= before
            after = await sb.exec("echo still usable", timeout=30)
            assert after.stdout == "still usable\n", after
        finally:
            await sb.close()

    asyncio.run(body())


SHELLS = [
    pytest.param(["/bin/sh"], id="host-sh"),
    pytest.param(
        [str(SANDBOX_DIR / "bin" / "busybox"), "sh"],
        id="image-busybox",
        marks=pytest.mark.engine("apptainer"),
    ),
]


def held_zombie() -> subprocess.Popen[bytes]:
    """A child that has exited and is not reaped until the caller waits for it."""
    child = subprocess.Popen(["true"])
    stat = Path(f"/proc/{child.pid}/stat")
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)
    return child


def sweep_function(shell: list[str], call: str, *args: str, env: dict[str, str] | None = None) -> str:
    """The output of ``call`` (shell text using the sweep's functions, arguments in ``$1``...) run in
    ``shell``, which must succeed with nothing on stderr."""
    from trajkit_singularity import scripts

    script = scripts.sweep() + "\n" + call + "\n"
    done = subprocess.run([*shell, "-c", script, "sweep", *args], capture_output=True, timeout=60, env=env)
    assert done.returncode == 0 and done.stderr == b"", done
    return done.stdout.decode()


WHETHER_GONE = 'reaped "$1" "$2"; if [ -e "/proc/$2" ]; then echo alive; else echo gone; fi'


@pytest.mark.parametrize("shell", SHELLS)
def test_a_sweep_waits_for_its_victims_to_be_reaped(shell: list[str]) -> None:
    if len(shell) > 1:
        need_engine("apptainer", UNAVAILABLE)
    zombie = held_zombie()
    reaper = threading.Timer(0.5, zombie.wait)
    reaper.start()
    try:
        assert sweep_function(shell, WHETHER_GONE, "20", str(zombie.pid)) == "gone\n"
    finally:
        reaper.join()


@pytest.mark.parametrize("shell", SHELLS)
def test_a_sweep_stops_waiting_at_its_deadline(shell: list[str]) -> None:
    if len(shell) > 1:
        need_engine("apptainer", UNAVAILABLE)
    zombie = held_zombie()
    started = time.monotonic()
    try:
        assert sweep_function(shell, WHETHER_GONE, "1", str(zombie.pid)) == "alive\n"
    finally:
        zombie.wait()
    assert time.monotonic() - started >= 0.9, "it returned before its deadline"


@pytest.mark.parametrize("shell", SHELLS)
def test_a_sweep_finds_the_marker_wherever_it_lies_in_an_environment(shell: list[str]) -> None:
    """Read by the shell itself, the environment is NUL-separated and its values may hold newlines."""
    if len(shell) > 1:
        need_engine("apptainer", UNAVAILABLE)
    env = {"A": "one\ntwo\n", "TRAJKIT_EXEC_ID": "f00d", "Z": "last"}
    marked = 'for m in f00d f00e; do if marked "$$" "$m"; then echo "$m yes"; else echo "$m no"; fi; done'
    assert sweep_function(shell, marked, env=env) == "f00d yes\nf00e no\n"
    assert sweep_function(shell, 'marked "$$" f00d || echo unmarked', env={"Z": "last"}) == "unmarked\n"
    assert sweep_function(shell, "marked 999999999 f00d || echo no process") == "no process\n"


@pytest.mark.engine("apptainer")
def test_an_exec_that_leaves_the_process_limit_full_is_still_swept(apptainer: None, cache_dir: Path) -> None:
    """Nothing the sweep does after a command needs a process of its own: a shell that cannot fork
    exits, and the command's processes would outlive the exec (holding its output open until the
    timeout) with its status lost."""

    async def body() -> None:
        backend = make_backend(cache_dir)
        sb = await backend.create(spec())
        try:
            cgroup = pids_cgroup(running_instances()[sb.name])
            result, before, after = await exec_leaving_the_limit_full(sb, cgroup)
            assert (result.exit_code, result.timed_out) == (7, False), result
            assert after <= before
        finally:
            await sb.close()

    asyncio.run(body())


@pytest.mark.engine("apptainer")
def test_limits_are_dropped_with_a_warning_only_where_the_engine_cannot_apply_them(
    apptainer: None, cache_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An engine without usable cgroups: default limits give way (loudly), explicit ones fail."""
    without_cgroups = tmp_path / "apptainer-without-cgroups"
    without_cgroups.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do [ "$a" = --pids-limit ] && '
        '{ echo "FATAL: while applying cgroups config: cannot use cgroups" >&2; exit 255; }; done\n'
        f'exec {_binary()} "$@"\n'
    )
    without_cgroups.chmod(0o755)

    async def body() -> None:
        backend = make_backend(cache_dir, binary=str(without_cgroups))
        sb = await backend.create(spec())
        try:
            assert (await sb.exec("echo runs", timeout=30)).stdout == "runs\n"
        finally:
            await sb.close()
        assert "cannot enforce memory and process limits" in caplog.text
        strict = make_backend(cache_dir, binary=str(without_cgroups), pids_limit="100")
        with pytest.raises(SandboxError, match="cgroups"):
            await strict.create(spec())

    asyncio.run(body())


def test_host_side_file_operations_refuse_what_is_not_a_regular_file(tmp_path: Path) -> None:
    from trajkit_singularity.files import LeavesScratch, read_beneath, write_beneath

    from trajkit.sandbox import FileTooLarge, NotARegularFile

    work = tmp_path / "work"
    work.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"host")
    os.mkfifo(work / "fifo")
    os.symlink(outside, work / "link")
    os.symlink(tmp_path, work / "dirlink")
    with open(work / "sparse", "wb") as handle:
        handle.write(b"HEAD")
        handle.truncate(1 << 40)
    with pytest.raises(NotARegularFile):
        read_beneath(work, ["fifo"], "fifo", 1024)
    with pytest.raises(NotARegularFile):
        write_beneath(work, ["fifo"], "fifo", b"x")
    for crossing in (["link"], ["dirlink", "outside.txt"]):
        with pytest.raises(LeavesScratch):
            read_beneath(work, crossing, "/".join(crossing), 1024)
        with pytest.raises(LeavesScratch):
            write_beneath(work, crossing, "/".join(crossing), b"pwned")
    assert outside.read_bytes() == b"host"
    with pytest.raises(FileTooLarge) as caught:
        read_beneath(work, ["sparse"], "sparse", 4096)
    assert (caught.value.size, caught.value.head[:4], len(caught.value.tail)) == (1 << 40, b"HEAD", 2048)
    write_beneath(work, ["new", "file.txt"], "new/file.txt", b"data")
    assert read_beneath(work, ["new", "file.txt"], "new/file.txt", 4) == b"data"
    with pytest.raises(FileTooLarge):
        read_beneath(work, ["new", "file.txt"], "new/file.txt", 3)


@pytest.mark.engine("apptainer")
def test_reads_in_the_container_are_capped_and_refuse_what_is_not_a_file(
    apptainer: None, cache_dir: Path
) -> None:
    """Paths outside the working directory are read by the container's reader program."""
    from trajkit.sandbox import FileTooLarge, NotARegularFile

    async def body() -> None:
        backend = make_backend(cache_dir)
        sb = await backend.create(spec())
        try:
            made = await sb.exec(
                "printf HEAD > /tmp/huge && dd if=/dev/zero of=/tmp/huge bs=1 count=0 seek=3G 2>/dev/null"
                " && printf TAIL >> /tmp/huge && mkfifo /tmp/fifo && echo made",
                timeout=60,
            )
            assert "made" in made.stdout, made
            with pytest.raises(FileTooLarge) as caught:
                await sb.read_file("/tmp/huge", limit=65536)
            assert caught.value.size == 3 * 1024**3 + 4
            assert caught.value.head.startswith(b"HEAD") and caught.value.tail.endswith(b"TAIL")
            assert len(caught.value.head) + len(caught.value.tail) == 65536
            for path in ("/tmp/fifo", "/dev/zero"):
                with pytest.raises(NotARegularFile):
                    await asyncio.wait_for(sb.read_file(path), 30)
            with pytest.raises(NotARegularFile):
                await asyncio.wait_for(sb.write_file("/tmp/fifo", b"x"), 30)
            await sb.exec("printf 0123456789 > /tmp/ten", timeout=30)
            assert await sb.read_file("/tmp/ten", limit=10) == b"0123456789"
            with pytest.raises(FileTooLarge) as small:
                await sb.read_file("/tmp/ten", limit=9)
            assert (small.value.size, small.value.head, small.value.tail) == (10, b"0123", b"56789")
        finally:
            await sb.close()

    asyncio.run(body())


@pytest.mark.engine("apptainer")
def test_cancelled_exec_kills_its_processes(apptainer: None, cache_dir: Path) -> None:
    async def body() -> None:
        backend = make_backend(cache_dir)
        sb = await backend.create(spec())
        try:
            task = asyncio.ensure_future(sb.exec("sleep 77771 & sleep 77772", timeout=60))
            await asyncio.sleep(1.5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await survivors(sb, "7777") == []
        finally:
            await sb.close()

    asyncio.run(body())


@pytest.mark.engine("apptainer")
def test_host_environment_does_not_reach_the_sandbox(
    apptainer: None, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("APPTAINERENV_INJECTED", "yes")

    async def body() -> None:
        backend = make_backend(cache_dir)
        sb = await backend.create(
            SandboxSpec(run_id="env-test", work_id="w0", image=str(SIF), env={"KEPT": "1"})
        )
        try:
            environment = (await sb.exec("env", timeout=30)).stdout
            assert "sk-secret" not in environment and "INJECTED" not in environment
            assert "KEPT=1" in environment.splitlines()
        finally:
            await sb.close()

    asyncio.run(body())


@pytest.mark.engine("apptainer")
def test_build_scratch_and_sandbox_directories_can_live_apart_from_the_cache(
    apptainer: None, cache_dir: Path, tmp_path: Path
) -> None:
    scratch, build_tmp = tmp_path / "scratch", tmp_path / "build-tmp"

    async def body() -> None:
        backend = make_backend(cache_dir, scratch_dir=str(scratch), tmp_dir=str(build_tmp))
        assert backend.engine.env["APPTAINER_TMPDIR"] == str(build_tmp)
        assert str(scratch) in backend.engine.env["TRAJKIT_APPTAINER_BINDS"].split(":")
        assert await backend.verify_image(f"docker-archive://{DOCKER_ARCHIVE}")  # converted through tmp_dir
        assert build_tmp.is_dir()
        sandbox_spec = spec()
        sb = await backend.create(sandbox_spec)
        try:
            await sb.write_file("note.txt", b"here")
            assert [path.read_bytes() for path in scratch.glob("trajkit-*/work/note.txt")] == [b"here"]
            assert not list((cache_dir / "sandboxes").glob("trajkit-*"))
        finally:
            await sb.close()
        assert list(scratch.glob("trajkit-*")) == []

    asyncio.run(body())


def test_owns_image_routes_apptainer_references(tmp_path: Path) -> None:
    from trajkit_singularity import SingularityBackend

    sandbox_dir = tmp_path / "sandbox"
    (sandbox_dir / ".singularity.d").mkdir(parents=True)
    plain_dir = tmp_path / "plain"
    plain_dir.mkdir()
    backend = SingularityBackend({"cache_dir": str(tmp_path / "cache")})
    owned = [
        "/images/app.sif",
        "relative/app.sif",
        "docker://python:3.12-slim",
        "oras://ghcr.io/org/image:tag",
        "library://alpine:latest",
        "shub://vsoch/hello-world",
        f"docker-archive://{tmp_path}/image.tar",
        str(sandbox_dir),
    ]
    not_owned = ["python:3.12-slim", "ubuntu", str(plain_dir), str(tmp_path / "missing-dir"), "image.tar"]
    assert [image for image in owned if not backend.owns_image(image)] == []
    assert [image for image in not_owned if backend.owns_image(image)] == []
    assert SingularityBackend.image_based and SingularityBackend.name == "singularity"


def test_settings_are_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError
    from trajkit_singularity.settings import SingularitySettings

    from trajkit_singularity import SingularityBackend

    monkeypatch.delenv("TRAJKIT_SIF_CACHE", raising=False)
    parsed = SingularitySettings.model_validate({"cache_dir": str(tmp_path)})
    assert (parsed.tmp_dir, parsed.scratch_dir, parsed.network, parsed.writable) == (
        tmp_path / "tmp",
        tmp_path / "sandboxes",
        "none",
        "overlay",
    )
    assert (parsed.memory, parsed.pids_limit, parsed.limits_required) == (4 * 1024**3, 1024, False)
    limits = SingularitySettings.model_validate({"memory": "512m", "pids_limit": "none"})
    assert (limits.memory, limits.pids_limit, limits.limits_required) == (512 * 1024**2, None, True)
    typed = SingularitySettings.model_validate(
        {"memory": 512 * 1024**2, "build_timeout": 60, "start_timeout": "30"}
    )
    assert (typed.memory, typed.build_timeout, typed.start_timeout, typed.limits_required) == (
        512 * 1024**2,
        60,
        30,
        True,
    )
    assert SingularitySettings().cache_dir == Path("~/.cache/trajkit/sif").expanduser()
    monkeypatch.setenv("TRAJKIT_SIF_CACHE", str(tmp_path / "env"))
    from_env = SingularitySettings.model_validate({})
    assert (from_env.cache_dir, from_env.tmp_dir) == (tmp_path / "env", tmp_path / "env" / "tmp")
    assert SingularitySettings.model_validate({"cache_dir": ""}).cache_dir == tmp_path / "env"
    bad_options: list[dict[str, object]] = [
        {"memory": "lots"},
        {"pids_limit": "0"},
        {"cache_dri": "/x"},
        {"build_timeout": "soon"},
        {"start_timeout": "-1"},
        {"network": "a b"},
        {"writable": "yes"},
    ]
    for bad in bad_options:
        with pytest.raises(ValidationError, match=next(iter(bad))):
            SingularitySettings.model_validate(bad)
    with pytest.raises(ValidationError, match="','") as caught:
        SingularitySettings.model_validate({"cache_dir": "/tmp/a,b"})
    assert caught.value.error_count() == 1  # the directories under it are not reported again
    with pytest.raises(ValidationError, match="writable"):
        SingularityBackend({"writable": "yes"})
    backend = SingularityBackend(SingularitySettings(cache_dir=tmp_path, memory=None))
    assert backend.settings.limits_required and backend.settings.scratch_dir == tmp_path / "sandboxes"


def test_missing_binary_is_a_clear_sandbox_error(tmp_path: Path) -> None:
    from trajkit_singularity import SingularityBackend

    backend = SingularityBackend({"cache_dir": str(tmp_path), "binary": "no-such-apptainer"})
    with pytest.raises(SandboxError, match=r"singularity\.binary"):
        asyncio.run(backend.verify_image(f"docker-archive://{DOCKER_ARCHIVE}"))


def test_plugin_is_registered_as_an_entry_point() -> None:
    try:
        metadata.distribution("trajkit-singularity")
    except metadata.PackageNotFoundError:
        pytest.skip("trajkit-singularity is not installed")
    entry = {ep.name: ep for ep in metadata.entry_points(group="trajkit")}.get("singularity")
    assert entry is not None and entry.value == "trajkit_singularity.plugin"
    plugin = entry.load()
    assert [backend.name for backend in plugin.trajkit_sandbox_backends()] == ["singularity"]
