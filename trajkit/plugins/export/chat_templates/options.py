"""The ``trajkit export`` options of the chat-template export (no heavy imports: they load lazily)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click


def _template_vars(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, Any]:
    parsed: dict[str, Any] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE (KEY a template variable name)", param=param)
        try:
            parsed[key] = json.loads(value)  # true, 3, ["a"]: typed; anything else: the text
        except ValueError:
            parsed[key] = value
    return parsed


def chat_template_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--chat_template`` and its companions to ``command``."""
    options = [
        click.option(
            "--chat_template",
            "chat_templates",
            multiple=True,
            metavar="T",
            help="Render every row through this chat template: a model directory, a Hub id in the local "
            "Hugging Face cache, or a .jinja file (repeatable; one output per template).",
        ),
        click.option(
            "--chat_template_name",
            default=None,
            metavar="NAME",
            help="Which of a model's named templates to use (default: tool_use if it has one, else default).",
        ),
        click.option(
            "--template_var",
            "template_vars",
            multiple=True,
            callback=_template_vars,
            metavar="KEY=VALUE",
            help="A variable the template reads (e.g. datetime, enable_thinking=false); a JSON value or text.",
        ),
        click.option(
            "--out_format",
            type=click.Choice(["messages", "text"]),
            default="messages",
            show_default=True,
            help="messages: the adapted messages, tools and chat_template_kwargs; text: the rendered text "
            "with the assistant spans as character offsets.",
        ),
        click.option(
            "--split_parallel_calls",
            is_flag=True,
            default=False,
            help="For a template that renders one call a turn: split parallel calls into single-call turns, "
            "each followed by its result, instead of leaving the row out.",
        ),
    ]
    for option in reversed(options):
        command = option(command)
    return command
