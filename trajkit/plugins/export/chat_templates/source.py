"""Where a chat template comes from: a ``.jinja`` file, a model directory, or a Hub id in the local cache.

A model directory holds the template the way transformers saves and loads it: ``chat_template.jinja``
(transformers 4.50 and later), or the ``chat_template`` entry of ``tokenizer_config.json`` (a string,
or a list of named templates; the ``tool_use`` one is taken when there is one, as transformers does
when tools are passed, else ``default``), plus named templates in ``additional_chat_templates/``.
The template's variables are the tokenizer's named special tokens (``bos_token``, ``eos_token``, ...),
which ``apply_chat_template`` passes to every template. A Hub id is looked up in the local Hugging
Face cache only: an export never downloads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
"""The named special tokens transformers hands a template (``special_tokens_map``)."""
TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
NAMED_DIR = "additional_chat_templates"
HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


class TemplateSourceError(Exception):
    """The template could not be found or read; the message says why and what to do."""


@dataclass(frozen=True)
class ChatTemplate:
    """A template and the variables it is rendered with."""

    name: str
    """A short name for reports and file names (the file's stem, the directory's name, the id)."""
    origin: str
    """Where it was read from."""
    text: str
    variables: dict[str, Any] = field(default_factory=dict)
    """The tokenizer's special tokens plus ``--template_var`` values (which win)."""

    @property
    def slug(self) -> str:
        return re.sub(r"[^\w.-]+", "-", self.name).strip("-") or "template"


def load_chat_template(
    spec: str, template_name: str | None = None, variables: Mapping[str, Any] | None = None
) -> ChatTemplate:
    """The template ``spec`` names; ``template_name`` picks one of several named templates."""
    path = Path(spec).expanduser()
    if path.is_file():
        if template_name is not None:
            raise TemplateSourceError(
                f"{spec} is a single template; --chat_template_name needs a model directory"
            )
        text = _read(path)
        return ChatTemplate(path.stem, str(path), text, dict(variables or {}))
    if path.is_dir():
        return _from_directory(path, path.name, template_name, variables)
    if spec.endswith(".jinja"):
        raise TemplateSourceError(f"{spec}: no such template file")
    if HUB_ID.match(spec):
        return _from_directory(_cached_snapshot(spec), spec, template_name, variables)
    raise TemplateSourceError(
        f"{spec}: not a .jinja file, a model directory or a Hub id (organisation/name) in the local cache"
    )


def _from_directory(
    directory: Path, name: str, template_name: str | None, variables: Mapping[str, Any] | None
) -> ChatTemplate:
    config = _read_config(directory)
    templates = _templates(directory, config)
    if not templates:
        raise TemplateSourceError(
            f"{directory}: no chat template ({TEMPLATE_FILE}, or chat_template in {CONFIG_FILE})"
        )
    if template_name is not None:
        if template_name not in templates:
            raise TemplateSourceError(
                f"{directory}: no template named {template_name!r}; it has {', '.join(sorted(templates))}"
            )
        chosen = template_name
    elif "tool_use" in templates:
        chosen = "tool_use"  # transformers takes it whenever tools are passed, and rows have tools
    elif "default" in templates:
        chosen = "default"
    else:
        raise TemplateSourceError(
            f"{directory}: several templates and no default; pick one with --chat_template_name "
            f"({', '.join(sorted(templates))})"
        )
    label = name if chosen == "default" else f"{name}:{chosen}"
    merged = {**special_tokens(directory, config), **(variables or {})}
    return ChatTemplate(label, str(directory), templates[chosen], merged)


def _templates(directory: Path, config: Mapping[str, Any]) -> dict[str, str]:
    found: dict[str, str] = {}
    entry = config.get("chat_template")
    if isinstance(entry, str):
        found["default"] = entry
    elif isinstance(entry, list):
        for item in entry:
            if (
                isinstance(item, dict)
                and isinstance(item.get("name"), str)
                and isinstance(item.get("template"), str)
            ):
                found[item["name"]] = item["template"]
    if (directory / TEMPLATE_FILE).is_file():
        found["default"] = _read(directory / TEMPLATE_FILE)
    named = directory / NAMED_DIR
    if named.is_dir():
        for path in sorted(named.glob("*.jinja")):
            found[path.stem] = _read(path)
    return found


def special_tokens(directory: Path, config: Mapping[str, Any]) -> dict[str, str]:
    """The named special tokens of a tokenizer directory (``special_tokens_map.json`` and
    ``tokenizer_config.json``; a token may be a string or an added-token object)."""
    tokens: dict[str, str] = {}
    mapping_file = directory / "special_tokens_map.json"
    sources = [_read_json(mapping_file) if mapping_file.is_file() else {}, config]
    for source in sources:
        for key in SPECIAL_TOKENS:
            value = source.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                tokens[key] = value
    return tokens


def _read_config(directory: Path) -> dict[str, Any]:
    path = directory / CONFIG_FILE
    return _read_json(path) if path.is_file() else {}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(_read(path))
    except ValueError as exc:
        raise TemplateSourceError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise TemplateSourceError(f"{path}: not a JSON object")
    return data


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TemplateSourceError(f"{path}: cannot be read ({exc})") from None


def _cached_snapshot(repo_id: str) -> Path:
    """The local snapshot of a Hub model; never a download."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError as exc:
        raise TemplateSourceError(
            f"{repo_id}: reading a Hub id needs huggingface_hub: pip install 'trajkit[chat-templates]' ({exc})"
        ) from None
    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError) as exc:
        raise TemplateSourceError(
            f"{repo_id} is not in the local Hugging Face cache ({type(exc).__name__}); fetch its "
            f"tokenizer files first (`hf download {repo_id} --include 'tokenizer*' '*.jinja'`), or give "
            "a model directory or a .jinja file"
        ) from None
