"""Rendering a row exactly as transformers does, and checking that the rendering kept the row.

Rendering goes through transformers' own ``render_jinja_template`` (the function
``apply_chat_template`` calls, with the same sandboxed Jinja2 environment, globals and filters),
so the text checked here is the text a trainer on the same transformers version tokenizes;
``docs/BENCHMARKS.md`` says why this costs less than keeping a copy of that environment in step.

The checks run on the :class:`~.adapt.Probe` rendering, where every piece of text is a unique
marker: each tool call, each tool result, each user turn and each assistant text appears exactly
once; each tool's description at least once (the tool list is there) and the system prompt once;
each call's arguments are a JSON object where they appear (or the template's own one-parameter-
a-tag form), never a JSON string inside JSON nor a Python dict; reasoning, where the template
reads it, appears at most once a turn and not nowhere. Then the real rendering: each call's
arguments decode from the text as the object the model sent, and every user turn is there
verbatim (unicode unescaped).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trajkit.plugins.export.chat_templates.adapt import Adapted, Probe, Profile, probe
from trajkit.plugins.export.chat_templates.source import ChatTemplate, TemplateSourceError

GENERATION_TAG = re.compile(r"\{%-?\s*(end)?generation\s*-?%\}")
TRANSFORMERS_MISSING = "--chat_template needs transformers: pip install 'trajkit[chat-templates]'"

MISSING = {
    "system": "system_prompt_missing",
    "user": "user_message_missing",
    "content": "content_dropped",
    "result": "tool_result_missing",
    "call": "tool_call_missing",
}
REPEATED = {
    "system": "system_prompt_repeated",
    "user": "user_message_repeated",
    "content": "content_repeated",
    "result": "tool_result_repeated",
    "call": "tool_call_repeated",
    "reasoning": "reasoning_repeated",
}
ARGUMENT_FORMS = {
    "json_object": None,
    "parameters": None,
    "json_string": "arguments rendered as a JSON string inside JSON (double-encoded)",
    "python_repr": "arguments rendered as a Python dict, not JSON",
    "unrecognised": "arguments rendered in no form a parser could read back",
}


class RenderError(Exception):
    """The template refused the conversation (its own ``raise_exception``, or an error in it)."""


class SpanError(Exception):
    """An assistant turn's span in the rendered text cannot be found."""


@dataclass
class Problem:
    kind: str
    detail: str


@dataclass
class Outcome:
    """What the checks found in one row."""

    problems: list[Problem] = field(default_factory=list)
    reasoning_turns: int = 0
    reasoning_rendered: int = 0


def _renderer() -> Callable[..., Any]:
    try:
        from transformers.utils import logging as transformers_logging
        from transformers.utils.chat_template_utils import render_jinja_template
    except ImportError as exc:
        raise TemplateSourceError(f"{TRANSFORMERS_MISSING} ({exc})") from None
    transformers_logging.set_verbosity_error()
    return render_jinja_template


def transformers_version() -> str:
    try:
        import transformers
    except ImportError:
        return "not installed"
    return str(transformers.__version__)


def render(
    template: ChatTemplate,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]],
    kwargs: Mapping[str, Any],
    *,
    add_generation_prompt: bool = False,
    track: bool = False,
) -> tuple[str, list[tuple[int, int]]]:
    """The text of ``messages`` and, with ``track``, the template's ``{% generation %}`` spans."""
    render_jinja_template = _renderer()
    try:
        texts, indices = render_jinja_template(
            conversations=[list(messages)],
            tools=list(tools) or None,
            chat_template=template.text,
            add_generation_prompt=add_generation_prompt,
            return_assistant_tokens_mask=track,
            **{**template.variables, **kwargs},
        )
    except Exception as exc:  # a template is code: it fails in any way it likes
        raise RenderError(describe(exc)) from None
    return texts[0], [(int(start), int(end)) for start, end in indices[0]] if track else []


def describe(exc: Exception) -> str:
    import jinja2

    message = str(exc) or type(exc).__name__
    if isinstance(exc, jinja2.UndefinedError):
        found = re.search(r"'(\w+)' is undefined", message)
        hint = f"{found.group(1)}=VALUE" if found else "NAME=VALUE"
        return f"{message} (the template needs a variable: give it with --template_var {hint})"
    if isinstance(exc, jinja2.TemplateError):
        return message
    return f"{type(exc).__name__}: {message}"


def template_variables(text: str) -> frozenset[str]:
    """The variables a template reads from its context (undeclared in it)."""
    import jinja2
    import jinja2.meta

    environment = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
    try:
        ast = environment.parse(GENERATION_TAG.sub("", text))
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateSourceError(f"the template does not parse: {exc}") from None
    return frozenset(jinja2.meta.find_undeclared_variables(ast))


def has_generation_spans(text: str) -> bool:
    return GENERATION_TAG.search(text) is not None


# -- the checks ---------------------------------------------------------------------------------


def check_row(template: ChatTemplate, profile: Profile, adapted: Adapted) -> tuple[str | None, Outcome]:
    """Render ``adapted`` and its probe; the text (None if the template refused it) and the findings."""
    try:
        text, _ = render(template, adapted.messages, adapted.tools, adapted.kwargs)
    except RenderError as exc:
        return None, Outcome([Problem("template_error", str(exc))])
    marked = probe(adapted, profile)
    try:
        probe_text, _ = render(template, marked.messages, marked.tools, marked.kwargs)
    except RenderError as exc:
        return None, Outcome([Problem("template_error", f"{exc} (on the marked copy of the row)")])
    outcome, forms = check_pieces(probe_text, marked, profile)
    outcome.problems += check_text(text, adapted, forms)
    return text, outcome


