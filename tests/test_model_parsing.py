"""Reading assistant messages in every dialect real endpoints use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.helpers import read_jsonl, trajkit, write_jsonl
from trajkit.model import parse_assistant_message, split_reasoning
from trajkit.sandbox import CappedBuffer, cap_text
from trajkit.testing.openai_server import OpenAITestServer


def test_reasoning_fields_of_each_dialect() -> None:
    assert parse_assistant_message({"content": "x", "reasoning": "r1"}).reasoning == "r1"
    assert parse_assistant_message({"content": "x", "reasoning_content": "r2"}).reasoning == "r2"
    details = [{"type": "reasoning.encrypted", "data": "zzz"}, {"type": "reasoning.summary", "summary": "r3"}]
    assert parse_assistant_message({"content": "x", "reasoning_details": details}).reasoning == "r3"
    assert parse_assistant_message({"content": "plain"}).reasoning is None


def test_tags_move_out_of_the_content() -> None:
    message = parse_assistant_message({"content": "<think>plan A</think>Answer."})
    assert (message.content, message.reasoning) == ("Answer.", "plan A")
    message = parse_assistant_message({"content": "<REASONING_SCRATCHPAD>s</REASONING_SCRATCHPAD>\nDone"})
    assert (message.content, message.reasoning) == ("Done", "s")
    assert split_reasoning("<think>cut off by the length limit") == ("", "cut off by the length limit")
    assert split_reasoning("a < b and c > d") == ("a < b and c > d", None)


def test_tags_are_content_when_the_endpoint_sent_structured_reasoning() -> None:
    """An endpoint that parsed the reasoning itself hands back the answer as the model wrote it:
    a tag in it is text the model meant, even at the start."""
    explained = "Qwen3 wraps its reasoning in <think> tags; the server strips them before </think> ends."
    for field in ("reasoning_content", "reasoning"):
        message = parse_assistant_message({"content": explained, field: "The user asks about tags."})
        assert (message.content, message.reasoning) == (explained, "The user asks about tags.")
    details = [{"type": "reasoning.text", "text": "native"}]
    message = parse_assistant_message({"content": "<think>literal</think> ok", "reasoning_details": details})
    assert (message.content, message.reasoning) == ("<think>literal</think> ok", "native")


def test_tags_are_reasoning_only_at_the_start_of_the_content() -> None:
    """Where a dialect puts its block; the same tags anywhere else are text, closing tags included."""
    explained = "Qwen3 wraps its reasoning in <think> tags; the text after </think> is the answer."
    assert split_reasoning(explained) == (explained, None)
    message = parse_assistant_message({"content": f"<think>plan</think>\n{explained}"})
    assert (message.content, message.reasoning) == (explained, "plan")
    assert split_reasoning("  \n<THINK>up</THINK> fine") == ("fine", "up")
    assert split_reasoning("<thinking>a</thinking>b <think>c</think>") == ("b <think>c</think>", "a")
    assert split_reasoning("<think>only</think>") == ("", "only")
    assert split_reasoning("Done. </think>") == ("Done. </think>", None)
    # a block is closed by its own tag only
    assert split_reasoning("<REASONING_SCRATCHPAD>s </think></REASONING_SCRATCHPAD>x") == ("x", "s </think>")


def test_literal_tags_never_reach_another_answer() -> None:
    """A parse reads one message: text of one answer is never carried into the next."""
    first = parse_assistant_message({"content": "Open with <think> and close later"})
    second = parse_assistant_message({"content": "then </think> closes it. Answer."})
    assert first.content == "Open with <think> and close later" and first.reasoning is None
    assert second.content == "then </think> closes it. Answer." and second.reasoning is None


def test_tool_calls_with_odd_shapes() -> None:
    message = parse_assistant_message(
        {
            "content": None,
            "tool_calls": [
                {"function": {"name": "terminal", "arguments": {"command": "ls"}}},
                {"id": "x", "function": {"name": "read_file"}},
            ],
        },
        {"prompt_tokens": 10, "completion_tokens": 5, "cost": 0.25},
        "tool_calls",
    )
    assert [(c.id, c.name, c.arguments) for c in message.tool_calls] == [
        ("call_0", "terminal", '{"command": "ls"}'),
        ("x", "read_file", "{}"),
    ]
    assert (message.usage.prompt_tokens, message.usage.completion_tokens, message.usage.cost) == (10, 5, 0.25)


def test_capped_buffer_keeps_head_and_tail_in_bounded_memory() -> None:
    buffer = CappedBuffer(100)
    for i in range(1000):
        buffer.feed(f"{i:05d}\n".encode())
    text = buffer.text()
    assert text.startswith("00000\n") and text.endswith("00999\n")
    assert "bytes truncated" in text
    assert len(buffer.head) + len(buffer.tail) <= 100
    assert cap_text("short", 100) == "short"


EXPLAINED = "Qwen3 wraps its reasoning in <think> tags; a parser takes what comes before </think>."


def tagged_answers(body: dict[str, Any]) -> dict[str, Any]:
    """Answers whose content mentions the tags: with ``reasoning_content`` for prompts saying so,
    else with the reasoning as a leading block."""
    prompt = body["messages"][-1]["content"]
    if "structured" in prompt:
        return {"content": EXPLAINED, "reasoning_content": "The user asks how Qwen3 marks reasoning."}
    return {"content": f"<think>Explain the tags.</think>\n{EXPLAINED}"}


def test_answers_about_tags_reach_the_records_whole(tmp_path: Path) -> None:
    """Through the real client and run: every record's answer is the model's, tags and all."""
    rows = [{"prompt": f"{kind} question {i}"} for i in range(3) for kind in ("structured", "tagged")]
    dataset = write_jsonl(tmp_path / "p.jsonl", rows)
    with OpenAITestServer(tagged_answers) as server:
        result = trajkit(
            "run", "--dataset_file", str(dataset), "--run_name", "r", "--output_dir", str(tmp_path),
            "--model", "m", "--base_url", server.base_url, "--distribution", "file_only", "--quiet",
        )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    records = read_jsonl(tmp_path / "r" / "trajectories.jsonl")
    assert len(records) == 6
    for record in records:
        answer = [t for t in record["conversations"] if t["from"] == "gpt"][-1]
        expected = (
            "The user asks how Qwen3" if "structured" in record["conversations"][1]["value"] else "Explain"
        )
        assert answer["value"] == EXPLAINED, record["conversations"]
        assert answer["reasoning"].startswith(expected)
