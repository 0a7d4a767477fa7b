"""The local sandbox: a fresh temporary directory per prompt, optionally isolated by bubblewrap.

Without isolation, commands run as ordinary processes in the prompt's directory (the working
directory is private, the machine is not). With ``--sandbox_option local.isolation=bwrap`` each
command runs in bubblewrap: the host file system read-only, only the working directory writable,
a private /tmp, no network, and its own PID namespace, so nothing it starts can outlive it.
Commands run with ``bash -c``; ``--sandbox_option local.shell=/bin/sh`` picks another shell (dash
starts on about 40 % less CPU than bash).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from trajkit import hookimpl
from trajkit.sandbox import (
    DEFAULT_CWD,
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

OWNER_FILE = "owner.json"
INLINE_IO = 256 * 1024
"""Files up to this size are read and written on the event loop; larger ones in a worker thread."""
INLINE_REMOVE = 32
"""A sandbox that ran no command and got at most this many files is removed on the event loop."""
BASE_ENV = {"LC_CTYPE": "C.UTF-8", "TERM": "dumb"}
"""UTF-8 through LC_CTYPE alone: C.UTF-8's other categories are C's, and LANG or LC_ALL would make
every shell start load all of the locale's files, about a tenth of what a ``bash -c`` costs."""
READ_SIZE = 65536
ESCAPED_PIPE_GRACE = 5.0
"""Seconds to wait, after the command exited and its group was killed, for a process that escaped
the group (``setsid``) to close the output pipes it inherited, before closing them on it."""


@hookimpl
def trajkit_sandbox_backends() -> list[type[SandboxBackend]]:
    return [LocalBackend]


