"""Shared plumbing: the load server in its own process, ``trajkit run`` in a measured subprocess.

Everything here is bounded: every wait has a deadline, every child process is stopped by its id.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parent.parent
NEUTRAL_CWD = Path(tempfile.gettempdir())
"""Children start here: ``python -m trajkit`` puts its working directory first on sys.path, so
starting in the repository would import the working tree even when --source names another."""
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
NOOP_DIST = "trajkit-bench-noop"
SOURCE: Path | None = None
"""Where ``trajkit`` is imported from, when not the repository (see :func:`use_source`)."""
SERVER_SOURCE: Path | None = None
"""Where the load server is imported from, when not from SOURCE (``--server-source``)."""
NOOP_MODULE = "trajkit_bench_noop"


# -- the machine ---------------------------------------------------------------------------------


def sandboxes_dir(work: Path) -> Path:
    """``work/sandboxes`` for the local sandboxes of a run, made passable for their unprivileged
    user when the benchmark runs as root (a temporary directory lets no other user through)."""
    os.chmod(work, 0o711)
    sandboxes = work / "sandboxes"
    sandboxes.mkdir(parents=True, exist_ok=True)
    return sandboxes


def raise_fd_limit() -> int:
    """Raise this process's soft open-files limit to the hard limit (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    mem_kb = 0
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    cpu_model = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    versions = {}
    for name in ("trajkit", "openai", "aiohttp", "httpx2", "pydantic", "orjson", "uvloop", "docker"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {
        "cores": os.cpu_count(),
        "cpu": cpu_model,
        "memory_gib": round(mem_kb / 2**20, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "nofile_soft_limit": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "versions": versions,
        "load_average": [round(x, 2) for x in load_average()],
        "cpu_pressure_avg60": _psi_avg60(),
        "date": datetime.now().isoformat(timespec="seconds"),
    }


def _psi_avg60() -> float | None:
    try:
        with open("/proc/pressure/cpu") as handle:
            return float(handle.readline().split("avg60=")[1].split()[0])
    except (OSError, ValueError, IndexError):
        return None


# -- /proc ----------------------------------------------------------------------------------------


def proc_cpu(pid: int) -> tuple[float, float]:
    """(own CPU seconds, CPU seconds of its reaped children) from /proc/PID/stat; works on zombies."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    # fields[0] is the state (field 3 of the man page): utime is field 14, so index 11.
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime) / CLK_TCK, (cutime + cstime) / CLK_TCK


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS/VmHWM (bytes) and Threads from /proc/PID/status; empty once the process is a zombie."""
    found: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    found[key] = int(value.split()[0]) * 1024
                elif key == "Threads":
                    found[key] = int(value)
    except OSError:
        pass
    return found


def schedstat(pid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for a CPU) of the process's main thread."""
    try:
        with open(f"/proc/{pid}/schedstat") as handle:
            run_ns, wait_ns, _ = (int(x) for x in handle.read().split())
    except (OSError, ValueError):
        return 0.0, 0.0
    return run_ns / 1e9, wait_ns / 1e9


def cpu_pressure_total() -> float | None:
    """Seconds (since boot) during which some runnable task waited for a CPU (Linux PSI)."""
    try:
        with open("/proc/pressure/cpu") as handle:
            for line in handle:
                if line.startswith("some"):
                    return int(line.rsplit("total=", 1)[1]) / 1e6
    except (OSError, ValueError, IndexError):
        return None
    return None


class TreeCPU:
    """Every CPU-second of a process and of everything it starts, wherever they end up: a cgroup
    v1 ``cpuacct`` group of its own (a process's children stay in it; sandbox processes moved
    into pids or memory cgroups too, those are other hierarchies). ``/proc``'s figures miss what is
    reaped by others: a sandbox's supervisor killed with its bubblewrap goes to the host's init.
    Unavailable (:meth:`finish` says None) without a writable cpuacct hierarchy (cgroup v2 only, say)."""

    def __init__(self) -> None:
        self.path: str | None = None
        own = _own_cpuacct()
        if own is not None:
            path = os.path.join(own, f"trajkit-bench-{os.getpid()}-{time.monotonic_ns()}")
            with contextlib.suppress(OSError):
                os.mkdir(path)
                self.path = path

    def join(self) -> None:
        """Move the calling process into the group (a ``preexec_fn``: before the program runs)."""
        if self.path is not None:
            with open(os.path.join(self.path, "cgroup.procs"), "w") as handle:
                handle.write(str(os.getpid()))

    def finish(self) -> float | None:
        """Once the tree has exited: its CPU seconds (None if unknown); the group is removed."""
        if self.path is None:
            return None
        for _ in range(100):  # the tree's last processes may take a moment to be gone
            with contextlib.suppress(OSError), open(os.path.join(self.path, "cgroup.procs")) as handle:
                if not handle.read().strip():
                    break
            time.sleep(0.1)
        used = None
        with (
            contextlib.suppress(OSError, ValueError),
            open(os.path.join(self.path, "cpuacct.usage")) as handle,
        ):
            used = int(handle.read()) / 1e9
        with contextlib.suppress(OSError):
            os.rmdir(self.path)
        return used


def _own_cpuacct() -> str | None:
    with contextlib.suppress(OSError), open("/proc/self/cgroup") as handle:
        for line in handle:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "cpuacct" in controllers.split(","):
                for mount in ("/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/cpu,cpuacct"):
                    directory = os.path.join(mount, path.lstrip("/"))
                    if os.access(directory, os.W_OK):
                        return directory
    return None


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


# -- the load server ------------------------------------------------------------------------------


class LoadServer:
    """``python -m trajkit.testing.openai_server`` in its own process, on 127.0.0.1 only."""

    def __init__(self, *args: str, ready_timeout: float = 30.0) -> None:
        self.args = ["--host", "127.0.0.1", "--port", "0", *args]
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen[str] | None = None
        self.base_url = ""
        self._cpu_mark = 0.0

    def __enter__(self) -> LoadServer:
        env = {**os.environ, "PYTHONPATH": _pythonpath(*([SERVER_SOURCE] if SERVER_SOURCE else []))}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trajkit.testing.openai_server", *self.args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            text=True,
            cwd=NEUTRAL_CWD,
            env=env,
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + self.ready_timeout
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
                    break
                line = self.proc.stdout.readline()
                if not line:
                    break
                if line.startswith("READY "):
                    self.base_url = line.split()[1]
                    self.mark()
                    return self
        self.__exit__(None, None, None)
        raise RuntimeError(f"load server did not print READY within {self.ready_timeout:g}s")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def mark(self) -> None:
        """Start counting the server's CPU from now."""
        self._cpu_mark = proc_cpu(self.pid)[0]

    def cpu_since_mark(self) -> float:
        return proc_cpu(self.pid)[0] - self._cpu_mark

    def __exit__(self, *_: object) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def docker_available(image: str) -> str | None:
    """None if the engine answers and has ``image``, else why not."""
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    try:
        info = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            text=True,
            timeout=15,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "the Docker engine did not answer within 15 s"
    if info.returncode != 0:
        return f"no Docker engine reachable ({info.stderr.strip()[:200]})"
    found = subprocess.run(
        ["docker", "image", "inspect", image], capture_output=True, text=True, timeout=30, check=False
    )
    if found.returncode != 0:
        return f"image {image} is not on the engine (bash scripts/engines/docker.sh images builds it)"
    try:
        import trajkit_docker  # noqa: F401
    except ImportError as exc:
        return f"the trajkit_docker package cannot be imported ({exc}; pip install -e ./trajkit_docker)"
    return None


def add_run_args(parser: Any, *, keep_help: str) -> None:
    """The flags every benchmark that runs ``trajkit run`` shares."""
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run at most (default 600)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--keep", type=Path, help=keep_help)
    parser.add_argument(
        "--trajkit-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for 'trajkit run', repeatable (e.g. --trajkit-arg=--transport=sdk)",
    )
    add_source_arg(parser)


def add_source_arg(parser: Any) -> None:
    parser.add_argument(
        "--source",
        type=Path,
        help="import trajkit from this directory instead of the repository, e.g. a snapshot made with "
        "'mkdir -p /tmp/src && git archive HEAD trajkit | tar -x -C /tmp/src'",
    )
    parser.add_argument(
        "--server-source",
        type=Path,
        help="import the load server from this directory (default: as --source), to compare two "
        "clients against the same server",
    )


def use_source(path: Path | None, server: Path | None = None) -> None:
    """Import ``trajkit`` from ``path`` here and in every child process started from now on
    (the load server from ``server`` when given)."""
    global SOURCE, SERVER_SOURCE
    if server is not None:
        SERVER_SOURCE = server.resolve()
        if not (SERVER_SOURCE / "trajkit" / "testing" / "openai_server.py").is_file():
            raise SystemExit(f"--server-source {server}: no trajkit.testing.openai_server there")
    if path is None:
        return
    SOURCE = path.resolve()
    if not (SOURCE / "trajkit" / "__init__.py").is_file():
        raise SystemExit(f"--source {path}: no trajkit package there")
    sys.path.insert(0, str(SOURCE))


def _pythonpath(*extra: Path) -> str:
    parts = [str(p) for p in extra] + ([str(SOURCE)] if SOURCE else []) + [str(REPO)]
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    return os.pathsep.join(parts)


# -- the no-op plugin -----------------------------------------------------------------------------


def install_noop_plugin(site: Path) -> Path:
    """Make bench/noop_plugin.py an installed plugin distribution under ``site``; returns ``site``."""
    site.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(REPO / "bench" / "noop_plugin.py", site / f"{NOOP_MODULE}.py")
    info = site / f"{NOOP_DIST.replace('-', '_')}-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {NOOP_DIST}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[trajkit]\nbench_noop = {NOOP_MODULE}\n")
    return site


# -- datasets and ledgers -------------------------------------------------------------------------


def write_prompts(path: Path, count: int, prefix: str = "task") -> Path:
    with path.open("w") as handle:
        for i in range(count):
            handle.write(json.dumps({"prompt": f"{prefix} {i}: do the thing and report"}) + "\n")
    return path


def ledger_records(run_dir: Path) -> Iterator[dict[str, Any]]:
    for path in sorted(run_dir.glob("batch_*.jsonl")):
        with path.open("rb") as handle:
            for raw in handle:
                if raw.endswith(b"\n"):
                    yield json.loads(raw)


@dataclass
class Window:
    """Throughput over the span from the first session start to the last session end."""

    trajectories: int
    seconds: float
    mean_session_s: float
    p50_session_s: float
    max_session_s: float
    first_wave_mean_s: float = 0.0
    """Mean session of the first ``wave`` sessions by start time (they all started at once)."""
    last_wave_mean_s: float = 0.0

    @property
    def per_second(self) -> float:
        return self.trajectories / self.seconds if self.seconds > 0 else 0.0


def session_window(run_dir: Path, wave: int = 0) -> Window:
    """Start = finish timestamp - duration of each record; the window spans all of them.

    ``wave`` (the sessions in flight) splits the sessions by start time to compare the first wave,
    which started all at once, with the last.
    """
    starts, ends, durations = [], [], []
    for record in ledger_records(run_dir):
        end = datetime.fromisoformat(record["metadata"]["timestamp"]).timestamp()
        starts.append(end - record["duration_s"])
        ends.append(end)
        durations.append(record["duration_s"])
    if not durations:
        return Window(0, 0.0, 0.0, 0.0, 0.0)
    by_start = [duration for _, duration in sorted(zip(starts, durations, strict=True))]
    wave = min(wave or len(by_start), len(by_start))
    ordered = sorted(durations)
    return Window(
        len(durations),
        max(ends) - min(starts),
        sum(durations) / len(durations),
        ordered[len(ordered) // 2],
        ordered[-1],
        sum(by_start[:wave]) / wave,
        sum(by_start[-wave:]) / wave,
    )


# -- trajkit run in a measured subprocess ---------------------------------------------------------


@dataclass
class Measured:
    """What one measured child process did."""

    returncode: int
    wall_s: float
    cpu_s: float
    """The process's own user + system CPU (all its threads)."""
    children_cpu_s: float
    """CPU of the processes it started and reaped (tool commands)."""
    max_rss: int
    """Peak resident set, bytes (the kernel's ru_maxrss)."""
    sampled_hwm: int
    """Peak of the sampled /proc/PID/status VmHWM, bytes."""
    max_threads: int
    max_fds: int
    stderr_tail: str
    main_thread_wait_s: float = 0.0
    """Time the main thread (the event loop) was runnable but waited for a CPU: other load."""
    cpu_pressure: float | None = None
    """Share of the wall time during which some task on the machine waited for a CPU (PSI)."""
    samples: list[tuple[float, int, int, float]] = field(default_factory=list)
    """(seconds since start, VmRSS bytes, open fds, own CPU seconds so far)."""
    tree_cpu_s: float | None = None
    """CPU of the process and everything it started, however they ended (:class:`TreeCPU`)."""

    @property
    def cpu_total_s(self) -> float:
        return self.cpu_s + self.children_cpu_s


def run_measured(
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 600.0,
    interval: float = 0.1,
    stdout: IO[bytes] | None = None,
) -> Measured:
    """Run ``argv``, sampling its memory, and account its CPU exactly (read while it is a zombie)."""
    started = time.monotonic()
    tree = TreeCPU()
    with open(os.devnull, "wb") as devnull, _tempfile() as errfile:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=stdout or devnull,
            stderr=errfile,
            env=env,
            cwd=cwd or NEUTRAL_CWD,
            preexec_fn=tree.join,  # a benchmark's child: this fork's cost is not measured
        )
        pid = proc.pid
        hwm = threads = fds = 0
        cpu = wait = 0.0
        pressure_before = cpu_pressure_total()
        samples: list[tuple[float, int, int, float]] = []
        killed = False
        while True:
            status = proc_status(pid)
            if status:
                hwm = max(hwm, status.get("VmHWM", 0))
                threads = max(threads, status.get("Threads", 0))
                nfds = open_fds(pid)
                fds = max(fds, nfds)
                with contextlib.suppress(OSError, ValueError):
                    cpu = proc_cpu(pid)[0]
                samples.append((round(time.monotonic() - started, 2), status.get("VmRSS", 0), nfds, cpu))
                wait = max(wait, schedstat(pid)[1])
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is not None and info.si_pid == pid:
                break
            if not killed and time.monotonic() - started > timeout:
                killed = True
                os.kill(pid, signal.SIGKILL)
            time.sleep(interval)
        wall = time.monotonic() - started
        own, children = proc_cpu(pid)
        wait = max(wait, schedstat(pid)[1])
        pressure_after = cpu_pressure_total()
        _, wait_status, usage = os.wait4(pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(wait_status)
        errfile.seek(0)
        tail = errfile.read().decode("utf-8", "replace")[-3000:]
    tree_cpu = tree.finish()
    if killed:
        tail += f"\n[killed after {timeout:g}s]"
    return Measured(
        proc.returncode,
        wall,
        own,
        children,
        usage.ru_maxrss * 1024,
        hwm,
        threads,
        fds,
        tail,
        wait,
        None
        if pressure_before is None or pressure_after is None
        else (pressure_after - pressure_before) / wall,
        samples,
        tree_cpu,
    )


@contextlib.contextmanager
def _tempfile() -> Iterator[Any]:
    with tempfile.TemporaryFile() as handle:
        yield handle


def trajkit_argv(
    dataset: Path,
    run_name: str,
    output_dir: Path,
    base_url: str,
    *,
    workers: int,
    extra: Sequence[str] = (),
    prefix: Sequence[str] = (),
) -> list[str]:
    """``trajkit run`` against the load server, quiet, filters that load answers cannot pass off."""
    return [
        *(prefix or [sys.executable]),
        "-m",
        "trajkit",
        "run",
        "--dataset_file",
        str(dataset),
        "--run_name",
        run_name,
        "--output_dir",
        str(output_dir),
        "--overwrite",
        "--quiet",
        "--model",
        "trajkit-test",
        "--base_url",
        base_url,
        "--num_workers",
        str(workers),
        "--no_filter",
        "no_reasoning",
        *extra,
    ]


def child_env(*sites: Path) -> dict[str, str]:
    """The runner's environment: no API keys, the plugin sites first on the path."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["PYTHONPATH"] = _pythonpath(*sites)
    return env


# -- reporting ------------------------------------------------------------------------------------


def marginal_memory(rows: list[dict[str, Any]], group: Sequence[str], peak: str, out: str) -> None:
    """Memory per session in flight, KiB, into ``row[out]``: (peak - the peak at the fewest in
    flight) / (n - that n), over the rows of one ``group`` (the keys that make a series)."""
    for key in {tuple(r[k] for k in group) for r in rows}:
        same = sorted((r for r in rows if tuple(r[k] for k in group) == key), key=lambda r: r["inflight"])
        for row in same[1:]:
            extra = (row[peak] - same[0][peak]) * 1024
            row[out] = round(extra / (row["inflight"] - same[0]["inflight"]), 1)


def mib(n: float) -> float:
    return round(n / 2**20, 1)


def save_json(path: Path | None, data: Any) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"results written to {path}")


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
