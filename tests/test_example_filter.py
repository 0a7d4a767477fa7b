"""The example plugin package ``examples/trajkit-min-tools``: found through its entry point, and
applied by a real run when named with ``--filter``.

Nothing is installed here. The entry-point test needs the package installed (it is in
requirements-dev.txt) and skips otherwise; the run tests work either way: without the installed
package, a throwaway ``.dist-info`` exposes the example's source under the same entry point.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest

from tests.helpers import read_jsonl, trajkit, write_jsonl
from trajkit.manager import load_plugins
from trajkit.plugins.scripted_model import split_task
from trajkit.testing.openai_server import OpenAITestServer, tool_script_policy

DIST = "trajkit-min-tools"
SOURCE = Path(__file__).resolve().parents[1] / "examples" / "trajkit-min-tools" / "src"


def installed() -> bool:
    try:
        importlib.metadata.distribution(DIST)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_the_entry_point_is_visible_when_installed() -> None:
    if not installed():
        pytest.skip(f"{DIST} is not installed: pip install -e ./examples/trajkit-min-tools")
    entry = {ep.name: ep for ep in importlib.metadata.entry_points(group="trajkit")}["min_tool_calls"]
    assert entry.value == "trajkit_min_tools"
    assert entry.dist is not None and entry.dist.name == DIST
    host = load_plugins()
    assert host.sources["min_tool_calls"].startswith(f"{DIST} ")
    assert not host.filters["min_tool_calls"].enabled_by_default, "the filter is opt-in"


def plugin_env(site: Path) -> dict[str, str]:
    """Environment in which the CLI sees the example plugin, installed or not."""
    if installed():
        return {}
    info = site / "trajkit_min_tools-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[trajkit]\nmin_tool_calls = trajkit_min_tools\n")
    return {"PYTHONPATH": f"{site}:{SOURCE}"}


THREE_CALLS = tool_script_policy(calls=3, tool="terminal", arguments={"command": "echo hi"}, final="Said hi.")


def policy(body: dict[str, Any]) -> dict[str, Any]:
    """``[direct]`` prompts are answered at once; others make three terminal calls first."""
    prompt, _ = split_task(body["messages"])
    reply = (
        {"content": "It is 4."} if "[direct]" in prompt else dict(cast(Mapping[str, Any], THREE_CALLS(body)))
    )
    return {**reply, "reasoning": "Working it out."}  # reasoning, so only our filter can reject


def run(tmp_path: Path, name: str, *flags: str, env: dict[str, str] | None = None) -> Path:
    dataset = write_jsonl(
        tmp_path / "prompts.jsonl",
        [{"prompt": "What is 2 + 2? [direct]"}, {"prompt": "Say hi from the shell [tools]"}],
    )
    with OpenAITestServer(policy, models={"test-model"}) as server:
        result = trajkit(
            "run", "--dataset_file", str(dataset), "--run_name", name, "--output_dir", str(tmp_path / "data"),
            "--model", "test-model", "--base_url", server.base_url, "--quiet", *flags,
            env={**plugin_env(tmp_path / name / "site"), **(env or {})},
            subprocess=True,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return tmp_path / "data" / name


def test_a_short_trajectory_is_rejected_with_the_reason(tmp_path: Path) -> None:
    run_dir = run(tmp_path, "min2", "--filter", "min_tool_calls")
    rejected = {r["prompt_index"]: r["reason"] for r in read_jsonl(run_dir / "rejected.jsonl")}
    assert rejected == {0: "min_tool_calls: 0 tool calls, fewer than 2"}
    kept = read_jsonl(run_dir / "trajectories.jsonl")
    assert [r["prompt_index"] for r in kept] == [1]
    assert kept[0]["tool_stats"]["terminal"]["count"] == 3


def test_the_minimum_comes_from_the_environment(tmp_path: Path) -> None:
    run_dir = run(tmp_path, "min4", "--filter", "min_tool_calls", env={"TRAJKIT_MIN_TOOL_CALLS": "4"})
    rejected = {r["prompt_index"]: r["reason"] for r in read_jsonl(run_dir / "rejected.jsonl")}
    assert rejected == {
        0: "min_tool_calls: 0 tool calls, fewer than 4",
        1: "min_tool_calls: 3 tool calls, fewer than 4",
    }


def test_the_minimum_is_a_setting_of_the_filter(tmp_path: Path) -> None:
    run_dir = run(tmp_path, "min3", "--filter", "min_tool_calls", "--min_tool_calls.minimum", "4")
    assert len(read_jsonl(run_dir / "rejected.jsonl")) == 2
    config = tmp_path / "run.toml"
    config.write_text('[filter_options.min_tool_calls]\nminimum = "few"\n')
    result = trajkit(
        "run", "--dataset_file", str(tmp_path / "prompts.jsonl"), "--run_name", "bad", "--config", str(config),
        "--output_dir", str(tmp_path / "data"), env=plugin_env(tmp_path / "bad" / "site"), subprocess=True,
    )  # fmt: skip
    assert result.returncode == 2
    assert (
        f"{config}: filter_options.min_tool_calls.minimum=few: filter 'min_tool_calls' expects minimum to be int >= 0"
        in result.stderr
    )


def test_the_filter_is_off_unless_named(tmp_path: Path) -> None:
    run_dir = run(tmp_path, "off")
    assert read_jsonl(run_dir / "rejected.jsonl") == []
    assert len(read_jsonl(run_dir / "trajectories.jsonl")) == 2
