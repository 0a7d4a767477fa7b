"""The agent as an RL environment: rollouts against the test model server, scored in their
sandbox (local and Docker), and the step interface driven by a loop that plays the model."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from trajkit.environment import Environment, Policy
from trajkit.testing.engines import need_engine
from trajkit.testing.openai_replies import Fault
from trajkit.testing.openai_server import OpenAITestServer, tool_script_policy

WRITE = tool_script_policy(calls=1, arguments={"command": "echo made > out.txt"}, final="made it")
PASSES = {"prompt": "Make out.txt", "check": "test -f out.txt", "source": "unit"}
FAILS = {"prompt": "Make other.txt", "check": "test -f other.txt"}


def sandboxes_in(root: Path) -> list[Path]:
    """The sandboxes under a local backend's root (its own bookkeeping files start with a dot)."""
    return [path for path in root.iterdir() if not path.name.startswith(".")]


def local_env(root: Path, **settings: Any) -> Environment:
    return Environment(
        toolsets=["terminal"], sandbox="local", sandbox_options={"local": {"root": str(root)}}, **settings
    )


def test_rollouts_are_scored_in_their_sandbox_which_then_closes(sandbox_root: Path) -> None:
    root = sandbox_root / "sandboxes"

    async def main(server: OpenAITestServer) -> tuple[list[Any], list[Any], list[Any]]:
        policy = Policy(base_url=server.base_url, model="policy", api_key="k")
        async with local_env(root, concurrency=2) as env:
            passing, failing = await asyncio.gather(
                env.rollout(PASSES, policy, samples=3), env.rollout(FAILS, policy, samples=2)
            )
            plain = await env.rollout({"prompt": "no check"}, policy)
        return passing, failing, plain

    with OpenAITestServer(WRITE) as server:
        passing, failing, plain = asyncio.run(main(server))
        assert server.max_in_flight <= 2, "more sessions at once than the environment's limit"
    assert [r.sample for r in passing] == [0, 1, 2]
    for rollout in passing:
        assert rollout.error is None and rollout.result.completed
        assert rollout.score.passed and rollout.score.value == 1.0
        assert rollout.score.checks[0]["detail"].startswith("exit 0")
        assert rollout.row["source"] == "unit"
        assert [t["function"]["name"] for t in rollout.tools] == ["terminal", "process"]
        assert rollout.messages[-1] == {
            "role": "assistant",
            "content": "made it",
            "reasoning": None,
        }
    assert [(r.score.passed, r.score.value) for r in failing] == [(False, 0.0)] * 2
    assert plain[0].score is None and plain[0].result.final_response == "made it"
    assert sandboxes_in(root) == [], "a sandbox outlived its rollout"


def test_a_failing_session_is_an_error_of_its_rollout_alone(sandbox_root: Path) -> None:
    tmp_path = sandbox_root

    def broken(number: int, body: dict[str, Any]) -> Fault | None:
        return Fault(status=400, message="bad request") if "broken" in json.dumps(body["messages"]) else None

    async def main(server: OpenAITestServer) -> tuple[list[Any], list[Any]]:
        policy = Policy(base_url=server.base_url, model="policy")
        async with local_env(tmp_path / "root", max_retries=0) as env:
            return await asyncio.gather(
                env.rollout({"prompt": "broken", "check": "true"}, policy, samples=2),
                env.rollout(PASSES, policy, samples=2),
            )

    with OpenAITestServer(WRITE, faults=broken) as server:
        broken, fine = asyncio.run(main(server))
    assert all(r.error and r.score is None and r.result is None for r in broken), broken
    assert all(r.error is None and r.score.passed for r in fine)
    assert sandboxes_in(tmp_path / "root") == []


