"""``trajkit serve`` as a real process for tests and benchmarks, and the model policy behind it."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from trajkit.plugins.scripted_model import split_task
from trajkit.testing.policies import dialect_policy

MODEL = "test-model"
TURN_USAGE = {"prompt_tokens": 100, "completion_tokens": 10}
"""Every model answer of the policy reports this usage, so a session's sum is known exactly."""


def serve_policy(body: dict[str, Any]) -> dict[str, Any]:
    """The scripted agent (with reasoning, in the prompt's dialect), plus directives for serving:

    ``[client-tool]``: the first turn calls the client's ``get_weather``; once its result is
    back, the answer quotes it. ``[slow]``: the first turn runs ``sleep 30`` in the terminal.
    """
    messages = body["messages"]
    prompt, since = split_task(messages)
    first = not any(m.get("role") == "assistant" for m in since)
    reply: dict[str, Any]
    if "[client-tool]" in prompt and first:
        call = {
            "id": "call_w",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
        reply = {"content": None, "reasoning": "The client can tell the weather.", "tool_calls": [call]}
    elif "[client-tool]" in prompt:
        result = next(m["content"] for m in reversed(since) if m.get("role") == "tool")
        reply = {"content": f"The weather: {result}", "reasoning": "The client answered."}
    elif "[slow]" in prompt and first:
        call = {
            "id": "call_s",
            "type": "function",
            "function": {"name": "terminal", "arguments": '{"command": "sleep 30"}'},
        }
        reply = {"content": None, "reasoning": "This takes a while.", "tool_calls": [call]}
    else:
        reply = dialect_policy(body)
    return {**reply, "_usage": dict(TURN_USAGE)}


class ServeProcess:
    """``python -m trajkit serve ... --port 0``, ready once it prints its address."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, ready_timeout: float = 60) -> None:
        full_env = {
            k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "TRAJKIT_SERVER_KEY"
        }
        full_env.update(env or {})
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trajkit", "serve", "--port", "0", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=full_env,
        )
        lines: queue.Queue[str] = queue.Queue()
        assert self.process.stdout is not None
        stdout = self.process.stdout
        threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()
        try:
            line = lines.get(timeout=ready_timeout)
        except queue.Empty:
            self.stop()
            raise AssertionError(f"trajkit serve did not start: {self.stderr}") from None
        if not line.startswith("READY "):
            self.stop()
            raise AssertionError(f"trajkit serve did not start: {line!r} {self.stderr}")
        self.base_url = line.split()[1]
        self.origin = self.base_url.removesuffix("/v1")
        self.stderr = ""

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM (a graceful stop: the final merge of a recorded run), then wait."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            _, self.stderr = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, self.stderr = self.process.communicate()
        return self.process.returncode

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def write_key(path: Path, key: str) -> Path:
    path.write_text(key + "\n")
    return path
