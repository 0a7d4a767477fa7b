"""Where a terminal session's CPU goes with the safe defaults, every process it starts counted.

Two parts, each measured with a cgroup v1 ``cpuacct`` group of its own (:class:`bench.common.TreeCPU`:
whatever a process starts stays in it, even what another process reaps):

- *program starts*: ``--starts`` times each, the CPU of one start of a program (its ``exec``, its
  run and its exit): ``/bin/true`` (what any program start costs here),
  ``setpriv`` as the sandboxes' host user (as root only), bubblewrap with a session's own options
  running ``/bin/true``, and the same running ``bash -c true`` (the supervisor's shell);
- *sessions*: ``--sessions`` local sandboxes with the defaults, ``--concurrency`` at once, each
  running ``--commands`` ``terminal`` calls of the builtin ``true`` (the state kept between calls,
  as the tool does), in a child process; the child's own start is measured once with no session
  and taken off. The slope between two command counts is what a command costs after the first.

    python -m bench.sandbox_start                       # 200 starts each, 300 sessions of 1 and 4 commands
    python -m bench.sandbox_start --sessions 300 --commands 1,4,10 --concurrency 50
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench import common


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.sandbox_start", description=__doc__.split("\n")[0])
    parser.add_argument("--starts", type=int, default=200, help="starts of each program (default 200)")
    parser.add_argument("--sessions", type=int, default=300, help="sessions per command count (default 300)")
    parser.add_argument(
        "--commands", default="1,4", help="comma-separated terminal calls per session (default 1,4)"
    )
    parser.add_argument("--concurrency", type=int, default=50, help="sessions at once (default 50)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument(
        "--child", nargs=3, type=int, metavar=("SESSIONS", "COMMANDS", "AT_ONCE"), help=argparse.SUPPRESS
    )
    common.add_source_arg(parser)
    return parser.parse_args(argv)


async def _starts(count: int) -> list[dict[str, Any]]:
    """The program starts, with bubblewrap's options for a session of the local backend's own."""
    from trajkit.plugins.local import bubblewrap
    from trajkit.plugins.local.run import LocalSandbox
    from trajkit.plugins.local.sandbox import LocalBackend
    from trajkit.sandbox import SandboxSpec

    backend = LocalBackend({"isolation": "bwrap"})
    sandbox = await backend.create(SandboxSpec(run_id="bench-start", work_id="w.starts"))
    assert isinstance(sandbox, LocalSandbox) and backend.confinement is not None
    try:  # the control directory goes with the backend's
        control = backend.control_dir(sandbox.name)
        options = backend.confinement.options(sandbox.workdir, sandbox.cwd, control, sandbox.env)
        return _start_rows(count, bubblewrap.as_user(backend.host_user)[0], options)
    finally:
        await sandbox.close()
        await backend.aclose()


def _start_rows(count: int, prefix: list[str], options: list[str]) -> list[dict[str, Any]]:
    bwrap = [*prefix, "bwrap", *options, "--"]
    programs = [("/bin/true", ["/bin/true"])]
    if prefix:
        programs.append(("setpriv as the sandboxes' user, then /bin/true", [*prefix, "/bin/true"]))
    programs += [
        ("bubblewrap with a session's options, then /bin/true", [*bwrap, "/bin/true"]),
        ("the same, then bash -c true", [*bwrap, "bash", "--noprofile", "--norc", "-c", "true"]),
    ]
    # Each start is a /bin/sh that joins the group and execs the program (started with vfork, so
    # no copy of this process is counted); what the /bin/sh alone costs is measured and taken off.
    launcher_alone = _tree_cpu_of_starts(count, [])
    rows = []
    for name, argv in programs:
        used = _tree_cpu_of_starts(count, argv) - launcher_alone
        rows.append({"program": name, "starts": count, "cpu_ms_per_start": round(1e3 * used / count, 3)})
        print(f"{name:55s} {rows[-1]['cpu_ms_per_start']:.2f} ms of CPU per start", flush=True)
    return rows


def _tree_cpu_of_starts(count: int, argv: list[str]) -> float:
    tree = common.TreeCPU()
    assert tree.path is not None  # checked by _cannot_measure
    join = 'echo $$ > "$0"' + (' && exec "$@"' if argv else "")
    for _ in range(count):
        subprocess.run(
            ["/bin/sh", "-c", join, os.path.join(tree.path, "cgroup.procs"), *argv], check=True, cwd="/"
        )
    used = tree.finish()
    assert used is not None
    return used


async def _sessions(count: int, commands: int, at_once: int) -> None:
    from trajkit.plugins.local.sandbox import LocalBackend
    from trajkit.plugins.toolsets import TerminalSession, terminal_command
    from trajkit.sandbox import SandboxSpec

    backend = LocalBackend({"isolation": "bwrap"})
    gate = asyncio.Semaphore(at_once)

    async def one(i: int) -> None:
        async with gate:
            sandbox = await backend.create(SandboxSpec(run_id="bench-start", work_id=f"w.{i}"))
            state = TerminalSession()
            for _ in range(commands):
                script, env = terminal_command("true", "", state, save=True)
                result = await sandbox.exec(script, timeout=60, env=env)
                assert result.exit_code == 0, result
            await sandbox.close()

    await asyncio.gather(*(one(i) for i in range(count)))
    await backend.aclose()


def _tree_cpu_of_child(args: argparse.Namespace, sessions: int, commands: int) -> float:
    tree = common.TreeCPU()
    child = [sys.executable, "-m", "bench.sandbox_start", "--child", str(sessions), str(commands)]
    subprocess.run(
        [*child, str(args.concurrency)],
        check=True,
        preexec_fn=tree.join,
        env=common.child_env(),
    )
    used = tree.finish()
    assert used is not None
    return used


def _cannot_measure() -> str | None:
    """Why nothing can be measured here (no bubblewrap, no cpuacct group to count in), or None."""
    from trajkit.plugins.local.sandbox import LocalBackend
    from trajkit.sandbox import SandboxError

    try:
        LocalBackend({"isolation": "bwrap"})
    except SandboxError as exc:
        return str(exc)
    probe = common.TreeCPU()
    if probe.path is None:
        return "no writable cgroup v1 cpuacct hierarchy here to count every process in"
    probe.finish()
    return None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    common.use_source(args.source)
    if args.child:
        asyncio.run(_sessions(*args.child))
        return {}
    problem = _cannot_measure()
    if problem:
        print(f"skipped: {problem}")
        return {}
    results: dict[str, Any] = {"figure": "a terminal session's CPU, every process counted"}
    results["starts"] = asyncio.run(_starts(args.starts))
    start_up = _tree_cpu_of_child(args, 0, 0)
    rows = []
    for commands in [int(part) for part in args.commands.split(",")]:
        used = _tree_cpu_of_child(args, args.sessions, commands) - start_up
        rows.append(
            {
                "commands": commands,
                "sessions": args.sessions,
                "cpu_ms_per_session": round(1e3 * used / args.sessions, 3),
            }
        )
        print(
            f"a session with {commands} terminal calls: {rows[-1]['cpu_ms_per_session']:.2f} ms of CPU in all",
            flush=True,
        )
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        slope = (last["cpu_ms_per_session"] - first["cpu_ms_per_session"]) / (
            last["commands"] - first["commands"]
        )
        results["cpu_ms_per_command_after_the_first"] = round(slope, 3)
        print(f"a terminal call after the first: {slope:.2f} ms of CPU in all", flush=True)
    results["sessions"] = rows
    results["machine"] = common.machine()
    common.save_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
