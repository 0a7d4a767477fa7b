"""The built-in ``vision`` toolset: ``vision_analyze`` answers a question about an image through a
vision-capable model.

The image is a URL (fetched from the runner under the run's network rules, see
:mod:`trajkit.plugins.web.toolset`) or a file in the session's sandbox (read through the sandbox's
confined file operations); either is capped in size and must be a PNG, JPEG, GIF or WebP. The
model is asked through the model client that serves it (the OpenAI-compatible one for a model
slug, with its retries and limits): the run's model and endpoint by default, or
``--vision.model``, ``--vision.base_url`` and the key in ``--vision.api_key_env``.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import Field, SecretStr

from trajkit import hookimpl
from trajkit.config.run_config import RunConfig
from trajkit.config.settings import StrictSettings
from trajkit.model import ModelClient, ModelError
from trajkit.plugins.toolsets import object_schema, string_arg
from trajkit.plugins.web.toolset import web_settings
from trajkit.sandbox import ByteSize, FileTooLarge
from trajkit.tools import Tool, ToolContext, ToolError, ToolRun, Toolset, ToolsetError

if TYPE_CHECKING:
    from trajkit.tools.fetch import Fetcher

IMAGE_TYPES = (
    (b"\x89PNG\r\n\x1a\n", "image/png", "png"),
    (b"\xff\xd8\xff", "image/jpeg", "jpg"),
    (b"GIF87a", "image/gif", "gif"),
    (b"GIF89a", "image/gif", "gif"),
)


@hookimpl
def trajkit_toolsets() -> list[Toolset]:
    return [VISION]


def image_type(data: bytes) -> tuple[str, str] | None:
    """(media type, file extension) of a PNG, JPEG, GIF or WebP image, by its first bytes."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp", "webp"
    for magic, mime, extension in IMAGE_TYPES:
        if data.startswith(magic):
            return mime, extension
    return None


def takes_image(kind: str) -> bool:
    return kind.startswith("image/") or kind in ("", "application/octet-stream", "binary/octet-stream")


class VisionSettings(StrictSettings):
    model: str | None = None
    """The vision-capable model (default: the run's model)."""
    base_url: str | None = None
    """Its OpenAI-compatible endpoint (default: the run's endpoint)."""
    api_key_env: str | None = None
    """The environment variable holding that endpoint's key (default: the run's key; with
    --vision.base_url, $OPENROUTER_API_KEY or $OPENAI_API_KEY, none for a local endpoint)."""
    max_image_bytes: ByteSize = Field(10 << 20, gt=0)
    """Largest image sent to the model (e.g. 10m)."""
    max_tokens: int = Field(1024, ge=1)
    """Tokens of one answer at most."""


@dataclass
class VisionRun:
    settings: VisionSettings
    client: ModelClient
    images: Fetcher

    async def aclose(self) -> None:
        await self.images.aclose()
        await self.client.aclose()


class VisionToolset(Toolset):
    Settings = VisionSettings

    def problem(self, settings: Any) -> str | None:
        if settings.api_key_env and not os.environ.get(settings.api_key_env):
            return f"set ${settings.api_key_env} to the vision endpoint's key (--vision.api_key_env)"
        return None

    async def start(self, run: ToolRun) -> None:
        settings: VisionSettings = run.settings_of(self)
        client = await vision_client(run, settings)
        from trajkit.plugins.web.pages import page_fetcher

        images = page_fetcher(web_settings(run.config), max_bytes=settings.max_image_bytes)
        vision = VisionRun(settings, client, images)
        run.resources[self.name] = vision
        run.on_close(vision.aclose)


async def vision_client(run: ToolRun, settings: VisionSettings) -> ModelClient:
    """The model client that answers vision questions in this run (``vision_analyze``'s, and
    ``browser_vision``'s), checked; :class:`ToolsetError` saying what is wrong."""
    if problem := VISION.problem(settings):
        raise ToolsetError(f"vision: {problem}")
    if run.config is None:
        raise ToolsetError("vision: needs the run configuration")
    if run.plugins is None:
        from trajkit.manager import load_plugins

        run.plugins = load_plugins()
    model = settings.model or run.config.model
    try:
        cls = run.plugins.model_client(model)
        client = cls.from_config(client_config(run.config, cls, settings, model))
        await client.check()
    except (ModelError, ValueError, RuntimeError) as exc:
        raise ToolsetError(f"vision: {exc}") from None
    return client


