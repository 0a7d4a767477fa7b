"""Output writers and ``trajkit export``, checked the way a trainer reads them: through ``datasets``.

Two real runs go through the CLI with the ``balanced`` distribution, so toolsets differ between
rows: one on the offline scripted model, one against the OpenAI-compatible test server, where a
policy calls whatever tools a row was offered with arguments of many shapes (nested objects,
lists with mixed types, nulls, floats, unicode, parallel calls) and remembers exactly what it sent.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import pyarrow.parquet as pq
import pytest

from tests.helpers import read_jsonl, trajkit, write_jsonl
from trajkit.manager import PluginError
from trajkit.plugins.export.writers import ParquetWriter
from trajkit.plugins.scripted_model import split_task
from trajkit.testing.openai_server import OpenAITestServer
from trajkit.testing.policies import dialect_policy

datasets.disable_progress_bars()

FORMATS = {
    "sharegpt": "trajectories.jsonl",
    "hermes": "trajectories.hermes.jsonl",
    "openai": "trajectories.openai.jsonl",
    "parquet": "trajectories.parquet",
}
WRITER_FLAGS = [flag for name in FORMATS for flag in ("--writer", name)]

# Arguments per tool, in the order the policy prefers them; shapes differ from tool to tool.
SHAPES: dict[str, dict[str, Any]] = {
    "write_file": {"path": "dir/a.txt", "content": 'line 1\nline "2" é ✓\n'},
    "terminal": {"command": "cat dir/a.txt || true", "timeout": 30},
    "execute_code": {"code": "print(sum(range(10)))", "timeout": 2.5},
    "patch": {"path": "dir/a.txt", "old_string": "line 1", "new_string": "first", "replace_all": False},
    "read_file": {"path": "dir/a.txt"},
    "search_files": {"pattern": "first|line", "path": "."},
}
# Keys no schema declares, with the shapes that break Arrow when arguments are objects.
ODD = {"options": {"tags": ["x", 2, None, True], "nested": {"depth": [{"k": 1.5}, {}]}}, "note": None}


@dataclass
class ShapesPolicy:
    """Calls the offered tools with varied argument shapes; ``[shapes]`` rows only.

    Turn 1 makes up to two parallel calls, turn 2 one call with extra nested arguments, turn 3
    answers. Other rows go to ``dialect_policy``. ``sent`` maps each call id to (name, arguments)
    exactly as the model sent them.
    """

    sent: dict[str, tuple[str, str]] = field(default_factory=dict)

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt, since = split_task(body["messages"])
        if "[shapes]" not in prompt:
            return dialect_policy(body)
        offered = {t["function"]["name"] for t in body.get("tools") or []}
        ordered = [name for name in SHAPES if name in offered]
        plan = [ordered[:2], [ordered[-1]]]
        turn = sum(1 for m in since if m.get("role") == "assistant")
        if turn >= len(plan):
            return {"content": "All done.", "reasoning": "Every step ran; time to answer."}
        calls = []
        for name in plan[turn]:
            arguments = SHAPES[name] if turn == 0 else {**SHAPES[name], **ODD}
            call_id = f"call_{uuid.uuid4().hex[:12]}"
            encoded = json.dumps(arguments, ensure_ascii=False)
            self.sent[call_id] = (name, encoded)
            calls.append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": encoded}}
            )
        content = f"Step {turn + 1}." if turn else None
        return {
            "content": content,
            "reasoning": f"Step {turn + 1}: {', '.join(plan[turn])}.",
            "tool_calls": calls,
        }


@dataclass
class Run:
    run_dir: Path
    kept: list[dict[str, Any]]
    sent: dict[str, tuple[str, str]]


def dataset_rows() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = [
        {"prompt": f"Task {i}: tidy up [shapes]", "topic": "shapes"} for i in range(12)
    ]
    for dialect in ("reasoning", "reasoning_content", "details", "think", "scratchpad"):
        rows.append({"prompt": f"Take notes [dialect:{dialect}]", "topic": dialect})
    rows.append({"prompt": "Run a command [badargs]", "topic": "badargs"})
    return rows


def run_trajkit(tmp: Path, *model_flags: str) -> Path:
    dataset = write_jsonl(tmp / "prompts.jsonl", [*dataset_rows()])
    result = trajkit(
        "run", "--dataset_file", str(dataset), "--run_name", "writers", "--output_dir", str(tmp / "data"),
        "--distribution", "balanced", "--disabled_toolsets", "web,vision,browser", "--num_workers", "6", "--quiet", *model_flags, *WRITER_FLAGS,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return tmp / "data" / "writers"


@pytest.fixture(scope="module", params=["scripted", "server"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp(request.param)
    policy = ShapesPolicy()
    if request.param == "scripted":
        run_dir = run_trajkit(tmp, "--model", "scripted")
    else:
        with OpenAITestServer(policy, models={"test-model"}) as server:
            run_dir = run_trajkit(tmp, "--model", "test-model", "--base_url", server.base_url)
    kept = read_jsonl(run_dir / "trajectories.jsonl")
    assert len(kept) == len(dataset_rows()), (run_dir / "rejected.jsonl").read_text()
    assert len({tuple(r["toolsets_used"]) for r in kept}) > 1, "the balanced distribution must vary toolsets"
    return Run(run_dir, kept, policy.sent)


def load(path: Path, cache: Path) -> datasets.Dataset:
    builder = "parquet" if path.suffix == ".parquet" else "json"
    dataset = datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=str(cache))
    assert isinstance(dataset, datasets.Dataset)
    return dataset


def canonical(value: Any) -> str:
    """Exact comparison: 1, 1.0 and True differ, key order does not."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def sent_arguments(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw  # the [badargs] row: what the model sent was not JSON, and stays as sent


