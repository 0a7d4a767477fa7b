"""The run directory has one owner: :class:`~trajkit.run.rundir.RunDir` names every file of a run and
reads it, and ``trajkit run`` and ``trajkit serve --record`` write it through one
:class:`~trajkit.run.invocation.Invocation`."""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.helpers import trajkit, write_jsonl
from tests.serve_helpers import MODEL, ServeProcess, serve_policy, write_key
from trajkit.config.run_config import RunConfig
from trajkit.manager import load_plugins
from trajkit.run import rundir
from trajkit.run.invocation import Invocation
from trajkit.run.lock import RunLocked
from trajkit.run.rundir import RunDir
from trajkit.testing.openai_server import OpenAITestServer

ROOT = Path(__file__).resolve().parent.parent
FILE_NAMES = {name for name in vars(rundir) if name.endswith(("_FILE", "_DIR"))}
"""The names of the run's files, as rundir.py defines them (``MANIFEST_FILE``, ``SPEND_DIR``...)."""
NAMED = {value for name, value in vars(rundir).items() if name in FILE_NAMES and isinstance(value, str)}


def python_files() -> Iterator[Path]:
    """The project's code: the core and the plugin packages (benchmarks read the statistics of
    the runs they start, of trajkit versions from before RunDir too)."""
    for top in ("trajkit", *sorted(p.name for p in ROOT.glob("trajkit_*") if p.is_dir())):
        for path in sorted((ROOT / top).rglob("*.py")):
            if "build" not in path.relative_to(ROOT).parts:
                yield path


def outside_rundir(path: Path, tree: ast.Module) -> Iterator[str]:
    """Where ``tree`` names a file of the run itself: a file-name constant of rundir.py imported
    or reached through the module, or a path joined with a run file's name written out."""
    for node in ast.walk(tree):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.ImportFrom) and node.module == "trajkit.run.rundir":
            yield from (f"{where}: imports {a.name}" for a in node.names if a.name in FILE_NAMES)
        elif isinstance(node, ast.Attribute) and node.attr in FILE_NAMES:
            yield f"{where}: uses {node.attr}"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            right = node.right
            if isinstance(right, ast.Constant) and right.value in NAMED:
                yield f"{where}: joins {right.value!r}"
            if isinstance(right, ast.JoinedStr) and any(
                isinstance(part, ast.Constant) and str(part.value).startswith("batch_")
                for part in right.values
            ):
                yield f"{where}: joins a batch file's name"
        elif (
            isinstance(node, ast.Constant)
            and node.value == rundir.MANIFEST_FILE
            and isinstance(node.value, str)
        ):
            yield f"{where}: names {node.value!r}"


def test_the_files_of_a_run_are_named_in_rundir_alone() -> None:
    assert {"MANIFEST_FILE", "KEPT_FILE", "TOOLS_FILE", "SPEND_DIR", "LOCK_FILE", "BATCH_FILE"} <= FILE_NAMES
    found = [
        problem
        for path in python_files()
        if path != ROOT / "trajkit" / "run" / "rundir.py"
        for problem in outside_rundir(path, ast.parse(path.read_text(), str(path)))
    ]
    assert found == []


def test_the_check_sees_the_ways_a_run_file_is_named_outside_rundir(tmp_path: Path) -> None:
    source = (
        "from trajkit.run.rundir import FAILURES_FILE, RunDir\n"
        "from trajkit.run import rundir\n"
        "a = run_dir / 'statistics.json'\n"
        "b = run_dir / f'batch_{n}.jsonl'\n"
        "c = rundir.TOOLS_FILE\n"
        "d = {'file': 'run.json'}\n"
        "e = run_dir / 'notes.txt'\n"
    )
    path = ROOT / "trajkit" / "example.py"
    found = [p.split(": ", 1)[1] for p in outside_rundir(path, ast.parse(source))]
    assert sorted(found) == sorted(
        [
            "imports FAILURES_FILE",
            "joins 'statistics.json'",
            "joins a batch file's name",
            "uses TOOLS_FILE",
            "names 'run.json'",
        ]
    )


# -- RunDir ----------------------------------------------------------------------------------------


def test_every_file_of_the_run_is_a_distinct_path_inside_it(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "r")
    paths = [
        run.manifest_path, run.statistics_path, run.checkpoint_path, run.failures_path, run.rejected_path,
        run.kept_path, run.compressed_path, run.tools_path, run.lock_path, run.spend_dir, run.report_path,
        run.hf_dataset_path, run.batch_path(0), run.output_path("trajectories.hermes.jsonl"),
    ]  # fmt: skip
    assert len(set(paths)) == len(paths) and all(p.parent == run.path for p in paths)
    assert run.spend_path("r-1-2") == run.spend_dir / "r-1-2.jsonl"
    # the four names the design fixes
    assert [run.batch_path(0).name, run.checkpoint_path.name, run.statistics_path.name, run.kept_path.name] == [
        "batch_0.jsonl", "checkpoint.json", "statistics.json", "trajectories.jsonl",
    ]  # fmt: skip
    assert str(run) == os.fspath(run) == str(tmp_path / "r") and run.name == "r"


