"""The built-in ``file`` toolset: read, write, patch and search files in the prompt's sandbox.

The tools' names and arguments are the reference agent's (``docs/tools.md``), less its host-only
arguments. Files go through the sandbox's confined file operations (never a command line), so a
path the model chooses, in an argument or in a diff, cannot leave the sandbox; ``search_files``
checks its path the same way, then lists and searches regular files with ``find`` and ``grep``
inside the sandbox.
"""

from __future__ import annotations

import json
import os
import posixpath
import shlex
from collections.abc import Iterator
from functools import cache
from importlib import resources
from typing import Any

from trajkit import hookimpl
from trajkit.plugins.files import unified_diff
from trajkit.plugins.toolsets import STRING, object_schema, string_arg
from trajkit.sandbox import (
    DEFAULT_READ_LIMIT,
    FileTooLarge,
    InvalidPath,
    NotARegularFile,
    OutsideSandbox,
    check_path,
)
from trajkit.tools import Tool, ToolContext, ToolError, Toolset

MAX_FILE_BYTES = DEFAULT_READ_LIMIT
"""Most bytes ``read_file`` pages through and ``write_file`` and ``patch`` hold or write: a session
cannot grow the runner past it."""
READ_LINES, MAX_READ_LINES = 500, 2000
LINE_CHARS = 2000
"""Longer lines are cut in what ``read_file`` and ``search_files`` show."""
SEARCH_OUTPUT = 4 << 20
"""Bytes of ``find``/``grep`` output read from the sandbox; past it, counts are lower bounds."""
SEARCH_LIMIT, MAX_SEARCH_LIMIT, MAX_CONTEXT = 50, 1000, 10
SEARCH_LINE_CHARS = 500
"""Longer lines are cut in what ``search_files`` shows: a match with its context fits a tool result."""
BINARY_PROBE = 8192
SHOWN_PATH_CHARS = 200
"""Characters of a path repeated in an error message: a path may be thousands long."""


@hookimpl
def trajkit_toolsets() -> list[Toolset]:
    return [FILE]


def int_arg(args: dict[str, Any], key: str, default: int, lowest: int, highest: int | None = None) -> int:
    """An integer argument, held within [lowest, highest] as the schema says."""
    value = args.get(key, default)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ToolError(f"argument '{key}' must be an integer")
    return max(lowest, value if highest is None else min(value, highest))


def choice_arg(args: dict[str, Any], key: str, choices: tuple[str, ...]) -> str:
    value = args.get(key) or choices[0]
    if value not in choices:
        raise ToolError(f"argument '{key}' must be one of {', '.join(choices)}")
    return str(value)


def path_arg(args: dict[str, Any], action: str, name: str = "path") -> str:
    """The path argument, refused (a tool error) when no sandbox could take it."""
    return _checked(action, string_arg(args, name))


def _checked(action: str, path: str) -> str:
    """``path``, or a tool error when no sandbox could take it (a NUL byte, thousands of bytes...):
    whatever the backend, the model is told, and no engine sees it."""
    try:
        return check_path(path)
    except InvalidPath as exc:
        raise ToolError(_file_problem(action, path, exc)) from None


def _file_problem(action: str, path: str, exc: BaseException) -> str:
    """What the model is told: the kind of problem, never a host path, an engine's words or the
    runner's internals (only the path the model gave, cut to its first characters)."""
    reasons = {
        InvalidPath: exc.strerror if isinstance(exc, InvalidPath) else "",
        FileNotFoundError: "no such file",
        IsADirectoryError: "is a directory",
        NotADirectoryError: "a parent is not a directory",
        NotARegularFile: "not a regular file (a device, FIFO or socket)",
        OutsideSandbox: "outside the sandbox",
        FileTooLarge: f"larger than {MAX_FILE_BYTES} bytes",
        UnicodeDecodeError: "not UTF-8 text",
    }
    reason = next((text for kind, text in reasons.items() if isinstance(exc, kind)), None)
    if reason is None:
        # The errno's own words: an exception's text may carry an engine's (and its host paths).
        code = exc.errno if isinstance(exc, OSError) else None
        reason = os.strerror(code).lower() if code else type(exc).__name__
    return f"cannot {action} {shown_path(path)}: {reason}"