def record_calls(record: dict[str, Any]) -> list[tuple[str, str, Any]]:
    return [
        (c["id"], c["name"], sent_arguments(c["arguments"]))
        for turn in record["conversations"]
        if turn["from"] == "gpt"
        for c in turn["tool_calls"]
    ]


JSON_VALUED = (".messages[]", ".tools[].function.parameters", ".metadata")
"""Paths whose values datasets reads as Json (each row's own object), so their keys may differ."""
"""Paths whose values are JSON of any shape, read by ``datasets`` as one ``Json`` column."""


def key_sets(value: Any, path: str = "") -> dict[str, frozenset[str]]:
    return dict(_key_sets(value, path))


def _key_sets(value: Any, path: str = "") -> Iterator[tuple[str, frozenset[str]]]:
    """Every dict's key set in a row, by position pattern (list indices collapsed)."""
    if isinstance(value, dict):
        yield path, frozenset(value)
        for key, item in value.items():
            yield from _key_sets(item, f"{path}.{key}")
    elif isinstance(value, list):
        for item in value:
            yield from _key_sets(item, f"{path}[]")


# -- the sharegpt source itself --------------------------------------------------------------


@pytest.mark.parametrize("run", ["server"], indirect=True)
def test_the_model_s_arguments_reach_the_record_unchanged(run: Run) -> None:
    recorded = {
        c["id"]: (c["name"], c["arguments"])
        for r in run.kept
        for t in r["conversations"]
        for c in t["tool_calls"]
    }
    assert set(run.sent) <= set(recorded)
    for call_id, sent in run.sent.items():
        assert recorded[call_id] == sent, "the exact string the model sent"
    assert any('"options"' in raw for _, raw in run.sent.values()), "nested shapes must have been sent"


# -- every format through datasets --------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_loads_with_one_schema_for_every_row(run: Run, fmt: str, tmp_path: Path) -> None:
    path = run.run_dir / FORMATS[fmt]
    dataset = load(path, tmp_path)
    assert dataset.num_rows == len(run.kept)
    assert dataset["prompt_index"] == [r["prompt_index"] for r in run.kept]
    assert dataset["work_id"] == [r["work_id"] for r in run.kept]
    if path.suffix == ".jsonl":
        rows = read_jsonl(path)
        shapes = [
            {p: keys for p, keys in key_sets(row).items() if not p.startswith(JSON_VALUED)} for row in rows
        ]
        for path_pattern in {p for shape in shapes for p in shape}:
            variants = {shape[path_pattern] for shape in shapes if path_pattern in shape}
            assert len(variants) == 1, (fmt, path_pattern, variants)
    assert all(set(row) == set(dataset.column_names) for row in dataset)


