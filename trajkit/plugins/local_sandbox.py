"""The local sandbox: a fresh temporary directory per prompt, optionally isolated by bubblewrap.

Without isolation, commands run as ordinary processes in the prompt's directory (the working
directory is private, the machine is not). With ``--sandbox_option local.isolation=bwrap`` each
command runs in bubblewrap: the host file system read-only, only the working directory writable,
a private /tmp, no network, and its own PID namespace, so nothing it starts can outlive it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from trajkit import hookimpl
from trajkit.sandbox import (
    DEFAULT_OUTPUT_CAP,
    CappedBuffer,
    ExecResult,
    Sandbox,
    SandboxBackend,
    SandboxError,
    SandboxInfo,
    SandboxSpec,
    owner_gone,
    owner_tag,
)

DEFAULT_CWD = "/work"
OWNER_FILE = "owner.json"
INLINE_IO = 256 * 1024
"""Files up to this size are read and written on the event loop; larger ones in a worker thread."""
BASE_ENV = {"LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "dumb"}


@hookimpl
def trajkit_sandbox_backends() -> list[type[SandboxBackend]]:
    return [LocalBackend]


class LocalBackend(SandboxBackend):
    name = "local"
    description = "temporary directory per prompt; isolation=bwrap for bubblewrap"

    def __init__(self, options: Mapping[str, object] | None = None) -> None:
        super().__init__(options)
        self.root = Path(str(self.options.get("root") or Path(tempfile.gettempdir()) / "trajkit-local"))
        self.isolation = str(self.options.get("isolation", "none"))
        if self.isolation not in ("none", "bwrap"):
            raise SandboxError(f"local sandbox: isolation must be 'none' or 'bwrap', not {self.isolation!r}")
        self.network = str(self.options.get("network", "none"))
        self.shell = shutil.which("bash") or "/bin/sh"
        self.root_ready = False
        if self.isolation == "bwrap" and not shutil.which("bwrap"):
            raise SandboxError("local sandbox: isolation=bwrap needs bubblewrap (apt-get install bubblewrap)")

    async def create(self, spec: SandboxSpec) -> Sandbox:
        cwd = spec.cwd or DEFAULT_CWD
        if not cwd.startswith("/"):
            cwd = f"{DEFAULT_CWD}/{cwd}"
        if not self.root_ready:
            self.root.mkdir(parents=True, exist_ok=True)
            self.root_ready = True
        base = Path(tempfile.mkdtemp(prefix=f"{spec.run_id}.", dir=self.root))
        owner = {"owner": owner_tag(), "deadline": time.time() + spec.lifetime}
        (base / OWNER_FILE).write_text(json.dumps(owner))
        workdir = base / "fs" / cwd.lstrip("/")
        workdir.mkdir(parents=True)
        return LocalSandbox(self, base, workdir, cwd if self.isolation == "bwrap" else str(workdir))

    async def reap(self, run_id: str | None = None) -> int:
        if not self.root.is_dir():
            return 0
        removed = 0
        for base in self.root.iterdir():
            if run_id is not None and not base.name.startswith(f"{run_id}."):
                continue
            if run_id is None and not _abandoned(base / OWNER_FILE):
                continue
            shutil.rmtree(base, ignore_errors=True)
            removed += 1
        return removed


def _abandoned(owner_file: Path) -> bool:
    """True if the sandbox's owner process is gone or its lifetime is over."""
    try:
        owner = json.loads(owner_file.read_text())
    except (OSError, ValueError):
        return True
    if time.time() > owner.get("deadline", 0):
        return True
    return owner_gone(str(owner.get("owner", "")))


