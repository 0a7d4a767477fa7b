"""A conversation longer than the model's context: final for its row, in a run and in ``serve``.

No attempt of such a row can succeed with the run's settings, so it is not retried (neither by the
client, nor by the run, nor by a resume), the run says so without a resume command, and
``status``/``stats`` name the row. A resume that changes an output-affecting setting runs it again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import read_jsonl, trajkit, write_jsonl
from trajkit.model import ModelConfigError, ModelContextOverflow
from trajkit.plugins.openai.transport import Retry, answer_error, status_error
from trajkit.testing.openai_server import OpenAITestServer, RecordedRequest
from trajkit.testing.policies import CONTEXT_OVERFLOW, dialect_policy

URL = "http://127.0.0.1:1/v1/chat/completions"

OVERFLOW_MESSAGES = [
    # OpenAI, DeepSeek, Groq
    "This model's maximum context length is 8192 tokens. However, your messages resulted in 9105 tokens.",
    # OpenRouter
    "This endpoint's maximum context length is 131072 tokens. However, you requested about 140000 tokens",
    # vLLM
    "The decoder prompt (length 5000) is longer than the maximum model length of 4096. Make sure that "
    "`max_model_len` is no smaller than the number of text tokens.",
    # SGLang
    "Requested token count exceeds the model's maximum context length of 32768 tokens.",
    "The input (40000 tokens) is longer than the model's context length (32768 tokens).",
    # llama.cpp's server
    "the request exceeds the available context size, try increasing it",
    # text-generation-inference, Together
    "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 `inputs` "
    "tokens and 512 `max_new_tokens`",
    # Anthropic's OpenAI-compatible endpoint
    "prompt is too long: 210000 tokens > 200000 maximum",
    # Mistral
    "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum context length",
]


@pytest.mark.parametrize("message", OVERFLOW_MESSAGES)
def test_each_endpoints_words_for_an_overflow_are_read_as_one(message: str) -> None:
    error = status_error(400, message, {}, URL)
    assert isinstance(error, ModelContextOverflow)
    assert (error.error_class, error.retryable, error.permanent, error.stops_run) == (
        "context_length_exceeded",
        False,
        True,
        False,
    )
    assert message[:40] in str(error)


def test_the_code_alone_is_enough_and_other_bad_requests_are_not_overflows() -> None:
    assert isinstance(
        status_error(400, "too long", {}, URL, code="context_length_exceeded"), ModelContextOverflow
    )
    for message in ("temperature must be at most 2", "messages: role 'robot' is not allowed", "bad json"):
        error = status_error(400, message, {}, URL)
        assert isinstance(error, ModelConfigError) and not isinstance(error, ModelContextOverflow)
        assert not error.permanent


def test_an_overflow_inside_an_answer_of_status_200_is_one_too() -> None:
    """Routers pass some providers' failures on inside a 200 answer: an overflow stays final."""
    assert isinstance(answer_error(CONTEXT_OVERFLOW), ModelContextOverflow)
    llama = {
        "code": 400,
        "message": "the request exceeds the available context size",
        "type": "exceed_context_size_error",
    }
    assert isinstance(answer_error(llama), ModelContextOverflow)
    assert isinstance(answer_error({"code": 502, "message": "provider returned error"}), Retry)


def run(dataset: Path, out: Path, base_url: str, *extra: str) -> Any:
    return trajkit(
        "run", "--dataset_file", str(dataset), "--run_name", "r", "--output_dir", str(out),
        "--model", "m", "--base_url", base_url, "--distribution", "terminal_only", "--quiet",
        "--max_attempts", "3", "--retry_backoff", "0", *extra,
    )  # fmt: skip


def overflowed(requests: list[RecordedRequest]) -> list[RecordedRequest]:
    return [r for r in requests if r.status == 400]


@pytest.mark.parametrize("transport", ["aiohttp", "sdk"])
def test_an_overflowing_row_fails_for_good(tmp_path: Path, transport: str) -> None:
    rows = [{"prompt": f"task {i}"} for i in range(4)]
    rows.insert(2, {"prompt": "a long task [overflow]"})
    dataset = write_jsonl(tmp_path / "p.jsonl", rows)
    run_dir = tmp_path / "r"
    with OpenAITestServer(dialect_policy) as server:
        first = run(dataset, tmp_path, server.base_url, "--transport", transport)
        assert len(overflowed(server.requests)) == 1, "neither the client nor the run retries it"

        assert first.returncode == 1, first.stderr[-2000:]
        assert "--resume" not in first.stderr
        assert "1 failed for good" in first.stderr
        assert "context_length_exceeded" in first.stderr
        assert len(read_jsonl(run_dir / "trajectories.jsonl")) == 4
        [failure] = read_jsonl(run_dir / "failures.jsonl")
        assert (failure["prompt_index"], failure["error_class"], failure["permanent"]) == (
            2,
            "context_length_exceeded",
            True,
        )
        statistics = json.loads((run_dir / "statistics.json").read_text())
        assert (statistics["done"], statistics["pending"], statistics["failed_for_good"]) == (4, 0, 1)
        assert statistics["failures"]["failed_for_good_by_class"] == {"context_length_exceeded": 1}
        assert statistics["failures"]["failing"] == 0
        assert json.loads((run_dir / "checkpoint.json").read_text())["pending"] == []

        status = trajkit("status", str(run_dir))
        assert status.returncode == 0, status.stderr
        assert "failed_for_good    1" in status.stdout
        assert "pending            0" in status.stdout
        assert "failed for good: prompt 2 (context_length_exceeded)" in status.stdout
        assert "maximum context length" in status.stdout
        stats = trajkit("stats", str(run_dir))
        assert stats.returncode == 0, stats.stderr
        assert "failed for good" in stats.stdout
        assert "rows that failed for good" in stats.stdout and "This model's maximum" in stats.stdout

        if transport == "sdk":
            return
        server.reset()
        again = run(dataset, tmp_path, server.base_url, "--resume")
        assert server.requests == [], "a resume does not run the row again"
        assert again.returncode == 1 and "--resume" not in again.stderr
        assert "1 failed for good" in again.stderr

        server.reset()  # a setting that shapes the sessions changed: the row may fit now
        more = ["--max_turns", "6", "--allow_change", "max_turns"]  # a change of the run's settings, allowed
        changed = run(dataset, tmp_path, server.base_url, "--resume", *more)
        assert len(overflowed(server.requests)) == 1 and changed.returncode == 1
        assert len(read_jsonl(run_dir / "failures.jsonl")) == 2
