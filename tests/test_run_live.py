"""``trajkit status``, ``stats``, ``report`` and ``export`` read the ledger as it is now: during a
run's first invocation, after ``kill -9`` before any merge, and with damaged ledger lines (counted
as such, never as done). They change nothing in the run directory.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import read_jsonl, trajkit, write_jsonl
from tests.test_resume import run_args
from trajkit.run.ledger import scan
from trajkit.run.rundir import RunDir
from trajkit.testing.openai_server import OpenAITestServer
from trajkit.testing.policies import dialect_policy


def figures(status: str) -> dict[str, str]:
    """``trajkit status`` output as key -> value."""
    return dict(re.findall(r"^(\w+) +(.*)$", status, re.M))


def valid_records(run_dir: Path) -> int:
    return len(scan(RunDir(run_dir)).records)


def started(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    with log.open("wb") as err:
        return subprocess.Popen([sys.executable, "-m", "trajkit", *args], env=env, stderr=err)


def test_status_stats_report_and_export_read_a_run_going_on_and_one_killed_before_its_merge(
    tmp_path: Path,
) -> None:
    rows = 40
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"Task {i}: list the files"} for i in range(rows)])
    run_dir = tmp_path / "r"
    with OpenAITestServer(dialect_policy, latency=0.3) as server:
        process = started(run_args(path, tmp_path, server, "--num_workers", "2"), tmp_path / "run.err")
        try:
            deadline = time.monotonic() + 60
            while valid_records(run_dir) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            server.latency = 600  # the run goes on but finishes no more (however loaded the machine)
            before = valid_records(run_dir)
            status = trajkit("status", str(run_dir))
            after = valid_records(run_dir)
            assert status.returncode == 0, status.stderr
            shown = figures(status.stdout)
            assert shown["running"].startswith(f"pid {process.pid} ")
            assert before <= int(shown["done"]) <= after < rows, status.stdout
            assert int(shown["pending"]) == rows - int(shown["done"])
            assert int(shown["kept"]) + int(shown["rejected"]) == int(shown["done"])
            assert not (run_dir / "statistics.json").exists()  # no merge yet: the ledger alone

            stats = trajkit("stats", str(run_dir))
            assert stats.returncode == 0, stats.stderr
            assert re.search(r"\| done +\| +\d+ \|", stats.stdout), stats.stdout
            exported = trajkit(
                "export", str(run_dir), "--format", "openai", "--out", str(tmp_path / "live.jsonl")
            )
            assert exported.returncode == 0, exported.stderr
            assert len(read_jsonl(tmp_path / "live.jsonl")) >= before
            page = trajkit("report", str(run_dir), "--out", str(tmp_path / "live.html"))
            assert page.returncode == 0, page.stderr
        finally:  # killed before the run could merge
            process.send_signal(signal.SIGKILL)
            process.wait()

    done = valid_records(run_dir)
    assert 0 < done < rows
    assert not (run_dir / "statistics.json").exists()  # killed before its first merge
    shown = figures(trajkit("status", str(run_dir)).stdout)
    assert (shown["running"], shown["done"], shown["pending"]) == ("no", str(done), str(rows - done))
    assert shown["dataset_rows"] == str(rows)
    stats = trajkit("stats", str(run_dir))
    assert stats.returncode == 0 and re.search(rf"\| done +\| +{done} \|", stats.stdout), stats.stdout
    exported = trajkit("export", str(run_dir), "--format", "openai", "--out", str(tmp_path / "killed.jsonl"))
    assert exported.returncode == 0, exported.stderr
    kept = int(shown["kept"])
    assert len(read_jsonl(tmp_path / "killed.jsonl")) == kept
    assert not (run_dir / "trajectories.jsonl").exists()  # the readers wrote nothing in the run


def damage_in_place(path: Path, line_numbers: list[int]) -> None:
    """NULs over the middle of some lines, the file's size unchanged (as a torn block leaves it)."""
    lines = path.read_bytes().splitlines(keepends=True)
    for number in line_numbers:
        line = lines[number]
        lines[number] = line[:10] + b"\0" * (len(line) - 20) + line[-10:]
    path.write_bytes(b"".join(lines))


def test_damaged_ledger_lines_are_counted_as_damaged_never_as_done(tmp_path: Path) -> None:
    rows = 20
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"Task {i}"} for i in range(rows)])
    run_dir = tmp_path / "r"
    args = ["run", "--dataset_file", str(path), "--run_name", "r", "--output_dir", str(tmp_path), "--quiet"]
    assert trajkit(*args).returncode == 0
    merged = json.loads((run_dir / "statistics.json").read_text())
    assert (merged["done"], merged["pending"]) == (rows, 0)

    damage_in_place(run_dir / "batch_0.jsonl", [3, 7])  # statistics.json still says 20 done
    shown = figures(trajkit("status", str(run_dir)).stdout)
    assert (shown["done"], shown["pending"], shown["bad_ledger_lines"]) == ("18", "2", "2")
    status = trajkit("status", str(run_dir)).stdout
    assert status.count("bad ledger line: ") == 2 and "batch_0.jsonl:4: " in status
    stats = trajkit("stats", str(run_dir))
    assert re.search(r"\| done +\| +18 \|", stats.stdout), stats.stdout
    assert json.loads((run_dir / "statistics.json").read_text()) == merged  # read, not rewritten

    resumed = trajkit(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    shown = figures(trajkit("status", str(run_dir)).stdout)
    assert (shown["done"], shown["pending"]) == (str(rows), "0")


def test_a_finished_run_is_read_from_its_merge(tmp_path: Path) -> None:
    """A run whose merge is current is not merged again by a reader: its own files are read."""
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"Task {i}"} for i in range(4)])
    args = ["run", "--dataset_file", str(path), "--run_name", "r", "--output_dir", str(tmp_path), "--quiet"]
    assert trajkit(*args).returncode == 0
    path.unlink()  # the dataset is gone: a reader that needed it could not count pending rows
    shown = figures(trajkit("status", str(tmp_path / "r")).stdout)
    assert (shown["done"], shown["pending"], shown["kept"]) == ("4", "0", "4")
