"""Profiling ``trajkit run`` and summarising where its CPU goes.

py-spy (sampling, only samples that hold the GIL) is the default; cProfile is the fallback that
needs nothing installed. Both summaries attribute each sample (or each second) to the innermost
trajkit function on the stack, so the table reads "this part of trajkit, including the library
calls it makes", and list the top functions by their own time.
"""

from __future__ import annotations

import pstats
import re
import shutil
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>.*?)(?::(?P<line>\d+))?\)$")
_SITE = re.compile(r".*/(site-packages|lib/python3\.\d+)/")


def py_spy_available() -> bool:
    return shutil.which("py-spy") is not None


def py_spy_prefix(output: Path, rate: int = 200) -> list[str]:
    """Prefix for the command line: ``py-spy record ... -- python``."""
    return ["py-spy", "record", "--gil", "--threads", "-r", str(rate), "-f", "raw", "-o", str(output), "--"]


def cprofile_args(output: Path) -> list[str]:
    """Arguments after ``python``: ``-m cProfile -o FILE``."""
    return ["-m", "cProfile", "-o", str(output)]


@dataclass
class Summary:
    total: float
    """Samples (py-spy) or seconds (cProfile) in the run's main thread."""
    phases: Counter[str] = field(default_factory=Counter)
    by_trajkit: Counter[str] = field(default_factory=Counter)
    """Session phase only: innermost trajkit function (or the library entry point without one)."""
    by_self: Counter[str] = field(default_factory=Counter)
    """Session phase only: the function on top of the stack."""
    by_package: Counter[str] = field(default_factory=Counter)
    """Session phase only: the package of the function on top of the stack."""
    session_total: float = 0.0
    other_threads: float = 0.0

    def top(self, counter: Counter[str], n: int) -> list[tuple[str, float]]:
        base = self.session_total or 1.0
        return [(name, 100.0 * value / base) for name, value in counter.most_common(n)]

    def render(self, n: int = 15, per_turn_ms: float | None = None) -> str:
        lines = []
        total = self.total or 1.0
        lines.append("phases of the runner's main thread (share of its samples):")
        for phase, value in self.phases.most_common():
            lines.append(f"  {100.0 * value / total:5.1f}%  {phase}")
        if self.other_threads:
            lines.append(
                f"  other threads: {100.0 * self.other_threads / (total + self.other_threads):.1f}% of all"
            )
        scale = f" (~ms/turn at {per_turn_ms:.2f} ms/turn)" if per_turn_ms else ""
        for title, counter in (
            ("session phase by package of the running function" + scale, self.by_package),
            ("session phase by innermost trajkit function" + scale, self.by_trajkit),
            ("session phase by own time (top of stack)" + scale, self.by_self),
        ):
            lines.append(title + ":")
            for name, share in self.top(counter, n):
                ms = f"  {share * per_turn_ms / 100:6.3f} ms" if per_turn_ms else ""
                lines.append(f"  {share:5.1f}%{ms}  {name}")
        return "\n".join(lines)


def _short(frame: str) -> tuple[str, str]:
    """('func (file)', file) with site-packages paths shortened and the line number dropped."""
    match = _FRAME.match(frame)
    if not match:
        return frame, ""
    path = _SITE.sub("", match.group("file"))
    path = path.split("/work/main/", 1)[-1]
    return f"{match.group('func')} ({path})", path


def _phase(names: Sequence[str]) -> str:
    joined = ";".join(names)
    if "Runner._finalize" in joined:
        return "merge and statistics (finalize)"
    if "_find_and_load" in joined:
        return "imports"
    if "BaseEventLoop._run_once" in joined:
        return "sessions (the event loop)"
    return "startup, planning and shutdown"


def _attribute(names: Sequence[str], paths: Sequence[str]) -> str:
    """The innermost trajkit frame below the event loop, else what the loop itself was doing."""
    start = max((i for i, n in enumerate(names) if n.startswith("BaseEventLoop._run_once")), default=-1) + 1
    below = list(zip(names[start:], paths[start:], strict=True))
    for name, path in reversed(below):
        if path.startswith("trajkit"):
            return name
    # No trajkit frame: a callback of the event loop (transport, timers) or the selector.
    for name, path in below:
        if not path.startswith(("asyncio/", "<frozen", "runpy", "contextvars")):
            return f"event loop: {name}"
    return f"event loop: {below[-1][0] if below else '?'}"


def summarise_py_spy(raw: Path) -> Summary:
    summary = Summary(0.0)
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        thread, *frames = stack.split(";")
        shortened = [_short(f) for f in frames]
        names = [s[0] for s in shortened]
        paths = [s[1] for s in shortened]
        if "MainThread" not in thread:
            summary.other_threads += count
            continue
        summary.total += count
        phase = _phase(names)
        summary.phases[phase] += count
        if phase.startswith("sessions"):
            summary.session_total += count
            summary.by_trajkit[_attribute(names, paths)] += count
            summary.by_self[names[-1] if names else "?"] += count
            summary.by_package[_package(paths[-1] if paths else "?")] += count
    return summary


def _package(path: str) -> str:
    if path.startswith("trajkit/plugins/"):
        return path.removesuffix(".py")
    if path.startswith("<frozen") or "/" not in path:
        return f"stdlib {path.removesuffix('.py')}" if path else "?"
    return path.split("/", 1)[0] + "/"


def summarise_cprofile(path: Path) -> Summary:
    """Own time per function; the innermost-trajkit view is approximated by trajkit functions' own
    time plus the own time of non-trajkit functions they call directly."""
    stats = pstats.Stats(str(path))
    raw = stats.stats  # type: ignore[attr-defined]
    summary = Summary(0.0)
    for (file, _line, func), (_cc, _nc, tottime, _cumtime, callers) in raw.items():
        name, short = _short(f"{func} ({file})")
        summary.total += tottime
        summary.by_self[name] += tottime
        summary.by_package[_package(short)] += tottime
        if short.startswith("trajkit"):
            summary.by_trajkit[name] += tottime
            continue
        trajkit_callers = [c for c in callers if _short(f"{c[2]} ({c[0]})")[1].startswith("trajkit")]
        if trajkit_callers:
            total_from = sum(callers[c][2] for c in callers) or 1.0
            for caller in trajkit_callers:
                share = tottime * callers[caller][2] / total_from
                summary.by_trajkit[_short(f"{caller[2]} ({caller[0]})")[0]] += share
        else:
            summary.by_trajkit[name] += tottime
    summary.session_total = summary.total
    summary.phases["whole process (cProfile does not split phases)"] = summary.total  # type: ignore[assignment]  # seconds: Counter holds floats too
    return summary
