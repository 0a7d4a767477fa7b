"""The trajectory record built as JSON directly must be exactly what the pydantic models give.

``record_json`` (the runner's path) skips the models when every value already has its JSON type;
the same record sent through the models is the reference. Both are built here from the same
session for records of many shapes and compared key by key, order and types included, so the
two cannot drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from trajkit.agent import ConversationResult, ToolStat
from trajkit.model import Message, Usage
from trajkit.record import trajectory as records
from trajkit.record.trajectory import TrajectoryRecord, record_json

RUN_TOOLS = ["execute_code", "patch", "read_file", "search_files", "terminal", "write_file"]
SYSTEM = "You are a capable assistant working in a sandboxed environment."


def call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant(
    content: str | None, reasoning: Any = None, calls: list[dict[str, Any]] | None = None
) -> Message:
    """An assistant message as the agent saves it."""
    message: Message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    message["reasoning"] = reasoning
    return message


def tool(call_id: str, name: str, content: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": content, "name": name}


def three_tool_calls(reasoning: bool = True) -> list[Message]:
    messages: list[Message] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Write a script that prints the first ten primes and run it."},
    ]
    for step, command in enumerate(("ls -la", "cat notes.txt", "python3 solve.py"), 1):
        call_id = f"call_{step}_0"
        messages.append(
            assistant(
                None,
                f"Step {step}: run {command}." if reasoning else None,
                [call(call_id, "terminal", json.dumps({"command": command}))],
            )
        )
        messages.append(tool(call_id, "terminal", json.dumps({"exit_code": 0, "output": f"line {step}\n"})))
    messages.append(assistant("Done: the script printed 2 3 5 7 11 13 17 19 23 29.", "All good."))
    return messages


def session(
    messages: list[Message],
    *,
    stats: dict[str, ToolStat] | None = None,
    usage: Usage | None = None,
    completed: bool = True,
    finish_reason: str | None = "stop",
    invalid_tool_calls: int = 0,
) -> ConversationResult:
    return ConversationResult(
        final_response=None,
        messages=messages,
        api_calls=sum(m["role"] == "assistant" for m in messages),
        completed=completed,
        usage=usage if usage is not None else Usage(5321, 412, 0.00123),
        tool_stats=stats if stats is not None else {"terminal": ToolStat(3, 3, 0)},
        invalid_tool_calls=invalid_tool_calls,
        finish_reason=finish_reason,
    )


def fields(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "work_id": "0123456789abcdef0123.0",
        "prompt_id": "0123456789abcdef0123",
        "prompt_index": 7,
        "metadata": {
            "source": "unit",
            "batch_num": 3,
            "timestamp": "2026-01-02T03:04:05.678901+00:00",
            "model": "provider/model",
        },
        "toolsets_used": ["code", "file", "terminal"],
        "tools_offered": list(RUN_TOOLS),
        "tool_schemas_key": "0123456789abcdef",
        "duration_s": 4.321,
        "attempt": 1,
        "backend": "local",
        "image": None,
        "digest": None,
    }
    return {**base, **overrides}


def failing_tools() -> ConversationResult:
    messages: list[Message] = [
        {"role": "user", "content": "Fix the file."},
        assistant(
            None,
            "Two calls at once.",
            [
                call("call_1_0", "read_file", '{"path": "a.txt"}'),
                call("call_1_1", "patch", "{not json"),
                call("call_1_2", "browse", "{}"),
            ],
        ),
        tool("call_1_0", "read_file", "Error: a.txt does not exist"),
        tool("call_1_1", "patch", "Error: arguments are not valid JSON; send a JSON object."),
        tool("call_1_2", "browse", "Error: tool 'browse' is not available."),
        assistant("", None, [call("call_2_0", "write_file", '{"path": "a.txt", "content": ""}')]),
        tool("call_2_0", "write_file", '{"path": "a.txt", "bytes_written": 0}'),
        assistant("I could not fix it.", ""),
    ]
    stats = {name: ToolStat() for name in RUN_TOOLS}
    stats["read_file"] = ToolStat(1, 0, 1)
    stats["patch"] = ToolStat(1, 0, 1)
    stats["write_file"] = ToolStat(1, 1, 0)
    return session(messages, stats=stats, invalid_tool_calls=1)


def cut_off() -> ConversationResult:
    messages = three_tool_calls()[:-1]
    return session(messages, completed=False, finish_reason="max_turns", usage=Usage())


# Shapes that take the direct path: every value already has its JSON type.
PLAIN: dict[str, Callable[[], tuple[ConversationResult, dict[str, Any]]]] = {
    "three tool calls with reasoning": lambda: (session(three_tool_calls()), fields()),
    "no reasoning": lambda: (session(three_tool_calls(reasoning=False)), fields()),
    "tool failures and an invalid call": lambda: (failing_tools(), fields(attempt=3)),
    "usage missing, cut off at max_turns": lambda: (cut_off(), fields()),
    "answer cut off by length": lambda: (
        session(three_tool_calls(), completed=False, finish_reason="length"),
        fields(),
    ),
    "no finish reason, no cost": lambda: (
        session(three_tool_calls(), finish_reason=None, usage=Usage(10, 0, None)),
        fields(),
    ),
    "answer only, nothing offered": lambda: (
        session(
            [{"role": "user", "content": "Say hi."}, assistant("hi é ✓ 你好 \U0001f600")],
            stats={},
        ),
        fields(toolsets_used=[], tools_offered=[]),
    ),
    "image with digest": lambda: (
        session(three_tool_calls()),
        fields(backend="docker", image="python:3.11-slim", digest="sha256:" + "ab" * 32),
    ),
    "dataset fields of every JSON shape": lambda: (
        session(three_tool_calls()),
        fields(
            metadata={
                "tags": ["x", 2, None, True, 1.5],
                "nested": {"depth": [{"k": -0.0}, {}], "empty": []},
                "big": 2**70,
                "text": "line\n\ttab \ud800",
                "batch_num": 0,
                "timestamp": "t",
                "model": "m",
            }
        ),
    ),
    "content None on the answer": lambda: (
        session([{"role": "user", "content": "?"}, assistant(None)]),
        fields(),
    ),
    "a sample with a score, fewer toolsets used than offered": lambda: (
        session(three_tool_calls()),
        fields(
            sample=3,
            toolsets_used=["terminal"],
            toolsets_offered=["file", "terminal"],
            score={
                "passed": False,
                "value": 0.5,
                "checks": [
                    {"scorer": "answer", "passed": True, "value": 1.0, "detail": "answer '4' given"},
                    {"scorer": "command", "passed": False, "value": 0.0, "detail": "exit 1\nE ✗"},
                ],
            },
        ),
    ),
}


# Shapes the models coerce or reject: the direct path must hand them to the models.
ODD: dict[str, Callable[[], tuple[ConversationResult, dict[str, Any]]]] = {
    "integer cost": lambda: (session(three_tool_calls(), usage=Usage(3, 4, 0)), fields()),
    "float token counts": lambda: (session(three_tool_calls(), usage=Usage(3.0, 4.0, 0.5)), fields()),  # type: ignore[arg-type]
    "infinite cost": lambda: (session(three_tool_calls(), usage=Usage(3, 4, float("inf"))), fields()),
    "NaN and a tuple among the dataset fields": lambda: (
        session(three_tool_calls()),
        fields(metadata={"score": float("nan"), "pair": (1, 2), "model": "m"}),
    ),
    "integer duration": lambda: (session(three_tool_calls()), fields(duration_s=4)),
    "a score with an integer value": lambda: (
        session(three_tool_calls()),
        fields(score={"passed": True, "value": 1, "checks": []}),
    ),
    "a score's keys in another order": lambda: (
        session(three_tool_calls()),
        fields(
            score={
                "checks": [{"value": 1.0, "passed": True, "scorer": "s", "detail": ""}],
                "value": 1.0,
                "passed": True,
            }
        ),
    ),
    "reasoning that is no string": lambda: (
        session([{"role": "user", "content": "?"}, assistant("a", reasoning=42)]),
        fields(),
    ),
    "arguments that are no string": lambda: (
        session(
            [
                {"role": "user", "content": "?"},
                assistant(None, None, [call("c", "terminal", {"command": "ls"})]),
            ]
        ),
        fields(),
    ),
    "content that is no string": lambda: (
        session([{"role": "user", "content": [{"type": "text", "text": "?"}]}, assistant("a")]),
        fields(),
    ),
}


def assert_identical(got: Any, want: Any, where: str = "record") -> None:
    """Equal values of the same types, and dict keys in the same order, all the way down."""
    assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, dict):
        assert list(got) == list(want), f"{where}: keys {list(got)} != {list(want)}"
        for key in want:
            assert_identical(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert len(got) == len(want), f"{where}: {len(got)} items != {len(want)}"
        for position, (a, b) in enumerate(zip(got, want, strict=True)):
            assert_identical(a, b, f"{where}[{position}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def reference(result: ConversationResult, kwargs: dict[str, Any]) -> dict[str, Any] | type[Exception]:
    """The record as the models give it: record_json told that nothing is plain."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(records, "_plain_scalars", lambda *args: False)
        try:
            return record_json(result, RUN_TOOLS, **kwargs)
        except (ValidationError, TypeError) as exc:
            return type(exc)


