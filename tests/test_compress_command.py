"""``trajkit compress`` end to end: the real CLI in a subprocess, summaries from the test server."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.helpers import read_jsonl, trajkit, write_jsonl
from trajkit.compress.turns import SUMMARY_PREFIX, problems
from trajkit.testing.openai_server import OpenAITestServer
from trajkit.testing.trajectories import reference_record, trajkit_record


def summary_policy(body: dict[str, Any]) -> dict[str, Any]:
    """A deterministic summariser: the same region always gets the same (short) summary."""
    excerpt = body["messages"][-1]["content"]
    return {"content": f"Progress: {excerpt.count('[TOOL RESULT')} tool results condensed."}


def compress(
    *args: str, server: OpenAITestServer | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    model = ["--model", "test-model", "--base_url", server.base_url] if server else []
    return trajkit("compress", *args, *model, timeout=timeout)


def test_summaries_through_the_server_keep_parallel_calls_whole_and_load_in_datasets(tmp_path: Path) -> None:
    records = [trajkit_record(i, steps=14, parallel=3) for i in range(6)]
    records.append(trajkit_record(99, steps=1, parallel=1))  # already under budget
    source = write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out.jsonl"
    with OpenAITestServer(summary_policy) as server:
        done = compress(
            str(source), "--out", str(out), "--max_tokens", "2500", "--strategy", "summary", server=server
        )
        assert done.returncode == 0, done.stderr
        requests = server.count
    rows = read_jsonl(out)
    assert [r["prompt_index"] for r in rows] == [*range(6), 99]
    for original, row in zip(records, rows, strict=True):
        meta = row["compression"]
        assert problems(row["conversations"]) == []
        assert meta["tokens_before"] > meta["tokens_after"] or row["prompt_index"] == 99
        if row["prompt_index"] == 99:
            assert (
                meta["under_budget"]
                and not meta["compressed"]
                and row["conversations"] == original["conversations"]
            )
            continue
        assert meta["under_budget"] and meta["summaries"] >= 1 and meta["summary_model"] == "test-model"
        summaries = [t for t in row["conversations"] if t["value"].startswith(SUMMARY_PREFIX)]
        assert len(summaries) == 1 and summaries[0]["from"] == "human"
        kept_ids = {t["tool_call_id"] for t in row["conversations"] if t["from"] == "tool"}
        for turn in row["conversations"]:
            if turn["from"] == "gpt" and turn["tool_calls"]:
                assert {c["id"] for c in turn["tool_calls"]} <= kept_ids  # parallel calls kept together
    assert requests == sum(r["compression"]["requests"] for r in rows)
    metrics = json.loads((tmp_path / "out.jsonl.metrics.json").read_text())
    assert metrics["records"] == 7 and metrics["under_budget"] == 7 and metrics["requests"] == requests
    assert metrics["spent"]["requests"] == requests  # as the model client counted them

    import datasets

    loaded = datasets.load_dataset("json", data_files=str(out), split="train")
    assert loaded.num_rows == 7
    assert set(loaded.features["compression"]) >= {"tokens_before", "tokens_after", "strategy", "cost"}


def test_the_first_tool_turn_late_in_the_conversation_is_kept(tmp_path: Path) -> None:
    record = trajkit_record(0, steps=10, parallel=2, answer_first=8)
    turns = record["conversations"]
    first_tool = next(i for i, t in enumerate(turns) if t["from"] == "tool")
    source = write_jsonl(tmp_path / "in.jsonl", [record])
    out = tmp_path / "out.jsonl"
    with OpenAITestServer(summary_policy) as server:
        done = compress(
            str(source),
            "--out",
            str(out),
            "--max_tokens",
            "1500",
            "--strategy",
            "summary",
            "--option",
            "keep_last=2",
            server=server,
        )
        assert done.returncode == 0, done.stderr
        asked = [r.body["messages"][-1]["content"] for r in server.requests]
    [row] = read_jsonl(out)
    kept = row["conversations"]
    for index in (0, 1, 2, first_tool - 1, first_tool, first_tool + 1):
        assert turns[index] in kept
    assert all(turns[first_tool]["value"][:60] not in excerpt for excerpt in asked)
    assert row["compression"]["under_budget"] and problems(kept) == []


def test_a_summariser_that_times_out_keeps_the_record_unchanged_and_flagged(tmp_path: Path) -> None:
    records = [trajkit_record(i, steps=10, parallel=2) for i in range(3)]
    small = trajkit_record(3, steps=1, parallel=1)  # under budget: no model needed, not flagged
    source = write_jsonl(tmp_path / "in.jsonl", [*records, small])
    out = tmp_path / "out.jsonl"
    with OpenAITestServer(summary_policy, latency=30.0) as server:
        done = compress(
            str(source),
            "--out",
            str(out),
            "--max_tokens",
            "1500",
            "--strategy",
            "summary",
            "--record_timeout",
            "1",
            server=server,
        )
    assert done.returncode == 0, done.stderr
    assert "3 records could not be compressed and were kept unchanged" in done.stderr
    rows = read_jsonl(out)
    assert [r["conversations"] for r in rows] == [r["conversations"] for r in [*records, small]]
    for row in rows[:3]:
        assert row["compression"]["error"] == "timeout: not compressed within 1s"
        assert not row["compression"]["under_budget"] and not row["compression"]["compressed"]
    assert rows[3]["compression"]["error"] is None and rows[3]["compression"]["under_budget"]
    metrics = json.loads((tmp_path / "out.jsonl.metrics.json").read_text())
    assert metrics["flagged"] == 3 and metrics["under_budget"] == 1

    import datasets  # flagged and clean rows side by side still make one schema

    loaded = datasets.load_dataset("json", data_files=str(out), split="train")
    assert loaded["compression"][0]["error"] == "timeout: not compressed within 1s"
    assert loaded["compression"][3]["error"] is None


def _cached_summaries(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT count(*) FROM summaries").fetchone()[0])


def test_kill_9_mid_file_then_a_rerun_pays_for_no_summary_twice(tmp_path: Path) -> None:
    records = [trajkit_record(i, steps=12, parallel=2) for i in range(12)]
    source = write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out.jsonl"
    cache = tmp_path / "out.jsonl.summaries.sqlite"
    with OpenAITestServer(summary_policy, latency=0.3) as server:
        args = [
            sys.executable, "-m", "trajkit", "compress", str(source), "--out", str(out), "--max_tokens", "1500",
            "--strategy", "summary", "--option", "summary_tokens=40", "--concurrency", "2", "--quiet",
            "--model", "test-model", "--base_url", server.base_url,
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
        process = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not out.exists() or out.read_bytes().count(b"\n") < 4):
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait()
        written_before = out.read_bytes().count(b"\n")
        assert 4 <= written_before < len(records)
        stored = _cached_summaries(cache)
        while server.in_flight:  # requests the killed process sent are answered (and paid) all the same
            time.sleep(0.05)
        first_requests = server.count

        done = compress(
            str(source),
            "--out",
            str(out),
            "--max_tokens",
            "1500",
            "--strategy",
            "summary",
            "--option",
            "summary_tokens=40",
            "--concurrency",
            "2",
            server=server,
        )
        assert done.returncode == 0, done.stderr
        second_requests = server.count - first_requests
    rows = read_jsonl(out)
    assert [r["prompt_index"] for r in rows] == list(range(12))  # nothing lost, nothing twice, in order
    assert all(problems(r["conversations"]) == [] and r["compression"]["under_budget"] for r in rows)
    needed = sum(r["compression"]["summaries"] for r in rows)
    assert first_requests >= stored > 0
    assert second_requests == needed - stored  # every summary stored before the kill was reused
    assert _cached_summaries(cache) == needed

    # and a rerun of the finished output asks for nothing
    with OpenAITestServer(summary_policy) as server:
        again = compress(
            str(source),
            "--out",
            str(out),
            "--max_tokens",
            "1500",
            "--strategy",
            "summary",
            "--option",
            "summary_tokens=40",
            server=server,
        )
        assert again.returncode == 0 and server.count == 0
        assert read_jsonl(out) == rows
        # nor does the output made again with settings that leave the requests as they were
        other = compress(
            str(source), "--out", str(out), "--max_tokens", "1500", "--strategy", "summary", "--option",
            "summary_tokens=40", "--option", "max_summaries=2", "--overwrite", server=server,
        )  # fmt: skip
        assert other.returncode == 0 and server.count == 0
    assert [r["conversations"] for r in read_jsonl(out)] == [r["conversations"] for r in rows]


def test_the_reference_runner_record_shape(tmp_path: Path) -> None:
    records = [reference_record(i, steps=12, parallel=2) for i in range(3)]
    source = write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out.jsonl"
    with OpenAITestServer(summary_policy) as server:
        done = compress(
            str(source), "--out", str(out), "--max_tokens", "2000", "--strategy", "pipeline", server=server
        )
        assert done.returncode == 0, done.stderr
    rows = read_jsonl(out)
    for original, row in zip(records, rows, strict=True):
        meta = row["compression"]
        assert meta["under_budget"] and meta["masked"] > 0 and meta["summaries"] == 1
        assert problems(row["conversations"]) == []
        assert all(set(turn) == {"from", "value"} for turn in row["conversations"])
        calls = sum(t["value"].count("<tool_call>") for t in row["conversations"])
        results = sum(t["value"].count("<tool_response>") for t in row["conversations"])
        assert calls == results
        assert row["conversations"][:3] == original["conversations"][:3]
        assert "(20 lines, " in row["conversations"][3]["value"]  # what the masked output held


def test_a_run_directory_is_read_through_its_kept_trajectories_only(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    write_jsonl(run / "trajectories.jsonl", [trajkit_record(i, steps=6) for i in range(3)])
    write_jsonl(run / "batch_0.jsonl", [trajkit_record(i, steps=6) for i in range(100, 105)])
    out = tmp_path / "out.jsonl"
    done = compress(str(run), "--out", str(out), "--max_tokens", "800", "--quiet")
    assert done.returncode == 0, done.stderr
    rows = read_jsonl(out)
    assert [r["prompt_index"] for r in rows] == [0, 1, 2]
    assert all(r["compression"]["strategy"] == "mask_observations" for r in rows)

    empty = tmp_path / "empty"
    empty.mkdir()
    refused = compress(str(empty), "--out", str(tmp_path / "x.jsonl"), "--max_tokens", "800")
    assert refused.returncode == 2 and "has no trajectories.jsonl" in refused.stderr


def test_a_torn_last_line_is_cut_off_and_the_record_redone(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [trajkit_record(i, steps=6) for i in range(5)])
    out = tmp_path / "out.jsonl"
    assert compress(str(source), "--out", str(out), "--max_tokens", "800", "--quiet").returncode == 0
    complete = out.read_bytes()
    lines = complete.splitlines(keepends=True)
    out.write_bytes(b"".join(lines[:3]) + lines[3][:100])  # as a kill -9 mid-write would leave it
    done = compress(str(source), "--out", str(out), "--max_tokens", "800", "--quiet")
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == complete
    assert "unfinished last line" in done.stderr


def test_an_output_of_other_settings_is_not_resumed(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [trajkit_record(i, steps=6) for i in range(2)])
    out = tmp_path / "out.jsonl"
    assert compress(str(source), "--out", str(out), "--max_tokens", "800", "--quiet").returncode == 0
    other = compress(str(source), "--out", str(out), "--max_tokens", "700", "--quiet")
    assert other.returncode == 2 and "differs in: max_tokens" in other.stderr
    over = compress(str(source), "--out", str(out), "--max_tokens", "700", "--quiet", "--overwrite")
    assert over.returncode == 0
    assert {r["compression"]["max_tokens"] for r in read_jsonl(out)} == {700}


def test_a_bad_option_names_the_strategy_the_key_and_what_it_expects(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [trajkit_record(0)])
    args = [str(source), "--out", str(tmp_path / "out.jsonl"), "--max_tokens", "800"]
    bad = compress(*args, "--strategy", "summary", "--option", "keep_last=few")
    assert bad.returncode == 2
    assert "--option keep_last=few: strategy 'summary' expects keep_last to be int >= 0" in bad.stderr
    unknown = compress(*args, "--strategy", "mask_observations", "--option", "keep=2")
    assert "strategy 'mask_observations' has no setting 'keep' (its settings: keep_last," in unknown.stderr
    shape = compress(*args, "--option", "keep_last")
    assert "--option 'keep_last': expected KEY=VALUE" in shape.stderr
    strategy = compress(*args, "--strategy", "squash")
    assert "unknown strategy 'squash' (installed: mask_observations, pipeline, summary)" in strategy.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_a_failing_summariser_keeps_the_record_and_its_error_never_shows_the_key(tmp_path: Path) -> None:
    key = "sk-compress-test-0123456789abcdef"

    def refusing(body: dict[str, Any]) -> dict[str, Any]:
        return {"_status": 400, "_error": f"this request cannot be served (key {key})"}

    records = [trajkit_record(i, steps=10, parallel=2) for i in range(2)]
    source = write_jsonl(tmp_path / "in.jsonl", records)
    key_file = tmp_path / "key"
    key_file.write_text(key)
    out = tmp_path / "out.jsonl"
    with OpenAITestServer(refusing, api_key=key) as server:
        done = compress(
            str(source), "--out", str(out), "--max_tokens", "1500", "--strategy", "summary",
            "--api_key_file", str(key_file), server=server,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = read_jsonl(out)
    assert [r["conversations"] for r in rows] == [r["conversations"] for r in records]
    for row in rows:
        error = row["compression"]["error"]
        assert error.startswith("ModelConfigError: ") and "[REDACTED]" in error
    assert key not in out.read_text() + done.stderr + done.stdout


def test_an_input_that_changed_under_a_resume_is_refused_and_one_that_grew_is_continued(
    tmp_path: Path,
) -> None:
    records = [trajkit_record(i, steps=6) for i in range(5)]
    source = write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "out.jsonl"
    args = [str(source), "--out", str(out), "--max_tokens", "800", "--quiet"]
    assert compress(*args).returncode == 0

    write_jsonl(source, [*records, trajkit_record(5, steps=6)])  # grew at the end: continued
    grown = compress(*args)
    assert grown.returncode == 0, grown.stderr
    assert [r["prompt_index"] for r in read_jsonl(out)] == list(range(6))

    write_jsonl(source, [records[0], trajkit_record(7, steps=6), *records[1:]])  # a record inserted
    changed = compress(*args)
    assert changed.returncode == 1
    assert "are not those the output was made from: the input changed since" in changed.stderr
    assert [r["prompt_index"] for r in read_jsonl(out)] == list(range(6))  # left as it was


def test_a_real_run_directory_compresses_into_valid_trajectories(tmp_path: Path) -> None:
    dataset = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"Write note {i}"} for i in range(3)])
    ran = trajkit(
        "run", "--dataset_file", str(dataset), "--run_name", "r", "--output_dir", str(tmp_path),
        "--model", "scripted", "--distribution", "terminal_only", "--quiet",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    run_dir = tmp_path / "r"
    kept = read_jsonl(run_dir / "trajectories.jsonl")
    out = tmp_path / "compressed.jsonl"
    done = compress(
        str(run_dir), "--out", str(out), "--max_tokens", "200", "--option", "keep_last=1",
        "--option", "min_chars=0", "--quiet",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = read_jsonl(out)
    assert [r["work_id"] for r in rows] == [r["work_id"] for r in kept]
    assert all(r["compression"]["masked"] > 0 and problems(r["conversations"]) == [] for r in rows)

    import datasets

    loaded = datasets.load_dataset("json", data_files=str(out), split="train")
    assert loaded.num_rows == len(kept)


def test_identical_regions_in_flight_at_once_are_asked_for_once(tmp_path: Path) -> None:
    record = trajkit_record(0, steps=10, parallel=2)
    source = write_jsonl(tmp_path / "in.jsonl", [record, record, record])
    out = tmp_path / "out.jsonl"
    with OpenAITestServer(summary_policy, latency=0.5) as server:
        done = compress(
            str(source), "--out", str(out), "--max_tokens", "1500", "--strategy", "summary",
            "--concurrency", "3", server=server,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert server.count == 1
    rows = read_jsonl(out)
    assert rows[0]["conversations"] == rows[1]["conversations"] == rows[2]["conversations"]
    assert [r["compression"]["requests"] for r in rows] == [1, 0, 0]


def test_an_offline_client_s_summaries_are_said_to_be_placeholders(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", [trajkit_record(0, steps=14, parallel=3)])
    done = compress(
        str(source), "--out", str(tmp_path / "out.jsonl"), "--max_tokens", "2500", "--strategy", "summary"
    )
    assert done.returncode == 0, done.stderr
    assert "--model scripted: summaries are offline placeholders" in done.stderr
    [row] = read_jsonl(tmp_path / "out.jsonl")
    assert row["compression"]["summaries"] >= 1


def test_input_lines_that_are_no_trajectory_fail_the_command_by_name(tmp_path: Path) -> None:
    """Every other record is written, then the command exits 1 naming each skipped line, and the
    output is marked incomplete (beside it, and in its metrics) until a complete compression."""
    lines: list[dict[str, Any] | str] = [trajkit_record(i, steps=2, parallel=1) for i in range(20)]
    lines[6] = '{"prompt_index": 6, "conversations": [{"from": "human", "value": "cut'
    lines.insert(12, '["a list"]')
    lines.insert(15, json.dumps({"prompt_index": 77}))  # JSON, but no conversations
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    marker = tmp_path / "out.jsonl.incomplete"

    result = compress(
        str(source), "--out", str(out), "--max_tokens", "100000", "--strategy", "mask_observations"
    )
    assert result.returncode == 1, result.stderr
    for number, problem in ((7, "not JSON"), (13, "not a JSON object"), (16, "no 'conversations' list")):
        assert f"{source}:{number}: {problem}" in result.stderr
    assert "3 input lines skipped" in result.stderr and "incomplete" in result.stderr
    assert len(read_jsonl(out)) == 19
    assert marker.is_file() and f"{source}:7" in marker.read_text()
    metrics = json.loads((tmp_path / "out.jsonl.metrics.json").read_text())
    assert metrics["complete"] is False and metrics["skipped_input_lines"] == [7, 13, 16]

    # the same input again: nothing to redo, and still incomplete
    again = compress(
        str(source), "--out", str(out), "--max_tokens", "100000", "--strategy", "mask_observations"
    )
    assert again.returncode == 1 and f"{source}:16" in again.stderr and marker.is_file()

    fixed = write_jsonl(tmp_path / "in.jsonl", [trajkit_record(i, steps=2, parallel=1) for i in range(20)])
    done = compress(
        str(fixed),
        "--out",
        str(out),
        "--max_tokens",
        "100000",
        "--strategy",
        "mask_observations",
        "--overwrite",
    )
    assert done.returncode == 0, done.stderr
    assert len(read_jsonl(out)) == 20 and not marker.exists()
    assert json.loads((tmp_path / "out.jsonl.metrics.json").read_text())["complete"] is True
