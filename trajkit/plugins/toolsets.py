"""Built-in toolsets ``terminal`` and ``code``: commands and programs run in the prompt's sandbox.

``terminal`` behaves like one interactive shell per session: the working directory and the
exported variables a command leaves are there for the next (``terminal.persistent``, on by
default), and ``background=true`` starts a process that the ``process`` tool lists, reads, writes
to and kills. It works on every backend: the state lives in a file of the sandbox's temporary
directory (``scripts/terminal.sh``) and background processes come from
:meth:`trajkit.sandbox.Sandbox.start_process`.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from trajkit import hookimpl
from trajkit.config.settings import StrictSettings
from trajkit.sandbox import cap_text, shell
from trajkit.sandbox.processes import SandboxProcess
from trajkit.tools import Tool, ToolContext, ToolError, Toolset

MAX_STDIN_WRITE = 64 * 1024
"""Most bytes one ``process`` write sends."""
KEPT_PROCESSES = 64
"""Ended background processes stay listed until a session has this many."""
DEFAULT_LOG_LINES = 200


@hookimpl
def trajkit_toolsets() -> list[Toolset]:
    return [TERMINAL, CODE]


class TerminalSettings(StrictSettings):
    persistent: bool = Field(
        True,
        description="keep each session's working directory and exported variables from one terminal "
        "call to the next, as an interactive shell does; false: every call starts afresh in the "
        "sandbox's working directory",
    )
    max_processes: int = Field(
        16, gt=0, description="background processes one session may have running at once"
    )


class TerminalToolset(Toolset):
    Settings = TerminalSettings


@dataclass
class Background:
    """A background process as the ``process`` tool knows it."""

    id: str
    process: SandboxProcess
    command: str
    """The command as the model gave it."""
    polled: int = 0
    """Bytes of its output that ``poll`` or ``wait`` have shown."""


@dataclass
class TerminalSession:
    """The ``terminal`` toolset's state in one session."""

    state_file: str = field(default_factory=lambda: f".trajkit-terminal-{uuid.uuid4().hex[:16]}")
    processes: dict[str, Background] = field(default_factory=dict)

    async def close(self) -> None:
        """Kill every background process still running: none outlives its session."""
        running = [bg.process for bg in self.processes.values() if bg.process.returncode is None]
        await asyncio.gather(*(process.kill() for process in running), return_exceptions=True)


def string_arg(args: dict[str, Any], key: str, *, required: bool = True, default: str = "") -> str:
    value = args.get(key, None if required else default)
    if not isinstance(value, str):
        raise ToolError(f"argument '{key}' must be a string" if key in args else f"missing argument '{key}'")
    return value


def _shell_text(args: dict[str, Any], key: str, *, required: bool = True) -> str:
    """A string argument that becomes shell text: no shell can hold a NUL character."""
    value = "" if not required and args.get(key) is None else string_arg(args, key)
    if "\0" in value:
        raise ToolError(f"argument '{key}' contains a NUL character, which no shell command can hold")
    return value


def _seconds(args: dict[str, Any], ctx: ToolContext, key: str = "timeout") -> float:
    value = args.get(key, ctx.timeout)
    if value is None:
        value = ctx.timeout
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ToolError(f"argument '{key}' must be a positive number of seconds")
    return min(float(value), ctx.timeout)


def _flag(args: dict[str, Any], key: str) -> bool:
    value = args.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ToolError(f"argument '{key}' must be true or false")
    return value


async def run_command(
    command: str, args: dict[str, Any], ctx: ToolContext, env: dict[str, str] | None = None
) -> str:
    timeout = _seconds(args, ctx)
    result = await ctx.sandbox.exec(command, timeout=timeout, env=env or None, output_cap=ctx.output_cap)
    output = result.stdout + (f"\n[stderr]\n{result.stderr}" if result.stderr else "")
    if result.timed_out:
        raise ToolError(f"command timed out after {timeout:g}s; partial output:\n{output}")
    return capped_json({"exit_code": result.exit_code, "output": output}, ctx.output_cap)


