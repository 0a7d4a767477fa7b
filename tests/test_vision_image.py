"""The ``vision`` and ``image_gen`` toolsets against real loopback servers: the vision model
receives the image (from a URL under the network rules, or from the sandbox), answered through
the OpenAI-compatible client; generated images land in the session's sandbox."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.test_web_tools import tools
from tests.web_servers import WebSite, png
from trajkit.manager import load_plugins
from trajkit.plugins.web import image_gen, vision
from trajkit.testing.openai_server import OpenAITestServer
from trajkit.testing.policies import dialect_policy
from trajkit.tools import ToolContext, ToolError, ToolsetError

RUN_KEY = "sk-run-key-for-tests-0001"


def images_sent(server: OpenAITestServer) -> list[bytes]:
    """The images of every chat request the server received, decoded from their data: URLs."""
    found = []
    for request in server.requests:
        for message in request.body["messages"]:
            for part in message["content"] if isinstance(message["content"], list) else []:
                if part.get("type") == "image_url":
                    head, _, payload = part["image_url"]["url"].partition(",")
                    assert head == "data:image/png;base64"
                    found.append(base64.b64decode(payload))
    return found


def run_model(server: OpenAITestServer) -> dict[str, Any]:
    return {"model": "test-model", "base_url": server.base_url, "api_key": RUN_KEY}


async def analyze(ctx: ToolContext, image_url: str, question: str = "What is in it?") -> dict[str, Any]:
    return json.loads(await vision.vision_analyze({"image_url": image_url, "question": question}, ctx))


async def test_the_vision_model_receives_the_image_from_a_url_or_the_sandbox(tmp_path: Path) -> None:
    server = OpenAITestServer(dialect_policy, api_key=RUN_KEY, models={"test-model"})
    async with server.serving(), WebSite().serving() as site:
        given = {**run_model(server), "toolset_options": {"web": {"allow_hosts": [site.host_port]}}}
        async with tools(tmp_path, "vision", **given) as ctx:
            from_url = await analyze(ctx, f"{site.url}/image.png", "What colour is it?")
            await ctx.sandbox.write_file("pics/wide.png", png(7, 5))
            from_file = await analyze(ctx, "pics/wide.png")
    assert from_url == {
        "image_url": f"{site.url}/image.png",
        "analysis": f"The image is a 3x2 image/png of {len(png())} bytes.",
    }
    assert from_file["analysis"].startswith("The image is a 7x5 image/png")
    assert images_sent(server) == [png(), png(7, 5)]
    chat = [r for r in server.requests if r.body.get("messages")]
    assert chat[0].body["model"] == "test-model" and chat[0].body["max_tokens"] == 1024
    assert chat[0].body["messages"][0]["content"][0] == {"type": "text", "text": "What colour is it?"}
    assert chat[0].headers["authorization"] == f"Bearer {RUN_KEY}"


async def test_images_are_capped_checked_and_fetched_under_the_network_rules(tmp_path: Path) -> None:
    server = OpenAITestServer(dialect_policy, api_key=RUN_KEY, models={"test-model"})
    async with server.serving(), WebSite().serving() as site:
        given = {**run_model(server), "toolset_options": {"vision": {"max_image_bytes": "40"}}}
        async with tools(tmp_path, "vision", **given) as ctx:
            with pytest.raises(ToolError, match=r"127\.0\.0\.1 is a loopback address"):
                await analyze(ctx, f"{site.url}/image.png")  # the server is not allow-listed here
            with pytest.raises(ToolError, match=re.escape("169.254.169.254 is a cloud metadata address")):
                await analyze(ctx, "http://169.254.169.254/latest/meta-data/")
            await ctx.sandbox.write_file("big.png", png(40, 40))
            with pytest.raises(ToolError, match=re.escape("big.png is larger than 40 bytes")):
                await analyze(ctx, "big.png")
            await ctx.sandbox.write_file("notes.txt", b"not an image")
            with pytest.raises(ToolError, match=re.escape("notes.txt is not a PNG, JPEG, GIF or WebP image")):
                await analyze(ctx, "notes.txt")
            with pytest.raises(ToolError, match=re.escape("cannot read ../outside.png")):
                await analyze(ctx, "../outside.png")
    assert images_sent(server) == []


async def test_vision_has_its_own_model_endpoint_and_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VISION_TEST_KEY", "sk-vision-key-0002")
    run_server = OpenAITestServer(dialect_policy, api_key=RUN_KEY, models={"test-model"})
    vision_server = OpenAITestServer(dialect_policy, api_key="sk-vision-key-0002", models={"eyes-1"})
    async with run_server.serving(), vision_server.serving():
        options = {
            "model": "eyes-1",
            "base_url": vision_server.base_url,
            "api_key_env": "VISION_TEST_KEY",
            "max_tokens": 77,
        }
        async with tools(
            tmp_path, "vision", **run_model(run_server), toolset_options={"vision": options}
        ) as ctx:
            await ctx.sandbox.write_file("a.png", png())
            answer = await analyze(ctx, "a.png")
    assert answer["analysis"].startswith("The image is a 3x2 image/png")
    assert images_sent(run_server) == [] and images_sent(vision_server) == [png()]
    [chat] = [r for r in vision_server.requests if r.body.get("messages")]
    assert chat.body["model"] == "eyes-1" and chat.body["max_tokens"] == 77
    assert chat.headers["authorization"] == "Bearer sk-vision-key-0002"
    monkeypatch.delenv("VISION_TEST_KEY")
    toolset = load_plugins(entry_points=False).toolsets["vision"]
    assert toolset.problem(toolset.Settings(api_key_env="VISION_TEST_KEY")) == (
        "set $VISION_TEST_KEY to the vision endpoint's key (--vision.api_key_env)"
    )


async def test_a_wrong_vision_model_stops_the_run_before_any_session(tmp_path: Path) -> None:
    server = OpenAITestServer(dialect_policy, api_key=RUN_KEY, models={"test-model"})
    async with server.serving():
        with pytest.raises(ToolsetError, match="vision: model 'blind-1' is not among the 1 models"):
            async with tools(
                tmp_path, "vision", **run_model(server), toolset_options={"vision": {"model": "blind-1"}}
            ):
                pass


async def test_a_generated_image_is_saved_in_the_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IMAGES_TEST_KEY", "sk-images-key-0003")
    async with WebSite().serving() as site:
        options = {
            "base_url": f"{site.url}/v1",
            "api_key_env": "IMAGES_TEST_KEY",
            "model": "painter-2",
            "directory": "art",
        }
        async with tools(tmp_path, "image_gen", toolset_options={"image_gen": options}) as ctx:
            made = json.loads(
                await image_gen.image_generate({"prompt": "a red square", "aspect_ratio": "portrait"}, ctx)
            )
            saved = await ctx.sandbox.read_file(made["path"])
            with pytest.raises(ToolError, match="'aspect_ratio' must be one of landscape, square, portrait"):
                await image_gen.image_generate({"prompt": "x", "aspect_ratio": "wide"}, ctx)
    assert made["path"].startswith("art/") and made["path"].endswith(".png")
    assert made["size"] == "1024x1536" and made["revised_prompt"] == "a red square"
    assert saved == png(4, 6) and made["bytes"] == len(saved)
    request = site.requests[-1]
    assert request.body == {"model": "painter-2", "prompt": "a red square", "n": 1, "size": "1024x1536"}
    assert request.headers["Authorization"] == "Bearer sk-images-key-0003"


async def test_an_endpoint_answering_with_a_url_is_fetched_and_errors_hide_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-images-key-0004")
    async with WebSite().serving() as site:
        options = {
            "base_url": f"{site.url}/v1",
            "response_format": "url",
            "timeout": 20,
            "max_image_bytes": "1m",
        }
        async with tools(tmp_path, "image_gen", toolset_options={"image_gen": options}) as ctx:
            made = json.loads(await image_gen.image_generate({"prompt": "a red square"}, ctx))
            assert await ctx.sandbox.read_file(made["path"]) == png()  # from the URL it answered
            assert made["size"] == "1536x1024"  # landscape by default
    assert site.requests[-1].body["response_format"] == "url"
    async with tools(
        tmp_path, "image_gen", toolset_options={"image_gen": options}
    ) as ctx:  # the server is gone
        with pytest.raises(ToolError) as caught:
            await image_gen.image_generate({"prompt": "a red square"}, ctx)
    assert "the images endpoint failed" in str(caught.value) and "sk-images-key-0004" not in str(caught.value)


def test_image_gen_is_off_until_an_endpoint_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    toolset = load_plugins(entry_points=False).toolsets["image_gen"]
    assert toolset.optional  # left out of a run's draws, not a reason to stop it
    assert "off until an images endpoint is set: --image_gen.base_url URL" in (
        toolset.problem(toolset.Settings()) or ""
    )
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    hosted = toolset.Settings(base_url="https://api.openai.com/v1")
    assert (
        toolset.problem(hosted)
        == "set $OPENAI_API_KEY to the images endpoint's key (or --image_gen.api_key_env NAME)"
    )
    assert (
        toolset.problem(toolset.Settings(base_url="http://localhost:9000/v1")) is None
    )  # local: no key needed