def vision_settings(config: RunConfig | None) -> VisionSettings:
    """The run's ``vision`` settings (the browser's screenshots go to the same model)."""
    found = config.toolset_options.get("vision") if config is not None else None
    return found if isinstance(found, VisionSettings) else VisionSettings()


async def ask_about_image(client: ModelClient, data: bytes, kind: str, question: str, max_tokens: int) -> str:
    """The vision model's answer to ``question`` about an image; :class:`ToolError` when it fails."""
    encoded = base64.b64encode(data).decode()
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": question},
            {"type": "image_url", "image_url": {"url": f"data:{kind};base64,{encoded}"}},
        ],
    }
    try:
        reply = await client.complete([message], [], {"max_tokens": max_tokens})
    except ModelError as exc:
        raise ToolError(f"the vision model failed: {exc}") from None
    if not reply.content:
        raise ToolError("the vision model gave no answer")
    return reply.content


def client_config(
    config: RunConfig, cls: type[ModelClient], settings: VisionSettings, model: str
) -> RunConfig:
    """The run's configuration with the vision model, endpoint and key in its client's settings."""
    changes: dict[str, Any] = {}
    if settings.base_url:
        changes["base_url"] = settings.base_url
        changes["api_key"] = None  # the run's own key is not sent to another endpoint
    if settings.api_key_env:
        changes["api_key"] = SecretStr(os.environ.get(settings.api_key_env, ""))
    section = config.settings_of(cls)
    missing = sorted(set(changes) - set(type(section).model_fields))
    if missing:
        raise ToolsetError(f"vision: model client {cls.name!r} has no {' or '.join(missing)} setting")
    options = {**config.model_options, cls.name: section.model_copy(update=changes)}
    return config.model_copy(update={"model": model, "model_options": options})


async def vision_analyze(args: dict[str, Any], ctx: ToolContext) -> str:
    vision = ctx.session.run.resources.get("vision")
    if not isinstance(vision, VisionRun):
        raise ToolError("the vision tool was not started for this run")
    source, question = string_arg(args, "image_url").strip(), string_arg(args, "question")
    data = await load_image(source, ctx, vision.images, vision.settings.max_image_bytes)
    kind = image_type(data)
    if kind is None:
        raise ToolError(f"{source} is not a PNG, JPEG, GIF or WebP image")
    analysis = await ask_about_image(vision.client, data, kind[0], question, vision.settings.max_tokens)
    return json.dumps({"image_url": source, "analysis": analysis}, ensure_ascii=False)


async def load_image(source: str, ctx: ToolContext, images: Fetcher, limit: int) -> bytes:
    """The bytes of an image URL, a data: URL or a file in the sandbox, at most ``limit``."""
    from trajkit.tools.fetch import FetchError

    if source.startswith(("http://", "https://")):
        try:
            response = await images.fetch(source, accept=takes_image, max_bytes=limit)
        except FetchError as exc:
            raise ToolError(str(exc)) from None
        if response.status >= 400:
            raise ToolError(f"{source} answered {response.status}")
        return response.body
    if source.startswith("data:"):
        _, _, payload = source.partition(",")
        if len(payload) > limit * 4 // 3 + 4:
            raise ToolError(f"the image is larger than {limit} bytes")
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise ToolError("the data: URL is not base64") from None
    try:
        return await ctx.sandbox.read_file(source, limit=limit)
    except FileTooLarge:
        raise ToolError(f"{source} is larger than {limit} bytes") from None
    except OSError as exc:
        raise ToolError(f"cannot read {source}: {exc.strerror or type(exc).__name__}") from None


VISION = VisionToolset(
    "vision",
    "look at images",
    (
        Tool(
            "vision_analyze",
            "Answer a question about an image: a URL, or the path of an image file in the working"
            " directory. Returns the vision model's analysis.",
            object_schema(
                ["image_url", "question"],
                image_url={"type": "string", "description": "the image's URL, or a file path"},
                question={"type": "string", "description": "what to find out about the image"},
            ),
            vision_analyze,
        ),
    ),
)
