"""Compression as a step of a run: every merge writes trajectories.compressed.jsonl next to the
kept trajectories, through the run's own model client, and a resume pays for no summary twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.helpers import read_jsonl, trajkit, write_jsonl
from trajkit.compress.turns import SUMMARY_PREFIX
from trajkit.testing.openai_server import OpenAITestServer
from trajkit.testing.policies import dialect_policy

KEY = "sk-step-test-key-0123456789"


def agent_or_summariser(body: dict[str, Any]) -> dict[str, Any]:
    """Sessions get the agent's answers; a request without tools is a summary request."""
    if body.get("tools"):
        return {**dialect_policy(body), "reasoning": "working"}
    return {"content": "Progress: the files were listed and read."}


def test_a_run_writes_compressed_trajectories_after_every_merge(tmp_path: Path) -> None:
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"look at the files {i}"} for i in range(4)])
    (tmp_path / "key").write_text(KEY)
    config = tmp_path / "run.toml"
    config.write_text(
        '[compress]\nmax_tokens = 200\nstrategy = "summary"\ntokenizer = "estimate"\nconcurrency = 2\n'
        "record_timeout = 120\n[compress.options]\nsummary_tokens = 30\nkeep_last = 1\n"
        "[compress.tokenizer_options]\nchars_per_token = 3.5\n"
    )
    with OpenAITestServer(agent_or_summariser, models={"m"}) as server:
        args = [
            "run", "--dataset_file", str(dataset), "--run_name", "r", "--output_dir", str(tmp_path),
            "--model", "m", "--base_url", server.base_url, "--api_key_file", str(tmp_path / "key"),
            "--distribution", "terminal_only", "--config", str(config), "--quiet",
        ]  # fmt: skip
        first = trajkit(*args)
        assert first.returncode == 0, first.stderr
        summaries = [r for r in server.requests if not r.body.get("tools")]
        assert summaries and all(r.headers.get("authorization") == f"Bearer {KEY}" for r in summaries)
        paid = server.count
        again = trajkit(*args, "--resume")
        assert again.returncode == 0, again.stderr
        assert server.count == paid  # nothing pending, and every summary comes from the cache
        # new rows before the old ones: the merge puts their records first, the step follows
        write_jsonl(dataset, [{"prompt": "look at the files new"}, *read_jsonl(dataset)])
        grown = trajkit(*args, "--resume")
        assert grown.returncode == 0, grown.stderr
    kept = read_jsonl(tmp_path / "r" / "trajectories.jsonl")
    compressed = read_jsonl(tmp_path / "r" / "trajectories.compressed.jsonl")
    assert len(kept) == 5 and [r["work_id"] for r in compressed] == [r["work_id"] for r in kept]
    for row in compressed:
        meta = row["compression"]
        assert meta["strategy"] == "summary" and meta["summary_model"] == "m"
        assert "3.5" in meta["counter"]
        assert meta["summaries"] >= 1 and meta["tokens_after"] < meta["tokens_before"]
        assert any(turn["value"].startswith(SUMMARY_PREFIX) for turn in row["conversations"])
    manifest = json.loads((tmp_path / "r" / "run.json").read_text())
    assert manifest["config"]["compress"]["max_tokens"] == 200
    assert KEY not in (tmp_path / "r" / "run.json").read_text()


def test_a_bad_compression_setting_is_refused_before_the_run(tmp_path: Path) -> None:
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi"}])
    result = trajkit(
        "run", "--dataset_file", str(dataset), "--run_name", "bad", "--output_dir", str(tmp_path),
        "--compress.max_tokens", "0",
    )  # fmt: skip
    assert result.returncode == 2
    assert "--compress.max_tokens=0: expects compress.max_tokens to be int or none >= 1" in result.stderr
    assert not (tmp_path / "bad").exists()
