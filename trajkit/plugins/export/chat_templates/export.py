"""The rows of a run through one or more chat templates: adapted, rendered, checked, written, reported.

Per template, once: what the template needs of the rows (:func:`fit_template`), found by
rendering a small sample conversation through it with each candidate adaptation until one passes
every check, and what it cannot take (parallel calls, text beside reasoning or beside calls in a
calling turn), found by rendering variants of the sample. Per row: adapt, render, check; a row
that fails is left out with the reason, the template's limit when the row has that feature, else
the first failed check. ``--out_format messages`` writes the adapted messages (what TRL and
Axolotl render through the same template: ``chat_template_kwargs`` carries any variable it needs);
``--out_format text`` the rendered text with the assistant spans.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from trajkit.jsonutil import dumps_line
from trajkit.plugins.export.chat_templates.adapt import (
    REASONING_FIELDS,
    TOOLS_VARIABLES,
    Adapted,
    Profile,
    adapt,
    has_parallel_calls,
)
from trajkit.plugins.export.chat_templates.check import (
    Outcome,
    SpanError,
    assistant_spans,
    check_row,
    template_variables,
    transformers_version,
)
from trajkit.plugins.export.chat_templates.source import ChatTemplate
from trajkit.plugins.export.writers import scalar_fields

OUT_FORMATS = ("messages", "text")
LIMITS = {
    "parallel_tool_calls": "the template renders one tool call per assistant turn (--split_parallel_calls splits them)",
    "content_with_reasoning": "the template refuses text and reasoning together in a turn that calls tools",
    "content_with_tool_calls": "the template drops the text of a turn that calls tools",
}
"""What a template may be unable to express, as the reasons rows are left out for."""


# -- fitting the template -----------------------------------------------------------------------

SAMPLE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The sample's {name} tool.",
            "parameters": {"type": "object", "properties": {key: {"type": "string"}}, "required": [key]},
        },
    }
    for name, key in (("terminal", "command"), ("read_file", "path"))
]


def sample_record(
    parallel: bool = False, content_with_reasoning: bool = False, content_with_calls: bool = False
) -> dict[str, Any]:
    """A short tool-calling conversation, in the trajectory record's shape, to fit a template with."""
    ls = {"id": "call_0a1b2c3d4e5f", "name": "terminal", "arguments": '{"command": "ls"}'}
    read = {"id": "call_9f8e7d6c5b4a", "name": "read_file", "arguments": '{"path": "a.txt"}'}
    text = "Let me look." if content_with_reasoning or content_with_calls else ""
    thought = "" if content_with_calls else "I should look first."
    first = {
        "from": "gpt",
        "value": text,
        "reasoning": thought,
        "tool_calls": [ls, read] if parallel else [ls],
    }
    turns: list[dict[str, Any]] = [
        {"from": "system", "value": "You are a careful assistant."},
        {"from": "human", "value": "What does the file say?"},
        first,
        {"from": "tool", "value": "a.txt", "tool_call_id": ls["id"], "name": "terminal"},
    ]
    if not parallel:
        turns.append({"from": "gpt", "value": "", "reasoning": "Now read it.", "tool_calls": [read]})
    turns += [
        {"from": "tool", "value": "hello", "tool_call_id": read["id"], "name": "read_file"},
        {"from": "gpt", "value": "It says hello.", "reasoning": "Done.", "tool_calls": []},
    ]
    return {"conversations": turns}


@dataclass
class Fit:
    """What a template needs of the rows and what it cannot take."""

    profile: Profile
    fitted: bool
    """Whether the sample passed every check with :attr:`profile`."""
    limits: dict[str, bool] = field(default_factory=dict)
    """Each of :data:`LIMITS`: True when the template cannot express it."""
    sample_problems: list[str] = field(default_factory=list)


