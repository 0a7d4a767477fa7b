"""Reading assistant messages in every dialect real endpoints use."""

from __future__ import annotations

from trajkit.model import parse_assistant_message, split_reasoning
from trajkit.sandbox import CappedBuffer, cap_text


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


def test_structured_and_tagged_reasoning_are_both_kept() -> None:
    message = parse_assistant_message({"content": "<think>tagged</think>ok", "reasoning": "native"})
    assert message.reasoning == "native\n\ntagged"


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