def test_the_step_interface_runs_the_tools_of_a_model_the_test_plays(sandbox_root: Path) -> None:
    root = sandbox_root / "sandboxes"

    async def main() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        env = local_env(root, max_turns=4, system_prompt="Be brief.")
        async with env, env.stepper() as episode:
            messages, tools = await episode.reset(PASSES)
            seen["opening"], seen["tools"] = messages, [t["function"]["name"] for t in tools]
            call = {"id": "c1", "type": "function", "function": {"name": "terminal", "arguments": ""}}
            call["function"]["arguments"] = json.dumps({"command": "echo stepped > out.txt; ls"})
            seen["first"] = await episode.step({"role": "assistant", "content": None, "tool_calls": [call]})
            seen["early"] = await episode.score()  # the sandbox as it is now: out.txt made
            seen["last"] = await episode.step({"role": "assistant", "content": "done"})
            seen["again"] = await episode.step({"role": "assistant", "content": "more"})
            seen["score"] = await episode.score()
            seen["sandboxes"] = sandboxes_in(root)
            # a second episode on the same stepper: the first sandbox is closed by reset
            await episode.reset(FAILS)
            seen["second"] = await episode.score()
            seen["sandboxes_then"] = sandboxes_in(root)
        return seen

    seen = asyncio.run(main())
    assert seen["opening"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Make out.txt"},
    ]
    assert seen["tools"] == ["terminal", "process"]
    tool_messages, done = seen["first"]
    assert not done and len(tool_messages) == 1 and tool_messages[0]["tool_call_id"] == "c1"
    assert "out.txt" in json.loads(tool_messages[0]["content"])["output"]
    assert seen["early"].passed
    assert seen["last"] == ([], True) and seen["again"] == ([], True)
    assert seen["score"].passed and seen["score"].value == 1.0
    assert len(seen["sandboxes"]) == 1 and len(seen["sandboxes_then"]) == 1
    assert seen["sandboxes"] != seen["sandboxes_then"]
    assert seen["second"].passed is False
    assert sandboxes_in(root) == [], "close() leaves no sandbox"


def test_max_turns_ends_a_stepped_session(sandbox_root: Path) -> None:
    tmp_path = sandbox_root

    async def main() -> list[tuple[list[Any], bool]]:
        async with local_env(tmp_path / "root", max_turns=2) as env:
            episode = env.stepper()
            try:
                await episode.reset({"prompt": "loop"})
                call = {"id": "x", "type": "function", "function": {"name": "terminal", "arguments": "{}"}}
                reply = {"role": "assistant", "content": None, "tool_calls": [call]}
                return [await episode.step(reply), await episode.step(reply)]
            finally:
                await episode.close()

    first, second = asyncio.run(main())
    assert first[1] is False and first[0][0]["tool_call_id"] == "x"
    assert second == ([], True)
    assert sandboxes_in(tmp_path / "root") == []


@pytest.fixture(scope="module")
def docker_client() -> Any:
    from tests.test_docker_run import _docker_client, _why_unavailable

    need_engine("docker", _why_unavailable())
    return _docker_client()


def test_rollouts_in_docker_are_scored_and_leave_no_container(docker_client: Any) -> None:
    from tests.test_docker_backend import PYTHON

    async def main(server: OpenAITestServer) -> tuple[str, list[Any], list[Any]]:
        policy = Policy(base_url=server.base_url, model="policy")
        settings = {"docker": {"pull": "never"}}
        async with Environment(toolsets=["terminal"], sandbox="docker", sandbox_options=settings) as env:
            row = {**PASSES, "image": PYTHON, "cwd": "/srv/app", "check": "grep -q made out.txt"}
            missing = {**PASSES, "image": "trajkit-test/absent:none"}
            found, absent = await asyncio.gather(
                env.rollout(row, policy, samples=2), env.rollout(missing, policy)
            )
            return env.run_id, found, absent

    with OpenAITestServer(WRITE) as server:
        run_id, found, absent = asyncio.run(main(server))
    assert [(r.error, r.score.passed) for r in found] == [(None, True)] * 2, [r.score for r in found]
    assert absent[0].error and absent[0].score is None
    left = docker_client.containers.list(all=True, filters={"label": f"trajkit.run={run_id}"})
    assert left == [], "a container outlived its rollout"