def shown_path(path: str) -> str:
    """``path`` as an error message repeats it: quoted when not printable, cut when long."""
    if len(path) > SHOWN_PATH_CHARS:
        return f"{shown_path(path[:SHOWN_PATH_CHARS])}... ({len(path)} characters)"
    return path if path.isprintable() else ascii(path)


async def _read_text(ctx: ToolContext, action: str, path: str) -> str:
    _checked(action, path)
    try:
        data = await ctx.sandbox.read_file(path, limit=MAX_FILE_BYTES)
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolError(_file_problem(action, path, exc)) from exc


async def _write(ctx: ToolContext, action: str, path: str, text: str) -> int:
    _checked(action, path)
    data = text.encode()
    if len(data) > MAX_FILE_BYTES:
        raise ToolError(
            f"{shown_path(path)} would be {len(data)} bytes; the file tools write at most {MAX_FILE_BYTES}"
        )
    try:
        await ctx.sandbox.write_file(path, data)
    except OSError as exc:
        raise ToolError(_file_problem(action, path, exc)) from exc
    return len(data)


# -- read_file -----------------------------------------------------------------------------------


async def read_file(args: dict[str, Any], ctx: ToolContext) -> str:
    path = path_arg(args, "read")
    offset = int_arg(args, "offset", 1, 1)
    limit = int_arg(args, "limit", READ_LINES, 1, MAX_READ_LINES)
    note = None
    try:
        data = await ctx.sandbox.read_file(path, limit=MAX_FILE_BYTES)
        size = len(data)
    except FileTooLarge as big:  # only its head was read: its size decides, never the memory it would take
        data, size = big.head, big.size
        note = f"only the first {len(data)} bytes can be read with read_file; use the terminal for the rest"
    except OSError as exc:
        raise ToolError(_file_problem("read", path, exc)) from exc
    if b"\0" in data[:BINARY_PROBE]:
        raise ToolError(f"cannot read {shown_path(path)}: a binary file ({size} bytes), not text")
    total = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    result: dict[str, Any] = {"path": path, "content": "", "total_lines": total, "file_size": size}
    shown: list[str] = []
    budget = ctx.output_cap - len(json.dumps(result)) - 160  # room for next_offset, truncated, note
    for number, line in enumerate(_lines(data, offset, min(limit, total - offset + 1)), offset):
        entry = f"{number}|{line[:LINE_CHARS]}" + (" [line cut]" if len(line) > LINE_CHARS else "")
        cost = len(json.dumps(entry, ensure_ascii=False).encode())  # with the escapes JSON adds
        if shown and cost > budget:
            break
        shown.append(entry[: max(budget, 64)])
        budget -= cost
    result["content"] = "\n".join(shown)
    if offset + len(shown) <= total:
        result.update(truncated=True, next_offset=offset + len(shown))
    if note:
        result["note"] = note
    return json.dumps(result, ensure_ascii=False)


def _lines(data: bytes, first: int, count: int) -> Iterator[str]:
    """Lines ``first`` (from 1) on of ``data``, ``count`` at most, each decoded on its own: a large
    file is never split or decoded whole (numbered as grep numbers them: by line feeds)."""
    start = _line_start(data, first)
    if start < 0:
        return
    for _ in range(count):
        end = data.find(b"\n", start)
        yield data[start : len(data) if end < 0 else end].removesuffix(b"\r").decode("utf-8", "replace")
        if end < 0:
            return
        start = end + 1


def _line_start(data: bytes, first: int) -> int:
    """Where line ``first`` (from 1) of ``data`` starts, or -1: line feeds are counted a block at
    a time in C, and looked for one by one only in the block that holds the one wanted."""
    wanted, start = first - 1, 0
    while wanted:
        end = min(start + (1 << 16), len(data))
        found = data.count(b"\n", start, end)
        if found >= wanted:
            for _ in range(wanted):
                start = data.find(b"\n", start) + 1
            return start
        if end == len(data):
            return -1
        wanted, start = wanted - found, end
    return start


