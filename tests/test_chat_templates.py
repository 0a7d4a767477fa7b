"""Exported rows rendered through the chat templates of the models people fine-tune for tool calling.

A real run against the OpenAI-compatible test server, with the ``balanced`` distribution (so the
tools differ from row to row), parallel tool calls, reasoning on every turn and unicode in the
prompts and the arguments, is exported as ``openai`` and ``hermes`` rows, loaded through
``datasets`` as a trainer loads them, and rendered through each template in
``tests/data/chat_templates/`` (the models' own ``chat_template`` text; ``README.md`` there says
where each file came from) the way ``transformers`` renders them: a sandboxed jinja2 environment
with ``trim_blocks``, ``lstrip_blocks``, its ``tojson`` (no key sorting, no ASCII escaping) and
``raise_exception``. Every tool call of the run must appear in the text exactly once, with its
name, and with its arguments as the JSON object the model sent: not a quoted string of JSON.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import datasets
import jinja2
import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tests.helpers import read_jsonl, trajkit, write_jsonl
from tests.test_writers import ShapesPolicy
from trajkit.plugins.scripted_model import split_task
from trajkit.testing.openai_server import OpenAITestServer

datasets.disable_progress_bars()

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
FAMILIES = ["qwen2.5", "qwen3", "llama3.1", "hermes-2-pro", "hermes-3", "mistral-nemo"]
SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}
UNICODE = "Tâche: ranger le dépôt ✓ — 日本語のメモ 🚀"


# -- the template engine, as transformers sets it up -------------------------------------------


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@cache
def template(family: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env.from_string((TEMPLATES / f"{family}.jinja").read_text(encoding="utf-8"))


def render(family: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    return template(family).render(
        messages=messages, tools=tools, add_generation_prompt=False, **SPECIAL_TOKENS
    )


# -- the run ----------------------------------------------------------------------------------


@dataclass
class Exported:
    kept: list[dict[str, Any]]
    openai: datasets.Dataset
    hermes: datasets.Dataset


def policy_for(shapes: ShapesPolicy) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """ShapesPolicy (parallel calls, nested and unicode arguments, reasoning on every turn); rows
    marked ``[single]`` make one call per turn, as Llama 3.1's template requires."""

    def policy(body: dict[str, Any]) -> dict[str, Any]:
        reply = shapes(body)
        prompt, _ = split_task(body["messages"])
        if "[single]" in prompt and reply.get("tool_calls"):
            reply["tool_calls"] = reply["tool_calls"][:1]
        return reply

    return policy


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    tmp = tmp_path_factory.mktemp("templates")
    rows = [
        {
            "prompt": f"{UNICODE} #{i} [shapes]{' [single]' if i % 3 == 0 else ''}",
            "source": "unicode-set" if i % 2 else "plain-set",
            "difficulty": i % 4,
        }
        for i in range(12)
    ]
    dataset = write_jsonl(tmp / "prompts.jsonl", rows)
    with OpenAITestServer(policy_for(ShapesPolicy()), models={"test-model"}) as server:
        result = trajkit(
            "run", "--dataset_file", str(dataset), "--run_name", "t", "--output_dir", str(tmp / "data"),
            "--distribution", "balanced", "--num_workers", "6", "--quiet",
            "--model", "test-model", "--base_url", server.base_url,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    run_dir = tmp / "data" / "t"
    kept = read_jsonl(run_dir / "trajectories.jsonl")
    assert len(kept) == len(rows), (run_dir / "rejected.jsonl").read_text()
    loaded = {}
    for fmt in ("openai", "hermes"):
        out = tmp / f"{fmt}.jsonl"
        result = trajkit("export", str(run_dir), "--format", fmt, "--out", str(out))
        assert result.returncode == 0, result.stderr
        loaded[fmt] = datasets.load_dataset(
            "json", data_files=str(out), split="train", cache_dir=str(tmp / f"cache-{fmt}")
        )
    return Exported(kept, loaded["openai"], loaded["hermes"])


def test_the_run_has_what_the_templates_must_survive(exported: Exported) -> None:
    calls_per_turn = [
        len(t["tool_calls"]) for r in exported.kept for t in r["conversations"] if t["from"] == "gpt"
    ]
    assert max(calls_per_turn) >= 2, "parallel tool calls"
    assert any(n == 1 for n in calls_per_turn)
    assert len({tuple(r["tools_offered"]) for r in exported.kept}) > 1, "tools differ per row"
    assert all(t["reasoning"] for r in exported.kept for t in r["conversations"] if t["from"] == "gpt")
    assert any(
        "é ✓" in c["arguments"] for r in exported.kept for t in r["conversations"] for c in t["tool_calls"]
    )


# -- what a rendering must hold -----------------------------------------------------------------


def expected_calls(record: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        (call["name"], json.loads(call["arguments"]))
        for turn in record["conversations"]
        if turn["from"] == "gpt"
        for call in turn["tool_calls"]
    ]


CHATML_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
LLAMA_CALL = re.compile(
    r"<\|start_header_id\|>assistant<\|end_header_id\|>\n\n(\{.*?\})<\|eot_id\|>", re.DOTALL
)
MISTRAL_CALLS = re.compile(r"\[TOOL_CALLS\](\[.*?\])</s>", re.DOTALL)


def rendered_calls(family: str, text: str) -> list[tuple[str, Any]]:
    """(name, arguments) of every tool call in a rendering, in order, decoded once."""
    if family == "llama3.1":
        blocks = [json.loads(b) for b in LLAMA_CALL.findall(text)]
        return [(b["name"], b["parameters"]) for b in blocks if "parameters" in b]
    if family == "mistral-nemo":
        return [(c["name"], c["arguments"]) for b in MISTRAL_CALLS.findall(text) for c in json.loads(b)]
    after_system = text.split("<|im_end|>", 1)[1]  # the system turn shows a <tool_call> example
    return [
        (b["name"], b["arguments"])
        for b in (json.loads(block) for block in CHATML_CALL.findall(after_system))
    ]


def check_rendering(family: str, text: str, record: dict[str, Any]) -> None:
    expected = expected_calls(record)
    assert expected, "every row called tools"
    got = rendered_calls(family, text)
    assert [(n, canonical(a)) for n, a in got] == [(n, canonical(a)) for n, a in expected], family
    assert all(isinstance(arguments, dict) for _, arguments in got), (
        "arguments decode to objects, not strings"
    )
    counts = Counter((name, canonical(arguments)) for name, arguments in expected)
    for (name, _), n in counts.items():
        occurrences = sum(1 for got_name, _ in got if got_name == name)
        assert occurrences >= n
    for name, arguments in expected:
        encoded = json.dumps(arguments, ensure_ascii=False)
        assert text.count(encoded) == counts[(name, canonical(arguments))], (family, encoded)
        assert json.dumps(encoded, ensure_ascii=False) not in text, "double-encoded arguments"
    assert UNICODE in text, "unicode as written, not escaped"


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


# -- openai rows ---------------------------------------------------------------------------------


def trainer_messages(row: dict[str, Any]) -> list[dict[str, Any]]:
    """What TRL and Axolotl hand the template: null keys dropped (Arrow fills them in)."""
    return [{k: v for k, v in m.items() if v is not None} for m in row["messages"]]


def mistral_ids(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mistral's template demands 9-character alphanumeric call ids; a Mistral fine-tune maps them."""
    ids: dict[str, str] = {}

    def short(call_id: str) -> str:
        return ids.setdefault(call_id, f"c{len(ids):08d}")

    out = []
    for message in messages:
        message = dict(message)
        if "tool_calls" in message:
            message["tool_calls"] = [{**c, "id": short(c["id"])} for c in message["tool_calls"]]
        if "tool_call_id" in message:
            message["tool_call_id"] = short(message["tool_call_id"])
        out.append(message)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_openai_rows_render_every_tool_call_once_and_correctly_encoded(
    exported: Exported, family: str
) -> None:
    rendered = refused = 0
    for record, row in zip(exported.kept, exported.openai, strict=True):
        messages = trainer_messages(row)
        tools = json.loads(row["tools"])
        if family == "mistral-nemo":
            messages = mistral_ids(messages)
        parallel = any(len(m.get("tool_calls") or []) > 1 for m in messages)
        if family == "llama3.1" and parallel:
            with pytest.raises(jinja2.exceptions.TemplateError, match="single tool-calls at once"):
                render(family, messages, tools)
            refused += 1
            continue
        text = render(family, messages, tools)
        check_rendering(family, text, record)
        for tool in tools:  # the offered tools reach the prompt
            assert tool["function"]["name"] in text
        if family == "qwen3":  # reasoning_content becomes each turn's <think> block
            for turn in record["conversations"]:
                if turn["from"] == "gpt":
                    assert text.count(f"<think>\n{turn['reasoning']}\n</think>") == 1
        rendered += 1
    assert rendered >= 4, "the [single] rows render in every family"
    if family == "llama3.1":
        assert refused, (
            "Llama 3.1's own template refuses parallel calls; that is the template, not the export"
        )
    else:
        assert rendered == len(exported.kept)


def test_string_arguments_are_what_double_encodes(exported: Exported) -> None:
    """Why the export carries objects: the OpenAI wire format's strings come out quoted."""
    record, row = next(
        (r, w)
        for r, w in zip(exported.kept, exported.openai, strict=True)
        if "[single]" in r["conversations"][1]["value"]
    )
    messages = trainer_messages(row)
    for message in messages:
        for call in message.get("tool_calls") or []:
            call["function"] = {**call["function"], "arguments": json.dumps(call["function"]["arguments"])}
    text = render("qwen2.5", messages, json.loads(row["tools"]))
    with pytest.raises(AssertionError):
        check_rendering("qwen2.5", text, record)
    assert all(isinstance(arguments, str) for _, arguments in rendered_calls("qwen2.5", text))


def test_metadata_is_in_every_exported_row(exported: Exported) -> None:
    for dataset in (exported.openai, exported.hermes):
        for record, row in zip(exported.kept, dataset, strict=True):
            assert row["metadata"] == record["metadata"]
            assert {"source", "difficulty", "model"} <= set(row["metadata"])


# -- hermes rows ---------------------------------------------------------------------------------

HERMES_ROLES = {"system": "system", "human": "user", "gpt": "assistant", "tool": "tool"}


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "mistral-nemo"])
def test_hermes_rows_render_every_tool_call_once(exported: Exported, family: str) -> None:
    """The hermes strings carry their tags in the text, so every template passes the calls through
    verbatim. (Mistral's template cannot take them: it wants a call id on every tool message, and
    the hermes rows merge one turn's answers into one tool turn.)"""
    for record, row in zip(exported.kept, exported.hermes, strict=True):
        messages = [{"role": HERMES_ROLES[t["from"]], "content": t["value"]} for t in row["conversations"]]
        # the tools are listed in the row's system text; Hermes' tool_use template wants a list
        text = render(family, messages, [] if family.startswith("hermes") else None)
        after_system = text if family == "llama3.1" else text.split("<|im_end|>", 1)[1]
        got = [json.loads(b) for b in CHATML_CALL.findall(after_system)]
        assert [(b["name"], canonical(b["arguments"])) for b in got] == [
            (n, canonical(a)) for n, a in expected_calls(record)
        ], family
        assert all(isinstance(b["arguments"], dict) for b in got)
        assert UNICODE in text
