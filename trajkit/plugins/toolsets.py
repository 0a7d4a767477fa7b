"""Built-in toolsets: ``terminal``, ``file`` and ``code``, each running against the prompt's sandbox."""

from __future__ import annotations

import json
import shlex
import uuid
from typing import Any

from trajkit import hookimpl
from trajkit.sandbox import (
    DEFAULT_READ_LIMIT,
    FileTooLarge,
    NotARegularFile,
    OutsideSandbox,
    cap_text,
    truncation_marker,
)
from trajkit.tools import Tool, ToolContext, ToolError, Toolset

MAX_FILE_BYTES = DEFAULT_READ_LIMIT
"""Most bytes ``write_file`` and ``patch`` hold or write: a session cannot grow the runner past it."""


@hookimpl
def trajkit_toolsets() -> list[Toolset]:
    return [TERMINAL, FILE, CODE]


def _string(args: dict[str, Any], key: str, *, required: bool = True, default: str = "") -> str:
    value = args.get(key, None if required else default)
    if not isinstance(value, str):
        raise ToolError(f"argument '{key}' must be a string" if key in args else f"missing argument '{key}'")
    return value


def _timeout(args: dict[str, Any], ctx: ToolContext) -> float:
    value = args.get("timeout", ctx.timeout)
    if not isinstance(value, int | float) or value <= 0:
        raise ToolError("argument 'timeout' must be a positive number of seconds")
    return min(float(value), ctx.timeout)


async def _run(command: str, args: dict[str, Any], ctx: ToolContext) -> str:
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
    return await _run(_string(args, "command"), args, ctx)


async def read_file(args: dict[str, Any], ctx: ToolContext) -> str:
    path = _string(args, "path")
    try:
        data = await ctx.sandbox.read_file(path, limit=ctx.output_cap)
    except FileTooLarge as big:
        # Only the head and tail were read: the file's size decides, never the memory it would take.
        omitted = big.size - len(big.head) - len(big.tail)
        return (
            big.head.decode("utf-8", "replace")
            + truncation_marker(omitted)
            + big.tail.decode("utf-8", "replace")
        )
    except OSError as exc:
        raise ToolError(_file_problem("read", path, exc)) from exc
    return cap_text(data.decode("utf-8", "replace"), ctx.output_cap)


async def write_file(args: dict[str, Any], ctx: ToolContext) -> str:
    path, content = _string(args, "path"), _string(args, "content")
    data = content.encode()
    if len(data) > MAX_FILE_BYTES:
        raise ToolError(f"content is {len(data)} bytes; the file tools write at most {MAX_FILE_BYTES}")
    try:
        await ctx.sandbox.write_file(path, data)
    except OSError as exc:
        raise ToolError(_file_problem("write", path, exc)) from exc
    return json.dumps({"path": path, "bytes_written": len(data)})


async def patch(args: dict[str, Any], ctx: ToolContext) -> str:
    path, old, new = _string(args, "path"), _string(args, "old_string"), _string(args, "new_string")
    replace_all = bool(args.get("replace_all", False))
    try:
        text = (await ctx.sandbox.read_file(path, limit=MAX_FILE_BYTES)).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolError(_file_problem("patch", path, exc)) from exc
    found = text.count(old) if old else 0
    if found == 0:
        raise ToolError(f"old_string not found in {path}")
    if found > 1 and not replace_all:
        raise ToolError(f"old_string occurs {found} times in {path}; make it unique or set replace_all")
    replaced = found if replace_all else 1
    # Checked before the replacement is built: replace_all can multiply a file's size.
    size = len(text.encode()) + replaced * (len(new.encode()) - len(old.encode()))
    if size > MAX_FILE_BYTES:
        raise ToolError(
            f"the patched file would be {size} bytes; the file tools write at most {MAX_FILE_BYTES}"
        )
    try:
        await ctx.sandbox.write_file(path, text.replace(old, new, -1 if replace_all else 1).encode())
    except OSError as exc:
        raise ToolError(_file_problem("patch", path, exc)) from exc
    return json.dumps({"path": path, "replacements": replaced})


def _file_problem(action: str, path: str, exc: BaseException) -> str:
    """What the model is told: the kind of problem, never a host path or the runner's internals."""
    reasons = {
        FileNotFoundError: "no such file",
        IsADirectoryError: "is a directory",
        NotADirectoryError: "a parent is not a directory",
        NotARegularFile: "not a regular file (a device, FIFO or socket)",
        OutsideSandbox: "outside the sandbox",
        FileTooLarge: f"larger than {MAX_FILE_BYTES} bytes",
        UnicodeDecodeError: "not UTF-8 text",
    }
    reason = next((text for kind, text in reasons.items() if isinstance(exc, kind)), type(exc).__name__)
    return f"cannot {action} {path}: {reason}"


async def search_files(args: dict[str, Any], ctx: ToolContext) -> str:
    pattern = _string(args, "pattern")
    path = _string(args, "path", required=False, default=".")
    # -D skip: a FIFO or device among the files must not block or flood the search.
    command = f"grep -rnI -D skip -e {shlex.quote(pattern)} -- {shlex.quote(path)} | head -n 200"
    return await _run(command, args, ctx)


async def execute_code(args: dict[str, Any], ctx: ToolContext) -> str:
    code = _string(args, "code")
    script = f".trajkit-snippet-{uuid.uuid4().hex[:12]}.py"
    await ctx.sandbox.write_file(script, code.encode())
    try:
        return await _run(f"python3 {script}", args, ctx)
    finally:
        await ctx.sandbox.exec(f"rm -f {script}", timeout=30)


def _schema(required: list[str], **properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


_STR = {"type": "string"}
_TIMEOUT = {"type": "number", "description": "seconds before the command is killed"}

TERMINAL = Toolset(
    "terminal",
    "run shell commands",
    (
        Tool(
            "terminal",
            "Run a shell command in the working directory and return its exit code and output.",
            _schema(["command"], command=_STR, timeout=_TIMEOUT),
            terminal,
        ),
    ),
)

FILE = Toolset(
    "file",
    "read, write, patch and search files",
    (
        Tool("read_file", "Read a text file.", _schema(["path"], path=_STR), read_file),
        Tool(
            "write_file",
            "Write a text file, creating parent directories; replaces existing content.",
            _schema(["path", "content"], path=_STR, content=_STR),
            write_file,
        ),
        Tool(
            "patch",
            "Replace old_string by new_string in a file (old_string must be unique unless replace_all).",
            _schema(
                ["path", "old_string", "new_string"],
                path=_STR,
                old_string=_STR,
                new_string=_STR,
                replace_all={"type": "boolean"},
            ),
            patch,
        ),
        Tool(
            "search_files",
            "Search file contents for a regular expression; returns matching lines with file:line.",
            _schema(["pattern"], pattern=_STR, path=_STR),
            search_files,
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
            _schema(["code"], code=_STR, timeout=_TIMEOUT),
            execute_code,
        ),
    ),
)
