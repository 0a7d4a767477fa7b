"""Who runs what in a Docker sandbox: no capability, no-new-privileges, a non-root user by default
(the image's own when it names one), the working directory and what the image put there handed to
that user, and ``docker.user`` to choose otherwise. Against a real engine, as root (as CI runs).

The hostile cases themselves (mount, unshare, /proc/sys, ...) are in the conformance suite, which
``tests/test_docker_backend.py`` runs on this backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import tracemalloc
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.test_docker_backend import BUSYBOX, make_backend, spec
from trajkit.testing.engines import need_engine

IDS = "id -u; id -g; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status | tr -s '\\t' ' '"


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    from tests.test_docker_backend import UNAVAILABLE

    need_engine("docker", UNAVAILABLE)
    import docker

    sdk = docker.from_env()
    yield sdk
    sdk.close()


def commit(client: Any, script: str, changes: list[str] | None = None) -> str:
    """A local image: busybox after ``script`` ran in it as root, with Dockerfile ``changes``."""
    tag = uuid.uuid4().hex[:8]
    donor = client.containers.run(BUSYBOX, ["/bin/sh", "-c", script], detach=True)
    try:
        assert donor.wait(timeout=60)["StatusCode"] == 0, donor.logs()
        donor.commit(repository="trajkit-test/privilege", tag=tag, changes=changes or [])
    finally:
        donor.remove(force=True)
    return f"trajkit-test/privilege:{tag}"


@pytest.fixture(scope="module")
def project_image(client: Any) -> Iterator[str]:
    """An image that ships a project (root's files, one of 24 MiB) in /srv/app and names no user."""
    image = commit(
        client,
        "mkdir -p /srv/app/src && echo original > /srv/app/src/main.txt && chmod 644 /srv/app/src/main.txt"
        " && dd if=/dev/zero of=/srv/app/data.bin bs=1048576 count=24 2>/dev/null",
    )
    yield image
    client.images.remove(image, force=True)


@pytest.fixture(scope="module")
def user_image(client: Any) -> Iterator[str]:
    """An image whose USER is an ordinary user of its own (4242)."""
    image = commit(
        client,
        "echo 'app:x:4242:4242:app:/home/app:/bin/sh' >> /etc/passwd && echo 'app:x:4242:' >> /etc/group"
        " && mkdir -p /home/app && chown 4242:4242 /home/app",
        ["USER app"],
    )
    yield image
    client.images.remove(image, force=True)


def in_sandbox(image: str, commands: list[str], cwd: str | None = None, **options: str) -> list[str]:
    """The output of each command, run one after another in one fresh sandbox of ``image``."""

    async def body() -> list[str]:
        backend = make_backend(pull="never", **options)
        sandbox = await backend.create(spec(image, cwd=cwd))
        try:
            return [(await sandbox.exec(c, timeout=60)).stdout for c in commands]
        finally:
            await sandbox.close()
            await backend.aclose()

    return asyncio.run(body())


@pytest.mark.engine("docker")
def test_containers_drop_every_capability_and_run_pid_1_as_a_user_of_its_own(client: Any) -> None:
    async def body() -> None:
        backend = make_backend(pull="never")
        sandbox = await backend.create(spec())
        try:
            attrs = client.api.inspect_container(sandbox.container_id)
            assert attrs["HostConfig"]["CapDrop"] == ["ALL"]
            assert "no-new-privileges" in attrs["HostConfig"]["SecurityOpt"]
            assert attrs["Config"]["User"] == "65534:65534"
            who = await sandbox.exec(f"{IDS}; stat -c '%u:%g' /proc/1; echo $HOME", timeout=30)
            assert who.stdout.splitlines() == [
                "1000", "1000", "CapEff: 0000000000000000", "NoNewPrivs: 1", "65534:65534", "/tmp",
            ]  # fmt: skip
            assert (await sandbox.exec("kill -9 1", timeout=30)).exit_code != 0
        finally:
            await sandbox.close()
            await backend.aclose()

    asyncio.run(body())


@pytest.mark.engine("docker")
def test_the_working_directory_and_the_image_s_project_are_handed_to_the_user(
    project_image: str,
) -> None:
    limit = 8 * 1024 * 1024

    async def body() -> None:
        backend = make_backend(pull="never")
        tracemalloc.start()
        try:
            sandbox = await backend.create(spec(project_image, cwd="/srv/app"))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        try:
            assert peak < limit, f"handing 24 MiB over held {peak} bytes"
            edited = await sandbox.exec(
                "echo edited >> src/main.txt && cat src/main.txt && mkdir new && rm data.bin"
                " && stat -c '%u %n' . src src/main.txt new && ls",
                timeout=60,
            )
            assert edited.exit_code == 0, edited
            assert edited.stdout.splitlines() == [
                "original", "edited", "1000 .", "1000 src", "1000 src/main.txt", "1000 new", "new", "src",
            ]  # fmt: skip
            await sandbox.write_file("deep/made/by/tool.txt", b"x")
            owned = await sandbox.exec(
                "stat -c '%u:%g' deep/made deep/made/by/tool.txt; rm -r deep", timeout=30
            )
            assert owned.stdout.split() == ["1000:1000", "1000:1000"] and owned.exit_code == 0
            elsewhere = await sandbox.exec(
                "touch /etc/x || echo refused; ls -ld /srv | cut -c1-10", timeout=30
            )
            assert elsewhere.stdout.split()[-2:] == ["refused", "drwxr-xr-x"]
            # The file tools write as the sandbox's user too: nothing it could not write itself.
            for system_file in ("/etc/passwd", "/bin/sh", "/etc/new-file"):
                with pytest.raises(PermissionError):
                    await sandbox.write_file(system_file, b"pwned")
            assert b"root:x:0:0" in await sandbox.read_file("/etc/passwd")
        finally:
            await sandbox.close()
            await backend.aclose()

    asyncio.run(body())


@pytest.mark.engine("docker")
def test_a_project_is_handed_over_once_per_image_then_sandboxes_start_from_a_prepared_image(
    client: Any, project_image: str
) -> None:
    async def body() -> list[str]:
        backend = make_backend(pull="never")
        images, prepared = [], []
        try:
            for _ in range(3):
                sandbox = await backend.create(spec(project_image, cwd="/srv/app"))
                try:
                    images.append(client.api.inspect_container(sandbox.container_id)["Image"])
                    edited = await sandbox.exec(
                        "echo mine >> src/main.txt && stat -c %u src/main.txt", timeout=30
                    )
                    assert edited.stdout == "1000\n", edited
                finally:
                    await sandbox.close()
            prepared = [image for image, _ in backend._engine.list_images("trajkit.prepared")]
        finally:
            await backend.aclose()
        return images + prepared

    first, second, third, *prepared = asyncio.run(body())
    original = client.api.inspect_image(project_image)["Id"]
    assert first == original and second == third != original
    assert second in prepared
    labels = {image: labels for image, labels in client.api.images(filters={"label": "trajkit.prepared"})}
    assert second not in labels, "the prepared image outlived its backend"


@pytest.mark.engine("docker")
def test_the_reaper_removes_prepared_images_of_dead_owners(client: Any) -> None:
    import socket
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    donor = client.containers.run(BUSYBOX, ["true"], detach=True)
    donor.wait(timeout=30)
    labels = {"trajkit": "1", "trajkit.prepared": "1"}
    orphan = donor.commit(
        repository="trajkit-prepared", tag=uuid.uuid4().hex[:12],
        changes=[f'LABEL {k}="{v}"' for k, v in {**labels, "trajkit.owner": f"{socket.gethostname()}:{dead.pid}"}.items()],
    ).id  # fmt: skip
    alive = donor.commit(
        repository="trajkit-prepared", tag=uuid.uuid4().hex[:12],
        changes=[f'LABEL {k}="{v}"' for k, v in {**labels, "trajkit.owner": f"elsewhere:{dead.pid}"}.items()],
    ).id  # fmt: skip
    donor.remove(force=True)
    try:

        async def body() -> None:
            backend = make_backend()
            await backend.reap()
            await backend.aclose()

        asyncio.run(body())
        remaining = {image.id for image in client.images.list(filters={"label": "trajkit.prepared"})}
        assert orphan not in remaining and alive in remaining
    finally:
        for image in (orphan, alive):
            with contextlib.suppress(Exception):
                client.images.remove(image, force=True)


@pytest.mark.engine("docker")
def test_working_directories_the_image_leaves_empty_are_handed_over_in_fewer_requests() -> None:
    """After the first sandbox of an image shows a working directory empty, later ones hand it over
    with one directory entry (at the root, in the request that makes the state directory)."""

    async def body() -> list[str]:
        backend = make_backend(pull="never")
        seen = []
        try:
            for cwd in ("/srv/new", "/srv/new", "/srv/new", "/top", "/top", "/top"):
                sandbox = await backend.create(spec(cwd=cwd))
                try:
                    result = await sandbox.exec("stat -c '%u:%g %a' . && touch made && ls", timeout=30)
                    seen.append(result.stdout)
                finally:
                    await sandbox.close()
            assert set(backend.workdirs()._empty.values()) == {0o755}
        finally:
            await backend.aclose()
        return seen

    assert asyncio.run(body()) == ["1000:1000 755\nmade\n"] * 6


@pytest.mark.engine("docker")
def test_an_image_s_own_user_runs_the_commands(user_image: str) -> None:
    [who] = in_sandbox(user_image, [f"{IDS}; echo $HOME; touch $HOME/ok && stat -c %u ."])
    assert who.splitlines() == [
        "4242",
        "4242",
        "CapEff: 0000000000000000",
        "NoNewPrivs: 1",
        "/home/app",
        "4242",
    ]


@pytest.mark.engine("docker")
def test_docker_user_image_is_the_visible_opt_out_and_still_keeps_no_capability(client: Any) -> None:
    root, named = in_sandbox(BUSYBOX, [IDS, "stat -c %u /proc/1"], user="image")
    assert root.splitlines() == ["0", "0", "CapEff: 0000000000000000", "NoNewPrivs: 1"]
    assert named.strip() == "0"
    [chosen] = in_sandbox(BUSYBOX, [f"{IDS}; stat -c %u ."], user="2000:3000")
    assert chosen.splitlines() == ["2000", "3000", "CapEff: 0000000000000000", "NoNewPrivs: 1", "2000"]


def test_the_user_setting_is_checked() -> None:
    settings = pytest.importorskip("trajkit_docker.settings")
    from pydantic import ValidationError

    check = settings.DockerSettings.model_validate
    assert check({}).user == "auto"
    for value, parsed in [
        ("IMAGE", "image"),
        (" auto ", "auto"),
        ("1000", "1000"),
        ("app:staff", "app:staff"),
    ]:
        assert check({"user": value}).user == parsed
    for bad in ("", "a b", "1000:", ":1000", "x;rm"):
        with pytest.raises(ValidationError, match="user"):
            check({"user": bad})


def test_who_runs_the_commands_by_setting_and_image() -> None:
    users = pytest.importorskip("trajkit_docker.users")
    assert users.commands_user("auto", "") == "1000:1000"
    assert users.commands_user("auto", "root") == "1000:1000"
    assert users.commands_user("auto", "0:0") == "1000:1000"
    assert users.commands_user("auto", "app") == "app"
    assert users.commands_user("image", "app") is None
    assert users.commands_user("5:6", "app") == "5:6"
    assert users.keeper_user("auto") == "65534:65534" and users.keeper_user("image") is None
