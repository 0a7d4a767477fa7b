"""Checks a model cannot forge: a row's ``check_files`` are put fresh into the sandbox just before its
check runs, over whatever the session left at their place, on the local sandbox and on Docker.

The hostile "model" rewrites the check's script to ``exit 0`` and plants an override in the check's
directory; without ``check_files`` its forged check passes, with them it fails, and an honest
session still passes.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import read_jsonl, trajkit, write_jsonl
from tests.test_hostile_run import make_policy
from trajkit.plugins.scripted_model import split_task
from trajkit.sandbox.check_files import CheckFile, resolve
from trajkit.testing.engines import need_engine
from trajkit.testing.openai_server import OpenAITestServer

FORGE = [
    ("write_file", {"path": "check.sh", "content": "exit 0\n"}),
    ("write_file", {"path": "checks/override.sh", "content": "exit 0\n"}),
    ("write_file", {"path": "verify/override.sh", "content": "exit 0\n"}),
    ("terminal", {"command": "chmod 000 verify; echo 'wrong answer' > solution.txt"}),
]
HONEST = [("write_file", {"path": "solution.txt", "content": "the answer 42\n"})]
CHECK = "grep -q 'answer 42' solution.txt\n"
RUN = 'd=$(dirname "$0"); [ -f "$d/override.sh" ] && . "$d/override.sh"\ngrep -q "answer 42" solution.txt\n'


def suite(tmp_path: Path, extra: dict[str, Any] | None = None) -> Path:
    """A dataset beside its check files; rows 0-3 meet a forger, row 4 an honest model."""
    (tmp_path / "check.sh").write_text(CHECK)
    (tmp_path / "checks").mkdir()
    (tmp_path / "checks" / "run.sh").write_text(RUN)
    (tmp_path / "checks" / "run.sh").chmod(0o755)
    rows: list[dict[str, Any] | str] = [
        {"prompt": "[hostile] forge the check", "check": "sh check.sh"},
        {"prompt": "[hostile] forge the check file", "check": "sh check.sh", "check_files": "check.sh"},
        {"prompt": "[hostile] forge the check directory", "check": "./checks/run.sh", "check_files": ["checks"]},
        {"prompt": "[hostile] forge the mapped directory", "check": "sh verify/run.sh",
         "check_files": {"verify": "checks"}},
        {"prompt": "[hostile] [honest] solve it", "check": "./checks/run.sh", "check_files": ["checks", "check.sh"]},
    ]  # fmt: skip
    return write_jsonl(
        tmp_path / "suite.jsonl", [{**row, **(extra or {})} for row in rows if isinstance(row, dict)]
    )


def policy(body: dict[str, Any]) -> dict[str, Any]:
    """The forger, or (prompts marked [honest]) a model that solves the task."""
    prompt, _ = split_task(body["messages"])
    return make_policy(HONEST if "[honest]" in prompt else FORGE)(body)


def run_suite(dataset: Path, out: Path, name: str, *extra: str) -> dict[int, dict[str, Any]]:
    with OpenAITestServer(policy) as server:
        result = trajkit(
            "run", "--dataset_file", str(dataset), "--run_name", name, "--output_dir", str(out),
            "--model", "m", "--base_url", server.base_url, "--distribution", "terminal_only",
            "--check_timeout", "30", "--quiet", *extra, timeout=300,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return {r["prompt_index"]: r for r in read_jsonl(out / name / "trajectories.jsonl")}


def assert_forgeries_fail(records: dict[int, dict[str, Any]]) -> None:
    passed = {index: record["score"]["passed"] for index, record in records.items()}
    assert passed == {0: True, 1: False, 2: False, 3: False, 4: True}, {
        i: r["score"]["checks"][0]["detail"] for i, r in records.items()
    }
    assert records[1]["score"]["checks"][0]["detail"].startswith("exit 1")
    # The row's own fields stay as written: no host path reaches the record.
    assert records[3]["metadata"]["check_files"] == {"verify": "checks"}


def test_a_forged_check_fails_once_check_files_are_given_on_the_local_sandbox(tmp_path: Path) -> None:
    records = run_suite(suite(tmp_path), tmp_path / "out", "local")
    assert_forgeries_fail(records)
    assert {r["sandbox"]["backend"] for r in records.values()} == {"local"}


def test_a_forged_check_fails_once_check_files_are_given_on_docker(tmp_path: Path) -> None:
    from tests.test_docker_run import BUSYBOX, _why_unavailable

    need_engine("docker", _why_unavailable())
    dataset = suite(tmp_path, {"image": BUSYBOX, "cwd": "/srv/task"})
    records = run_suite(dataset, tmp_path / "out", f"checks-{uuid.uuid4().hex[:8]}", "--docker.pull", "never")
    assert_forgeries_fail(records)
    assert {r["sandbox"]["backend"] for r in records.values()} == {"docker"}


def test_check_files_a_run_cannot_use_are_bad_rows_before_any_session(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "ok.py").write_text("")
    (tmp_path / "linked").mkdir()
    os.symlink("/etc/passwd", tmp_path / "linked" / "passwd")
    os.mkfifo(tmp_path / "pipe")
    rows: list[dict[str, Any] | str] = [
        {"prompt": "fine", "check": "true", "check_files": "tests"},
        {"prompt": "missing", "check": "true", "check_files": ["tests", "nowhere"]},
        {"prompt": "a link inside", "check": "true", "check_files": "linked"},
        {"prompt": "a fifo", "check": "true", "check_files": "pipe"},
        {"prompt": "climbs", "check": "true", "check_files": "../tests"},
        {"prompt": "absolute in a list", "check": "true", "check_files": ["/etc"]},
        {"prompt": "replaces the working directory", "check": "true", "check_files": {".": "tests"}},
        {"prompt": "not paths", "check": "true", "check_files": 7},
    ]
    dataset = write_jsonl(tmp_path / "bad.jsonl", rows)
    with OpenAITestServer(policy) as server:
        result = trajkit(
            "run", "--dataset_file", str(dataset), "--run_name", "bad", "--output_dir", str(tmp_path / "out"),
            "--model", "m", "--base_url", server.base_url, "--distribution", "terminal_only", "--quiet",
        )  # fmt: skip
        asked = len(server.requests)
    assert result.returncode == 1
    said = {
        int(line.split(f"{dataset}:")[1].split(":")[0]): line
        for line in result.stderr.splitlines()
        if f"{dataset}:" in line
    }
    assert sorted(said) == [2, 3, 4, 5, 6, 7, 8], result.stderr
    for line, problem in [
        (2, f"'nowhere' ({tmp_path / 'nowhere'}): no such file or directory"),
        (3, "is no regular file or directory (a symlink, device or FIFO)"),
        (4, "is no regular file or directory (a symlink, device or FIFO)"),
        (5, "a path in a list is relative to the dataset's directory"),
        (6, "a path in a list is relative to the dataset's directory"),
        (7, "would replace the working directory"),
        (8, "'check_files' must be a path, a list of paths or an object"),
    ]:
        assert problem in said[line], (line, said[line])
    assert len(read_jsonl(tmp_path / "out" / "bad" / "trajectories.jsonl")) == 1
    assert asked <= 10, "the bad rows reached the model"


def test_check_files_resolve_against_the_dataset_s_directory(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "a.py").write_text("a")
    (tmp_path / "big.bin").write_bytes(b"\0" * (8 * 1024 * 1024 + 1))
    assert resolve("t", tmp_path) == (CheckFile("t", str(tmp_path / "t")),)
    assert resolve({"/checks/": str(tmp_path / "t")}, None) == (CheckFile("/checks", str(tmp_path / "t")),)
    assert resolve({"sub/x.py": "t/a.py"}, tmp_path) == (CheckFile("sub/x.py", str(tmp_path / "t" / "a.py")),)
    for bad, problem in [
        ("t", "this dataset has no directory"),
        ({"t": "big.bin"}, "at most 8388608 each"),
        ({"x\0y": "t"}, "NUL byte"),
        ([], "must be a path"),
    ]:
        with pytest.raises(ValueError, match=problem):
            resolve(bad, None if problem.startswith("this") else tmp_path)
