"""The file tools as a hostile model uses them: what they hand back and what they refuse to hold."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from trajkit.plugins import toolsets
from trajkit.plugins.files import tools as file_tools
from trajkit.plugins.local.sandbox import LocalBackend
from trajkit.record.secrets import REDACTED, Scrubber, environment_secrets
from trajkit.sandbox import Sandbox, SandboxSpec
from trajkit.tools import ToolContext, ToolError

T = TypeVar("T")


def with_tools(root: Path, body: Callable[[ToolContext], Awaitable[T]]) -> T:
    async def main() -> T:
        backend = LocalBackend({"root": str(root), "isolation": "none"})
        sandbox: Sandbox = await backend.create(SandboxSpec(run_id="tools", work_id="w0"))
        try:
            return await body(ToolContext(sandbox, timeout=30, output_cap=4096))
        finally:
            await sandbox.close()
            await backend.aclose()

    return asyncio.run(main())


def test_read_file_numbers_lines_and_pages_through_a_long_file(tmp_path: Path) -> None:
    lines = [f"line {i:06d}" for i in range(1, 50_001)]

    async def body(ctx: ToolContext) -> list[dict[str, Any]]:
        await ctx.sandbox.write_file("big.txt", "\n".join(lines).encode() + b"\n")
        read = [json.loads(await file_tools.read_file({"path": "big.txt", "offset": 1, "limit": 3}, ctx))]
        read.append(json.loads(await file_tools.read_file({"path": "big.txt", "offset": 49_999}, ctx)))
        read.append(json.loads(await file_tools.read_file({"path": "big.txt", "offset": 60_000}, ctx)))
        pages, offset = [], 1
        while offset is not None and len(pages) < 100:  # the default limit, cut to the output cap
            pages.append(json.loads(await file_tools.read_file({"path": "big.txt", "offset": offset}, ctx)))
            offset = pages[-1].get("next_offset") if pages[-1].get("next_offset", 0) <= 1200 else None
        return [*read, *pages]

    first, end, past, *pages = with_tools(tmp_path, body)
    assert first["content"] == "1|line 000001\n2|line 000002\n3|line 000003"
    assert (first["total_lines"], first["next_offset"], first["truncated"]) == (50_000, 4, True)
    assert first["file_size"] == len("\n".join(lines)) + 1
    assert end["content"] == "49999|line 049999\n50000|line 050000" and "next_offset" not in end
    assert past["content"] == "" and past["total_lines"] == 50_000
    shown = [row for page in pages for row in page["content"].split("\n")]
    assert shown[:1200] == [f"{n}|{lines[n - 1]}" for n in range(1, 1201)]  # no line lost or repeated
    assert all(len(json.dumps(page).encode()) <= 4096 for page in pages) and len(pages) > 3


def test_read_file_refuses_binary_and_cuts_long_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(file_tools, "MAX_FILE_BYTES", 10_000)

    async def body(ctx: ToolContext) -> tuple[str, dict[str, Any], dict[str, Any]]:
        await ctx.sandbox.write_file("image.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
        with pytest.raises(ToolError) as binary:
            await file_tools.read_file({"path": "image.png"}, ctx)
        await ctx.sandbox.write_file("wide.txt", b"x" * 3000 + b"\nshort\n")
        wide = json.loads(await file_tools.read_file({"path": "wide.txt"}, ctx))
        await ctx.sandbox.write_file("huge.txt", b"a line\n" * 5000)
        huge = json.loads(await file_tools.read_file({"path": "huge.txt", "limit": 2}, ctx))
        return str(binary.value), wide, huge

    binary, wide, huge = with_tools(tmp_path, body)
    assert binary == "cannot read image.png: a binary file (16 bytes), not text"
    assert wide["content"] == "1|" + "x" * 2000 + " [line cut]\n2|short"
    assert huge["file_size"] == 35_000 and huge["content"] == "1|a line\n2|a line"
    assert (
        huge["note"] == "only the first 5000 bytes can be read with read_file; use the terminal for the rest"
    )


def test_patch_refuses_to_build_a_file_past_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_tools, "MAX_FILE_BYTES", 100_000)

    async def body(ctx: ToolContext) -> tuple[str, bytes]:
        await ctx.sandbox.write_file("a.txt", b"a" * 1000)
        with pytest.raises(ToolError, match="would be 1000000 bytes"):
            await file_tools.patch(
                {"path": "a.txt", "old_string": "a", "new_string": "b" * 1000, "replace_all": True}, ctx
            )
        with pytest.raises(ToolError, match=r"b\.txt would be 100001 bytes"):
            await file_tools.write_file({"path": "b.txt", "content": "x" * 100_001}, ctx)
        done = await file_tools.patch({"path": "a.txt", "old_string": "a" * 1000, "new_string": "ok"}, ctx)
        return done, await ctx.sandbox.read_file("a.txt")

    done, content = with_tools(tmp_path, body)
    assert json.loads(done) == {"path": "a.txt", "replacements": 1, "first_line": 1}
    assert content == b"ok"


@pytest.mark.parametrize(
    ("setup", "path", "reason"),
    [
        ("mkfifo p", "p", "not a regular file (a device, FIFO or socket)"),
        ("ln -s /etc/hostname h", "h", "outside the sandbox"),
        ("", "../../../../etc/hostname", "outside the sandbox"),
        ("", "/proc/self/environ", "outside the sandbox"),
        ("mkdir d", "d", "is a directory"),
        ("", "missing.txt", "no such file"),
    ],
)
def test_refusals_say_why_without_host_paths(tmp_path: Path, setup: str, path: str, reason: str) -> None:
    async def body(ctx: ToolContext) -> list[str]:
        if setup:
            await ctx.sandbox.exec(setup, timeout=30)
        said = []
        for tool, args in (
            (file_tools.read_file, {}),
            (file_tools.patch, {"old_string": "a", "new_string": "b"}),
        ):
            with pytest.raises(ToolError) as refused:
                await tool({"path": path, **args}, ctx)
            said.append(str(refused.value))
        return said

    for message in with_tools(tmp_path, body):
        assert message.endswith(reason), message
        assert str(tmp_path) not in message


def test_scrubber_replaces_known_secrets_everywhere_and_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-1234567890")
    monkeypatch.setenv("HARMLESS", "value-1234567890")
    monkeypatch.setenv("SHORT_KEY", "abc")
    secrets = environment_secrets()
    assert "tok-1234567890" in secrets and "value-1234567890" not in secrets
    scrubber = Scrubber(["sk-the-api-key-0001", *secrets])
    clean: dict[str, Any] = {"conversations": [{"from": "tool", "value": "abc ok"}], "n": 3}
    assert scrubber.scrub(clean) is clean and scrubber.scrubbed == 0
    dirty = {
        "conversations": [{"from": "tool", "value": "key=sk-the-api-key-0001 and tok-1234567890"}],
        "metadata": {"sk-the-api-key-0001": ["x tok-1234567890"]},
        "n": 3,
    }
    scrubbed = scrubber.scrub(dirty)
    assert scrubber.scrubbed == 1
    text = json.dumps(scrubbed)
    assert "sk-the-api-key" not in text and "tok-1234567890" not in text
    assert scrubbed["conversations"][0]["value"] == f"key={REDACTED} and {REDACTED}"
    assert scrubbed["n"] == 3


def test_terminal_output_past_the_cap_is_cut_inside_valid_json(tmp_path: Path) -> None:
    """Escapes make the JSON longer than the output, and stdout and stderr are capped each: the
    result is cut inside its output field, never in the middle of the JSON."""
    script = "import sys; print('\"\\x01\\n' * 3000); print('e\\n' * 3000, file=sys.stderr)"

    async def body(ctx: ToolContext) -> str:
        return await toolsets.terminal({"command": f"python3 -c {json.dumps(script)}"}, ctx)

    content = with_tools(tmp_path, body)
    assert len(content.encode()) <= 4096
    result = json.loads(content)
    assert result["exit_code"] == 0
    assert result["output"].startswith('"\x01\n"\x01\n') and "bytes truncated" in result["output"]


def test_paths_no_engine_takes_are_refused_by_their_length_in_bytes() -> None:
    from trajkit.sandbox import NAME_MAX, PATH_MAX, InvalidPath, check_path

    fine = ["a", "dir/" + "n" * NAME_MAX, "/".join(["d"] * ((PATH_MAX - 1) // 2)), "é" * (NAME_MAX // 2)]
    for path in fine:
        assert check_path(path) == path
    refused = {
        "a\0b": "NUL byte",
        "caf\udce9": "not valid UTF-8",
        "n" * (NAME_MAX + 1): f"a name in the path is {NAME_MAX + 1} bytes long",
        "é" * 128: "a name in the path is 256 bytes long",
        "d/" * (PATH_MAX // 2): f"the path is {PATH_MAX} bytes long",
    }
    for path, reason in refused.items():
        with pytest.raises(InvalidPath, match=reason) as caught:
            check_path(path)
        assert path not in str(caught.value)


def test_what_the_model_is_told_of_a_path_is_short_and_printable(tmp_path: Path) -> None:
    async def body(ctx: ToolContext) -> list[str]:
        told = []
        for path in ("x" * 8000, "bad\0name", "missing.txt"):
            with pytest.raises(ToolError) as caught:
                await file_tools.read_file({"path": path}, ctx)
            told.append(str(caught.value))
        return told

    long, nul, missing = with_tools(tmp_path, body)
    assert long.startswith("cannot read " + "x" * 200 + "... (8000 characters): the path is 8000 bytes")
    assert nul == "cannot read 'bad\\x00name': the path contains a NUL byte"
    assert missing == "cannot read missing.txt: no such file"