def static_profile(template: ChatTemplate) -> Profile:
    """The reasoning field and tools variable the template's source reads."""
    reads = template_variables(template.text)
    reasoning = next(
        (name for name, pattern in REASONING_FIELDS.items() if pattern.search(template.text)), None
    )
    tools = next((name for name in TOOLS_VARIABLES if name in reads), None)
    return Profile(reasoning_field=reasoning, tools_variable=tools)


def _problems(
    template: ChatTemplate, profile: Profile, record: Mapping[str, Any], extra: Mapping[str, Any]
) -> list[str]:
    _, outcome = check_row(template, profile, adapt(record, SAMPLE_TOOLS, profile, extra))
    return [problem.kind for problem in outcome.problems]


def fit_template(template: ChatTemplate, extra: Mapping[str, Any]) -> Fit:
    """Try each argument form and id form on the sample: the first that passes every check (else
    the one that fails least: no template error, fewest problems), and what the template cannot
    express (the sample's variants that fail with that profile)."""
    base = static_profile(template)
    sample = sample_record()
    tried = []
    for arguments in ("object", "string"):
        for call_ids in ("kept", "alnum9"):
            profile = Profile(arguments, call_ids, base.reasoning_field, base.tools_variable)
            problems = _problems(template, profile, sample, extra)
            if not problems:
                return Fit(profile, True, _limits(template, profile, extra))
            tried.append((("template_error" in problems, len(problems)), profile, problems))
    _, profile, problems = min(tried, key=lambda entry: entry[0])
    return Fit(profile, False, {}, problems)


def _limits(template: ChatTemplate, profile: Profile, extra: Mapping[str, Any]) -> dict[str, bool]:
    with_reasoning = _problems(template, profile, sample_record(content_with_reasoning=True), extra)
    return {
        "parallel_tool_calls": bool(_problems(template, profile, sample_record(parallel=True), extra)),
        # refused outright (gpt-oss raises); a template that only drops the text is the next limit
        "content_with_reasoning": "template_error" in with_reasoning,
        "content_with_tool_calls": bool(
            _problems(template, profile, sample_record(content_with_calls=True), extra)
        ),
    }


# -- one template's export -------------------------------------------------------------------


@dataclass
class RowResult:
    row: dict[str, Any] | None
    reason: str | None = None
    detail: str | None = None