@pytest.mark.parametrize("fmt", FORMATS)
def test_tool_calls_round_trip(run: Run, fmt: str, tmp_path: Path) -> None:
    dataset = load(run.run_dir / FORMATS[fmt], tmp_path)
    for record, row in zip(run.kept, dataset, strict=True):
        expected = [(name, canonical(args)) for _, name, args in record_calls(record)]
        assert [(n, canonical(a)) for n, a in calls_in(fmt, row)] == expected, record["prompt_index"]
        if fmt == "openai":
            ids = [c["id"] for m in row["messages"] for c in m.get("tool_calls", [])]
            assert ids == [call_id for call_id, _, _ in record_calls(record)]


TOOL_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


def calls_in(fmt: str, row: dict[str, Any]) -> list[tuple[str, Any]]:
    if fmt == "hermes":
        blocks = [
            json.loads(b)
            for t in row["conversations"]
            if t["from"] == "gpt"
            for b in TOOL_CALL.findall(t["value"])
        ]
        return [(b["name"], b["arguments"]) for b in blocks]
    if fmt == "openai":  # the arguments object itself, which chat templates render with tojson
        calls = [c["function"] for m in row["messages"] for c in m.get("tool_calls", [])]
        return [(c["name"], c["arguments"]) for c in calls]
    return [
        (c["name"], sent_arguments(c["arguments"]))
        for t in row["conversations"]
        for c in t["tool_calls"] or []
    ]


def test_hermes_strings_have_their_blocks_in_order(run: Run, tmp_path: Path) -> None:
    dataset = load(run.run_dir / FORMATS["hermes"], tmp_path)
    assert set(dataset.column_names) >= {"conversations", "prompt_index", "completed", "api_calls"}
    for record, row in zip(run.kept, dataset, strict=True):
        turns = row["conversations"]
        assert all(set(t) == {"from", "value"} for t in turns)
        system, human, *rest = turns
        assert system["from"] == "system" and system["value"].startswith(record["conversations"][0]["value"])
        listed = json.loads(re.search(r"<tools>\n(.*)\n</tools>", system["value"], re.DOTALL).group(1))  # type: ignore[union-attr]
        assert [tool["name"] for tool in listed] == record["tools_offered"]
        assert all(tool["parameters"]["type"] == "object" for tool in listed)
        assert human == {"from": "human", "value": record["conversations"][1]["value"]}
        assert row["metadata"] == record["metadata"], "the row's own fields, the model, the batch"

        source_gpt = [t for t in record["conversations"] if t["from"] == "gpt"]
        assert not source_gpt[-1]["tool_calls"], "the run completed with a final answer"
        position = 0
        for source in source_gpt:
            turn = rest[position]
            position += 1
            assert turn["from"] == "gpt"
            value = turn["value"]
            assert value.startswith(f"<think>\n{source['reasoning']}\n</think>")
            assert value.count("<think>") == 1 and value.count("</think>") == 1
            if source["value"].strip():
                assert source["value"] in value
            calls = TOOL_CALL.findall(value)
            assert len(calls) == len(source["tool_calls"])
            if not calls:
                assert "<tool_response>" not in value
                continue
            assert value.index("</think>") < value.index("<tool_call>")
            if source["value"].strip():
                assert value.index(source["value"]) < value.index("<tool_call>")
            assert value.endswith("</tool_call>")
            answers = rest[position]  # every answer to this turn's calls, merged into one turn
            position += 1
            assert answers["from"] == "tool"
            responses = [json.loads(b) for b in TOOL_RESPONSE.findall(answers["value"])]
            assert [r["tool_call_id"] for r in responses] == [c["id"] for c in source["tool_calls"]]
            assert [r["name"] for r in responses] == [c["name"] for c in source["tool_calls"]]
        assert position == len(rest)