def validated_through_models(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Record every record ``record_json`` hands to the models."""
    handed: list[dict[str, Any]] = []

    def model_validate(data: dict[str, Any]) -> TrajectoryRecord:
        handed.append(data)
        return TrajectoryRecord.model_validate(data)

    monkeypatch.setattr(records, "TrajectoryRecord", SimpleNamespace(model_validate=model_validate))
    return handed


@pytest.mark.parametrize("shape", PLAIN)
def test_the_direct_record_is_the_model_s_dump(shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    result, kwargs = PLAIN[shape]()
    want = reference(result, kwargs)
    assert isinstance(want, dict)
    handed = validated_through_models(monkeypatch)
    got = record_json(result, RUN_TOOLS, **kwargs)
    assert handed == [], "a plain record went through the models"
    assert_identical(got, want)
    assert_identical(TrajectoryRecord.model_validate(got).to_json_dict(), got)


@pytest.mark.parametrize("shape", ODD)
def test_values_the_models_would_change_go_through_the_models(
    shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, kwargs = ODD[shape]()
    want = reference(result, kwargs)
    handed = validated_through_models(monkeypatch)
    if isinstance(want, dict):
        got = record_json(result, RUN_TOOLS, **kwargs)
        assert_identical(got, want)
    else:
        with pytest.raises(want):
            record_json(result, RUN_TOOLS, **kwargs)
    assert len(handed) == 1


def test_the_record_shares_no_mutable_part_with_its_inputs() -> None:
    result, kwargs = PLAIN["dataset fields of every JSON shape"]()
    record = record_json(result, RUN_TOOLS, **kwargs)
    record["metadata"]["tags"].append("changed")
    record["metadata"]["nested"]["depth"][1]["k"] = 1
    record["tools_offered"].append("changed")
    assert kwargs["metadata"]["tags"] == ["x", 2, None, True, 1.5]
    assert kwargs["metadata"]["nested"]["depth"][1] == {}
    assert kwargs["tools_offered"] == RUN_TOOLS
