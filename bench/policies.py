"""Load-server policies for the benchmarks (``--policy bench.policies:NAME``)."""

from __future__ import annotations

import json
import uuid
from typing import Any

FILE_CALLS = 3


def file_tools(body: dict[str, Any]) -> dict[str, Any]:
    """Three tool turns on the file tools (write, read, write: no process is started), then an answer."""
    turn = sum(1 for m in body.get("messages") or () if isinstance(m, dict) and m.get("role") == "assistant")
    if turn >= FILE_CALLS:
        return {"content": "done"}
    if turn % 2 == 0:
        name, arguments = "write_file", {"path": f"notes/n{turn}.txt", "content": "hello\n"}
    else:
        name, arguments = "read_file", {"path": f"notes/n{turn - 1}.txt"}
    call = {
        "id": f"call_{turn}_{uuid.uuid4().hex[:12]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    return {"content": None, "tool_calls": [call]}