class LocalSandbox(Sandbox):
    def __init__(self, backend: LocalBackend, base: Path, workdir: Path, cwd: str) -> None:
        self.backend = backend
        self.base = base
        self.workdir = workdir
        self.cwd = cwd
        self.info = SandboxInfo(backend="local")
        self.closed = False

    async def exec(
        self,
        command: str,
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        output_cap: int = DEFAULT_OUTPUT_CAP,
    ) -> ExecResult:
        if self.closed:
            raise SandboxError("sandbox is closed")
        # A clean environment: the runner's own variables (API keys among them) must never be
        # visible to a command whose output lands in a trajectory.
        full_env = {
            **BASE_ENV,
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": self.cwd,
            **(env or {}),
        }
        argv = self._argv(command, full_env)
        # Pipes of our own: asyncio's wait() would otherwise also wait for the pipes to close,
        # which a background child keeps open, and the kill below would never come.
        (out_read, out_write), (err_read, err_write) = os.pipe(), os.pipe()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=self.workdir,
                env=full_env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out_write,
                stderr=err_write,
                start_new_session=True,
            )
        except BaseException:
            for fd in (out_read, err_read):
                os.close(fd)
            raise
        finally:
            os.close(out_write)
            os.close(err_write)
        stdout, stderr = CappedBuffer(output_cap), CappedBuffer(output_cap)
        pumps = asyncio.gather(_pump(out_read, stdout), _pump(err_read, stderr))
        timed_out = False
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            timed_out = True
        finally:
            # The command's own process group: background children die with it, always.
            _kill_group(proc.pid)
            await proc.wait()
        try:
            await asyncio.wait_for(pumps, 5)
        except TimeoutError:  # a process that escaped the group still holds the pipe
            pumps.cancel()
        return ExecResult(
            exit_code=124 if timed_out else (proc.returncode or 0),
            stdout=stdout.text(),
            stderr=stderr.text(),
            timed_out=timed_out,
            truncated=stdout.truncated or stderr.truncated,
        )

    def _argv(self, command: str, env: Mapping[str, str]) -> list[str]:
        shell = [self.backend.shell, "-c", command]
        if self.backend.isolation != "bwrap":
            return shell
        argv = ["bwrap", "--die-with-parent", "--unshare-all", *_host_root_binds(self.cwd)]
        argv += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        argv += ["--bind", str(self.workdir), self.cwd, "--chdir", self.cwd]
        if self.backend.network != "none":
            argv.append("--share-net")
        argv.append("--clearenv")
        for key, value in env.items():
            argv += ["--setenv", key, value]
        return [*argv, "--", *shell]

    def host_path(self, path: str) -> Path:
        """Where a sandbox path lives on the host; paths outside the workdir only when not isolated."""
        full = path if path.startswith("/") else f"{self.cwd.rstrip('/')}/{path}"
        full = os.path.normpath(full)
        inside = self.cwd.rstrip("/")
        if full == inside or full.startswith(inside + "/"):
            return self.workdir / os.path.relpath(full, inside)
        if self.backend.isolation == "bwrap":
            raise PermissionError(f"{path}: only the working directory {self.cwd} is accessible")
        return Path(full)

    async def read_file(self, path: str) -> bytes:
        if self.closed:
            raise SandboxError("sandbox is closed")
        target = self.host_path(path)
        if target.is_file() and target.stat().st_size <= INLINE_IO:
            return target.read_bytes()  # a thread handoff costs more CPU than a small read
        return await asyncio.to_thread(target.read_bytes)

    async def write_file(self, path: str, data: bytes) -> None:
        if self.closed:
            raise SandboxError("sandbox is closed")
        target = self.host_path(path)

        def write() -> None:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)

        if len(data) <= INLINE_IO:
            write()  # a thread handoff costs more CPU than a small write
        else:
            await asyncio.to_thread(write)

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await asyncio.to_thread(shutil.rmtree, self.base, True)


def _host_root_binds(cwd: str) -> list[str]:
    """Bind the host's top-level directories read-only onto bubblewrap's empty root.

    The working directory's top-level directory is left out, so that its path can be created in
    the sandbox's own (writable, private) root whether or not it exists on the host.
    """
    top = cwd.strip("/").split("/")[0]
    argv: list[str] = []
    for entry in sorted(os.listdir("/")):
        path = f"/{entry}"
        if entry in {top, "proc", "dev", "tmp"}:
            continue
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    return argv


async def _pump(fd: int, buffer: CappedBuffer) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
    )
    try:
        while chunk := await reader.read(65536):
            buffer.feed(chunk)
    finally:
        transport.close()


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