def test_openai_messages_are_what_trainers_read(run: Run, tmp_path: Path) -> None:
    written = read_jsonl(run.run_dir / FORMATS["openai"])
    dataset = load(run.run_dir / FORMATS["openai"], tmp_path)
    assert isinstance(dataset.features["messages"].feature, datasets.Json), "each message its own object"
    for record, row, line in zip(run.kept, dataset, written, strict=True):
        tools = row["tools"]
        assert [t["function"]["name"] for t in tools] == record["tools_offered"]
        assert all(t["type"] == "function" and "parameters" in t["function"] for t in tools)
        assert tools == line["tools"], "each row's own schemas back, no other row's properties filled in"
        assert row["metadata"] == record["metadata"]
        messages = row["messages"]
        assert messages == line["messages"], "no null keys, in the file or after loading"
        assert not any(v is None for m in line["messages"] for v in m.values())
        assert [m["role"] for m in messages][:2] == ["system", "user"]
        for message, turn in zip(messages, record["conversations"], strict=True):
            assert message["content"] == turn["value"]
            keys = {"role", "content"}
            if message["role"] == "assistant":
                assert message.get("reasoning_content") == (turn["reasoning"] or None)
                keys |= {"reasoning_content"} if turn["reasoning"] else set()
                keys |= {"tool_calls"} if turn["tool_calls"] else set()
                assert all(c["type"] == "function" for c in message.get("tool_calls", []))
                for call, sent in zip(message.get("tool_calls", []), turn["tool_calls"], strict=True):
                    arguments = call["function"]["arguments"]
                    assert canonical(arguments) == canonical(sent_arguments(sent["arguments"]))
                    assert isinstance(arguments, dict) or arguments == sent["arguments"], "not JSON: as sent"
            if message["role"] == "tool":
                keys |= {"tool_call_id", "name"}
                assert (message["tool_call_id"], message["name"]) == (turn["tool_call_id"], turn["name"])
            assert set(message) == keys
    distinct = {json.dumps(row["tools"]) for row in dataset}
    assert len(distinct) > 1, "rows were offered different tools, all in the one list column"


def test_parquet_holds_the_sharegpt_rows(run: Run, tmp_path: Path) -> None:
    path = run.run_dir / FORMATS["parquet"]
    assert pq.read_schema(path).names == list(run.kept[0]), "the record's columns, in its order"
    for record, row in zip(run.kept, load(path, tmp_path), strict=True):
        assert json.loads(row["metadata"]) == record["metadata"]
        assert {s.pop("tool"): s for s in row["tool_stats"]} == record["tool_stats"]
        assert {s["tool"]: s["count"] for s in row["tool_error_counts"]} == record["tool_error_counts"]
        plain = {k: v for k, v in row.items() if k not in {"metadata", "tool_stats", "tool_error_counts"}}
        assert canonical(plain) == canonical({k: record[k] for k in plain})


