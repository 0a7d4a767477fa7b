"""The built-in ``file`` toolset: read, write, patch and search files in the prompt's sandbox.

Files go through the sandbox's confined file operations (never a command line), so a path the
model chooses cannot leave the sandbox; searching runs ``grep`` inside the sandbox.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from trajkit import hookimpl
from trajkit.plugins.toolsets import STRING, object_schema, run_command, string_arg
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
    return [FILE]


async def read_file(args: dict[str, Any], ctx: ToolContext) -> str:
    path = string_arg(args, "path")
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
    path, content = string_arg(args, "path"), string_arg(args, "content")
    data = content.encode()
    if len(data) > MAX_FILE_BYTES:
        raise ToolError(f"content is {len(data)} bytes; the file tools write at most {MAX_FILE_BYTES}")
    try:
        await ctx.sandbox.write_file(path, data)
    except OSError as exc:
        raise ToolError(_file_problem("write", path, exc)) from exc
    return json.dumps({"path": path, "bytes_written": len(data)})


async def patch(args: dict[str, Any], ctx: ToolContext) -> str:
    path, old, new = string_arg(args, "path"), string_arg(args, "old_string"), string_arg(args, "new_string")
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
    pattern = string_arg(args, "pattern")
    path = string_arg(args, "path", required=False, default=".")
    # -D skip: a FIFO or device among the files must not block or flood the search.
    command = f"grep -rnI -D skip -e {shlex.quote(pattern)} -- {shlex.quote(path)} | head -n 200"
    return await run_command(command, args, ctx)


FILE = Toolset(
    "file",
    "read, write, patch and search files",
    (
        Tool("read_file", "Read a text file.", object_schema(["path"], path=STRING), read_file),
        Tool(
            "write_file",
            "Write a text file, creating parent directories; replaces existing content.",
            object_schema(["path", "content"], path=STRING, content=STRING),
            write_file,
        ),
        Tool(
            "patch",
            "Replace old_string by new_string in a file (old_string must be unique unless replace_all).",
            object_schema(
                ["path", "old_string", "new_string"],
                path=STRING,
                old_string=STRING,
                new_string=STRING,
                replace_all={"type": "boolean"},
            ),
            patch,
        ),
        Tool(
            "search_files",
            "Search file contents for a regular expression; returns matching lines with file:line.",
            object_schema(["pattern"], pattern=STRING, path=STRING),
            search_files,
        ),
    ),
)