# -- write_file and patch ------------------------------------------------------------------------


async def write_file(args: dict[str, Any], ctx: ToolContext) -> str:
    path, content = path_arg(args, "write"), string_arg(args, "content")
    written = await _write(ctx, "write", path, content)
    return json.dumps({"path": path, "bytes_written": written})


async def patch(args: dict[str, Any], ctx: ToolContext) -> str:
    mode = choice_arg(args, "mode", ("replace", "patch"))
    if mode == "patch":
        return await _apply_diff(string_arg(args, "patch"), ctx)
    path, old, new = path_arg(args, "patch"), string_arg(args, "old_string"), string_arg(args, "new_string")
    replace_all = bool(args.get("replace_all", False))
    text = await _read_text(ctx, "patch", path)
    found = text.count(old) if old else 0
    if found == 0:
        raise ToolError(f"old_string not found in {shown_path(path)}")
    if found > 1 and not replace_all:
        raise ToolError(
            f"old_string occurs {found} times in {shown_path(path)}; make it unique or set replace_all"
        )
    replaced = found if replace_all else 1
    # Checked before the replacement is built: replace_all can multiply a file's size.
    size = len(text.encode()) + replaced * (len(new.encode()) - len(old.encode()))
    if size > MAX_FILE_BYTES:
        raise ToolError(
            f"the patched file would be {size} bytes; the file tools write at most {MAX_FILE_BYTES}"
        )
    line = text[: text.index(old)].count("\n") + 1
    await _write(ctx, "patch", path, text.replace(old, new, -1 if replace_all else 1))
    return json.dumps({"path": path, "replacements": replaced, "first_line": line})


async def _apply_diff(diff: str, ctx: ToolContext) -> str:
    """Every file of a unified diff patched in memory first; written only if all of it applies."""
    if len(diff.encode()) > MAX_FILE_BYTES:
        raise ToolError(f"the patch is larger than {MAX_FILE_BYTES} bytes")
    try:
        changes = unified_diff.parse(diff)
    except unified_diff.DiffError as exc:
        raise ToolError(str(exc)) from None
    texts: dict[str, str] = {}
    created: list[str] = []
    for change in changes:
        if change.path not in texts:
            texts[change.path] = await _current(ctx, change)
            if change.created:
                created.append(change.path)
        try:
            texts[change.path] = unified_diff.apply(change, texts[change.path])
        except unified_diff.DiffError as exc:
            raise ToolError(f"{exc}; nothing was written") from None
    for path, text in texts.items():
        await _write(ctx, "patch", path, text)
    modified = [path for path in texts if path not in created]
    hunks = sum(len(change.hunks) for change in changes)
    return json.dumps({"files_modified": modified, "files_created": created, "hunks_applied": hunks})


async def _current(ctx: ToolContext, change: unified_diff.FileChange) -> str:
    """The file's text before the change ("" for a file the diff creates, which must not exist)."""
    if not change.created:
        return await _read_text(ctx, "patch", change.path)
    _checked("create", change.path)
    try:
        await ctx.sandbox.read_file(change.path, limit=0)
    except FileNotFoundError:
        return ""
    except FileTooLarge:
        pass
    except OSError as exc:
        raise ToolError(_file_problem("create", change.path, exc)) from exc
    raise ToolError(
        f"cannot create {shown_path(change.path)}: it exists already (patch it with a diff from its content)"
    )


# -- search_files --------------------------------------------------------------------------------


@cache
def _search_script() -> str:
    return resources.files("trajkit.plugins.files").joinpath("search_files.sh").read_text()