def test_parquet_streams_row_groups_and_survives_shapes_that_vary(run: Run, tmp_path: Path) -> None:
    records = [json.loads(json.dumps(r)) for r in run.kept]
    records[0]["finish_reason"] = None  # a column null in the first row group keeps its type
    records[0]["metadata"]["difficulty"] = 3
    records[1]["metadata"]["difficulty"] = "hard"
    records[2]["metadata"]["difficulty"] = {"level": [1, None]}

    class SmallGroups(ParquetWriter):
        rows_per_group = 4

    writer = SmallGroups()
    path = tmp_path / "out.parquet"
    assert writer.write(iter(records), path) == len(records)
    assert pq.ParquetFile(path).num_row_groups == -(-len(records) // 4)
    dataset = load(path, tmp_path / "cache")
    assert [json.loads(m).get("difficulty") for m in dataset["metadata"]][:3] == [
        3,
        "hard",
        {"level": [1, None]},
    ]
    assert dataset["finish_reason"][0] is None and dataset["finish_reason"][1] == records[1]["finish_reason"]


def test_parquet_without_pyarrow_names_the_extra(tmp_path: Path) -> None:
    fake = tmp_path / "site" / "pyarrow"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('pyarrow is not installed here')\n")
    dataset = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "hello"}])
    result = trajkit(
        "run", "--dataset_file", str(dataset), "--run_name", "p", "--output_dir", str(tmp_path / "data"),
        "--writer", "parquet", env={"PYTHONPATH": str(tmp_path / "site")}, subprocess=True,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "pip install 'trajkit[parquet]'" in result.stderr
    assert not list((tmp_path / "data").glob("p/batch_*.jsonl")), "no prompt may run before the error"

    finished = tmp_path / "finished"
    finished.mkdir()
    (finished / "trajectories.jsonl").write_text("")
    result = trajkit(
        "export",
        str(finished),
        "--format",
        "parquet",
        env={"PYTHONPATH": str(tmp_path / "site")},
        subprocess=True,
    )
    assert result.returncode == 1
    assert "pip install 'trajkit[parquet]'" in result.stderr
    assert list(finished.iterdir()) == [finished / "trajectories.jsonl"]


def test_parquet_writer_raises_a_plugin_error_without_pyarrow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(PluginError, match=r"trajkit\[parquet\]"):
        ParquetWriter()


# -- trajkit export -------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_renders_a_finished_run_like_the_run_did(run: Run, fmt: str, tmp_path: Path) -> None:
    out = tmp_path / "exports" / f"export-{fmt}{Path(FORMATS[fmt]).suffix}"
    result = trajkit("export", str(run.run_dir), "--format", fmt, "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert f"{len(run.kept)} rows" in result.stderr
    produced = run.run_dir / FORMATS[fmt]
    if fmt == "parquet":
        assert pq.read_table(out).equals(pq.read_table(produced))
    else:
        assert out.read_bytes() == produced.read_bytes()
    assert load(out, tmp_path / "cache").num_rows == len(run.kept)
    assert [p.name for p in out.parent.iterdir()] == [out.name], "no temporary file left"


def test_export_defaults_to_the_writer_s_file_in_the_run_dir(run: Run, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run.run_dir, copy)
    (copy / FORMATS["hermes"]).unlink()
    result = trajkit("export", str(copy), "--format", "hermes")
    assert result.returncode == 0, result.stderr
    assert (copy / FORMATS["hermes"]).read_bytes() == (run.run_dir / FORMATS["hermes"]).read_bytes()


def test_export_of_an_unknown_format_lists_the_writers(run: Run) -> None:
    result = trajkit("export", str(run.run_dir), "--format", "alpaca", "--out", "/nonexistent/x")
    assert result.returncode == 2
    assert "unknown format 'alpaca'" in result.stderr
    assert "hermes, hf, openai, parquet, sharegpt" in result.stderr


def test_export_leaves_nothing_behind_when_it_fails(run: Run, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    copy.mkdir()
    lines = (run.run_dir / "trajectories.jsonl").read_text().splitlines()
    (copy / "trajectories.jsonl").write_text("\n".join([*lines[:3], "{torn", *lines[3:]]) + "\n")
    out = tmp_path / "out" / "data.jsonl"
    out.parent.mkdir()
    out.write_text("previous export\n")
    result = trajkit("export", str(copy), "--format", "openai", "--out", str(out))
    assert result.returncode == 1
    assert "trajectories.jsonl:4: not a JSON record" in result.stderr
    assert out.read_text() == "previous export\n", "a failed export must not touch the old file"
    assert [p.name for p in out.parent.iterdir()] == ["data.jsonl"], "no temporary file left"


def test_export_needs_a_run(tmp_path: Path) -> None:
    result = trajkit("export", str(tmp_path), "--format", "hermes")
    assert result.returncode == 1
    assert f"{tmp_path} is not a trajkit run directory (no run.json, no ledger)" in result.stderr
