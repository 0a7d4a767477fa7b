"""One prompt's container: commands run through ``docker exec``, files through the archive API."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import posixpath
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from trajkit.sandbox import DEFAULT_OUTPUT_CAP, CappedBuffer, ExecResult, Sandbox, SandboxError, SandboxInfo
from trajkit_docker.archive import pack_file, resolve_link, unpack_entry
from trajkit_docker.engine import Engine, api_message, is_directory, translated

if TYPE_CHECKING:
    from trajkit_docker.backend import DockerBackend

log = logging.getLogger(__name__)
T = TypeVar("T")

STATE_DIR = "/.trajkit"
"""Created in every container (mode 1777) to hold the process-group id of each running exec."""

TIMEOUT_EXIT_CODE = 124
KILL_GRACE = 10.0
"""Seconds the output stream may stay open after the process group was killed."""
ABORT_GRACE = 5.0
MAX_SYMLINKS = 16

# Runs the command as the leader of a new session, hence of a new process group whose id is the
# leader's pid, and writes that id where a second exec can find it: `docker exec` cannot kill what it
# started, so a timeout is enforced by `kill -9 -PGID` from that second exec. When the command ends,
# the group is killed too, so background children never outlive the exec. A non-interactive shell
# does not give `&` jobs their own group, so `setsid` never needs to fork and `$!` is the leader.
# `wait`'s stderr is discarded: shells report a killed job ("Killed") there, which is not output.
# Arguments: $1 = exec token, $2 = command, $3 = working directory.
EXEC_WRAPPER = f"""\
cd "$3" || exit 1
setsid /bin/sh -c "$2" &
pg=$!
f={STATE_DIR}/exec-$1
{{ echo "$pg" > "$f.new" && mv -f "$f.new" "$f"; }} 2>/dev/null
wait "$pg" 2>/dev/null
rc=$?
kill -9 -"$pg" 2>/dev/null
rm -f "$f"
exit "$rc"
"""

# Kills the process group recorded by EXEC_WRAPPER; waits briefly in case the deadline came before
# the wrapper had written it. Argument: $1 = exec token.
EXEC_KILLER = f"""\
f={STATE_DIR}/exec-$1
i=0
while [ ! -s "$f" ] && [ "$i" -lt 50 ]; do sleep 0.1; i=$((i+1)); done
[ -s "$f" ] && kill -9 -"$(cat "$f")"
"""


class DockerSandbox(Sandbox):
    def __init__(
        self, backend: DockerBackend, engine: Engine, container_id: str, cwd: str, info: SandboxInfo
    ) -> None:
        self._backend = backend
        self._engine = engine
        self.container_id = container_id
        self.cwd = cwd
        self.info = info
        self._closed = False

    def __repr__(self) -> str:
        return f"DockerSandbox({self.container_id[:12]}, image={self.info.image!r})"

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._backend.call(fn, *args)

    def _resolve(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.cwd, path))

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"docker: sandbox {self.container_id[:12]} is closed")

    async def exec(
        self,
        command: str,
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        output_cap: int = DEFAULT_OUTPUT_CAP,
    ) -> ExecResult:
        self._check_open()
        token = uuid.uuid4().hex
        argv = ["/bin/sh", "-c", EXEC_WRAPPER, "trajkit-exec", token, command, self.cwd]
        run = ExecRun(self._engine, self.container_id, argv, env or {}, output_cap)
        finished = run.start(asyncio.get_running_loop())
        try:
            exit_code = await asyncio.wait_for(asyncio.shield(finished), timeout)
        except TimeoutError:
            await self._kill_and_drain(run, finished, token)
            return run.result(TIMEOUT_EXIT_CODE, timed_out=True)
        except asyncio.CancelledError:
            self._start_killer(token)
            run.abort()
            finished.add_done_callback(_ignore_outcome)
            raise
        return run.result(exit_code, timed_out=False)

    def _start_killer(self, token: str) -> asyncio.Task[tuple[int, str]]:
        argv = ["/bin/sh", "-c", EXEC_KILLER, "trajkit-kill", token]
        return self._backend.in_background(
            self._call(self._engine.run_helper, self.container_id, argv), "killing an exec's process group"
        )

    async def _kill_and_drain(self, run: ExecRun, finished: asyncio.Future[int], token: str) -> None:
        """Kill the exec's process group, then wait (bounded) for its output stream to end."""
        self._start_killer(token)
        try:
            await asyncio.wait_for(asyncio.shield(finished), KILL_GRACE)
            return
        except TimeoutError:
            log.warning("%r: exec output still open %.0fs after kill; closing the stream", self, KILL_GRACE)
        except SandboxError:
            return
        run.abort()
        try:
            await asyncio.wait_for(asyncio.shield(finished), ABORT_GRACE)
        except TimeoutError:
            finished.add_done_callback(_ignore_outcome)
            raise SandboxError(f"docker: exec in {self.container_id[:12]} would not stop") from None
        except SandboxError:
            pass

    async def read_file(self, path: str) -> bytes:
        self._check_open()
        target = self._resolve(path)
        for _ in range(MAX_SYMLINKS):
            with translated(f"reading {target!r}"):
                fetched = await self._call(self._engine.get_archive, self.container_id, target)
            if fetched is None:
                raise FileNotFoundError(f"no such file in the sandbox: {target}")
            archive, stat = fetched
            if is_directory(stat):
                raise IsADirectoryError(f"is a directory in the sandbox: {target}")
            entry = unpack_entry(archive)
            if entry.kind == "file":
                return entry.data
            if entry.kind == "dir":
                raise IsADirectoryError(f"is a directory in the sandbox: {target}")
            if entry.kind != "symlink":
                raise OSError(f"not a regular file in the sandbox: {target} (mode {stat.get('mode')})")
            target = resolve_link(target, entry.link_target)
        raise OSError(f"too many levels of symbolic links in the sandbox: {self._resolve(path)}")

    async def write_file(self, path: str, data: bytes) -> None:
        """Extract a one-file tar at the deepest existing ancestor, carrying any missing parents."""
        self._check_open()
        target = self._resolve(path)
        if target == "/":
            raise IsADirectoryError("is a directory in the sandbox: /")
        directory = posixpath.dirname(target)
        while True:
            relative = posixpath.relpath(target, directory)
            with translated(f"writing {target!r}"):
                try:
                    done = await self._call(
                        self._engine.put_archive, self.container_id, directory, pack_file(relative, data)
                    )
                except Exception as exc:
                    file_error = _file_error(exc, target)
                    if file_error is None:
                        raise
                    raise file_error from exc
            if done:
                return
            if directory == "/":
                raise SandboxError(f"docker: cannot write {target!r}: the container has no root directory")
            directory = posixpath.dirname(directory)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with translated(f"removing container {self.container_id[:12]}"):
            await self._call(self._engine.remove_container, self.container_id)