def capped_json(fields: dict[str, Any], cap: int, text_key: str = "output") -> str:
    """``fields`` as JSON of at most ``cap`` bytes: the text under ``text_key`` is cut (head and
    tail) to fit, so the model never sees JSON cut in the middle. Escapes make JSON longer than
    the text, so the text's own budget shrinks until it fits."""
    text = fields[text_key]
    budget = cap
    while True:
        encoded = json.dumps({**fields, text_key: cap_text(text, budget)}, ensure_ascii=False)
        size = len(encoded.encode())
        if size <= cap or budget <= 64:
            return encoded
        budget = max(64, budget * cap // size - 16)  # escapes expand the text about evenly


COMMAND_VARIABLE = "TRAJKIT_COMMAND"
"""The model's command reaches the terminal's script in this variable, which the script removes."""


def terminal_command(
    command: str, workdir: str, state: TerminalSession | None, *, save: bool
) -> tuple[str, dict[str, str]]:
    """``command`` as the sandbox runs it, and the environment it needs: in the session's state
    (``state``) or afresh (None).

    The state's script is one line that ends in ``eval`` of the command, which reaches it in the
    environment rather than in the script: the shell's messages then read as the command's own
    (``bash: line 1: ...``; a syntax error quotes the command's line, never the script).
    """
    if state is None:
        return (f"cd -- {shlex.quote(workdir)} || exit 1; {command}" if workdir else command), {}
    values = (
        f'__tk_state="${{TMPDIR:-/tmp}}/{state.state_file}"; __tk_dir={shlex.quote(workdir)}; '
        f"__tk_save={'1' if save else ''}"
    )
    return f"{values}; {shell.script('trajkit.plugins', 'terminal.sh')}", {COMMAND_VARIABLE: command}


def terminal_session(ctx: ToolContext) -> TerminalSession:
    state = ctx.session.state.get(TERMINAL.name)
    if state is None:
        state = ctx.session.state[TERMINAL.name] = TerminalSession()
        ctx.session.on_close(state.close)
    assert isinstance(state, TerminalSession)
    return state


async def terminal(args: dict[str, Any], ctx: ToolContext) -> str:
    command = _shell_text(args, "command")
    workdir = _shell_text(args, "workdir", required=False)
    background = _flag(args, "background")
    settings: TerminalSettings = ctx.session.run.settings_of(TERMINAL)
    session = terminal_session(ctx)
    state = session if settings.persistent else None
    if not background:
        script, env = terminal_command(command, workdir, state, save=True)
        return await run_command(script, args, ctx, env)
    running = sum(1 for bg in session.processes.values() if bg.process.returncode is None)
    if running >= settings.max_processes:
        raise ToolError(
            f"{running} background processes are running, the most a session may have; "
            "kill one with the process tool first"
        )
    script, env = terminal_command(command, workdir, state, save=False)
    process = await ctx.sandbox.start_process(script, env=env)
    return capped_json(_describe(_register(session, process, command)), ctx.output_cap, "command")


def _register(session: TerminalSession, process: SandboxProcess, command: str) -> Background:
    background = Background(f"proc_{uuid.uuid4().hex[:12]}", process, command)
    session.processes[background.id] = background
    ended = [bg for bg in session.processes.values() if bg.process.returncode is not None]
    for old in ended[: max(0, len(session.processes) - KEPT_PROCESSES)]:
        del session.processes[old.id]
    return background


def _describe(bg: Background) -> dict[str, Any]:
    process = bg.process
    described: dict[str, Any] = {"session_id": bg.id, "command": bg.command}
    if process.returncode is None:
        described["status"] = "running"
    else:
        described.update(status="exited", exit_code=process.returncode)
    described["uptime_s"] = round(time.time() - process.started, 1)
    return described


def _find(session: TerminalSession, wanted: str) -> Background:
    if wanted in session.processes:
        return session.processes[wanted]
    matches = [bg for key, bg in session.processes.items() if key.startswith(wanted)]
    if len(matches) == 1 and wanted:
        return matches[0]
    known = ", ".join(session.processes) or "none"
    problem = "matches several processes" if matches else "is no background process of this session"
    raise ToolError(f"session_id '{wanted}' {problem} (known: {known})")


def _new_output(bg: Background, cap: int) -> str:
    fields = {**_describe(bg), "output": bg.process.output.since(bg.polled)}
    bg.polled = bg.process.output.total
    return capped_json(fields, cap)


def _log(bg: Background, args: dict[str, Any], cap: int) -> str:
    lines = bg.process.output.since(0).splitlines(keepends=True)
    limit, offset = args.get("limit", DEFAULT_LOG_LINES), args.get("offset")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise ToolError("argument 'limit' must be a positive number of lines")
    if offset is None:
        offset = max(0, len(lines) - limit)
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ToolError("argument 'offset' must be a line number from 0")
    shown = "".join(lines[offset : offset + limit])
    return capped_json({**_describe(bg), "offset": offset, "total_lines": len(lines), "output": shown}, cap)


async def process(args: dict[str, Any], ctx: ToolContext) -> str:
    action = string_arg(args, "action")
    session = terminal_session(ctx)
    if action == "list":
        listing = [_describe(bg) for bg in session.processes.values()]
        return cap_text(json.dumps({"processes": listing}, ensure_ascii=False), ctx.output_cap)
    if action not in PROCESS_ACTIONS:
        raise ToolError(f"unknown action '{action}': choose one of {', '.join(PROCESS_ACTIONS)}")
    bg = _find(session, string_arg(args, "session_id"))
    proc = bg.process
    if action in ("poll", "log"):
        await proc.refresh()
        return _new_output(bg, ctx.output_cap) if action == "poll" else _log(bg, args, ctx.output_cap)
    if action == "wait":
        await proc.wait(_seconds(args, ctx))
        return _new_output(bg, ctx.output_cap)
    if action == "kill":
        if proc.returncode is None:
            await proc.kill()
        return capped_json(_describe(bg), ctx.output_cap, "command")
    if action == "close":
        await proc.close_stdin()
        return capped_json({**_describe(bg), "stdin": "closed"}, ctx.output_cap, "command")
    data = _shell_text(args, "data") + ("\n" if action == "submit" else "")
    encoded = data.encode()
    if len(encoded) > MAX_STDIN_WRITE:
        raise ToolError(
            f"argument 'data' holds {len(encoded)} bytes, more than the {MAX_STDIN_WRITE} one write sends"
        )
    try:
        await proc.write(encoded)
    except (BrokenPipeError, OSError) as exc:
        raise ToolError(f"cannot write to {bg.id}: {exc}") from exc
    return capped_json({**_describe(bg), "written_bytes": len(encoded)}, ctx.output_cap, "command")


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
PROCESS_ACTIONS = ("list", "poll", "log", "wait", "kill", "write", "submit", "close")

TERMINAL_DESCRIPTION = (
    "Run a shell command and return its exit code and output. The shell keeps its state between "
    "calls like an interactive terminal: the working directory and exported environment variables "
    "persist from one call to the next. A command returns as soon as it finishes (or is killed when "
    "its timeout runs out), and anything it left running in the background with '&' is stopped "
    "then; for servers and other long-running programs set background=true, which returns a "
    "session_id to use with the process tool."
)
PROCESS_DESCRIPTION = (
    "Manage background processes started with terminal(background=true). list: every process of "
    "this session. poll: status and the output since the last poll. log: the output by line "
    "(offset, limit; default the last 200 lines). wait: block until the process exits or timeout "
    "runs out, with the new output. kill: stop it and everything it started. write: send data to "
    "its standard input as is; submit: the same followed by a newline (to answer a prompt); close: "
    "close its standard input. Background processes end with the session."
)

TERMINAL = TerminalToolset(
    "terminal",
    "run shell commands in a persistent shell, and background processes",
    (
        Tool(
            "terminal",
            TERMINAL_DESCRIPTION,
            object_schema(
                ["command"],
                command={"type": "string", "description": "the shell command to run"},
                background={
                    "type": "boolean",
                    "description": "run it in the background and return a session_id at once (default false)",
                },
                timeout=TIMEOUT,
                workdir={
                    "type": "string",
                    "description": "directory to run this command in (default: the shell's current directory)",
                },
            ),
            terminal,
        ),
        Tool(
            "process",
            PROCESS_DESCRIPTION,
            object_schema(
                ["action"],
                action={"type": "string", "enum": list(PROCESS_ACTIONS)},
                session_id={
                    "type": "string",
                    "description": "the process, as terminal returned it (a unique prefix will do); "
                    "required except for list",
                },
                data={"type": "string", "description": "text for write and submit"},
                timeout={"type": "number", "description": "most seconds wait blocks"},
                offset={"type": "integer", "description": "first line log shows (default: the last lines)"},
                limit={"type": "integer", "description": "most lines log shows (default 200)"},
            ),
            process,
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
