"""trajkit as an Atropos environment (``trajkit_atropos``): groups of sessions of a dataset's rows
against the test model server as the policy, scored in their sandbox (local and Docker),
tokenized through a real chat template on a tokenizer built here, written by ``process`` and sent
by ``serve`` to Atropos's own trajectory API server (``run-api``)."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import build_tokenizer, read_jsonl, trajkit, write_jsonl
from trajkit.testing.engines import need_engine
from trajkit.testing.openai_server import OpenAITestServer

pytest.importorskip("atroposlib")
transformers = pytest.importorskip("transformers")

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
CHATML = {"eos_token": "<|im_end|>"}
QWEN_SPECIAL = ["<|im_start|>", "<tool_call>", "</tool_call>"]
MIXED = {"prompt": "Make out.txt", "check": "test -f out.txt", "source": "unit"}
"""Half the sessions of a group make the file (the policy below alternates): scores differ."""
SAME = {"prompt": "Say hello", "check": "true"}
"""Every session passes: a group whose scores are all equal."""
NO_REASONING_FILTER = {"disabled_filters": ["no_reasoning"]}


class AlternatingPolicy:
    """A session's first call runs a command (``echo made > out.txt`` in the even sessions of a
    prompt, ``true`` in the odd ones), its second answers: in a group of a prompt, half pass."""

    def __init__(self) -> None:
        self.sessions: dict[str, itertools.count[int]] = {}
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        if any(m["role"] == "tool" for m in messages):
            return {"role": "assistant", "content": "done"}
        prompt = next(m["content"] for m in messages if m["role"] == "user")
        with self.lock:
            number = next(self.sessions.setdefault(prompt, itertools.count()))
        command = "echo made > out.txt" if number % 2 == 0 else "true"
        call = {
            "id": f"call_{number}",
            "type": "function",
            "function": {"name": "terminal", "arguments": json.dumps({"command": command})},
        }
        return {"role": "assistant", "content": "", "tool_calls": [call]}


@pytest.fixture(scope="module")
def qwen_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("qwen-tokenizer")
    template = (TEMPLATES / "qwen2.5.jinja").read_text(encoding="utf-8")
    build_tokenizer(directory, template, CHATML, QWEN_SPECIAL)
    return directory


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def env_command(
    mode: str, dataset: Path, tokenizer: Path, server: OpenAITestServer, *extra: str
) -> list[str]:
    return [
        sys.executable, "-m", "trajkit_atropos", mode,
        "--env.dataset_file", str(dataset), "--env.tokenizer_name", str(tokenizer),
        "--env.use_wandb", "False", "--env.group_size", "2", "--env.toolsets", "terminal",
        "--openai.base_url", server.base_url, "--openai.model_name", "policy", "--openai.api_key", "k",
        *extra,
    ]  # fmt: skip


def run_env(command: list[str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    return subprocess.run(
        command, capture_output=True, text=True, env=environ, timeout=timeout, stdin=subprocess.DEVNULL
    )


def local_settings(root: Path, **more: Any) -> str:
    return json.dumps({"sandbox_options": {"local": {"root": str(root)}}, **NO_REASONING_FILTER, **more})


def in_process_env(server: OpenAITestServer, dataset: Path, tokenizer: Path, **settings: Any) -> Any:
    """The environment in this process, as Atropos's commands build it, against ``server``."""
    from atroposlib.envs.server_handling.server_baseline import APIServerConfig
    from trajkit_atropos.config import TrajkitEnvConfig
    from trajkit_atropos.env import TrajkitEnv

    config = TrajkitEnvConfig(
        dataset_file=str(dataset),
        tokenizer_name=str(tokenizer),
        use_wandb=False,
        toolsets="terminal",
        **settings,
    )
    return TrajkitEnv(config, [APIServerConfig(base_url=server.base_url, model_name="policy", api_key="k")])


def assert_masked_tokens(group: dict[str, Any]) -> None:
    for tokens, masks in zip(group["tokens"], group["masks"], strict=True):
        assert len(tokens) == len(masks)
        assert all(mask in (-100, token) for token, mask in zip(tokens, masks, strict=True))
        assert any(mask != -100 for mask in masks) and masks[0] == -100


# -- masks, token by token -------------------------------------------------------------------------


