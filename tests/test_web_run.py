"""A run whose model (the project's test server and its scripted policy) calls every web, vision
and image tool, end to end through ``trajkit run``: loopback servers stand in for the search
service, the pages and the images endpoint; the records count every call."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import read_jsonl, trajkit, write_jsonl
from tests.test_vision_image import images_sent
from tests.web_servers import WebSite, png
from trajkit.testing.openai_server import OpenAITestServer
from trajkit.testing.policies import dialect_policy

MODEL_KEY = "sk-model-key-e2e-0005"
IMAGES_KEY = "sk-images-key-e2e-0006"
WEB_TOOLS = ("web_search", "web_extract", "image_generate", "vision_analyze")


def test_a_run_calls_every_web_vision_and_image_tool(tmp_path: Path) -> None:
    site = WebSite().start()
    server = OpenAITestServer(dialect_policy, api_key=MODEL_KEY, models={"test-model"}).start()
    try:
        config = tmp_path / "run.toml"
        config.write_text(
            'distribution = "looking"\n'
            "[distributions.looking]\nweb = 1.0\nvision = 1.0\nimage_gen = 1.0\n"
            f'[toolset_options.image_gen]\nbase_url = "{site.url}/v1"\napi_key_env = "E2E_IMAGES_KEY"\n'
        )
        dataset = write_jsonl(
            tmp_path / "prompts.jsonl",
            [
                {"prompt": "Who kept the Longstone lighthouse?"},
                {"prompt": f"Summarise {site.url}/report.pdf and describe {site.url}/image.png"},
            ],
        )
        result = trajkit(
            "run", "--config", str(config), "--dataset_file", str(dataset), "--run_name", "web",
            "--output_dir", str(tmp_path), "--model", "test-model", "--base_url", server.base_url,
            "--api_key", MODEL_KEY, "--num_workers", "2", "--quiet",
            "--web.search_provider", "searxng", "--searxng.url", f"{site.url}/searxng",
            "--web.allow_hosts", site.host_port,
            env={"E2E_IMAGES_KEY": IMAGES_KEY},
        )  # fmt: skip
    finally:
        server.stop()
        site.stop()
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "web"
    searched, named = sorted(read_jsonl(run_dir / "trajectories.jsonl"), key=lambda r: r["prompt_index"])
    for record in (searched, named):
        assert set(record["toolsets_offered"]) == {"web", "vision", "image_gen"}
        assert set(record["toolsets_used"]) == {"web", "vision", "image_gen"}
        for tool in WEB_TOOLS:
            assert record["tool_stats"][tool] == {"count": 1, "success": 1, "failure": 0}, (tool, record)
    results = {
        turn["name"]: json.loads(turn["value"])
        for turn in searched["conversations"]
        if turn["from"] == "tool"
    }
    assert results["web_search"]["results"][0]["url"] == f"{site.url}/article?n=1"
    page = results["web_extract"]["results"][0]
    assert page["title"] == "Lighthouses of the North Sea" and "NAVIGATION-BOILERPLATE" not in page["content"]
    assert results["image_generate"]["path"].startswith("images/")
    assert results["vision_analyze"]["analysis"] == f"The image is a 4x4 image/png of {len(png(4, 4))} bytes."
    named_results = {t["name"]: json.loads(t["value"]) for t in named["conversations"] if t["from"] == "tool"}
    assert named_results["web_extract"]["results"][0]["content"].startswith(
        "Quarterly report of the lighthouse keepers"
    )
    assert named_results["vision_analyze"]["image_url"] == f"{site.url}/image.png"
    # the model server answered the vision questions with the images themselves
    assert sorted(images_sent(server)) == sorted([png(4, 4), png()])  # the one made, the one named
    statistics = json.loads((run_dir / "statistics.json").read_text())
    for tool in WEB_TOOLS:
        assert statistics["tools"][tool]["count"] == 2
    for path in run_dir.iterdir():
        if path.is_file():
            text = path.read_text()
            assert IMAGES_KEY not in text and MODEL_KEY not in text, path.name
    assert IMAGES_KEY not in result.stderr


def test_a_run_that_can_draw_web_without_a_search_provider_stops_saying_what_to_set(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text('distribution = "searching"\n[distributions.searching]\nweb = 0.5\nfile = 0.5\n')
    dataset = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "look it up"}])
    result = trajkit(
        "run", "--config", str(config), "--dataset_file", str(dataset), "--run_name", "w",
        "--output_dir", str(tmp_path), "--quiet",
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "no search provider is set: pass --web.search_provider NAME" in result.stderr
    assert not (tmp_path / "w" / "trajectories.jsonl").exists()