async def search_files(args: dict[str, Any], ctx: ToolContext) -> str:
    pattern = string_arg(args, "pattern")
    target = choice_arg(args, "target", ("content", "files"))
    mode = choice_arg(args, "output_mode", ("content", "files_only", "count"))
    path = string_arg(args, "path", required=False, default=".") or "."
    glob = args.get("file_glob") or ""
    if not isinstance(glob, str):
        raise ToolError("argument 'file_glob' must be a string")
    limit = int_arg(args, "limit", SEARCH_LIMIT, 1, MAX_SEARCH_LIMIT)
    offset = int_arg(args, "offset", 0, 0)
    context = int_arg(args, "context", 0, 0, MAX_CONTEXT) if target == "content" and mode == "content" else 0
    where = await _search_path(path, ctx)
    words = [target, mode, where, glob, pattern, str(context)]
    command = f"(\nset -- {' '.join(shlex.quote(word) for word in words)}\n{_search_script()})"
    result = await ctx.sandbox.exec(command, timeout=ctx.timeout, output_cap=SEARCH_OUTPUT)
    if result.timed_out:
        raise ToolError(f"the search took longer than {ctx.timeout:g}s; search a smaller directory")
    found = _found(result.stdout, target, mode, context, ctx.sandbox.cwd if path.startswith("/") else "")
    if result.truncated:
        found["truncated"] = True  # its counts are lower bounds
    return _page(found, offset, limit, ctx.output_cap)


async def _search_path(path: str, ctx: ToolContext) -> str:
    """``path`` checked as the file tools check a path (inside the sandbox, a directory or a
    regular file), as a command in the sandbox's working directory names it."""
    _checked("search", path)
    try:
        await ctx.sandbox.read_file(path, limit=0)
    except (FileTooLarge, IsADirectoryError):
        pass  # a regular file that is not empty, or a directory
    except OSError as exc:
        raise ToolError(_file_problem("search", path, exc)) from exc
    cwd = ctx.sandbox.cwd.rstrip("/")
    if path == cwd or path.startswith(cwd + "/"):
        path = path[len(cwd) :].lstrip("/") or "."
    path = posixpath.normpath(path)
    return path if path.startswith("/") or path == "." else f"./{path}"  # never an option to find


def _found(output: str, target: str, mode: str, context: int, base: str) -> dict[str, Any]:
    """The search's output as what the model is shown, before paging: sorted by file and line;
    names relative to the working directory, or absolute under ``base`` if the path given was."""
    if target == "files":
        files = sorted({_shown(name, base) for name in output.split("\0") if name.strip("\n")})
        return {"files": files}
    lines: dict[str, dict[int, str]] = {}
    matches: list[tuple[str, int]] = []
    for row in output.split("\n"):
        name, sep, rest = row.partition("\0")
        number, kind, text = _numbered(rest)
        if not sep or number is None:
            continue  # a group separator, or a line cut by the output cap
        name = _shown(name, base)
        lines.setdefault(name, {})[number] = text
        if kind == ":":
            matches.append((name, number))
    matches.sort()
    if mode == "files_only":
        return {"files": sorted({name for name, _ in matches})}
    if mode == "count":
        counts: dict[str, int] = {}
        for name, _ in matches:
            counts[name] = counts.get(name, 0) + 1
        return {"counts": counts, "total_matches": len(matches)}
    entries = []
    for name, number in matches:
        seen = lines[name]
        entry: dict[str, Any] = {"path": name, "line": number, "content": seen[number][:SEARCH_LINE_CHARS]}
        if context:
            entry["before"] = [
                seen[n][:SEARCH_LINE_CHARS] for n in range(number - context, number) if n in seen
            ]
            entry["after"] = [
                seen[n][:SEARCH_LINE_CHARS] for n in range(number + 1, number + context + 1) if n in seen
            ]
        entries.append(entry)
    return {"matches": entries}


def _numbered(rest: str) -> tuple[int | None, str, str]:
    """``"12:text"`` -> (12, ":", "text"); ``"12-text"`` (context) -> (12, "-", "text")."""
    digits = len(rest) - len(rest.lstrip("0123456789"))
    if not digits or digits == len(rest) or rest[digits] not in ":-":
        return None, "", ""
    return int(rest[:digits]), rest[digits], rest[digits + 1 :]


