"""``trajkit run`` with MCP servers as toolsets, end to end: the test model calls a per-session
server (in each row's sandbox: local, and Docker's ``trajkit-test/python`` image) and a shared
``mcp-server-time``; the records, ``tools.json`` and the export carry the MCP tools' schemas."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

from tests.helpers import read_jsonl, trajkit, write_jsonl
from tests.test_docker_run import docker_client  # noqa: F401 (fixture)
from tests.test_mcp_servers import STDLIB_SERVER, TIME_SERVER
from trajkit.plugins.scripted_model import split_task
from trajkit.testing.openai_server import OpenAITestServer

PYTHON_IMAGE = "trajkit-test/python:latest"
CALL = re.compile(r"\[call:(\w+) (\{.*?\})\]")


def calling_policy(body: dict[str, Any]) -> dict[str, Any]:
    """Makes the calls the prompt lists (``[call:NAME {args}]``), one a turn, then answers."""
    prompt, since = split_task(body["messages"])
    calls = CALL.findall(prompt)
    made = sum(1 for message in since if message.get("role") == "assistant")
    if made < len(calls):
        name, arguments = calls[made]
        call = {"id": f"call_{made}", "type": "function", "function": {"name": name, "arguments": arguments}}
        return {"content": None, "reasoning": f"Calling {name}.", "tool_calls": [call]}
    results = [m.get("content") for m in since if m.get("role") == "tool"]
    return {"content": f"Done: {results}", "reasoning": "All calls are made."}


def mcp_config(path: Path, *, drawn: bool) -> Path:
    offered = (
        'distribution = "with_mcp"\n[distributions.with_mcp]\n"mcp:notes" = 1.0\n"mcp:time" = 1.0\n'
        if drawn
        else 'toolsets = ["mcp:notes", "mcp:time"]\n'
    )
    path.write_text(
        offered + "[mcp_servers.notes]\n"
        'command = "python3"\n'
        f'args = ["-c", {json.dumps(STDLIB_SERVER)}]\n'
        'env = { NOTE_KEY = "${MCP_E2E_TOKEN}" }\n'
        "[mcp_servers.time]\n"
        f"command = {json.dumps(TIME_SERVER)}\n"
        'mode = "shared"\n'
    )
    return path


TOKEN = "tok-e2e-never-recorded-4471"
PROMPT = (
    'Write a note, list the files, then the time. [call:write_note {"name": "n.txt", "text": "hello"}] '
    '[call:list_files {}] [call:get_current_time {"timezone": "UTC"}] [call:environment {"name": "NOTE_KEY"}]'
)


def run_with_mcp(
    tmp_path: Path, sandbox_root: Path, rows: list[dict[str, Any] | str], name: str, *, drawn: bool = False
) -> Path:
    dataset = write_jsonl(tmp_path / "prompts.jsonl", rows)
    config = mcp_config(tmp_path / "run.toml", drawn=drawn)
    with OpenAITestServer(calling_policy) as server:
        result = trajkit(
            "run", "--config", str(config), "--dataset_file", str(dataset), "--run_name", name,
            "--output_dir", str(tmp_path), "--model", "m", "--base_url", server.base_url,
            "--sandbox_option", f"local.root={sandbox_root}", "--sandbox_option", "docker.pull=never",
            "--num_workers", "2", "--quiet", env={"MCP_E2E_TOKEN": TOKEN}, timeout=600,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    for path in (tmp_path / name).rglob("*"):  # the server got it; no file of the run holds it
        assert not path.is_file() or TOKEN not in path.read_text(errors="replace"), path.name
    return tmp_path / name


def check_records(run_dir: Path, count: int) -> list[dict[str, Any]]:
    records = read_jsonl(run_dir / "trajectories.jsonl")
    assert len(records) == count
    schemas = json.loads((run_dir / "tools.json").read_text())
    for record in records:
        assert sorted(record["toolsets_used"]) == ["mcp:notes", "mcp:time"]
        for tool in ("write_note", "list_files", "get_current_time", "environment"):
            assert record["tool_stats"][tool] == {"count": 1, "success": 1, "failure": 0}, record[
                "tool_stats"
            ]
        assert record["tool_stats"]["convert_time"]["count"] == 0  # every tool of the run, zero-filled
        results = [turn["value"] for turn in record["conversations"] if turn["from"] == "tool"]
        assert results[0] == "written"
        assert json.loads(results[1]) == ["n.txt"]  # the session's own sandbox: its note alone
        assert json.loads(results[2])["timezone"] == "UTC"
        assert results[3] == "[REDACTED]"  # the server had the token, the record does not
        offered = schemas[record["tool_schemas_key"]]
        names = {schema["function"]["name"]: schema["function"] for schema in offered}
        assert set(names) == {
            "write_note",
            "list_files",
            "environment",
            "flood",
            "get_current_time",
            "convert_time",
        }
        assert names["write_note"]["parameters"]["required"] == ["name", "text"]
    return records


def test_a_run_calls_mcp_tools_in_local_sandboxes(tmp_path: Path, sandbox_root: Path) -> None:
    rows: list[dict[str, Any] | str] = [{"prompt": PROMPT}, {"prompt": PROMPT + " (again)"}]
    run_dir = run_with_mcp(tmp_path, sandbox_root, rows, "mcp-local")
    check_records(run_dir, 2)
    saved = json.loads((run_dir / "run.json").read_text())["config"]
    assert saved["tables"]["mcp_servers"]["time"]["mode"] == "shared"
    exported = tmp_path / "export.jsonl"
    result = trajkit("export", str(run_dir), "--format", "openai", "--out", str(exported))
    assert result.returncode == 0, result.stderr
    row = read_jsonl(exported)[0]
    assert {tool["function"]["name"] for tool in row["tools"]} >= {"write_note", "get_current_time"}


def test_a_run_calls_mcp_tools_in_docker_sandboxes(
    tmp_path: Path,
    sandbox_root: Path,
    docker_client: Any,  # noqa: F811
) -> None:
    run_name = f"mcp-docker-{uuid.uuid4().hex[:8]}"
    rows: list[dict[str, Any] | str] = [{"prompt": PROMPT, "image": PYTHON_IMAGE}]
    run_dir = run_with_mcp(tmp_path, sandbox_root, rows, run_name, drawn=True)  # drawn by a distribution
    (record,) = check_records(run_dir, 1)
    assert record["sandbox"]["backend"] == "docker"


IMAGE_PROMPT = (
    'Write a note, then list the files. [call:write_note {"name": "n.txt", "text": "from the image"}] '
    "[call:list_files {}]"
)


def test_a_per_session_server_found_only_in_the_row_s_image_is_listed_there(
    tmp_path: Path,
    docker_client: Any,  # noqa: F811
) -> None:
    """A server program that exists in the row's Docker image alone (in an image this test builds
    on trajkit-test/python) is started and listed in each session's container; a second server
    that starts nowhere leaves its tools out of the session, which goes on."""
    context = tmp_path / "image"
    context.mkdir()
    server = context / "notes-server"
    server.write_text(f"#!/usr/bin/python3\n{STDLIB_SERVER}")
    server.chmod(0o755)
    (context / "Dockerfile").write_text(
        f"FROM {PYTHON_IMAGE}\nCOPY notes-server /usr/local/bin/notes-server\n"
    )
    tag = f"trajkit-test/mcp-notes-{uuid.uuid4().hex[:8]}:latest"
    docker_client.images.build(path=str(context), tag=tag, rm=True, pull=False)
    config = tmp_path / "run.toml"
    config.write_text(
        'toolsets = ["mcp:notes", "mcp:absent"]\n'
        '[mcp_servers.notes]\ncommand = "notes-server"\n'
        '[mcp_servers.absent]\ncommand = "no-such-mcp-server"\nstart_timeout = 20\n'
    )
    dataset = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": IMAGE_PROMPT, "image": tag}])
    name = f"mcp-image-{uuid.uuid4().hex[:8]}"
    try:
        with OpenAITestServer(calling_policy) as model:
            result = trajkit(
                "run", "--config", str(config), "--dataset_file", str(dataset), "--run_name", name,
                "--output_dir", str(tmp_path), "--model", "m", "--base_url", model.base_url,
                "--sandbox_option", "docker.pull=never", timeout=600,
            )  # fmt: skip
    finally:
        docker_client.images.remove(tag, force=True)
    assert result.returncode == 0, result.stderr
    assert "mcp:absent offers no tools in this session: MCP server 'absent' failed to start" in result.stderr
    (record,) = read_jsonl(tmp_path / name / "trajectories.jsonl")
    assert record["sandbox"]["backend"] == "docker"
    assert record["tools_offered"] == ["environment", "flood", "list_files", "write_note"]
    assert record["toolsets_used"] == ["mcp:notes"]
    assert record["tool_stats"]["write_note"] == {"count": 1, "success": 1, "failure": 0}
    assert record["tool_stats"]["list_files"] == {"count": 1, "success": 1, "failure": 0}
    results = [turn["value"] for turn in record["conversations"] if turn["from"] == "tool"]
    assert results[0] == "written"
    assert "n.txt" in json.loads(results[1])  # the container's working directory
    offered = json.loads((tmp_path / name / "tools.json").read_text())[record["tool_schemas_key"]]
    names = {schema["function"]["name"]: schema["function"] for schema in offered}
    assert set(names) == set(record["tools_offered"])
    assert names["write_note"]["parameters"]["required"] == ["name", "text"]


def test_the_library_agent_offers_a_per_session_server_s_tools(sandbox_root: Path) -> None:
    from trajkit.library import Agent

    servers = {"notes": {"command": "python3", "args": ["-c", STDLIB_SERVER]}}
    with OpenAITestServer(calling_policy) as server:
        agent = Agent(
            "m", base_url=server.base_url, api_key="k", enabled_toolsets=["mcp:notes"],
            sandbox_options={"root": str(sandbox_root)}, mcp_servers=servers,
        )  # fmt: skip
        assert agent.tools == {}  # listed in each conversation's sandbox
        result = agent.run_conversation(IMAGE_PROMPT)
    assert result.completed
    assert result.tool_stats["write_note"].success == 1
    assert result.tool_stats["list_files"].success == 1
    results = [m["content"] for m in result.messages if m["role"] == "tool"]
    assert results == ["written", '["n.txt"]']


def test_trajkit_serve_offers_and_records_a_per_session_server_s_tools(
    tmp_path: Path, sandbox_root: Path
) -> None:
    import openai

    from tests.serve_helpers import ServeProcess, write_key

    config = tmp_path / "serve.toml"
    config.write_text(
        'toolsets = ["mcp:notes"]\n[mcp_servers.notes]\ncommand = "python3"\n'
        f'args = ["-c", {json.dumps(STDLIB_SERVER)}]\n'
    )
    run_dir, key = tmp_path / "served", write_key(tmp_path / "server.key", "server-key-for-mcp-4242")
    with OpenAITestServer(calling_policy) as model:
        process = ServeProcess(
            "--config", str(config), "--model", "m", "--base_url", model.base_url,
            "--server_key_file", str(key), "--sandbox_option", f"local.root={sandbox_root}",
            "--record", str(run_dir),
        )  # fmt: skip
        try:
            api = openai.OpenAI(base_url=process.base_url, api_key="server-key-for-mcp-4242", max_retries=0)
            answer = api.chat.completions.create(
                model="m", messages=[{"role": "user", "content": IMAGE_PROMPT}]
            )
            assert "written" in (answer.choices[0].message.content or "")
        finally:
            assert process.stop() == 0, process.stderr
    (record,) = read_jsonl(run_dir / "trajectories.jsonl")
    assert record["toolsets_used"] == ["mcp:notes"]
    assert record["tool_stats"]["write_note"] == {"count": 1, "success": 1, "failure": 0}
    assert record["tool_stats"]["list_files"] == {"count": 1, "success": 1, "failure": 0}
    offered = json.loads((run_dir / "tools.json").read_text())[record["tool_schemas_key"]]
    assert {schema["function"]["name"] for schema in offered} == {
        "write_note",
        "list_files",
        "environment",
        "flood",
    }
