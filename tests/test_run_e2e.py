"""A whole run through the real CLI against the project's OpenAI-compatible server and the real SDK."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers import read_jsonl, trajkit, write_jsonl
from trajkit.manager import load_plugins
from trajkit.testing.openai_server import OpenAITestServer
from trajkit.testing.policies import dialect_policy

SECRET = "sk-test-secret-3141592653"
DIALECTS = ["reasoning", "reasoning_content", "details", "think", "scratchpad"]


def dataset_rows() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for i in range(20):
        dialect = DIALECTS[i % len(DIALECTS)]
        rows.append({"prompt": f"Task {i}: tidy the notes [dialect:{dialect}]", "topic": f"t{i % 3}"})
    rows.append({"prompt": "Look something up [hallucinate]", "topic": "h"})
    rows.append({"prompt": "Run a command [badargs]", "topic": "b"})
    rows.append({"prompt": "Answer without thinking [dialect:none]", "topic": "n"})
    rows.append(dict(rows[0]))  # a duplicate row is a work item of its own
    return rows


@pytest.fixture(scope="module", params=["aiohttp", "sdk"])
def finished_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, OpenAITestServer, str]:
    """One run per transport: aiohttp (the default) and the openai SDK's own path."""
    tmp = tmp_path_factory.mktemp(f"e2e-{request.param}")
    dataset = write_jsonl(tmp / "prompts.jsonl", dataset_rows())
    prefill = tmp / "prefill.json"
    prefill.write_text(
        json.dumps([{"role": "user", "content": "PREFILL-EXAMPLE"}, {"role": "assistant", "content": "ok"}])
    )
    server = OpenAITestServer(dialect_policy, api_key=SECRET, models={"test-model"})
    server.start()
    result = trajkit(
        "run",
        "--dataset_file", str(dataset),
        "--run-name", "e2e",
        "--output_dir", str(tmp / "data"),
        "--model", "test-model",
        "--base_url", server.base_url,
        "--api_key", SECRET,
        "--batch_size", "5",
        "--num_workers", "8",
        "--ephemeral_system_prompt", "EPHEMERAL-INSTRUCTION",
        "--prefill_messages_file", str(prefill),
        "--transport", request.param,
    )  # fmt: skip
    server.stop()
    assert result.returncode == 0, result.stderr
    return tmp / "data" / "e2e", server, result.stderr


def test_run_directory_has_the_four_artifacts(finished_run: tuple[Path, OpenAITestServer, str]) -> None:
    run_dir, _, _ = finished_run
    for name in (
        "batch_0.jsonl",
        "checkpoint.json",
        "statistics.json",
        "trajectories.jsonl",
        "rejected.jsonl",
    ):
        assert (run_dir / name).is_file(), name
    ledger = [r for path in sorted(run_dir.glob("batch_*.jsonl")) for r in read_jsonl(path)]
    assert len(ledger) == 24
    assert {len(read_jsonl(p)) for p in run_dir.glob("batch_*.jsonl")} == {5, 4}


TOOLSET_OF = {
    tool.name: toolset.name for toolset in load_plugins().toolsets.values() for tool in toolset.tools
}


def test_kept_records_carry_every_field(finished_run: tuple[Path, OpenAITestServer, str]) -> None:
    run_dir, _, _ = finished_run
    records = read_jsonl(run_dir / "trajectories.jsonl")
    assert len(records) == 22
    assert [r["prompt_index"] for r in records] == sorted(r["prompt_index"] for r in records)
    schemas = {json.dumps(sorted(r["tool_stats"])) for r in records}
    assert len(schemas) == 1, "every row must have the same tool_stats columns"
    for record in records:
        assert record["completed"] and not record["partial"]
        assert record["metadata"]["model"] == "test-model"
        assert {"batch_num", "timestamp", "topic"} <= set(record["metadata"])
        assert record["sandbox"]["backend"] == "local"
        assert record["usage"]["total_tokens"] > 0 and record["duration_s"] >= 0
        assert set(record["toolsets_offered"]) == {"terminal", "file", "code"}
        called = {name for name, stat in record["tool_stats"].items() if stat["count"]}
        assert set(record["toolsets_used"]) == {TOOLSET_OF[name] for name in called}
        assert "write_file" in record["tools_offered"]
        gpt = [t for t in record["conversations"] if t["from"] == "gpt"]
        assert all(t["reasoning"] for t in gpt), "reasoning must be read from every dialect"
        assert not any("<think>" in t["value"] or "SCRATCHPAD" in t["value"] for t in gpt)
        tool_turns = [t for t in record["conversations"] if t["from"] == "tool"]
        call_ids = [c["id"] for t in gpt for c in t["tool_calls"]]
        assert [t["tool_call_id"] for t in tool_turns] == call_ids
        assert record["conversations"][0]["from"] == "system"


