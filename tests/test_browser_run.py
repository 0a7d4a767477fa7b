"""A run whose model (the project's test server and its scripted policy) calls every browser tool,
end to end through ``trajkit run``: headless Chromium browses the test's loopback pages, and the
screenshots of ``browser_vision`` go to the same test server as vision questions."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from tests.helpers import read_jsonl, trajkit, write_jsonl
from tests.test_browser_tools import chromium_missing, site
from trajkit.plugins.browser.toolset import TOOLS
from trajkit.testing.engines import need_engine
from trajkit.testing.openai_server import OpenAITestServer
from trajkit.testing.policies import dialect_policy

MODEL_KEY = "sk-model-key-browser-0007"
BROWSER_TOOLS = tuple(tool.name for tool in TOOLS)


async def run_trajkit(*args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "trajkit", *args,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, stderr = await asyncio.wait_for(process.communicate(), 300)
    assert process.returncode is not None
    return process.returncode, stderr.decode()


async def test_a_run_calls_every_browser_tool(tmp_path: Path) -> None:
    need_engine("chromium", chromium_missing())
    server = OpenAITestServer(dialect_policy, api_key=MODEL_KEY, models={"test-model"}).start()
    try:
        async with site() as url:
            dataset = write_jsonl(
                tmp_path / "prompts.jsonl",
                [{"prompt": f"Sign the guest book at {url}/form"}, {"prompt": f"What is on {url}/links ?"}],
            )
            code, stderr = await run_trajkit(
                "run", "--dataset_file", str(dataset), "--run_name", "browsing", "--output_dir", str(tmp_path),
                "--model", "test-model", "--base_url", server.base_url, "--api_key", MODEL_KEY,
                "--distribution", "browser_only", "--num_workers", "2", "--max_turns", "20", "--quiet",
                "--web.allow_hosts", url.removeprefix("http://"), "--browser.browsers", "1",
            )  # fmt: skip
    finally:
        server.stop()
    assert code == 0, stderr
    run_dir = tmp_path / "browsing"
    form, links = sorted(read_jsonl(run_dir / "trajectories.jsonl"), key=lambda r: r["prompt_index"])
    for record in (form, links):
        assert record["toolsets_offered"] == ["browser"] and record["toolsets_used"] == ["browser"]
        for tool in BROWSER_TOOLS:
            if tool == "browser_type" and record is links:
                assert record["tool_stats"][tool]["count"] == 0  # no field on that page
                continue
            assert record["tool_stats"][tool] == {"count": 1, "success": 1, "failure": 0}, (tool, record)
    results = {t["name"]: json.loads(t["value"]) for t in form["conversations"] if t["from"] == "tool"}
    assert results["browser_navigate"]["title"] == "Sign the guest book"
    assert 'textbox "Your name"' in results["browser_snapshot"]["snapshot"]
    assert results["browser_type"]["characters"] == len("trajkit")
    assert results["browser_click"]["url"] == f"{url}/links"
    assert results["browser_back"]["url"] == f"{url}/form"
    assert results["browser_console"]["result"] == "Sign the guest book"
    assert results["browser_vision"]["annotated"] >= 3  # the field, the button and the link
    assert results["browser_vision"]["analysis"].startswith("The image is a 1280x720 image/png of ")
    on_links = {t["name"]: json.loads(t["value"]) for t in links["conversations"] if t["from"] == "tool"}
    assert on_links["browser_get_images"]["images"][0]["src"] == f"{url}/pixel.png"
    statistics = json.loads((run_dir / "statistics.json").read_text())
    assert statistics["tools"]["browser_navigate"]["count"] == 2
    for path in run_dir.iterdir():
        if path.is_file():
            assert MODEL_KEY not in path.read_text(), path.name


def test_a_run_offered_a_browser_it_cannot_start_stops_saying_what_to_do(tmp_path: Path) -> None:
    dataset = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "look at a page"}])
    result = trajkit(
        "run", "--dataset_file", str(dataset), "--run_name", "b", "--output_dir", str(tmp_path),
        "--model", "scripted", "--toolsets", "browser", "--browser.executable_path", "/nonexistent/chromium",
        "--quiet",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "no Chromium at /nonexistent/chromium: install it (apt-get install chromium)" in result.stderr
    assert not (tmp_path / "b" / "trajectories.jsonl").exists()
