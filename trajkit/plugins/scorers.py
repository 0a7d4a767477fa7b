"""The built-in scorers: a row's check command run in its sandbox, and reference-answer matching.

- ``command`` (row field ``check``): ``/bin/sh -c CHECK`` in the prompt's sandbox, in its working
  directory, after the agent's last turn; exit status 0 passes. The exit status and the output
  (head and tail) are the check's detail. A check that outlives ``--check_timeout`` fails.
- ``answer`` (row fields ``answer``, ``answer_pattern``): the model's final answer, stripped of
  surrounding whitespace, equals ``answer`` (stripped), or Python regular expression
  ``answer_pattern`` matches somewhere in it. A session without a final answer fails.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from trajkit import hookimpl
from trajkit.record.scorers import DETAIL_CHARS, Check, ScoreContext, Scorer, clip


@hookimpl
def trajkit_scorers() -> list[type[Scorer]]:
    return [CommandCheck, AnswerMatch]


class CommandCheck(Scorer):
    name = "command"
    description = "the row's 'check' command, run in the sandbox after the session, exits 0"
    fields = ("check",)

    def row_problem(self, row: Mapping[str, Any]) -> str | None:
        check = row.get("check")
        if not isinstance(check, str) or not check.strip():
            return f"'check' must be a non-empty command string, got {check!r}"
        return None

    async def score(self, context: ScoreContext) -> Check:
        result = await context.sandbox.exec(
            str(context.row["check"]), timeout=context.timeout, output_cap=4 * DETAIL_CHARS
        )
        output = (result.stdout + result.stderr).strip()
        if result.timed_out:
            return Check(False, 0.0, clip(f"timed out after {context.timeout:g}s\n{output}"))
        passed = result.exit_code == 0
        return Check(passed, 1.0 if passed else 0.0, clip(f"exit {result.exit_code}\n{output}"))


class AnswerMatch(Scorer):
    name = "answer"
    description = "the final answer equals the row's 'answer', or matches its 'answer_pattern' regex"
    fields = ("answer", "answer_pattern")

    def row_problem(self, row: Mapping[str, Any]) -> str | None:
        answer, pattern = row.get("answer"), row.get("answer_pattern")
        if answer is not None and not isinstance(answer, str | int | float):
            return f"'answer' must be a string or a number, got {type(answer).__name__}"
        if pattern is not None:
            if not isinstance(pattern, str):
                return f"'answer_pattern' must be a string, got {type(pattern).__name__}"
            try:
                re.compile(pattern)
            except re.error as exc:
                return f"'answer_pattern' is not a valid regular expression: {exc}"
        return None

    async def score(self, context: ScoreContext) -> Check:
        given = (context.final_response or "").strip()
        if context.final_response is None:
            return Check(False, 0.0, "no final answer")
        answer, pattern = context.row.get("answer"), context.row.get("answer_pattern")
        if answer is not None:
            expected = str(answer).strip()
            if given == expected:
                return Check(True, 1.0, f"answer {expected!r} given exactly")
            if pattern is None:
                return Check(False, 0.0, clip(f"expected {expected!r}, got {given!r}"))
        if pattern is not None and re.search(str(pattern), given):
            return Check(True, 1.0, f"answer matches {pattern!r}")
        return Check(False, 0.0, clip(f"no match for {pattern!r} in {given!r}"))
