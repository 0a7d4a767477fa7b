"""Who runs what in an Apptainer sandbox when trajkit runs as root (as CI runs): commands as user
65534, entered through the image's own setpriv or su with nothing left of root, a seccomp filter,
/proc/sys read-only; files written for the sandbox belong to that user; an image that cannot drop
root is refused unless ``singularity.user=caller`` says to accept it, which the run says once.

The hostile cases themselves (mount, unshare, /proc/sys, ...) are in the conformance suite, which
``tests/test_singularity_backend.py`` runs on this backend.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.test_singularity_backend import SANDBOX_DIR, apptainer, cache_dir, make_backend, spec
from trajkit.sandbox import ImageUnavailable

STATUS = "id -u; id -g; grep -E '^(CapInh|CapPrm|CapEff|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status | tr -s '\\t' ' '"
UNPRIVILEGED = [
    "65534", "65534", "CapInh: 0000000000000000", "CapPrm: 0000000000000000",
    "CapEff: 0000000000000000", "CapAmb: 0000000000000000", "NoNewPrivs: 1", "Seccomp: 2",
]  # fmt: skip

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="what happens when trajkit runs as root")
__all__ = ["apptainer", "cache_dir"]  # the fixtures of the backend's own tests


@pytest.mark.engine("apptainer")
def test_commands_and_files_belong_to_an_unprivileged_user(apptainer: None, cache_dir: Path) -> None:
    async def body() -> None:
        backend = make_backend(cache_dir)
        sb = await backend.create(spec())
        try:
            who = await sb.exec(f"{STATUS}; echo $HOME; stat -c %u:%g /proc/1 .", timeout=30)
            assert who.stdout.splitlines() == [*UNPRIVILEGED, "/tmp", "0:0", "65534:65534"]
            await sb.write_file("made/by/the/tool.txt", b"x")
            on_host = sb.directory / "work" / "made" / "by" / "the"
            assert (on_host.stat().st_uid, (on_host / "tool.txt").stat().st_gid) == (65534, 65534)
            edited = await sb.exec("echo more >> made/by/the/tool.txt && rm -r made && echo done", timeout=30)
            assert edited.stdout == "done\n", edited
            await sb.write_file("/tmp/outside.txt", b"y")
            assert (await sb.exec("stat -c %u /tmp/outside.txt", timeout=30)).stdout == "65534\n"
            with pytest.raises(OSError):
                await sb.write_file("/etc/passwd", b"root::0:0::/:/bin/sh\n")
            assert b"root:x:0:0" in await sb.read_file("/etc/passwd")
        finally:
            await sb.close()

    asyncio.run(body())


@pytest.fixture
def image_without_a_switch(tmp_path: Path) -> Path:
    """The BusyBox sandbox directory less its su and setpriv: no way to become another user."""
    image = tmp_path / "no-switch"
    shutil.copytree(SANDBOX_DIR, image, symlinks=True)
    for found in [*image.rglob("su"), *image.rglob("setpriv")]:
        found.unlink()
    return image


@pytest.mark.engine("apptainer")
def test_an_image_that_cannot_drop_root_is_refused_unless_the_caller_accepts_it(
    apptainer: None, cache_dir: Path, image_without_a_switch: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def refused() -> None:
        backend = make_backend(cache_dir)
        with pytest.raises(ImageUnavailable, match=r"singularity\.user=caller"):
            await backend.verify_image(str(image_without_a_switch))

    async def accepted() -> list[str]:
        backend = make_backend(cache_dir, user="caller")
        outputs = []
        for _ in range(2):
            sb = await backend.create(spec(str(image_without_a_switch)))
            try:
                outputs.append((await sb.exec(STATUS, timeout=30)).stdout)
            finally:
                await sb.close()
        return outputs

    asyncio.run(refused())
    with caplog.at_level(logging.WARNING):
        first, second = asyncio.run(accepted())
    assert first == second and first.splitlines()[:2] == ["0", "0"]
    assert "CapEff: 0000000000000000" in first and "NoNewPrivs: 1" in first
    said = [r.getMessage() for r in caplog.records if "singularity.user=caller" in r.getMessage()]
    assert len(said) == 1 and "run as root" in said[0]


def run_enter(*argv: str) -> subprocess.CompletedProcess[str]:
    from trajkit_singularity import scripts

    return subprocess.run(
        ["/bin/sh", "-c", scripts.text("enter"), "enter", *argv], capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize(
    ("tool", "kind", "name", "drop"),
    [("setpriv", "setpriv", "-", "-"), ("su", "su", "nobody", "setpriv"), ("su", "su", "nobody", "-")],
)
def test_the_enter_program_leaves_nothing_of_root(tool: str, kind: str, name: str, drop: str) -> None:
    """Through util-linux's setpriv and su (this machine's), as the images that have them do."""
    paths = {"setpriv": shutil.which("setpriv"), "su": shutil.which("su")}
    if paths[tool] is None or (drop != "-" and paths[drop] is None):
        pytest.skip(f"{tool} is not installed here")
    status = STATUS.replace("|Seccomp", "")
    result = run_enter(
        paths[tool] or "", kind, "65534", "65534", name, paths.get(drop) or "-",
        "/bin/sh", "-c", f'{status}; printf "[%s]" "$0" "$@"', "-x", "--", "'quoted arg'",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["65534", "65534"]
    assert {line for line in lines[2:-1]} >= {"CapEff: 0000000000000000", "CapPrm: 0000000000000000"}
    if drop != "-" or kind == "setpriv":
        assert "CapInh: 0000000000000000" in lines
    assert lines[-1] == "[-x][--]['quoted arg']"


def test_the_seccomp_profile_denies_new_namespaces() -> None:
    from trajkit_singularity import scripts

    profile: dict[str, Any] = json.loads(scripts.seccomp_profile())
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    denied = {name for rule in profile["syscalls"] if "args" not in rule for name in rule["names"]}
    assert {"unshare", "setns"} <= denied
    [clone] = [rule for rule in profile["syscalls"] if rule["names"] == ["clone"]]
    assert clone["args"][0]["value"] == clone["args"][0]["valueTwo"] == 0x10000000


@pytest.mark.engine("apptainer")
def test_apptainer_s_errors_name_none_of_the_runner_s_directories(
    apptainer: None, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An instance that cannot start (its overlay directory gone): Apptainer names the host path
    of the sandbox's directory, which must not reach failures.jsonl or the logs."""
    from trajkit.sandbox import SandboxError
    from trajkit_singularity import backend as singularity_backend

    prepare = singularity_backend._prepare_directory

    def without_overlay(directory: Path, *args: Any) -> None:
        prepare(directory, *args)
        shutil.rmtree(directory / "overlay")

    monkeypatch.setattr(singularity_backend, "_prepare_directory", without_overlay)

    async def body() -> str:
        backend = make_backend(cache_dir)
        with pytest.raises(SandboxError) as failed:
            await backend.create(spec())
        return str(failed.value)

    message = asyncio.run(body())
    assert "<sandboxes>/trajkit-" in message and "overlay" in message
    assert str(cache_dir) not in message