def _shown(name: str, base: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return posixpath.join(base, name) if base and not name.startswith("/") else name


def _page(found: dict[str, Any], offset: int, limit: int, cap: int) -> str:
    """One page of the results, cut further so the JSON fits ``cap`` bytes."""
    key = next(k for k in ("matches", "files", "counts") if k in found)
    items = list(found[key].items()) if key == "counts" else list(found[key])
    result: dict[str, Any] = {"total_count": len(items), **{k: v for k, v in found.items() if k != key}}
    page = items[offset : offset + limit]
    while True:
        result[key] = dict(page) if key == "counts" else page
        shown_to = offset + len(page)
        if shown_to < len(items):
            result["next_offset"] = shown_to
        text = json.dumps(result, ensure_ascii=False)
        if len(text.encode()) <= cap or not page:
            return text
        page = page[: max(len(page) * cap // len(text.encode()) - 1, 0)] if len(page) > 1 else []


INTEGER = {"type": "integer"}

FILE = Toolset(
    "file",
    "read, write, patch and search files",
    (
        Tool(
            "read_file",
            "Read a text file with line numbers, as LINE_NUMBER|CONTENT lines; page through a long "
            "file with offset and limit.",
            object_schema(
                ["path"],
                path={
                    "type": "string",
                    "description": "the file, relative to the working directory or absolute",
                },
                offset={**INTEGER, "description": "first line to show, from 1", "default": 1, "minimum": 1},
                limit={
                    **INTEGER,
                    "description": "lines to show",
                    "default": READ_LINES,
                    "maximum": MAX_READ_LINES,
                },
            ),
            read_file,
        ),
        Tool(
            "write_file",
            "Write a text file, replacing its content; parent directories are created.",
            object_schema(["path", "content"], path=STRING, content=STRING),
            write_file,
        ),
        Tool(
            "patch",
            "Edit files. mode 'replace' (default): replace old_string by new_string in the file at "
            "path (old_string must occur once unless replace_all). mode 'patch': apply a unified "
            "diff (--- a/PATH, +++ b/PATH, @@ hunks) to one or more files; a file the diff creates "
            "has --- /dev/null. Nothing is written unless all of it applies.",
            object_schema(
                ["mode"],
                mode={"type": "string", "enum": ["replace", "patch"], "default": "replace"},
                path={"type": "string", "description": "mode 'replace': the file to edit"},
                old_string={"type": "string", "description": "mode 'replace': the exact text to replace"},
                new_string={
                    "type": "string",
                    "description": "mode 'replace': its replacement ('' deletes it)",
                },
                replace_all={
                    "type": "boolean",
                    "description": "mode 'replace': every occurrence",
                    "default": False,
                },
                patch={"type": "string", "description": "mode 'patch': the unified diff"},
            ),
            patch,
        ),
        Tool(
            "search_files",
            "Search file contents with a regular expression (target 'content'), or find files whose "
            "name matches a glob (target 'files'). Results are sorted by path; page with offset and limit.",
            object_schema(
                ["pattern"],
                pattern={
                    "type": "string",
                    "description": "an extended regular expression (as grep -E) for content, a glob such "
                    "as '*.py' for files",
                },
                target={"type": "string", "enum": ["content", "files"], "default": "content"},
                path={"type": "string", "description": "the directory or file to search", "default": "."},
                file_glob={"type": "string", "description": "content search: only files whose name matches"},
                limit={**INTEGER, "description": "results to show", "default": SEARCH_LIMIT},
                offset={**INTEGER, "description": "results to skip", "default": 0},
                output_mode={
                    "type": "string",
                    "enum": ["content", "files_only", "count"],
                    "description": "content search: matching lines, the files with a match, or the "
                    "number of matches per file",
                    "default": "content",
                },
                context={
                    **INTEGER,
                    "description": "content search: lines shown around each match",
                    "default": 0,
                },
            ),
            search_files,
        ),
    ),
)


def schemas_markdown() -> str:
    """The file tools' schemas as the model is given them (docs/tools.md's last section is made so)."""
    blocks = [
        f"### `{tool.name}`\n\n```json\n{json.dumps(tool.schema(), indent=2, ensure_ascii=False)}\n```\n"
        for tool in FILE.tools
    ]
    return "\n".join(blocks)
