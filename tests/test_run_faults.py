"""A run survives its environment: a disk that fills, two invocations at once, a damaged ledger,
damaged derived files. Real files, real processes, the real CLI."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import read_jsonl, trajkit, write_jsonl
from tests.test_resume import assert_exactly_once, run_args, sessions_started
from trajkit.manager import load_plugins
from trajkit.run.ledger import read_jsonl as ledger_lines
from trajkit.run.ledger import scan
from trajkit.run.rundir import RunDir
from trajkit.run.runner import EXIT_IO, EXIT_LOCKED
from trajkit.run.view import run_status
from trajkit.testing.engines import need_engine
from trajkit.testing.openai_server import OpenAITestServer
from trajkit.testing.policies import dialect_policy


def prompts(count: int) -> list[dict[str, Any]]:
    return [{"prompt": f"Task number {i}: describe the files"} for i in range(count)]


def scripted(dataset: Path, out: Path, *extra: str) -> list[str]:
    return [
        "run",
        "--dataset_file",
        str(dataset),
        "--run_name",
        "r",
        "--output_dir",
        str(out),
        "--quiet",
        *extra,
    ]


def start(args: list[str]) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    return subprocess.Popen(
        [sys.executable, "-m", "trajkit", *args], env=env, stderr=subprocess.PIPE, text=True
    )


# -- a disk that fills mid-run ----------------------------------------------------------------------


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        reason = None if mounted.returncode == 0 else f"cannot mount a tmpfs: {mounted.stderr.strip()}"
    except FileNotFoundError:
        reason = "no mount command"
    need_engine("tmpfs", reason)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_disk_that_fills_mid_run_loses_nothing_paid_for(tmp_path: Path) -> None:
    dataset = prompts(24)
    path = write_jsonl(tmp_path / "p.jsonl", dataset)
    with (
        small_tmpfs(tmp_path / "disk", "256k") as disk,
        OpenAITestServer(dialect_policy, latency=0.02) as server,
    ):
        filler = disk / "filler"
        filler.write_bytes(b"\0" * (256 - 48) * 1024)  # room for the first records, not for all
        process = start(run_args(path, disk, server))
        assert process.stderr is not None
        said = []
        for line in process.stderr:
            said.append(line)
            if "free space to keep them" in line:
                filler.unlink()  # space comes back while the run still holds its finished records
                break
        said += process.stderr.readlines()
        process.wait(timeout=120)
        stderr = "".join(said)
        assert process.returncode == EXIT_IO, stderr
        assert "No space left on device" in stderr and "batch_" in stderr
        assert "every finished line held in memory is written now" in stderr
        assert "--resume" in stderr
        run_dir = disk / "r"
        index = scan(RunDir(run_dir))
        assert not index.bad, index.bad  # no fragment, no line run onto another
        kept_first = {
            r["conversations"][1]["value"] for p in run_dir.glob("batch_*.jsonl") for r in ledger_lines(p)
        }
        assert 0 < len(kept_first) < len(dataset)
        # every session the first invocation paid for reached the ledger, the held ones included
        assert set(sessions_started(server)) == kept_first
        # the run says where it stands, from its ledger: no merge was made on the full disk
        status = trajkit("status", str(run_dir)).stdout
        assert f"done               {len(kept_first)}\n" in status, status
        assert f"pending            {len(dataset) - len(kept_first)}\n" in status, status
        server.reset()

        resumed = trajkit(*run_args(path, disk, server, "--resume"))
        assert resumed.returncode == 0, resumed.stderr
        assert_exactly_once(run_dir, dataset)
        assert not set(sessions_started(server)) & kept_first  # nothing finished ran again
        stats = json.loads((run_dir / "statistics.json").read_text())
        assert stats["invocations"] == 2 and stats["bad_ledger_lines"] == 0


def test_a_merge_on_a_full_disk_names_the_output_and_its_cause(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", prompts(6))
    with small_tmpfs(tmp_path / "disk", "512k") as disk:
        assert trajkit(*scripted(path, disk)).returncode == 0
        (disk / "r" / "trajectories.jsonl").unlink()
        free = shutil.disk_usage(disk).free
        (disk / "filler").write_bytes(b"\0" * free)  # not a byte left for the merge's output
        result = trajkit(*scripted(path, disk, "--resume"))
        assert result.returncode == EXIT_IO, result.stderr
        assert "No space left on device" in result.stderr and "Traceback" not in result.stderr
        assert f"error: {disk / 'r'}/" in result.stderr and "--resume" in result.stderr
        (disk / "filler").unlink()
        again = trajkit(*scripted(path, disk, "--resume"))
        assert again.returncode == 0, again.stderr
        assert len(read_jsonl(disk / "r" / "trajectories.jsonl")) == 6
        assert not [p.name for p in (disk / "r").iterdir() if p.name.startswith(".")]


# -- two invocations at once -------------------------------------------------------------------------


def test_two_invocations_of_one_run_exactly_one_runs(tmp_path: Path) -> None:
    dataset = prompts(10)
    path = write_jsonl(tmp_path / "p.jsonl", dataset)
    run_dir = tmp_path / "r"
    delay = [0.0]
    with OpenAITestServer(dialect_policy, latency=lambda _body: delay[0]) as server:
        first = trajkit(*run_args(path, tmp_path, server, "--max_samples", "2"))
        assert first.returncode == 0, first.stderr
        delay[0] = 2.0  # the winner still runs when the other invocation starts, however late
        more = ["--resume", "--max_samples", "10", "--allow_change", "max_samples"]
        both = [start(run_args(path, tmp_path, server, *more)) for _ in range(2)]
        deadline = time.monotonic() + 30
        while RunDir(run_dir).holder() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        holder = RunDir(run_dir).holder()
        assert holder is not None and holder.pid in {p.pid for p in both}
        # a locked run can still be read
        status = run_status(RunDir(run_dir), load_plugins())
        assert status["running"] == str(holder) and status["finished_records"] >= 2
        assert trajkit("stats", str(run_dir)).returncode == 0
        results = {p.pid: (p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in both}
    codes = sorted(code for code, _ in results.values())
    assert codes == [0, EXIT_LOCKED], results
    loser = next(err for code, err in results.values() if code == EXIT_LOCKED)
    assert f"in use by another trajkit invocation (pid {holder.pid} on host" in loser
    assert_exactly_once(run_dir, dataset)
    manifest = json.loads((run_dir / "run.json").read_text())
    assert len(manifest["invocations"]) == 2  # the refused invocation wrote nothing
    assert RunDir(run_dir).holder() is None


def test_a_killed_invocation_leaves_no_stale_lock(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", prompts(8))
    run_dir = tmp_path / "r"
    delay = [0.5]
    with OpenAITestServer(dialect_policy, latency=lambda _body: delay[0]) as server:
        process = start(run_args(path, tmp_path, server))
        deadline = time.monotonic() + 30
        while RunDir(run_dir).holder() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert RunDir(run_dir).holder() is not None
        process.kill()
        process.wait()
        assert RunDir(run_dir).holder() is None
        delay[0] = 0.0
        resumed = trajkit(*run_args(path, tmp_path, server, "--resume"))
    assert resumed.returncode == 0, resumed.stderr


# -- a damaged ledger ---------------------------------------------------------------------------------


def test_bad_ledger_lines_are_reported_and_their_prompts_run_again(tmp_path: Path) -> None:
    dataset = prompts(9)
    path = write_jsonl(tmp_path / "p.jsonl", dataset)
    assert trajkit(*scripted(path, tmp_path, "--batch_size", "3")).returncode == 0
    run_dir = tmp_path / "r"
    first, second, third = (run_dir / f"batch_{n}.jsonl" for n in range(3))
    a, b, c = first.read_bytes().splitlines(keepends=True)
    first.write_bytes(a + b[:80] + c)  # a write cut short, the next record appended onto it
    data = bytearray(second.read_bytes())
    boundary = data.index(b"\n") + 1
    data[boundary - 40 : boundary + 40] = bytes(80)  # a zeroed block across a record boundary
    second.write_bytes(bytes(data))
    with third.open("ab") as handle:
        handle.write(b"\xde\xad garbage\n")

    status = trajkit("status", str(run_dir))
    assert status.returncode == 0, status.stderr
    assert f"{first}:2: two records on one line" in status.stdout
    assert f"{second}:1: NUL bytes" in status.stdout
    assert f"{third}:4: not valid JSON" in status.stdout
    assert "finished_records   6" in status.stdout

    resumed = trajkit(*scripted(path, tmp_path, "--resume", "--batch_size", "3"))
    assert resumed.returncode == 0, resumed.stderr
    assert "ledger line skipped, its prompt runs again" in resumed.stderr
    records = read_jsonl(run_dir / "trajectories.jsonl")
    assert [r["conversations"][1]["value"] for r in records] == [d["prompt"] for d in dataset]
    assert len({r["work_id"] for r in records}) == len(dataset)
    assert json.loads((run_dir / "statistics.json").read_text())["bad_ledger_lines"] == 3


# -- damaged derived files ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    [
        {"statistics.json": "{not json", "run.json": "[1, 2]", "checkpoint.json": "\0\0\0"},
        {"statistics.json": None, "run.json": '{"invocations": 3}', "checkpoint.json": None},
    ],
    ids=["garbled", "missing-or-misshapen"],
)
def test_damaged_derived_files_are_rebuilt_from_the_ledger(tmp_path: Path, damage: dict[str, Any]) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", prompts(3))
    assert trajkit(*scripted(path, tmp_path)).returncode == 0
    run_dir = tmp_path / "r"
    for name, content in damage.items():
        if content is None:
            (run_dir / name).unlink()
        else:
            (run_dir / name).write_text(content)

    status = trajkit("status", str(run_dir))
    assert status.returncode == 0, status.stderr
    assert "finished_records   3" in status.stdout
    if damage["statistics.json"] is not None:
        assert "statistics.json is damaged" in status.stderr

    resumed = trajkit(*scripted(path, tmp_path, "--resume"))
    assert resumed.returncode == 0, resumed.stderr
    assert "run.json is damaged" in resumed.stderr and (run_dir / "run.json.damaged").exists()
    stats = json.loads((run_dir / "statistics.json").read_text())
    assert (stats["done"], stats["pending"], stats["kept"]) == (3, 0, 3)
    assert json.loads((run_dir / "checkpoint.json").read_text())["done"] == 3
    assert json.loads((run_dir / "run.json").read_text())["config"]["run_name"] == "r"
    assert trajkit("stats", str(run_dir)).returncode == 0


def test_an_unwritable_run_directory_is_an_io_error_naming_the_path(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", prompts(1))
    blocker = tmp_path / "out"
    blocker.write_text("a file where the output directory should be")
    result = trajkit(*scripted(path, blocker))
    assert result.returncode == EXIT_IO, result.stderr
    assert f"error: {blocker / 'r'}:" in result.stderr and "Traceback" not in result.stderr


def test_the_lock_file_survives_overwrite_and_is_not_a_merge_temporary(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", prompts(2))
    assert trajkit(*scripted(path, tmp_path)).returncode == 0
    assert trajkit(*scripted(path, tmp_path, "--overwrite")).returncode == 0
    run_dir = tmp_path / "r"
    assert (run_dir / "run.lock").exists()
    assert len(json.loads((run_dir / "run.json").read_text())["invocations"]) == 1
    shutil.rmtree(run_dir)