def test_masks_cover_exactly_the_assistant_turns(qwen_tokenizer: Path) -> None:
    from trajkit_atropos.tokens import NOT_TRAINED, Renderer, policy_template

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(qwen_tokenizer))
    renderer = Renderer(policy_template(tokenizer), tokenizer)
    call = {
        "id": "call_7",
        "type": "function",
        "function": {"name": "terminal", "arguments": '{"command": "ls -a"}'},
    }
    messages = [
        {"role": "system", "content": "You are careful."},
        {"role": "user", "content": "List the files, then say what you saw."},
        {"role": "assistant", "content": "", "reasoning": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_7", "name": "terminal", "content": "a.txt b.txt"},
        {"role": "assistant", "content": "Two files: a.txt and b.txt.", "reasoning": None},
    ]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "terminal",
                "description": "Run a command.",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
            },
        }
    ]
    out = renderer.tokenize(messages, tools)
    assert tokenizer.decode(out.tokens) == out.text, "the tokens are the rendered text"
    as_sent = [{k: v for k, v in m.items() if k != "reasoning"} for m in messages]
    as_sent[2] = {
        **as_sent[2],
        "tool_calls": [{**call, "function": {"name": "terminal", "arguments": {"command": "ls -a"}}}],
    }
    rendered = tokenizer.apply_chat_template(as_sent, tools=tools, tokenize=False)
    assert out.text == rendered, "the text is what transformers renders (arguments as the object sent)"
    # Expected independently of the renderer: each assistant turn of ChatML runs from after
    # "<|im_start|>assistant\n" to its "<|im_end|>" inclusive; nothing else is trained.
    pieces = [tokenizer.decode([token]) for token in out.tokens]
    starts = list(itertools.accumulate([0, *map(len, pieces)]))
    assert starts[-1] == len(out.text)
    turns = [
        (m.start(1), m.end(1))
        for m in re.finditer(r"<\|im_start\|>assistant\n(.*?<\|im_end\|>)", out.text, flags=re.DOTALL)
    ]
    assert len(turns) == 2
    for token, mask, start, piece in zip(out.tokens, out.masks, starts, pieces, strict=False):
        trained = any(begin <= start < end for begin, end in turns)
        assert mask == (token if trained else NOT_TRAINED), (start, piece)
    trained_text = "".join(
        piece for piece, mask in zip(pieces, out.masks, strict=True) if mask != NOT_TRAINED
    )
    assert trained_text == (
        '<tool_call>\n{"name": "terminal", "arguments": {"command": "ls -a"}}\n</tool_call><|im_end|>'
        "Two files: a.txt and b.txt.<|im_end|>"
    )
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in out.tokens, "special tokens are single tokens"


# -- process: scored groups to JSONL, the rollouts in a run directory ------------------------------


def test_process_writes_scored_groups_and_records_the_rollouts(
    tmp_path: Path, sandbox_root: Path, qwen_tokenizer: Path
) -> None:
    dataset = write_jsonl(tmp_path / "rows.jsonl", [MIXED, SAME])
    groups_file = tmp_path / "groups.jsonl"
    run_dir = tmp_path / "rollouts"
    with OpenAITestServer(AlternatingPolicy()) as server:
        command = env_command(
            "process", dataset, qwen_tokenizer, server,
            "--env.total_steps", "2", "--env.data_path_to_save_groups", str(groups_file),
            "--env.ensure_scores_are_not_same", "True", "--env.record_dir", str(run_dir),
            "--env.trajkit_settings", local_settings(sandbox_root),
        )  # fmt: skip
        finished = run_env(command)
    assert finished.returncode == 0, finished.stderr[-4000:]
    groups = read_jsonl(groups_file)
    assert len(groups) == 1, "the group whose scores are all equal is dropped"
    (group,) = groups
    assert sorted(group["scores"]) == [0.0, 1.0], "scored by the row's check in each session's sandbox"
    assert_masked_tokens(group)
    assert [m["role"] for m in group["messages"][0]] == ["system", "user", "assistant", "tool", "assistant"]
    group_id = group["group_overrides"]["group_id"]
    assert [o["rollout_id"] for o in group["overrides"]] == [f"{group_id}.0", f"{group_id}.1"]
    assert list(sandbox_root.iterdir()) == [] or all(p.name.startswith(".") for p in sandbox_root.iterdir())

    records = read_jsonl(run_dir / "trajectories.jsonl")
    assert len(records) == 4, "every rollout recorded, the dropped group's too"
    by_group: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_group.setdefault(record["metadata"]["group_id"], []).append(record)
    assert sorted(r["score"]["value"] for r in by_group[group_id]) == [0.0, 1.0]
    assert {r["metadata"]["source"] for r in by_group[group_id]} == {"unit"}
    invocation = json.loads((run_dir / "run.json").read_text())["invocations"][-1]
    assert invocation["model_client"]["requests"] == 8, "4 sessions of two model calls, in the run's accounts"
    status = trajkit("status", str(run_dir))
    assert status.returncode == 0 and re.search(r"done\s+4", status.stdout), status.stdout + status.stderr
    exported = trajkit("export", str(run_dir), "--format", "openai", "--out", str(tmp_path / "out.jsonl"))
    assert exported.returncode == 0, exported.stderr
    assert len(read_jsonl(tmp_path / "out.jsonl")) == 4