class ExecRun:
    """One exec's output pump, on a thread of its own.

    Streaming occupies a thread for the whole life of the command, so it must not come from a
    bounded pool: a pool full of streams waiting to be killed would starve the kills themselves.
    The thread is a daemon and is always ended by the stream closing (normally, or by :meth:`abort`).
    """

    def __init__(
        self,
        engine: Engine,
        container_id: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        output_cap: int,
    ) -> None:
        self._engine = engine
        self._container_id = container_id
        self._argv = list(argv)
        self._env = dict(env)
        self.stdout = CappedBuffer(output_cap)
        self.stderr = CappedBuffer(output_cap)
        self._stream: Any = None
        self._aborted = threading.Event()
        self._lock = threading.Lock()

    def start(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[int]:
        finished: asyncio.Future[int] = loop.create_future()
        thread = threading.Thread(
            target=self._main, args=(loop, finished), name="trajkit-docker-exec", daemon=True
        )
        thread.start()
        return finished

    def result(self, exit_code: int, *, timed_out: bool) -> ExecResult:
        return ExecResult(
            exit_code=exit_code,
            stdout=self.stdout.text(),
            stderr=self.stderr.text(),
            timed_out=timed_out,
            truncated=self.stdout.truncated or self.stderr.truncated,
        )

    def abort(self) -> None:
        """Close the output stream from another thread, ending the pump."""
        with self._lock:
            self._aborted.set()
            stream = self._stream
        if stream is not None:
            _close_quietly(stream)

    def _main(self, loop: asyncio.AbstractEventLoop, finished: asyncio.Future[int]) -> None:
        try:
            outcome: int | BaseException = self._pump()
        except BaseException as exc:
            outcome = exc
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is waiting any more
            loop.call_soon_threadsafe(_settle, finished, outcome)

    def _pump(self) -> int:
        with translated("running a command"):
            exec_id = self._engine.exec_create(self._container_id, self._argv, self._env)
            stream = self._engine.exec_stream(exec_id)
            with self._lock:
                self._stream = stream
                aborted = self._aborted.is_set()
            if aborted:
                _close_quietly(stream)
            for out, err in stream:
                if out:
                    self.stdout.feed(out)
                if err:
                    self.stderr.feed(err)
            if self._aborted.is_set():
                return -1
            return self._engine.exec_exit_code(exec_id)


def _settle(finished: asyncio.Future[int], outcome: int | BaseException) -> None:
    if finished.done():
        return
    if isinstance(outcome, BaseException):
        finished.set_exception(outcome)
    else:
        finished.set_result(outcome)


def _ignore_outcome(finished: asyncio.Future[int]) -> None:
    """Retrieve the outcome nobody waits for any more, so asyncio does not report it as lost."""
    if not finished.cancelled():
        finished.exception()


def _close_quietly(stream: Any) -> None:
    try:
        stream.close()
    except Exception as exc:
        log.debug("closing an exec stream failed: %s", exc)


def _file_error(exc: Exception, target: str) -> OSError | None:
    """The file error that an engine failure stands for, which the engine reports only in words."""
    message = api_message(exc).lower()
    replacing_a_directory = (
        "cannot overwrite directory" in message  # dockerd
        or ("error creating file at" in message and "file exists" in message)  # podman
        or "is a directory" in message
    )
    if replacing_a_directory:
        return IsADirectoryError(f"is a directory in the sandbox: {target}")
    if "cannot overwrite non-directory" in message or "not a directory" in message:
        return NotADirectoryError(f"a parent is not a directory in the sandbox: {target}")
    return None