def test_ledger_files_in_numeric_order_and_what_makes_a_run(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    assert run.batch_files() == [] and not run.holds_a_run() and not run.is_a_run()
    for number in (10, 2, 0):
        run.batch_path(number).write_text("")
    (tmp_path / "batch_x.jsonl").write_text("")
    (tmp_path / "batch_3.jsonl.tmp").write_text("")
    assert [n for n, _ in run.batch_files()] == [0, 2, 10]
    assert run.holds_a_run() and run.is_a_run()
    failed_only = RunDir(tmp_path / "failed")
    failed_only.path.mkdir()
    failed_only.failures_path.write_text('{"work_id": "a.0"}\n{"work_id": "b.0"')  # the last line torn
    assert failed_only.holds_a_run() and [e["work_id"] for e in failed_only.failures()] == ["a.0"]
    settings_only = RunDir(tmp_path / "settings")
    settings_only.path.mkdir()
    settings_only.manifest_path.write_text('{"invocations": []}')
    assert settings_only.is_a_run() and not settings_only.holds_a_run()


def test_damaged_json_files_read_as_missing_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = RunDir(tmp_path)
    assert run.run_json("x") is None and run.statistics() is None and run.tool_schemas() == {}
    run.manifest_path.write_text('{"invocations": {}}')
    run.statistics_path.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="trajkit"):
        assert run.run_json("reading the run without it") is None
        assert run.statistics() is None
    assert f"{run.manifest_path} is damaged" in caplog.text and "reading the run without it" in caplog.text
    assert f"{run.statistics_path} is damaged: invalid JSON" in caplog.text
    assert run.run_json("x", required={}) == {"invocations": {}}
    run.manifest_path.write_text('{"invocations": [{"run_id": "a"}], "run_name": "r"}')
    assert run.run_json("x") == {"invocations": [{"run_id": "a"}], "run_name": "r"}


