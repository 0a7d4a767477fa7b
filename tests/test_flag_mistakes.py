"""Mistakes in flags and files a user makes: one clear error that names the flag, the entry or the
line, what is wrong and what was probably meant; and install hints that work as printed."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import read_jsonl, trajkit, write_jsonl
from trajkit.manager import PluginError, load_plugins
from trajkit.testing.openai_server import OpenAITestServer
from trajkit.testing.policies import dialect_policy

REPO = Path(__file__).resolve().parent.parent


def run(tmp_path: Path, *extra: str, rows: list[dict[str, Any]] | None = None, name: str = "r") -> Any:
    dataset = write_jsonl(tmp_path / "p.jsonl", rows or [{"prompt": f"task {i}"} for i in range(20)])
    return trajkit(
        "run", "--dataset_file", str(dataset), "--run_name", name, "--output_dir", str(tmp_path), "--quiet",
        *extra,
    )  # fmt: skip


# -- --prefill_messages_file --------------------------------------------------------------------------

WORKED_EXAMPLE = [
    {"role": "user", "content": "PREFILL: how many files are here?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "ex_1",
                "type": "function",
                "function": {"name": "terminal", "arguments": '{"command": "ls"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "ex_1", "content": "a.txt\nb.txt"},
    {"role": "assistant", "content": "Two files."},
]


def test_tool_call_examples_are_prefilled_as_given(tmp_path: Path) -> None:
    prefill = tmp_path / "prefill.json"
    prefill.write_text(json.dumps(WORKED_EXAMPLE))
    with OpenAITestServer(dialect_policy) as server:
        result = run(
            tmp_path, "--model", "m", "--base_url", server.base_url, "--prefill_messages_file", str(prefill),
            "--distribution", "terminal_only", rows=[{"prompt": "count the files"}],
        )  # fmt: skip
        first = server.requests[0].body["messages"]
    assert result.returncode == 0, result.stderr[-2000:]
    assert first[1:5] == WORKED_EXAMPLE and first[5] == {"role": "user", "content": "count the files"}
    assert "PREFILL" not in (tmp_path / "r" / "trajectories.jsonl").read_text()


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda m: m[2].pop("tool_call_id"), "entry 3 (role 'tool'): a tool entry needs the tool_call_id"),
        (lambda m: m[2].update(tool_call_id="ex_9"), "entry 3 (role 'tool'): tool_call_id 'ex_9' answers no open call"),
        (lambda m: m.pop(2), "entry 3 (role 'assistant'): the tool calls ex_1 must be answered by tool entries first"),
        (lambda m: m[1].update(role="robot"), "entry 2 (role 'robot'): role:"),
        (lambda m: m[0].pop("content"), "entry 1 (role 'user'): content is missing"),
        (lambda m: m[1]["tool_calls"][0]["function"].update(arguments={"command": "ls"}), "entry 2 (role 'assistant'): tool_calls.0.function.arguments"),
        (lambda m: m.__delitem__(slice(2, 4)), "the tool calls ex_1 are never answered"),
    ],
)  # fmt: skip
def test_a_wrong_prefill_entry_is_named(tmp_path: Path, change: Any, expected: str) -> None:
    messages = json.loads(json.dumps(WORKED_EXAMPLE))
    change(messages)
    prefill = tmp_path / "prefill.json"
    prefill.write_text(json.dumps(messages))
    result = run(tmp_path, "--prefill_messages_file", str(prefill))
    assert result.returncode == 2
    assert "--prefill_messages_file" in result.stderr and f"{prefill}: {expected}" in result.stderr
    assert not (tmp_path / "r").exists()


def test_prefill_messages_of_a_configuration_file_are_checked_too(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps({"prefill_messages": [{"role": "tool", "content": "x"}]}))
    result = run(tmp_path, "--config", str(config))
    assert result.returncode == 2
    assert "prefill_messages" in result.stderr and "entry 1 (role 'tool')" in result.stderr


# -- names that are not installed, or misspelt ----------------------------------------------------------


def test_an_unknown_sandbox_is_one_flag_error_with_a_suggestion(tmp_path: Path) -> None:
    result = run(tmp_path, "--sandbox", "lcoal")
    assert result.returncode == 2
    assert "--sandbox lcoal: unknown sandbox backend 'lcoal'" in result.stderr
    assert "did you mean 'local'?" in result.stderr
    assert "p.jsonl:" not in result.stderr, "one error, not one per row"
    assert not (tmp_path / "r").exists()
    image = run(tmp_path, "--image_backend", "dokcer")
    assert image.returncode == 2 and "--image_backend dokcer" in image.stderr
    assert "did you mean 'docker'?" in image.stderr and "p.jsonl:" not in image.stderr


def test_a_misspelt_plugin_setting_gets_a_suggestion(tmp_path: Path) -> None:
    result = run(tmp_path, "--sandbox_option", "local.isolaton=none")
    assert result.returncode == 2
    assert "has no setting 'isolaton'" in result.stderr and "did you mean 'isolation'?" in result.stderr


def test_a_prompt_field_no_row_has_is_one_error_with_a_suggestion(tmp_path: Path) -> None:
    rows = [{"question": f"q {i}", "answer": "a"} for i in range(20)]
    result = run(tmp_path, "--prompt_field", "questoin", rows=rows)
    assert result.returncode == 2
    assert "--prompt_field questoin: no row of" in result.stderr
    assert "did you mean 'question'?" in result.stderr and "answer, question" in result.stderr
    assert "p.jsonl:" not in result.stderr, "one error, not one per row"
    default = run(tmp_path, rows=rows)
    assert default.returncode == 2 and "no row of" in default.stderr and "--prompt_field" in default.stderr
    # a field that some rows have is still a row error for the others
    mixed = run(tmp_path, "--prompt_field", "question", rows=[*rows[:19], {"answer": "a"}])
    assert mixed.returncode == 1 and "p.jsonl:20: missing required field 'question'" in mixed.stderr


def test_a_hub_dataset_outside_the_cache_names_the_hf_command(tmp_path: Path) -> None:
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    dataset = "hf://nobody/nothing"
    result = trajkit(
        "run", "--dataset_file", dataset, "--run_name", "r", "--output_dir", str(tmp_path), env=env,
        subprocess=True,
    )  # fmt: skip
    assert result.returncode == 2
    assert "hf download --repo-type dataset nobody/nothing" in result.stderr
    assert "huggingface-cli" not in result.stderr
    assert "hf://nobody/nothing" in result.stderr and "hf:/nobody" not in result.stderr.replace("hf://", "")


# -- install hints ------------------------------------------------------------------------------------


def package_dir(command: str) -> Path:
    """The directory a hint's ``pip install ./DIR`` names, from the repository's root."""
    target = command.split("pip install ", 1)[1].split()[0]
    assert target.startswith("./"), command
    return REPO / target


def test_the_ray_hint_installs_from_this_repository(tmp_path: Path) -> None:
    result = trajkit(
        "run", "--dataset_file", str(write_jsonl(tmp_path / "p.jsonl", [{"prompt": "x"}])),
        "--run_name", "r", "--output_dir", str(tmp_path), "--executor", "ray",
        env={"TRAJKIT_DISABLE_PLUGINS": "ray"},
    )  # fmt: skip
    assert result.returncode == 2
    assert "executor 'ray' is not installed" in result.stderr
    assert "pip install trajkit-ray" not in result.stderr
    directory = package_dir(result.stderr)
    project = tomllib.loads((directory / "pyproject.toml").read_text())["project"]
    assert project["name"] == "trajkit-ray"
    assert "from the root of the trajkit repository" in result.stderr


@pytest.mark.parametrize("name", ["docker", "modal", "singularity"])
def test_backend_hints_install_from_this_repository(name: str) -> None:
    host = load_plugins(entry_points=False)
    with pytest.raises(PluginError) as missing:
        host.backend(name)
    project = tomllib.loads((package_dir(str(missing.value)) / "pyproject.toml").read_text())["project"]
    assert project["name"] == f"trajkit-{name}"


def test_the_image_backend_hint_names_image_backends_only() -> None:
    host = load_plugins(entry_points=False)
    with pytest.raises(PluginError) as missing:
        host.image_backend()
    message = str(missing.value)
    assert all(name in message for name in ("docker", "modal", "singularity"))
    assert "ray" not in message


# -- an agent that never calls a tool --------------------------------------------------------------------


def answer_without_tools(body: dict[str, Any]) -> dict[str, Any]:
    prompt = body["messages"][-1]["content"]
    if "[no tools]" in prompt:
        return {"content": "I would run ls, but here is a guess.", "reasoning": "No need for tools."}
    return dialect_policy(body)


def test_no_tool_calls_is_a_filter_off_by_default_and_counted_either_way(tmp_path: Path) -> None:
    rows = [{"prompt": "task 0"}, {"prompt": "task 1 [no tools]"}, {"prompt": "task 2"}]
    with OpenAITestServer(answer_without_tools) as server:
        default = run(
            tmp_path,
            "--model",
            "m",
            "--base_url",
            server.base_url,
            "--distribution",
            "terminal_only",
            rows=rows,
        )
        assert default.returncode == 0, default.stderr[-2000:]
        statistics = json.loads((tmp_path / "r" / "statistics.json").read_text())
        assert (statistics["kept"], statistics["without_tool_calls"]) == (3, 1)
        enabled = run(
            tmp_path, "--model", "m", "--base_url", server.base_url, "--distribution", "terminal_only",
            "--filter", "no_tool_calls", rows=rows, name="filtered",
        )  # fmt: skip
    assert enabled.returncode == 0, enabled.stderr[-2000:]
    statistics = json.loads((tmp_path / "filtered" / "statistics.json").read_text())
    assert (statistics["kept"], statistics["without_tool_calls"]) == (2, 1)
    assert statistics["rejected_by_filter"] == {"no_tool_calls": 1}
    [rejected] = read_jsonl(tmp_path / "filtered" / "rejected.jsonl")
    assert rejected["prompt_index"] == 1 and rejected["reason"].startswith("no_tool_calls: ")