def test_process_stops_with_the_reason_when_every_group_fails(
    tmp_path: Path, sandbox_root: Path, qwen_tokenizer: Path
) -> None:
    dataset = write_jsonl(tmp_path / "rows.jsonl", [MIXED, SAME])
    with OpenAITestServer(AlternatingPolicy(), api_key="the-right-key") as server:
        command = env_command(
            "process", dataset, qwen_tokenizer, server,
            "--env.total_steps", "20", "--env.data_path_to_save_groups", str(tmp_path / "groups.jsonl"),
            "--env.trajkit_settings", local_settings(sandbox_root),
        )  # fmt: skip
        finished = run_env(command)
    assert finished.returncode == 2 and "Traceback" not in finished.stderr, finished.stderr[-3000:]
    assert "error: 8 groups in a row failed" in finished.stderr
    assert "2 of 2 sessions failed" in finished.stderr and "401" in finished.stderr
    assert all(p.name.startswith(".") for p in sandbox_root.iterdir()), "a sandbox outlived the environment"


# -- serve: registered with Atropos's API, groups read back from /batch -------------------------------


@pytest.fixture
def trajectory_api() -> Iterator[str]:
    """Atropos's trajectory API server, with a trainer registered and started (``/register``,
    a first ``/batch``), as ``/register-env`` requires."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "atroposlib.cli.run_api", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: request("GET", url + "/") is not None, 60, "the trajectory API to start")
        registration = {
            "wandb_group": "g", "wandb_project": "p", "batch_size": 4, "max_token_len": 1 << 20,
            "checkpoint_dir": "", "save_checkpoint_interval": -1, "starting_step": 0, "num_steps": 2,
        }  # fmt: skip
        assert "uuid" in request("POST", url + "/register", registration)
        assert request("GET", url + "/batch")["batch"] is None
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def request(method: str, url: str, body: Any = None) -> Any:
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, ConnectionError):
        return None


def wait_for(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_serve_registers_and_sends_groups_to_the_trajectory_api(
    tmp_path: Path, sandbox_root: Path, qwen_tokenizer: Path, trajectory_api: str
) -> None:
    dataset = write_jsonl(tmp_path / "rows.jsonl", [MIXED, SAME])
    batches: list[Any] = []
    with OpenAITestServer(AlternatingPolicy()) as server:
        command = env_command(
            "serve", dataset, qwen_tokenizer, server,
            "--env.rollout_server_url", trajectory_api, "--env.wandb_name", "trajkit-test",
            "--env.total_steps", "1", "--env.ensure_scores_are_not_same", "False", "--env.include_messages", "True",
            "--env.max_num_workers", "2", "--env.trajkit_settings", local_settings(sandbox_root),
        )  # fmt: skip
        environ = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
        env = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=environ,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        try:

            def batch_ready() -> bool:
                answer = request("GET", trajectory_api + "/batch")
                if answer and answer.get("batch"):
                    batches.append(answer["batch"])
                return bool(batches) or env.poll() is not None

            wait_for(batch_ready, 180, "a batch of groups from the environment")
            # after the trainer's step 1 of total_steps 1, the environment fills one more batch and stops
            _, stderr = env.communicate(timeout=180)
        finally:
            if env.poll() is None:
                env.kill()
                env.wait()
    assert batches, f"no batch reached the API; the environment said:\n{stderr[-4000:]}"
    assert env.returncode == 0, stderr[-4000:]
    (batch,) = batches
    assert len(batch) == 2 and sum(len(group["tokens"]) for group in batch) == 4
    ids = set()
    for group in batch:
        assert group["env_id"] == 0, "sent by the registered environment"
        assert len(group["scores"]) == 2
        assert_masked_tokens(group)
        ids.add(group["group_overrides"]["group_id"])
        prompt = group["messages"][0][1]["content"]
        expected = [0.0, 1.0] if prompt == MIXED["prompt"] else [1.0, 1.0]
        assert sorted(group["scores"]) == expected, (
            "scored in each session's sandbox; equal scores kept as asked"
        )
    assert len(ids) == 2
    assert all(p.name.startswith(".") for p in sandbox_root.iterdir()), "a sandbox outlived the environment"


# -- a check scored in the row's sandbox, local and Docker ----------------------------------------


@pytest.mark.parametrize("backend", ["local", "docker"])
def test_a_check_is_scored_in_the_rows_sandbox(
    backend: str, sandbox_root: Path, qwen_tokenizer: Path, tmp_path: Path
) -> None:
    row = dict(MIXED)
    settings: dict[str, Any] = dict(NO_REASONING_FILTER)
    if backend == "docker":
        from tests.test_docker_backend import PYTHON
        from tests.test_docker_run import _docker_client, _why_unavailable

        need_engine("docker", _why_unavailable())
        client = _docker_client()
        row.update(image=PYTHON, cwd="/srv/app", check="grep -q made out.txt")
        settings["sandbox_options"] = {"docker": {"pull": "never"}}
    else:  # the check is a file of the dataset's, copied into the sandbox just before it runs
        (tmp_path / "verify.sh").write_text("test -f out.txt\n")
        row.update(check="sh verify.sh", check_files="verify.sh")
        settings["sandbox_options"] = {"local": {"root": str(sandbox_root)}}
    dataset = write_jsonl(tmp_path / "rows.jsonl", [row])

    async def main(server: OpenAITestServer) -> tuple[Any, str]:
        env = in_process_env(
            server,
            dataset,
            qwen_tokenizer,
            group_size=4,
            trajkit_settings=json.dumps(settings),
            include_messages=True,
        )
        await env.setup()
        try:
            item = await env.get_next_item()
            group, backlog = await env.collect_trajectories(item)
            again, _ = await env.collect_trajectories(item)
            assert again is None, "a group is rolled out once in a process"
            assert backlog == []
            assert env.environment is not None
            return group, env.environment.run_id
        finally:
            await env.teardown()

    with OpenAITestServer(AlternatingPolicy()) as server:
        group, run_id = asyncio.run(main(server))
        assert server.count == 8, "4 sessions of two model calls, none paid twice"
    assert sorted(group["scores"]) == [0.0, 0.0, 1.0, 1.0]
    for messages, score in zip(group["messages"], group["scores"], strict=True):
        command = messages[2]["tool_calls"][0]["function"]["arguments"]["command"]
        assert (command == "echo made > out.txt") == (score == 1.0), "each score is its own sandbox's"
    assert_masked_tokens(group)
    if backend == "docker":
        left = client.containers.list(all=True, filters={"label": f"trajkit.run={run_id}"})
        assert left == [], "a container outlived its rollout"
    else:
        assert all(p.name.startswith(".") for p in sandbox_root.iterdir())


# -- counted once ------------------------------------------------------------------------------------


def test_a_restarted_environment_gives_the_same_ids_and_skips_recorded_groups(
    sandbox_root: Path, qwen_tokenizer: Path, tmp_path: Path
) -> None:
    dataset = write_jsonl(tmp_path / "rows.jsonl", [MIXED, {**MIXED, "prompt": "Make out.txt, please"}])
    record_dir = tmp_path / "rollouts"

    async def one_group(server: OpenAITestServer, record: bool) -> tuple[str, str, Any]:
        env = in_process_env(
            server, dataset, qwen_tokenizer, group_size=2, trajkit_settings=local_settings(sandbox_root),
            record_dir=str(record_dir) if record else None,
        )  # fmt: skip
        await env.setup()
        try:
            item = await env.get_next_item()
            group, _ = await env.collect_trajectories(item)
            return item.group_id, item.row["prompt"], group
        finally:
            await env.teardown()

    with OpenAITestServer(AlternatingPolicy()) as server:
        first, first_prompt, _ = asyncio.run(one_group(server, record=True))
        again, again_prompt, _ = asyncio.run(one_group(server, record=False))
        resumed, resumed_prompt, group = asyncio.run(one_group(server, record=True))
    assert (again, again_prompt) == (first, MIXED["prompt"]), (
        "the same group has the same id in a new process"
    )
    assert resumed_prompt != first_prompt and resumed != first, (
        "a group recorded before is not rolled out again"
    )
    assert group is not None and len(group["tokens"]) == 2
    records = read_jsonl(record_dir / "trajectories.jsonl")
    assert sorted(r["metadata"]["group_id"] for r in records) == sorted([first, first, resumed, resumed])


def test_rows_without_a_check_or_answer_are_refused_with_their_lines(
    qwen_tokenizer: Path, tmp_path: Path
) -> None:
    from trajkit_atropos.config import TrajkitEnvError

    dataset = write_jsonl(tmp_path / "rows.jsonl", [MIXED, {"prompt": "Say something"}])

    async def main(server: OpenAITestServer) -> None:
        env = in_process_env(server, dataset, qwen_tokenizer)
        try:
            await env.setup()
        finally:
            await env.teardown()

    with (
        OpenAITestServer(AlternatingPolicy()) as server,
        pytest.raises(TrajkitEnvError, match=r"rows\.jsonl: .*line 2"),
    ):
        asyncio.run(main(server))
    assert server.count == 0, "nothing paid for before the dataset is checked"