class TemplateExport:
    """One template's rows: each adapted, rendered, checked; the counts for the report."""

    def __init__(
        self, template: ChatTemplate, extra: Mapping[str, Any], out_format: str, split: bool
    ) -> None:
        self.template = template
        self.extra = dict(extra)
        self.out_format = out_format
        self.split = split
        self.fit = fit_template(template, extra)
        self.rows = 0
        self.rendered = 0
        self.adapted: Counter[str] = Counter()
        self.left_out: Counter[str] = Counter()
        self.reasoning_not_rendered = 0

    def process(self, record: Mapping[str, Any], tools: Sequence[Mapping[str, Any]]) -> RowResult:
        self.rows += 1
        profile = self.fit.profile
        adapted = adapt(
            record,
            tools,
            profile,
            self.extra,
            self.split and self.fit.limits.get("parallel_tool_calls", False),
        )
        text, outcome = check_row(self.template, profile, adapted)
        if outcome.problems or text is None:
            return self._left_out(adapted, outcome)
        row: dict[str, Any]
        if self.out_format == "text":
            try:
                spans, source = assistant_spans(self.template, adapted, text)
            except SpanError as exc:
                return self._count(RowResult(None, "assistant_spans", str(exc)))
            row = {"text": text, "assistant_spans": spans, "spans_from": source}
        else:
            row = {"messages": adapted.messages, "tools": adapted.tools}
            if adapted.kwargs:
                row["chat_template_kwargs"] = adapted.kwargs
        row["chat_template_adaptations"] = sorted(adapted.changes)
        row.update(scalar_fields(record))
        self.rendered += 1
        self.adapted.update(adapted.changes)
        if profile.reasoning_field:
            self.reasoning_not_rendered += outcome.reasoning_turns - outcome.reasoning_rendered
        return RowResult(row)

    def _left_out(self, adapted: Adapted, outcome: Outcome) -> RowResult:
        messages = adapted.messages
        calling = [m for m in messages if m.get("tool_calls")]
        field_name = self.fit.profile.reasoning_field or "reasoning_content"
        limits = self.fit.limits
        if limits.get("parallel_tool_calls") and has_parallel_calls(messages):
            return self._count(RowResult(None, "parallel_tool_calls", LIMITS["parallel_tool_calls"]))
        if limits.get("content_with_reasoning") and any(
            m.get("content") and m.get(field_name) for m in calling
        ):
            return self._count(RowResult(None, "content_with_reasoning", LIMITS["content_with_reasoning"]))
        if limits.get("content_with_tool_calls") and any(m.get("content") for m in calling):
            return self._count(RowResult(None, "content_with_tool_calls", LIMITS["content_with_tool_calls"]))
        first = outcome.problems[0]
        return self._count(RowResult(None, first.kind, "; ".join(p.detail for p in outcome.problems[:3])))

    def _count(self, result: RowResult) -> RowResult:
        self.left_out[str(result.reason)] += 1
        return result

    def report(self) -> dict[str, Any]:
        profile = self.fit.profile
        return {
            "template": self.template.name,
            "origin": self.template.origin,
            "transformers": transformers_version(),
            "rows": self.rows,
            "rendered": self.rendered,
            "adapted": dict(sorted(self.adapted.items())),
            "left_out": dict(sorted(self.left_out.items())),
            "profile": {
                "arguments": profile.arguments,
                "call_ids": profile.call_ids,
                "reasoning_field": profile.reasoning_field,
                "tools_variable": profile.tools_variable,
            },
            "cannot_express": sorted(k for k, v in self.fit.limits.items() if v),
            "fits_a_tool_calling_sample": self.fit.fitted,
            "sample_problems": self.fit.sample_problems,
            "reasoning_turns_not_rendered": self.reasoning_not_rendered,
        }


def write_template_export(
    export: TemplateExport,
    records: Iterable[Mapping[str, Any]],
    schemas_for: Callable[[Mapping[str, Any]], Sequence[Mapping[str, Any]]],
    out: IO[bytes],
    left_out: IO[bytes],
) -> dict[str, Any]:
    """Every record through ``export``: kept rows to ``out``, the others with reasons to ``left_out``."""
    for record in records:
        result = export.process(record, schemas_for(record))
        if result.row is not None:
            out.write(dumps_line(result.row))
        else:
            entry = {key: record.get(key) for key in ("work_id", "prompt_id", "prompt_index", "sample")}
            left_out.write(dumps_line({**entry, "reason": result.reason, "detail": result.detail}))
    return export.report()


def report_table(reports: Sequence[Mapping[str, Any]]) -> str:
    """The per-template report as a plain table: rows, rendered, adapted and left out by kind."""
    lines = [f"{'template':<34} {'rows':>5} {'rendered':>8}  adapted / left out"]
    for report in reports:
        adapted = ", ".join(f"{k} {v}" for k, v in report["adapted"].items()) or "-"
        left = ", ".join(f"{k} {v}" for k, v in report["left_out"].items()) or "-"
        lines.append(
            f"{report['template'][:34]:<34} {report['rows']:>5} {report['rendered']:>8}  adapted: {adapted}"
        )
        lines.append(f"{'':<34} {'':>5} {'':>8}  left out: {left}")
    return "\n".join(lines)


def report_json(reports: Sequence[Mapping[str, Any]]) -> str:
    return json.dumps(list(reports), ensure_ascii=False, indent=2) + "\n"


def output_name(template: ChatTemplate, out_format: str) -> str:
    """The file name of one template's rows when several templates share a directory."""
    return f"trajectories.{out_format}.{template.slug}.jsonl"


def beside(target: Path, suffix: str) -> Path:
    """A companion file of ``target``: ``rows.jsonl`` -> ``rows.SUFFIX``."""
    return target.with_name(f"{target.name.removesuffix('.jsonl')}.{suffix}")
