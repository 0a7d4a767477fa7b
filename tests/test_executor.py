"""Executors: the seam between the runner and where sessions run (``trajkit_executors``).

The ``local`` executor is the default and runs the sessions as ever; a third-party executor is
handed plain, picklable work and a narrow driver, and what it hands back is recorded by the runner
(the ledger, ``failures.jsonl``); the tool schemas offered are saved in the run so that writers and
``trajkit export`` render them without the plugins that made them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.helpers import read_jsonl, trajkit, write_jsonl
from trajkit import hookimpl
from trajkit.config.run_config import RunConfig
from trajkit.config.settings import StrictSettings
from trajkit.manager import PluginError, PluginHost, load_plugins
from trajkit.plugins.export.command import export_records, read_records
from trajkit.plugins.export.writers import OpenAIWriter
from trajkit.plugins.local_executor import LocalExecutor
from trajkit.run.attempt import Sessions
from trajkit.run.executor import Driver, Executor, Failed, Finished, SessionPlan, WorkOrder
from trajkit.run.files import RunIOError
from trajkit.run.finalize import offer_tool_schemas
from trajkit.run.rundir import RunDir
from trajkit.run.runner import EXIT_INCOMPLETE, EXIT_OK, Runner
from trajkit.tools import Tool, ToolContext, Toolset
from trajkit.tools import catalog as tool_catalog
from trajkit.tools.catalog import tool_schemas_key

PROMPTS: list[dict[str, Any] | str] = [
    *({"prompt": f"task {i}", "topic": "t"} for i in range(6)),
    {"prompt": "please fail"},
]


def run(config: RunConfig, host: PluginHost) -> tuple[int, Runner]:
    runner = Runner(config, host)
    outcome = asyncio.run(runner.run())
    return outcome.exit_code, runner


def stable(record: dict[str, Any]) -> dict[str, Any]:
    """A record without what differs between two runs of the same plan (time and duration)."""
    metadata = {k: v for k, v in record["metadata"].items() if k != "timestamp"}
    return {**record, "metadata": metadata, "duration_s": None}


# -- (a) the local executor is the default, and the run is what it was -----------------------------


def test_local_is_the_default_executor_and_runs_every_session(tmp_path: Path) -> None:
    host = load_plugins(entry_points=False)
    assert host.executors == {"local": LocalExecutor}
    assert RunConfig().executor == "local"
    assert host.sources["trajkit.plugins.local_executor"] == "built-in"

    dataset = write_jsonl(tmp_path / "d.jsonl", PROMPTS)
    default = RunConfig(
        dataset_file=dataset, run_name="default", output_dir=tmp_path, quiet=True, num_workers=3
    )
    named = default.model_copy(update={"run_name": "named", "executor": "local"})
    assert run(default, host)[0] == EXIT_OK
    assert run(named, load_plugins(entry_points=False))[0] == EXIT_OK

    first = read_jsonl(tmp_path / "default" / "trajectories.jsonl")
    second = read_jsonl(tmp_path / "named" / "trajectories.jsonl")
    assert [r["prompt_index"] for r in first] == list(range(len(PROMPTS)))
    assert [stable(r) for r in first] == [stable(r) for r in second]
    batches = {
        r["work_id"]: r["metadata"]["batch_num"] for r in read_jsonl(tmp_path / "default" / "batch_0.jsonl")
    }
    assert set(batches.values()) == {0}  # the runner numbers the batch a record lands in
    assert all(r["tool_schemas_key"] in RunDir(tmp_path / "default").tool_schemas() for r in first)


def test_the_cli_takes_the_executor_flag(tmp_path: Path) -> None:
    dataset = write_jsonl(tmp_path / "d.jsonl", PROMPTS[:2])
    args = ["run", "--dataset_file", str(dataset), "--output_dir", str(tmp_path), "--quiet"]
    result = trajkit(*args, "--run_name", "flag", "--executor", "local")
    assert result.returncode == 0, result.stderr
    assert len(read_jsonl(tmp_path / "flag" / "trajectories.jsonl")) == 2

    # (c) an unknown executor is a usage error naming the installed ones, before any row runs
    result = trajkit(*args, "--run_name", "unknown", "--executor", "cluster")
    assert result.returncode == 2, result.stderr
    installed = ", ".join(sorted(load_plugins().executors))
    assert f"unknown executor 'cluster' (installed: {installed})" in result.stderr
    assert not (tmp_path / "unknown").exists()


# -- (b) a third-party executor ----------------------------------------------------------------------


class RemoteLike(Executor):
    """Runs each session as a remote node would: from pickled work, with plugins it loads itself.

    Prompts containing "fail" are not run: a failure is reported for them, twice (a retry). The
    first prompt's record is reported twice, and once more for a work id that is not pending.
    """

    name = "remote_like"
    description = "test executor"

    class Settings(StrictSettings):
        label: str = "none"

    seen: list[WorkOrder]
    driver_attributes: set[str]

    async def start(self, plan: SessionPlan, host: PluginHost) -> None:
        self.shipped_plan = pickle.dumps(plan)  # what would travel to a node
        self.sessions = Sessions(pickle.loads(self.shipped_plan), load_plugins(entry_points=False))
        await self.sessions.open()
        RemoteLike.instances.append(self)

    async def execute(self, work: Sequence[WorkOrder], driver: Driver) -> None:
        self.seen = [pickle.loads(pickle.dumps(order)) for order in work]
        self.driver_attributes = {name for name in dir(driver) if not name.startswith("_")}
        for order in self.seen:
            if not driver.may_start():
                return
            if "fail" in order.item.row.prompt:
                for attempt in (1, 2):
                    driver.started(order.work_id, attempt)
                    driver.report(
                        Failed(order.work_id, attempt, "node_lost", "the node went away", attempt == 2)
                    )
                continue
            if order.item.index == 0:  # run twice, as after a resubmission; and reported for no work
                driver.started(order.work_id, 1)
                finished = await self.sessions.attempt(order, 1)
                for outcome in (finished, finished, Finished("f00.0", finished.record)):
                    driver.report(outcome)
                continue
            await self.sessions.run(order, driver)

    def statistics(self) -> dict[str, Any]:
        return self.sessions.statistics()

    async def aclose(self) -> None:
        await self.sessions.close()

    instances: ClassVar[list[RemoteLike]] = []


def remote_like_plugin() -> object:
    class Plugin:
        @hookimpl
        def trajkit_executors(self) -> list[type[Executor]]:
            return [RemoteLike]

    return Plugin()


def test_a_plugin_executor_gets_the_work_and_the_runner_records_what_it_returns(tmp_path: Path) -> None:
    RemoteLike.instances.clear()
    host = load_plugins(entry_points=False, extra=[("remote", remote_like_plugin())])
    assert sorted(host.executors) == ["local", "remote_like"]
    dataset = write_jsonl(tmp_path / "d.jsonl", PROMPTS)
    config = RunConfig(
        dataset_file=dataset,
        run_name="remote",
        output_dir=tmp_path,
        quiet=True,
        executor="remote_like",
        executor_options={"remote_like": {"label": "x"}},
    )
    code, _ = run(config, host)
    assert code == EXIT_INCOMPLETE  # the failing row is pending
    (executor,) = RemoteLike.instances
    assert executor.settings.label == "x"  # type: ignore[attr-defined]
    assert [order.item.index for order in executor.seen] == list(range(len(PROMPTS)))
    assert {order.backend for order in executor.seen} == {"local"}
    # no ledger, no paths
    assert executor.driver_attributes == {
        "may_start",
        "admit",
        "withdraw",
        "stopped",
        "started",
        "report",
        "paid",
    }

    run_dir = tmp_path / "remote"
    ledger = read_jsonl(run_dir / "batch_0.jsonl")
    assert sorted(r["prompt_index"] for r in ledger) == list(range(len(PROMPTS) - 1))  # each once
    failures = read_jsonl(run_dir / "failures.jsonl")
    assert [(f["prompt_index"], f["attempt"], f["error_class"]) for f in failures] == [
        (6, 1, "node_lost"),
        (6, 2, "node_lost"),
    ]
    statistics = json.loads((run_dir / "statistics.json").read_text())
    assert (statistics["done"], statistics["pending"]) == (6, 1)
    assert statistics["failures"]["failing_by_class"] == {"node_lost": 1}
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["config"]["executor"] == "remote_like"
    assert manifest["invocations"][-1]["succeeded"] == 6
    assert manifest["invocations"][-1]["failed"] == 1

    # the resume runs only the failing row again, with the local executor this time
    resumed = config.model_copy(
        update={"resume": True, "executor": "local", "executor_options": {}, "allow_change": ["executor"]}
    )
    code, _ = run(resumed, load_plugins(entry_points=False))
    assert code == EXIT_OK
    assert len(read_jsonl(run_dir / "trajectories.jsonl")) == len(PROMPTS)


def test_an_unknown_executor_names_the_installed_ones(tmp_path: Path) -> None:
    host = load_plugins(entry_points=False, extra=[("remote", remote_like_plugin())])
    config = RunConfig(
        dataset_file=tmp_path / "d.jsonl", run_name="x", output_dir=tmp_path, executor="cluster"
    )
    with pytest.raises(PluginError, match=r"unknown executor 'cluster' \(installed: local, remote_like\)"):
        Runner(config, host)


def test_two_executors_of_one_name_are_an_error_naming_both() -> None:
    class Local(Executor):
        name = "local"

    twin = type("Twin", (), {"trajkit_executors": staticmethod(hookimpl(lambda: [Local]))})()
    host = load_plugins(entry_points=False, extra=[("twin", twin)])
    with pytest.raises(
        PluginError, match=r"executor 'local' is registered twice: by .*local_executor and by twin"
    ):
        host.executors  # noqa: B018


# -- (d) the tool schemas offered are saved in the run -------------------------------------------


async def _jot(arguments: dict[str, Any], context: ToolContext) -> str:
    return "noted"


JOT = Tool(
    "jot",
    "Write a line into the notebook.",
    {"type": "object", "properties": {"line": {"type": "string"}}},
    _jot,
)


def jot_plugin() -> object:
    class Plugin:
        @hookimpl
        def trajkit_toolsets(self) -> list[Toolset]:
            return [Toolset("notebook", "a plugin's toolset", (JOT,))]

    return Plugin()


def test_exports_render_the_saved_schemas_without_the_plugin_that_made_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    host = load_plugins(entry_points=False, extra=[("jot", jot_plugin())])
    dataset = write_jsonl(tmp_path / "d.jsonl", PROMPTS[:3])
    config = RunConfig(
        dataset_file=dataset,
        run_name="jot",
        output_dir=tmp_path,
        quiet=True,
        distribution="notes_and_files",
        distributions={"notes_and_files": {"notebook": 1.0, "file": 0.5}},
        writers=["sharegpt", "openai"],
    )
    assert run(config, host)[0] == EXIT_OK
    run_dir = tmp_path / "jot"
    saved = RunDir(run_dir).tool_schemas()
    records = read_jsonl(run_dir / "trajectories.jsonl")
    for record in records:
        schemas = saved[record["tool_schemas_key"]]
        assert tool_schemas_key(schemas) == record["tool_schemas_key"]
        assert [s["function"]["name"] for s in schemas] == record["tools_offered"]
        assert JOT.schema() in schemas
    run_rows = read_jsonl(run_dir / "trajectories.openai.jsonl")

    # `trajkit export` in a process where the notebook plugin is not installed
    result = trajkit("export", str(run_dir), "--format", "openai", "--out", str(tmp_path / "again.jsonl"))
    assert result.returncode == 0, result.stderr
    assert "not installed" not in result.stderr
    assert read_jsonl(tmp_path / "again.jsonl") == run_rows

    # a run made before tools.json: the installed plugins' schemas, and a warning for the missing tool
    RunDir(run_dir).tools_path.unlink()
    writer = OpenAIWriter()
    offer_tool_schemas([writer], RunDir(run_dir))
    with caplog.at_level(logging.WARNING, logger="trajkit"):
        export_records(writer, read_records(run_dir / "trajectories.jsonl"), tmp_path / "old.jsonl")
    assert "tool 'jot' is not installed" in caplog.text
    for row in read_jsonl(tmp_path / "old.jsonl"):
        (jot,) = [s for s in row["tools"] if s["function"]["name"] == "jot"]
        assert jot["function"]["parameters"] == {"type": "object", "properties": {}}


def test_tool_schemas_the_disk_refused_are_written_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    catalog = RunDir(tmp_path).tools_catalog()

    def refuse(path: Path, text: str) -> None:
        raise RunIOError(path, OSError(28, "No space left on device"))

    monkeypatch.setattr(tool_catalog, "write_atomic", refuse)
    with pytest.raises(RunIOError, match=r"tools\.json: No space left"):
        catalog.add({"k1": [JOT.schema()]})
    monkeypatch.undo()
    catalog.flush()
    assert RunDir(tmp_path).tool_schemas() == {"k1": [JOT.schema()]}

    RunDir(tmp_path).tools_path.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="trajkit"):
        assert RunDir(tmp_path).tool_schemas() == {}
    assert "installed plugins instead" in caplog.text
