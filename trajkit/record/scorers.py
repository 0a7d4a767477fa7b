"""Scorers: verify a finished session against what its dataset row says success is.

A row may carry a check: a command to run in the prompt's sandbox after the session (``"check":
"pytest -q tests/"``), a reference answer (``"answer": "42"``), or whatever field a third-party
scorer reads. Every registered scorer (hook ``trajkit_scorers``) that applies to the row gives a
:class:`Check`; together they are the record's ``score``::

    "score": {"passed": true, "value": 1.0,
              "checks": [{"scorer": "command", "passed": true, "value": 1.0, "detail": "exit 0: ..."}]}

``score`` is null when no scorer applies to the row. Scoring runs in the attempt, after the
agent's last turn (and after the session's tools closed: nothing it started still runs) and
before the sandbox is closed, within the attempt's ``--prompt_timeout``. A row's
``check_files`` are copied fresh into the sandbox first (:mod:`trajkit.sandbox.check_files`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from trajkit.sandbox import Sandbox, SandboxError
from trajkit.sandbox.check_files import CheckFile, CheckFilesError, install

DETAIL_CHARS = 2000
"""Characters of a check's detail (a command's output, say) kept in the record: head and tail."""


@dataclass(frozen=True)
class Check:
    """One scorer's verdict on one trajectory."""

    passed: bool
    value: float
    """1.0 for a pass, 0.0 for a fail, or a partial credit in between."""
    detail: str = ""
    """What a person reads to see why (an exit status and the output, the answer given...)."""


@dataclass(frozen=True)
class ScoreContext:
    """What a scorer sees of a finished session."""

    row: Mapping[str, Any]
    """The dataset row: ``prompt``, ``image``, ``cwd``, ``backend`` and its other fields."""
    final_response: str | None
    """The model's final answer, None when the session ended without one."""
    messages: Sequence[Mapping[str, Any]]
    """The conversation as saved (OpenAI message format)."""
    sandbox: Sandbox
    """The prompt's sandbox, still open, as the agent left it."""
    timeout: float
    """Seconds a command the scorer runs may take (``--check_timeout``)."""


class Scorer(ABC):
    """Scores trajectories of rows that carry what it checks against.

    Scorers are instantiated once where sessions run; :meth:`score` may be called for many
    sessions at once, so keep no per-session state on the instance.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    fields: ClassVar[tuple[str, ...]] = ()
    """The row fields the scorer reads; it applies to a row that has any of them."""

    def applies(self, row: Mapping[str, Any]) -> bool:
        return any(row.get(field) is not None for field in self.fields)

    def row_problem(self, row: Mapping[str, Any]) -> str | None:
        """Why the row's check cannot be used (the run reports it as a bad row), else None."""
        return None

    @abstractmethod
    async def score(self, context: ScoreContext) -> Check:
        """The verdict. A :class:`~trajkit.sandbox.SandboxError` fails the attempt (it is retried);
        any other exception is a failed check that names it (the session is kept)."""


def clip(text: str, limit: int = DETAIL_CHARS) -> str:
    """``text`` with its head and tail kept when longer than ``limit``, the cut marked."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def row_problems(scorers: Sequence[Scorer], row: Mapping[str, Any]) -> list[str]:
    return [f"{s.name}: {problem}" for s in scorers if s.applies(row) and (problem := s.row_problem(row))]


async def score_session(
    scorers: Sequence[Scorer], context: ScoreContext, check_files: Sequence[CheckFile] = ()
) -> dict[str, Any] | None:
    """The record's ``score`` from every scorer that applies to the row, or None if none does.

    The row's ``check_files`` are put in place first (see :mod:`trajkit.sandbox.check_files`); when the
    sandbox refuses them, every check fails saying why, unrun.
    """
    applying = [scorer for scorer in scorers if scorer.applies(context.row)]
    refused = None
    if applying and check_files:
        try:
            await install(context.sandbox, check_files)
        except CheckFilesError as exc:
            refused = Check(False, 0.0, f"the check files could not be put in place: {exc.strerror or exc}")
    checks: list[dict[str, Any]] = []
    for scorer in applying:
        try:
            check = refused or await scorer.score(context)
        except SandboxError:
            raise  # the sandbox is broken: the attempt fails and is retried
        except Exception as exc:  # a broken scorer fails its check, not the paid-for session
            check = Check(False, 0.0, f"the scorer failed: {type(exc).__name__}: {exc}")
        value = float(check.value)
        checks.append(
            {
                "scorer": scorer.name,
                "passed": bool(check.passed),
                "value": value if math.isfinite(value) else 0.0,
                "detail": clip(str(check.detail)),
            }
        )
    if not checks:
        return None
    return {
        "passed": all(c["passed"] for c in checks),
        "value": round(sum(c["value"] for c in checks) / len(checks), 6),
        "checks": checks,
    }