def test_spend_is_each_spend_file_s_last_whole_line_else_run_json_s(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.spend_dir.mkdir()
    line = {"requests": 2, "prompt_tokens": 10, "completion_tokens": 5, "cost": 0.5}
    run.spend_path("a").write_text(
        json.dumps({**line, "requests": 1}) + "\n" + json.dumps(line) + '\n{"requests": 9'
    )
    assert run.spend() == {"a": line}
    served = {"requests": 3, "prompt_tokens": 30, "completion_tokens": 3, "cost": 0.25}
    invocations = [{"run_id": "a", "model_client": {"cost": 99}}, {"served": True, "model_client": served}]
    assert run.spent(invocations) == {
        "requests": 5,
        "prompt_tokens": 40,
        "completion_tokens": 8,
        "cost": 0.75,
    }


def test_ledger_state_changes_when_the_ledger_or_the_spend_grows(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.batch_path(0).write_text("x\n")
    before = run.ledger_state()
    assert list(before) == ["batch_0.jsonl"]
    run.spend_dir.mkdir()
    run.spend_path("a").write_text("{}\n")
    assert set(run.ledger_state()) == {"batch_0.jsonl", "spend/a.jsonl"}
    with run.batch_path(0).open("a") as handle:
        handle.write("y\n")
    assert run.ledger_state()["batch_0.jsonl"] != before["batch_0.jsonl"]


def test_the_lock_is_held_by_one_and_seen_by_readers(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "new" / "r")
    lock = run.lock()
    lock.take()  # makes the directory
    try:
        holder = run.holder()
        assert holder is not None and holder.pid == os.getpid()
        with pytest.raises(RunLocked, match="in use by another trajkit invocation"):
            run.lock().acquire()
    finally:
        lock.release()
    assert run.holder() is None and run.lock_path.read_text() == ""


def test_a_damaged_run_json_is_kept_aside_and_rebuilt(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.manifest_path.write_text('{"invocations": 3}')
    manifest = run.manifest("r", "1.0")
    assert manifest.invocations == [] and "rebuilt" in manifest.data
    assert (tmp_path / "run.json.damaged").read_text() == '{"invocations": 3}'
    manifest.save()
    assert run.run_json("x") == manifest.data


def test_clear_keeps_the_lock_and_the_merge_leaves_no_temporaries(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    for path in (run.lock_path, run.manifest_path, run.batch_path(0), run.kept_path):
        path.write_text("x")
    run.spend_dir.mkdir()
    run.spend_path("a").write_text("{}\n")
    run.clear()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.lock"]
    leftovers = [".trajectories.jsonl.abc", ".statistics.json.def", ".rejected.jsonl.1"]
    for name in [*leftovers, ".other.jsonl.x", ".trajectories.hermes.jsonl.y"]:
        (tmp_path / name).write_text("")
    run.remove_merge_temporaries(["trajectories.jsonl"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".other.jsonl.x", ".trajectories.hermes.jsonl.y", "run.lock"
    ]  # fmt: skip


# -- one invocation ----------------------------------------------------------------------------


def test_an_invocation_holds_the_run_notes_itself_and_closes_its_entry(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "r")
    host = load_plugins()
    config = RunConfig(run_name="r", output_dir=tmp_path, batch_size=3)

    async def invoke() -> None:
        invocation = Invocation(run, "r")
        invocation.hold()
        assert run.holder() is not None
        invocation.begin(config, host, {"run_id": "r-1"}, {"model": ["a", "b"]}, lambda: {"succeeded": 1})
        assert invocation.ledger.batch_size == 3 and invocation.catalog.path == run.tools_path
        entry = run.run_json("x")["invocations"][-1]  # type: ignore[index]
        assert entry["run_id"] == "r-1" and entry["config_changes"] == {"model": ["a", "b"]}
        await invocation.end("stopped", {"succeeded": 2})
        invocation.ledger.close()
        invocation.release()

    asyncio.run(invoke())
    assert run.holder() is None
    saved = run.run_json("x")
    assert saved is not None and saved["config"] == config.manifest()
    assert saved["plugins"] == dict(sorted(host.sources.items()))
    (entry,) = saved["invocations"]
    assert entry["stop_reason"] == "stopped" and entry["succeeded"] == 2 and entry["wall_seconds"] >= 0


def test_an_invocation_that_fails_before_reading_lets_go_of_the_lock(tmp_path: Path) -> None:
    run = RunDir(tmp_path)

    def refuse() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError):
        Invocation(run, "r").hold(refuse)
    assert run.holder() is None and not run.manifest_path.exists()
    other = Invocation(run, "r")
    other.hold()
    try:
        with pytest.raises(RunLocked):
            Invocation(run, "r").hold()
    finally:
        other.release()


# -- a run and a served recording ------------------------------------------------------------------

KEY = "sk-rundir-test-key-161803398"


def test_a_run_and_a_served_recording_leave_the_same_files(tmp_path: Path, sandbox_root: Path) -> None:
    """Both go through one Invocation: the same files, but for the spend files (a served session's
    spend is its invocation's entry in run.json)."""
    local = ["--sandbox_option", f"local.root={sandbox_root}", "--sandbox_option", "local.isolation=none"]
    with OpenAITestServer(serve_policy, api_key=KEY, models={MODEL}) as server:
        dataset = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "one"}, {"prompt": "two"}])
        ran = trajkit(
            "run", "--dataset_file", str(dataset), "--run_name", "batch", "--output_dir", str(tmp_path),
            "--model", MODEL, "--base_url", server.base_url, "--api_key", KEY, *local,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        served_dir = tmp_path / "served"
        server_key = "trajkit-rundir-server-key-2236"
        with ServeProcess(
            "--model", MODEL, "--base_url", server.base_url,
            "--api_key_file", str(write_key(tmp_path / "model.key", KEY)),
            "--server_key_file", str(write_key(tmp_path / "server.key", server_key)),
            "--record", str(served_dir), *local,
        ) as process:  # fmt: skip
            client = openai.OpenAI(base_url=process.base_url, api_key=server_key, max_retries=0)
            for prompt in ("one", "two"):
                client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}])
            assert process.stop() == 0, process.stderr
    batch, served = RunDir(tmp_path / "batch"), RunDir(served_dir)
    names = {run: sorted(p.name for p in run.path.iterdir()) for run in (batch, served)}
    assert names[batch] == sorted([*names[served], batch.spend_dir.name]), names
    known = {
        p.name
        for p in (
            batch.manifest_path, batch.statistics_path, batch.checkpoint_path, batch.rejected_path,
            batch.kept_path, batch.tools_path, batch.lock_path, batch.spend_dir, batch.batch_path(0),
        )
    }  # fmt: skip
    assert set(names[batch]) == known
    invocations = {run: run.run_json("x")["invocations"] for run in (batch, served)}  # type: ignore[index]
    assert {*invocations[batch][0]} - {"run_id", "offer"} == {*invocations[served][0]} - {"served"}