def check_pieces(text: str, marked: Probe, profile: Profile) -> tuple[Outcome, list[str]]:
    """Count every marker in the probe's rendering; the findings and each call's argument form."""
    outcome = Outcome()
    forms: list[str] = []
    calls = [m for m, (kind, _) in marked.pieces.items() if kind == "call"]
    missing_calls = [m for m in calls if m not in text]
    if calls and len(missing_calls) == len(calls):
        outcome.problems.append(
            Problem("tool_calls_dropped", f"the template renders none of the row's {len(calls)} tool calls")
        )
    for mark, (kind, what) in marked.pieces.items():
        count = text.count(mark)
        if kind == "tool":
            if not count:
                outcome.problems.append(Problem("tool_list_missing", f"{what} is not in the text"))
            continue
        if kind == "reasoning":
            outcome.reasoning_turns += 1
            outcome.reasoning_rendered += bool(count)
        elif not count and not (kind == "call" and len(missing_calls) == len(calls)):
            outcome.problems.append(Problem(MISSING[kind], f"{what} is not in the text"))
        if count > 1:
            outcome.problems.append(Problem(REPEATED[kind], f"{what} appears {count} times"))
        if kind == "call":
            form = arguments_form(text, mark, marked.arguments[mark]) if mark in marked.arguments else "text"
            forms.append(form)
            if ARGUMENT_FORMS.get(form):
                outcome.problems.append(Problem("arguments_not_json", f"{what}: {ARGUMENT_FORMS[form]}"))
    if profile.reasoning_field and outcome.reasoning_turns and not outcome.reasoning_rendered:
        outcome.problems.append(
            Problem(
                "reasoning_dropped",
                f"the template reads {profile.reasoning_field} but renders none of the row's reasoning",
            )
        )
    return outcome, forms


def arguments_form(text: str, mark: str, arguments: Any) -> str:
    """How a call's (marked) arguments object was encoded where it appears."""
    position = text.find(mark)
    if position < 0:
        return "missing"
    start = max(0, position - 400)
    decoder = json.JSONDecoder()
    for brace in range(position - 1, start - 1, -1):
        if text[brace] != "{":
            continue
        try:
            value, _ = decoder.raw_decode(text, brace)
        except ValueError:
            continue
        if value == arguments:
            return "json_object"
    if text[position - 2 : position] == '\\"':
        return "json_string"
    if text[position - 1 : position] == "'":
        return "python_repr"
    if next(iter(arguments)) in text[start:position]:
        return "parameters"
    return "unrecognised"


def check_text(text: str, adapted: Adapted, forms: Sequence[str]) -> list[Problem]:
    """The real rendering: JSON arguments decode as the model's objects; user turns verbatim."""
    problems = []
    calls = [call for m in adapted.messages for call in m.get("tool_calls") or []]
    objects = _json_objects(text) if "json_object" in forms else []
    for number, (call, form) in enumerate(zip(calls, forms, strict=False), 1):
        if form != "json_object":
            continue
        arguments = call["function"]["arguments"]
        expected = json.loads(arguments) if isinstance(arguments, str) else arguments
        if expected not in objects:
            name = call["function"]["name"]
            problems.append(
                Problem(
                    "arguments_not_found",
                    f"call {number} ({name}): its arguments are not in the text as the JSON object the model sent",
                )
            )
    for message in adapted.messages:
        content = message.get("content")
        if message["role"] == "user" and isinstance(content, str) and content.strip() not in text:
            problems.append(Problem("user_message_altered", "a user turn is not in the text as written"))
    return problems


def _json_objects(text: str) -> list[Any]:
    decoder = json.JSONDecoder()
    found = []
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        found.append(value)
    return found


# -- assistant spans ----------------------------------------------------------------------------


def assistant_spans(template: ChatTemplate, adapted: Adapted, text: str) -> tuple[list[list[int]], str]:
    """Character spans of the assistant's turns in ``text`` and where they came from: the
    template's ``{% generation %}`` blocks when it has them (what transformers' assistant mask
    uses), else each assistant turn as the text the model produces after the generation prompt."""
    if has_generation_spans(template.text):
        _, marked = render(template, adapted.messages, adapted.tools, adapted.kwargs, track=True)
        return [list(span) for span in marked], "generation"
    spans: list[list[int]] = []
    cursor = 0
    for index, message in enumerate(adapted.messages):
        if message["role"] != "assistant":
            continue
        earlier = adapted.messages[:index]
        try:
            previous, _ = render(template, earlier, adapted.tools, adapted.kwargs)
            prompted, _ = render(template, earlier, adapted.tools, adapted.kwargs, add_generation_prompt=True)
            upto, _ = render(template, adapted.messages[: index + 1], adapted.tools, adapted.kwargs)
        except RenderError as exc:
            raise SpanError(f"assistant turn {index} cannot be rendered on its own: {exc}") from None
        # the turn as generated: what follows the generation prompt (or where the stored turn
        # leaves it, e.g. a prompt that opens <think> for a turn stored without one, as TRL splits
        # a completion); it must stand in the row's text after the turns before it
        start = _common_prefix(prompted, upto)
        turn = upto[start:]
        found = text.find(turn, cursor) if turn and start >= _common_prefix(previous, upto) else -1
        if found < 0:
            raise SpanError(
                f"the template renders assistant turn {index} differently once later turns follow, "
                "so the text it was generated as is not a span of the row"
            )
        spans.append([found, found + len(turn)])
        cursor = found + len(turn)
    return spans, "turns"


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
