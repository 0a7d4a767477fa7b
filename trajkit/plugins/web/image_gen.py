"""The built-in ``image_gen`` toolset: ``image_generate`` asks an OpenAI-compatible images endpoint
(``POST /images/generations``) for an image and saves it in the session's sandbox, returning its
path so later tools (``vision_analyze``, the file tools) can use it.

It is off until an endpoint is set (``--image_gen.base_url``): a run whose distribution draws it
without one leaves it out. The endpoint's key comes from the environment variable named by
``--image_gen.api_key_env``; it is sent in the request's header only, and removed from any error.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

import orjson
from pydantic import Field

from trajkit import hookimpl
from trajkit.config.settings import StrictSettings
from trajkit.plugins.toolsets import object_schema, string_arg
from trajkit.plugins.web.toolset import web_settings
from trajkit.plugins.web.vision import image_type, takes_image
from trajkit.sandbox import ByteSize
from trajkit.tools import Tool, ToolContext, ToolError, ToolRun, Toolset, ToolsetError

if TYPE_CHECKING:
    from trajkit.tools.fetch import Fetcher, Response

SIZES = {"landscape": "1536x1024", "square": "1024x1024", "portrait": "1024x1536"}
"""The image size asked for each aspect ratio (the reference's names and GPT image sizes)."""
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


@hookimpl
def trajkit_toolsets() -> list[Toolset]:
    return [IMAGE_GEN]


class ImageGenSettings(StrictSettings):
    base_url: str | None = None
    """An OpenAI-compatible endpoint serving /images/generations (e.g. https://api.openai.com/v1);
    image_gen is offered only once it is set."""
    model: str = "gpt-image-1"
    """The image model."""
    api_key_env: str = "OPENAI_API_KEY"
    """The environment variable holding the endpoint's key (a local endpoint needs none)."""
    response_format: Literal["b64_json", "url"] | None = None
    """Sent as response_format when set (DALL-E models take it; GPT image models answer base64)."""
    timeout: float = Field(300.0, gt=0)
    """Seconds one image may take."""
    max_image_bytes: ByteSize = Field(20 << 20, gt=0)
    """Largest image kept (e.g. 20m)."""
    directory: str = "images"
    """Where in the sandbox images are saved."""


def _local(url: str) -> bool:
    return (urlsplit(url).hostname or "") in LOCAL_HOSTS


@dataclass
class ImageRun:
    settings: ImageGenSettings
    key: str | None
    api: Fetcher
    downloads: Fetcher
    """For an endpoint that answers with an image URL: fetched under the run's network rules."""

    async def aclose(self) -> None:
        await self.api.aclose()
        await self.downloads.aclose()

    def scrubbed(self, text: str) -> str:
        return text.replace(self.key, "[REDACTED]") if self.key else text


class ImageGenToolset(Toolset):
    Settings = ImageGenSettings
    optional = True

    def problem(self, settings: Any) -> str | None:
        if not settings.base_url:
            return "off until an images endpoint is set: --image_gen.base_url URL (OpenAI-compatible)"
        if not _local(settings.base_url) and not os.environ.get(settings.api_key_env):
            return (
                f"set ${settings.api_key_env} to the images endpoint's key (or --image_gen.api_key_env NAME)"
            )
        return None

    async def start(self, run: ToolRun) -> None:
        settings: ImageGenSettings = run.settings_of(self)
        problem = self.problem(settings)
        if problem:
            raise ToolsetError(f"image_gen: {problem}")
        from trajkit.plugins.web.pages import api_fetcher, page_fetcher

        base_url = str(settings.base_url)
        host, port = urlsplit(base_url).hostname, urlsplit(base_url).port
        # an image URL the endpoint hands back may be on the endpoint's own host
        own = (
            [f"{host}:{port or (443 if base_url.startswith('https') else 80)}"]
            if host and ":" not in host
            else []
        )
        images = ImageRun(
            settings,
            os.environ.get(settings.api_key_env) or None,
            api_fetcher(settings.timeout, settings.max_image_bytes * 4 // 3 + (1 << 20)),
            page_fetcher(web_settings(run.config), max_bytes=settings.max_image_bytes, extra_allow=own),
        )
        run.resources[self.name] = images
        run.on_close(images.aclose)


async def image_generate(args: dict[str, Any], ctx: ToolContext) -> str:
    from trajkit.tools.fetch import FetchError

    images = ctx.session.run.resources.get("image_gen")
    if not isinstance(images, ImageRun):
        raise ToolError("the image tool was not started for this run")
    prompt = string_arg(args, "prompt").strip()
    if not prompt:
        raise ToolError("argument 'prompt' is empty")
    aspect = args.get("aspect_ratio") or "landscape"
    if aspect not in SIZES:
        raise ToolError(f"argument 'aspect_ratio' must be one of {', '.join(SIZES)}")
    settings = images.settings
    body: dict[str, Any] = {"model": settings.model, "prompt": prompt, "n": 1, "size": SIZES[aspect]}
    if settings.response_format:
        body["response_format"] = settings.response_format
    headers = {"Authorization": f"Bearer {images.key}"} if images.key else {}
    try:
        response = await images.api.fetch(
            f"{str(settings.base_url).rstrip('/')}/images/generations",
            method="POST",
            json=body,
            headers=headers,
        )
    except FetchError as exc:
        raise ToolError(images.scrubbed(f"the images endpoint failed: {exc}")) from None
    data, revised = await _image_of(images, response)
    kind = image_type(data)
    if kind is None:
        raise ToolError(
            "the images endpoint answered with something that is not a PNG, JPEG, GIF or WebP image"
        )
    path = f"{settings.directory.strip('/') or '.'}/{uuid.uuid4().hex[:12]}.{kind[1]}"
    try:
        await ctx.sandbox.write_file(path, data)
    except OSError as exc:
        raise ToolError(f"cannot save the image as {path}: {exc.strerror or type(exc).__name__}") from None
    result = {"path": path, "bytes": len(data), "media_type": kind[0], "size": SIZES[aspect]}
    if revised:
        result["revised_prompt"] = revised
    return json.dumps(result, ensure_ascii=False)


async def _image_of(images: ImageRun, response: Response) -> tuple[bytes, str | None]:
    """The image an answer holds (inline, or at the URL it gives) and the prompt the model used."""
    from trajkit.tools.fetch import FetchError

    if response.status >= 400:
        raise ToolError(
            images.scrubbed(f"the images endpoint answered {response.status}: {response.excerpt()}")
        )
    try:
        answer = orjson.loads(response.body)
        item = answer["data"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        raise ToolError("the images endpoint's answer holds no image (expected data[0])") from None
    revised = item.get("revised_prompt") if isinstance(item, dict) else None
    if isinstance(item, dict) and isinstance(item.get("b64_json"), str):
        if len(item["b64_json"]) > images.settings.max_image_bytes * 4 // 3 + 4:
            raise ToolError(f"the image is larger than {images.settings.max_image_bytes} bytes")
        try:
            return base64.b64decode(item["b64_json"], validate=True), revised
        except (binascii.Error, ValueError):
            raise ToolError("the images endpoint's b64_json is not base64") from None
    if isinstance(item, dict) and isinstance(item.get("url"), str):
        try:
            fetched = await images.downloads.fetch(item["url"], accept=takes_image)
        except FetchError as exc:
            raise ToolError(f"the generated image could not be fetched: {exc}") from None
        if fetched.status >= 400:
            raise ToolError(f"the generated image's URL answered {fetched.status}")
        return fetched.body, revised
    raise ToolError("the images endpoint's answer holds neither b64_json nor url")


IMAGE_GEN = ImageGenToolset(
    "image_gen",
    "generate images",
    (
        Tool(
            "image_generate",
            "Generate an image from a text prompt. The image is saved in the working directory and"
            " its path is returned, for other tools to use.",
            object_schema(
                ["prompt"],
                prompt={"type": "string", "description": "what the image shows, in detail"},
                aspect_ratio={"type": "string", "enum": list(SIZES), "description": "default landscape"},
            ),
            image_generate,
        ),
    ),
)
