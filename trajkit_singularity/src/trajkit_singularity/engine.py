"""Running the Apptainer CLI from the event loop, every call bounded in time.

spython runs the same CLI through blocking ``subprocess`` calls with no timeout, so one hung
``apptainer`` would stall a worker thread forever. Every call here is an asyncio subprocess in its own
process group: on timeout or cancellation the whole client tree (a wrapper script, bwrap, apptainer,
its starter) is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trajkit.sandbox import SandboxError

# Settings of the caller's environment an Apptainer client may need; anything else (API keys above
# all) stays out of the client and so out of every container.
_PASSED_VARIABLES = frozenset(
    {
        "PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "XDG_RUNTIME_DIR",
        "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
    }
)  # fmt: skip
_PASSED_PREFIXES = ("APPTAINER_", "SINGULARITY_")
KILL_GRACE = 10.0
"""Seconds to wait for a killed client to be reaped."""


@dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: bytes
    stderr: bytes
    hidden: Mapping[str, str] = field(default_factory=dict)
    """Host directories (-> what to say instead) that the reason must not name."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def reason(self) -> str:
        """The last lines of stderr, where Apptainer says what went wrong, on one line, naming none
        of the :attr:`hidden` host directories (they reach failures.jsonl and logs)."""
        text = hide(self.stderr.decode("utf-8", "replace"), self.hidden)
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return " | ".join(lines[-3:]) if lines else f"exit code {self.returncode}"


def hide(text: str, hidden: Mapping[str, str]) -> str:
    """``text`` with each host directory of ``hidden`` replaced by its stand-in, longest first."""
    for directory in sorted(hidden, key=len, reverse=True):
        text = text.replace(directory, hidden[directory])
    return text


class CliTimeout(SandboxError):
    """An Apptainer command did not finish in time (and was killed)."""


def client_environment(extra: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for an Apptainer client: the caller's engine settings plus ``extra``.

    ``APPTAINERENV_*`` variables of the caller are left out on purpose: they would inject values into
    every sandbox behind the run's back.
    """
    environ = os.environ if environ is None else environ
    env = {
        key: value
        for key, value in environ.items()
        if key in _PASSED_VARIABLES or key.startswith(_PASSED_PREFIXES)
    }
    env.setdefault("PATH", os.defpath)
    env.update(extra)
    return env


async def spawn(
    argv: Sequence[str], *, env: Mapping[str, str], stdin: int = asyncio.subprocess.DEVNULL
) -> asyncio.subprocess.Process:
    """Start ``argv`` in a new session (so its whole tree can be killed) with piped output."""
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=stdin,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env),
            start_new_session=True,
        )
    except OSError as error:
        raise SandboxError(f"cannot run {argv[0]}: {error}") from error


async def kill_tree(process: asyncio.subprocess.Process) -> None:
    """SIGKILL the process group of ``process`` (made by :func:`spawn`) and reap it, bounded."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(process.wait(), KILL_GRACE)


async def run(
    argv: Sequence[str],
    *,
    timeout: float,
    env: Mapping[str, str],
    input: bytes | None = None,
    hidden: Mapping[str, str] | None = None,
) -> CliResult:
    """Run ``argv`` to completion within ``timeout`` seconds; raise :class:`CliTimeout` past it."""
    stdin = asyncio.subprocess.DEVNULL if input is None else asyncio.subprocess.PIPE
    process = await spawn(argv, env=env, stdin=stdin)
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(input), timeout)
    except TimeoutError:
        await kill_tree(process)
        raise CliTimeout(f"`{' '.join(argv[1:4])} ...` did not finish within {timeout:g} s") from None
    except BaseException:
        await asyncio.shield(kill_tree(process))
        raise
    assert process.returncode is not None
    return CliResult(process.returncode, stdout, stderr, dict(hidden or {}))


class Apptainer:
    """One engine executable, the environment its clients run with, and the host directories its
    errors must not name (see :meth:`CliResult.reason`)."""

    def __init__(self, binary: str, env: Mapping[str, str], hidden: Mapping[str, str] | None = None) -> None:
        self.binary = binary
        self.env = dict(env)
        self.hidden = dict(hidden or {})

    async def run(self, *args: str, timeout: float, input: bytes | None = None) -> CliResult:
        return await run([self.binary, *args], timeout=timeout, env=self.env, input=input, hidden=self.hidden)

    async def instances(self, timeout: float = 60.0) -> dict[str, int]:
        """Running instances of this user on this host: name -> pid of the instance's init."""
        result = await self.run("instance", "list", "--json", timeout=timeout)
        if not result.ok:
            raise SandboxError(f"apptainer instance list failed: {result.reason()}")
        try:
            listing = json.loads(result.stdout or b"{}").get("instances") or []
            return {str(item["instance"]): int(item["pid"]) for item in listing}
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise SandboxError(f"unexpected `apptainer instance list --json` output: {error}") from error

    async def stop(self, name: str, timeout: float = 60.0) -> None:
        """Stop instance ``name`` at once; nothing in it needs a clean shutdown.

        ``instance stop --force`` polls for about two seconds, so the instance's init is killed
        directly (the pid namespace dies with it and Apptainer drops the instance); the CLI is the
        fallback when that is not possible.
        """
        pid = (await self.instances(timeout)).get(name)
        if pid is None:
            return
        if _is_instance_init(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            for _ in range(50):
                if name not in await self.instances(timeout):
                    return
                await asyncio.sleep(0.1)
        result = await self.run("instance", "stop", "--force", name, timeout=timeout)
        if not result.ok and name in await self.instances(timeout):
            raise SandboxError(f"cannot stop instance {name}: {result.reason()}")


def _is_instance_init(pid: int) -> bool:
    """Whether ``pid`` is an Apptainer instance's init (not a recycled pid of something else)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as stream:
            return stream.read().split(b"\0", 1)[0] in (b"appinit", b"sinit")
    except OSError:
        return False