def test_duplicates_each_get_a_trajectory(finished_run: tuple[Path, OpenAITestServer, str]) -> None:
    run_dir, _, _ = finished_run
    records = read_jsonl(run_dir / "trajectories.jsonl")
    first = [r for r in records if r["prompt_index"] in (0, 23)]
    assert len(first) == 2
    assert first[0]["prompt_id"] == first[1]["prompt_id"]
    assert first[0]["work_id"] != first[1]["work_id"]


def test_filters_reject_with_reasons(finished_run: tuple[Path, OpenAITestServer, str]) -> None:
    run_dir, _, _ = finished_run
    rejected = {r["prompt_index"]: r["reason"] for r in read_jsonl(run_dir / "rejected.jsonl")}
    assert rejected == {
        20: "hallucinated_tool: called tools not offered: web_search",
        22: "no_reasoning: none of 4 assistant turns carries reasoning",
    }


def test_bad_arguments_are_a_tool_failure_answered_to_the_model(
    finished_run: tuple[Path, OpenAITestServer, str],
) -> None:
    run_dir, _, _ = finished_run
    record = next(r for r in read_jsonl(run_dir / "trajectories.jsonl") if r["prompt_index"] == 21)
    bad_tool = record["conversations"][2]["tool_calls"][0]["name"]
    assert record["tool_stats"][bad_tool]["failure"] == 1
    assert record["tool_error_counts"][bad_tool] == 1
    assert record["conversations"][3]["value"].startswith("Error: arguments are not valid JSON")


def test_statistics_match_the_records(finished_run: tuple[Path, OpenAITestServer, str]) -> None:
    run_dir, _, _ = finished_run
    stats = json.loads((run_dir / "statistics.json").read_text())
    kept = read_jsonl(run_dir / "trajectories.jsonl")
    rejected = [r["record"] for r in read_jsonl(run_dir / "rejected.jsonl")]
    everything = kept + rejected
    assert (stats["done"], stats["kept"], stats["rejected"], stats["pending"]) == (24, 22, 2, 0)
    assert stats["rejected_by_filter"] == {"hallucinated_tool": 1, "no_reasoning": 1}
    for tool, stat in stats["tools"].items():
        assert stat["count"] == sum(r["tool_stats"][tool]["count"] for r in everything), tool
        assert stat["failure"] == sum(r["tool_stats"][tool]["failure"] for r in everything), tool
    assert stats["api_calls"] == sum(r["api_calls"] for r in everything)
    assert stats["tokens"]["total"] == sum(r["usage"]["total_tokens"] for r in everything)
    assert stats["reasoning_coverage"] == round(23 / 24, 4)


def test_model_saw_ephemeral_and_prefill_but_records_do_not(
    finished_run: tuple[Path, OpenAITestServer, str],
) -> None:
    run_dir, server, _ = finished_run
    requests = server.requests
    assert len(requests) == sum(r["api_calls"] for r in read_jsonl(run_dir / "trajectories.jsonl")) + sum(
        r["record"]["api_calls"] for r in read_jsonl(run_dir / "rejected.jsonl")
    )
    first = requests[0].body["messages"]
    assert "EPHEMERAL-INSTRUCTION" in first[0]["content"]
    assert first[1]["content"] == "PREFILL-EXAMPLE"
    agent = next(v for k, v in requests[0].headers.items() if k.lower() == "user-agent")
    assert agent.startswith("trajkit/") or "OpenAI/Python" in agent
    for path in (p for p in run_dir.rglob("*") if p.is_file()):
        text = path.read_text()
        assert "EPHEMERAL-INSTRUCTION" not in text and "PREFILL-EXAMPLE" not in text, path.name


def test_secret_never_reaches_the_run_directory_or_logs(
    finished_run: tuple[Path, OpenAITestServer, str],
) -> None:
    run_dir, _, stderr = finished_run
    assert SECRET not in stderr
    for path in (p for p in run_dir.rglob("*") if p.is_file()):
        assert SECRET not in path.read_text(), path.name


def test_finished_run_resumed_spends_nothing_and_changes_nothing(
    finished_run: tuple[Path, OpenAITestServer, str], tmp_path: Path
) -> None:
    run_dir, _, _ = finished_run
    before = {p.name: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    server = OpenAITestServer(dialect_policy)
    with server:
        result = trajkit(
            "run", "--dataset_file", str(run_dir.parent.parent / "prompts.jsonl"), "--run_name", "e2e",
            "--output_dir", str(run_dir.parent), "--model", "test-model", "--base_url", server.base_url, "--resume",
            "--ephemeral_system_prompt", "EPHEMERAL-INSTRUCTION",
            "--prefill_messages_file", str(run_dir.parent.parent / "prefill.json"),
            "--allow_change", "base_url",  # this server listens on another port than the run's
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert server.count == 0
    after = {p.name: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    assert after == before


def test_rows_are_spread_over_batches_by_finish_order(
    finished_run: tuple[Path, OpenAITestServer, str],
) -> None:
    run_dir, _, _ = finished_run
    batch_nums = Counter(r["metadata"]["batch_num"] for r in read_jsonl(run_dir / "trajectories.jsonl"))
    assert set(batch_nums) <= {0, 1, 2, 3, 4}