class LocalBackend(SandboxBackend):
    name = "local"
    description = (
        "temporary directory per prompt; isolation=bwrap for bubblewrap, shell=/bin/sh for a lighter shell"
    )

    def __init__(self, options: Mapping[str, object] | None = None) -> None:
        super().__init__(options)
        self.root = Path(str(self.options.get("root") or Path(tempfile.gettempdir()) / "trajkit-local"))
        self.isolation = str(self.options.get("isolation", "none"))
        if self.isolation not in ("none", "bwrap"):
            raise SandboxError(f"local sandbox: isolation must be 'none' or 'bwrap', not {self.isolation!r}")
        self.network = str(self.options.get("network", "none"))
        self.shell = _find_shell(str(self.options.get("shell") or ""))
        self.root_text = str(self.root)
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
        # Plain strings and os calls: at a thousand sessions in flight, pathlib's objects cost more
        # CPU than the system calls they wrap.
        base = tempfile.mkdtemp(prefix=f"{spec.run_id}.", dir=self.root_text)
        owner = {"owner": owner_tag(), "deadline": time.time() + spec.lifetime}
        _write(os.path.join(base, OWNER_FILE), json.dumps(owner).encode())
        workdir = os.path.join(base, "fs", cwd.lstrip("/"))
        os.makedirs(workdir)
        return LocalSandbox(self, base, workdir, cwd if self.isolation == "bwrap" else workdir)

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
    def __init__(self, backend: LocalBackend, base: str, workdir: str, cwd: str) -> None:
        self.backend = backend
        self.base = base
        self.workdir = workdir
        self.cwd = cwd
        self.info = SandboxInfo(backend="local")
        self.closed = False
        self.ran_commands = False
        self.files_written = 0
        # A clean environment: the runner's own variables (API keys among them) must never be
        # visible to a command whose output lands in a trajectory.
        self.env = {**BASE_ENV, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": cwd}

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
        self.ran_commands = True
        full_env = {**self.env, **env} if env else self.env
        proc = _Command(self._argv(command, full_env), cwd=self.workdir, env=full_env, output_cap=output_cap)
        await proc.wait(timeout)
        stdout, stderr = proc.stdout, proc.stderr
        return ExecResult(
            exit_code=124 if proc.timed_out else (proc.returncode or 0),
            stdout=stdout.text(),
            stderr=stderr.text(),
            timed_out=proc.timed_out,
            truncated=stdout.truncated or stderr.truncated,
        )

    def _argv(self, command: str, env: Mapping[str, str]) -> list[str]:
        shell = [self.backend.shell, "-c", command]
        if self.backend.isolation != "bwrap":
            return shell
        argv = ["bwrap", "--die-with-parent", "--unshare-all", *_host_root_binds(self.cwd)]
        argv += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        argv += ["--bind", self.workdir, self.cwd, "--chdir", self.cwd]
        if self.backend.network != "none":
            argv.append("--share-net")
        argv.append("--clearenv")
        for key, value in env.items():
            argv += ["--setenv", key, value]
        return [*argv, "--", *shell]

    def host_path(self, path: str) -> str:
        """Where a sandbox path lives on the host; paths outside the workdir only when not isolated."""
        full = os.path.normpath(path if path.startswith("/") else f"{self.cwd}/{path}")
        inside = self.cwd.rstrip("/")
        if full == inside:
            return self.workdir
        if full.startswith(inside + "/"):
            return self.workdir + full[len(inside) :]
        if self.backend.isolation == "bwrap":
            raise PermissionError(f"{path}: only the working directory {self.cwd} is accessible")
        return full

    async def read_file(self, path: str) -> bytes:
        if self.closed:
            raise SandboxError("sandbox is closed")
        target = self.host_path(path)
        if os.path.isfile(target) and os.stat(target).st_size <= INLINE_IO:
            return _read(target)  # a thread handoff costs more CPU than a small read
        return await asyncio.to_thread(_read, target)

    async def write_file(self, path: str, data: bytes) -> None:
        if self.closed:
            raise SandboxError("sandbox is closed")
        target = self.host_path(path)
        self.files_written += 1

        def write() -> None:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            _write(target, data)

        if len(data) <= INLINE_IO:
            write()  # a thread handoff costs more CPU than a small write
        else:
            await asyncio.to_thread(write)

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.small_tree:  # a few files: removing them costs less than a thread handoff
                shutil.rmtree(self.base, True)
            else:
                await asyncio.to_thread(shutil.rmtree, self.base, True)

    @property
    def small_tree(self) -> bool:
        """Without a command run, the tree holds only what ``write_file`` put there."""
        return not self.ran_commands and self.files_written <= INLINE_REMOVE


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


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _find_shell(wanted: str) -> str:
    """The shell's path: ``wanted`` (a path or a name on PATH) if given, else bash, else /bin/sh."""
    if not wanted:
        return shutil.which("bash") or "/bin/sh"
    found = shutil.which(wanted)
    if found is None:
        raise SandboxError(f"local sandbox: shell {wanted!r} is not an executable file or a command on PATH")
    return found


class _Command:
    """One command run to its end, its output pipes and its exit watched by the event loop itself.

    The exit is a pidfd's readability, the output two non-blocking pipes read into capped buffers:
    three readers on the loop and no task, where asyncio's subprocess transport, child watcher and
    stream readers cost half again as much runner CPU per start. Without pidfds (not Linux, Linux
    before 5.3) a thread waits for the exit instead.
    """

    def __init__(self, argv: list[str], *, cwd: str, env: Mapping[str, str], output_cap: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.stdout, self.stderr = CappedBuffer(output_cap), CappedBuffer(output_cap)
        self.returncode: int | None = None
        self.timed_out = False
        self.done = self.loop.create_future()
        self.grace: asyncio.TimerHandle | None = None
        (out_read, out_write), (err_read, err_write) = os.pipe(), os.pipe()
        try:
            self.proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out_write,
                stderr=err_write,
                start_new_session=True,  # its own process group, killed as a whole below
            )
        except BaseException:
            os.close(out_read)
            os.close(err_read)
            raise
        finally:
            os.close(out_write)
            os.close(err_write)
        self.pid = self.proc.pid
        self.pipes = {out_read: self.stdout, err_read: self.stderr}
        for fd in self.pipes:
            os.set_blocking(fd, False)
            self.loop.add_reader(fd, self._read, fd)
        pidfd_open = getattr(os, "pidfd_open", None)
        try:
            pidfd = pidfd_open(self.pid) if pidfd_open else -1
        except OSError:
            pidfd = -1
        if pidfd >= 0:
            self.loop.add_reader(pidfd, self._pidfd_ready, pidfd)
        else:
            threading.Thread(target=self._wait_in_thread, daemon=True).start()

    async def wait(self, timeout: float) -> None:
        """Until the command exited and its output pipes closed; on timeout its group is killed."""
        timer = self.loop.call_later(timeout, self._time_out)
        try:
            await self.done
        except asyncio.CancelledError:
            # Cancelled from outside: the whole tree still dies, and is reaped, before this ends.
            _kill_group(self.pid)
            self._close_pipes()
            if self.returncode is None:
                self.done = self.loop.create_future()
                await self.done
            raise
        finally:
            timer.cancel()

    def _read(self, fd: int) -> bool:
        """Read what the pipe holds; False once there is nothing more for now."""
        try:
            data = os.read(fd, READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            data = b""
        if data:
            self.pipes[fd].feed(data)
            return True
        self._close_pipe(fd)
        self._finish_if_done()
        return False

    def _pidfd_ready(self, pidfd: int) -> None:
        self.loop.remove_reader(pidfd)
        os.close(pidfd)
        self._exited(_reap(self.pid))

    def _wait_in_thread(self) -> None:
        returncode = self.proc.returncode = _reap(self.pid)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self.loop.call_soon_threadsafe(self._exited, returncode)

    def _exited(self, returncode: int) -> None:
        self.returncode = self.proc.returncode = returncode
        # The command's own process group: background children die with it, always.
        _kill_group(self.pid)
        for fd in list(self.pipes):
            # What the pipe holds (at most READ_SIZE unless resized), then usually EOF: most
            # commands finish here, without another turn of the loop.
            if self._read(fd):
                self._read(fd)
        if self.pipes:  # still held open, by a dying background child or one that left the group
            self.grace = self.loop.call_later(ESCAPED_PIPE_GRACE, self._close_pipes)
        self._finish_if_done()

    def _time_out(self) -> None:
        if self.returncode is None:
            self.timed_out = True
            _kill_group(self.pid)

    def _close_pipe(self, fd: int) -> None:
        self.loop.remove_reader(fd)
        os.close(fd)
        del self.pipes[fd]

    def _close_pipes(self) -> None:
        for fd in list(self.pipes):
            self._close_pipe(fd)
        self._finish_if_done()

    def _finish_if_done(self) -> None:
        if self.returncode is not None and not self.pipes and not self.done.done():
            self.done.set_result(None)
        if not self.pipes and self.grace is not None:
            self.grace.cancel()


def _reap(pid: int) -> int:
    """Wait for the child ``pid``; its exit code, or minus the signal that killed it."""
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:  # reaped elsewhere (an old SIGCHLD-based asyncio child watcher)
        return 255
    return os.waitstatus_to_exitcode(status)
