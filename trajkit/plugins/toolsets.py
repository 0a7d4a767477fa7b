"""Built-in toolsets ``terminal`` and ``code``: commands and programs run in the prompt's sandbox."""

from __future__ import annotations

import json
import uuid
from typing import Any

from trajkit import hookimpl
from trajkit.sandbox import cap_text
from trajkit.tools import Tool, ToolContext, ToolError, Toolset


@hookimpl
def trajkit_toolsets() -> list[Toolset]:
    return [TERMINAL, CODE]


def string_arg(args: dict[str, Any], key: str, *, required: bool = True, default: str = "") -> str:
    value = args.get(key, None if required else default)
    if not isinstance(value, str):
        raise ToolError(f"argument '{key}' must be a string" if key in args else f"missing argument '{key}'")
    return value


def _timeout(args: dict[str, Any], ctx: ToolContext) -> float:
    value = args.get("timeout", ctx.timeout)
    if not isinstance(value, int | float) or value <= 0:
        raise ToolError("argument 'timeout' must be a positive number of seconds")
    return min(float(value), ctx.timeout)


async def run_command(command: str, args: dict[str, Any], ctx: ToolContext) -> str:
    result = await ctx.sandbox.exec(command, timeout=_timeout(args, ctx), output_cap=ctx.output_cap)
    output = result.stdout + (f"\n[stderr]\n{result.stderr}" if result.stderr else "")
    if result.timed_out:
        raise ToolError(f"command timed out after {_timeout(args, ctx):g}s; partial output:\n{output}")
    return _result_json(result.exit_code, output, ctx.output_cap)


def _result_json(exit_code: int, output: str, cap: int) -> str:
    """The result as JSON of at most ``cap`` bytes: the output is cut (head and tail) to fit, so
    the model never sees JSON cut in the middle. Escapes make JSON longer than the text, and
    stdout and stderr are capped each, so the output's own budget shrinks until it fits."""
    budget = cap
    while True:
        text = json.dumps({"exit_code": exit_code, "output": cap_text(output, budget)}, ensure_ascii=False)
        size = len(text.encode())
        if size <= cap or budget <= 64:
            return text
        budget = max(64, budget * cap // size - 16)  # escapes expand the text about evenly


async def terminal(args: dict[str, Any], ctx: ToolContext) -> str:
    return await run_command(string_arg(args, "command"), args, ctx)


async def execute_code(args: dict[str, Any], ctx: ToolContext) -> str:
    code = string_arg(args, "code")
    script = f".trajkit-snippet-{uuid.uuid4().hex[:12]}.py"
    await ctx.sandbox.write_file(script, code.encode())
    try:
        return await run_command(f"python3 {script}", args, ctx)
    finally:
        await ctx.sandbox.exec(f"rm -f {script}", timeout=30)


def object_schema(required: list[str], **properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


STRING = {"type": "string"}
TIMEOUT = {"type": "number", "description": "seconds before the command is killed"}

TERMINAL = Toolset(
    "terminal",
    "run shell commands",
    (
        Tool(
            "terminal",
            "Run a shell command in the working directory and return its exit code and output.",
            object_schema(["command"], command=STRING, timeout=TIMEOUT),
            terminal,
        ),
    ),
)

CODE = Toolset(
    "code",
    "run Python snippets",
    (
        Tool(
            "execute_code",
            "Run a Python 3 program and return its exit code and output.",
            object_schema(["code"], code=STRING, timeout=TIMEOUT),
            execute_code,
        ),
    ),
)
