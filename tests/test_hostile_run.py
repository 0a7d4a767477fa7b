"""A whole run with one hostile session among ordinary ones, on the default settings.

The hostile "model" plants symlinks to a host file, a host directory and the runner's /proc
entries, a FIFO, /dev/zero and a 3 GB sparse file, starts a ``setsid`` daemon and reads every
process's environment; then it points the file tools at all of them. Its neighbours must finish,
the host must be untouched, the key must be in no file of the run directory, the runner must stay
small, no process may be left, and the runner must exit.
"""

from __future__ import annotations

import base64
import json
import os
import random
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import read_jsonl, write_jsonl
from trajkit.manager import load_plugins
from trajkit.plugins.local import bubblewrap
from trajkit.plugins.scripted_model import scripted_reply, split_task
from trajkit.testing.engines import need_engine
from trajkit.testing.openai_server import OpenAITestServer

KEY = f"sk-hostile-test-{uuid.uuid4().hex}"
PEAK_RSS_LIMIT = 1024 * 1024  # KiB: the runner must stay under 1 GB


def hostile_steps(
    host_file: Path, host_dir: Path, marker: str, key_file: Path | None = None
) -> list[tuple[str, dict[str, Any]]]:
    # With the privilege a root runner's sandbox once kept: uncover the host's home, where the
    # key file lies, and send the key out encoded (past the scrubber); make the host's /var
    # writable and change it.
    key = key_file or host_file
    uncover = (
        f"umount /root; umount -l {key.parent}; base64 {key}; base64 < {key}; ls -a {key.parent}; "
        f"umount /var/tmp; mount -o remount,bind,rw /var; echo pwned > /var/tmp/{host_dir.name}-escaped; "
        "grep CapEff /proc/self/status"
    )
    plant = (
        f"ln -s {host_file} host_link; ln -s {host_dir} host_dir; ln -s /proc/self/environ env_link; "
        f"ln -s /proc/$PPID/cmdline cmd_link; ln -s /dev/zero zero; mkfifo fifo; "
        "dd if=/dev/zero of=sparse bs=1 count=0 seek=3221225472 2>/dev/null; "
        f"setsid sleep {marker} </dev/null >/dev/null 2>&1 & "
        "cat /proc/$PPID/environ /proc/$PPID/cmdline /proc/1/environ 2>/dev/null | tr '\\0' ' '; "
        "for p in /proc/[0-9]*; do cat $p/environ $p/cmdline 2>/dev/null | tr '\\0' ' '; done; echo planted"
    )
    return [
        ("terminal", {"command": plant}),
        ("terminal", {"command": uncover}),
        ("write_file", {"path": "host_link", "content": "pwned"}),
        ("read_file", {"path": "host_link"}),
        ("patch", {"path": "host_link", "old_string": "HOST", "new_string": "pwned"}),
        ("write_file", {"path": "host_dir/created.txt", "content": "pwned"}),
        ("write_file", {"path": f"../../../../../../..{host_dir}/created.txt", "content": "pwned"}),
        ("read_file", {"path": "env_link"}),
        ("read_file", {"path": "cmd_link"}),
        ("read_file", {"path": "/proc/self/environ"}),
        ("read_file", {"path": "zero"}),
        ("read_file", {"path": "sparse"}),
        ("patch", {"path": "sparse", "old_string": "a", "new_string": "b"}),
        ("read_file", {"path": "fifo"}),
        ("write_file", {"path": "fifo", "content": "x"}),
        ("search_files", {"pattern": "sk-", "path": "."}),
    ]


def make_policy(steps: list[tuple[str, dict[str, Any]]]) -> Any:
    def policy(body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        prompt, since = split_task(messages)
        if "[hostile]" not in prompt:
            reply = scripted_reply(messages, [t["function"]["name"] for t in body.get("tools") or []])
            reply.pop("role", None)
            return reply
        turn = sum(1 for m in since if m.get("role") == "assistant")
        if turn >= len(steps):
            return {"content": "done", "reasoning": "finished"}
        tool, arguments = steps[turn]
        call = {
            "id": f"call_{turn}",
            "type": "function",
            "function": {"name": tool, "arguments": json.dumps(arguments)},
        }
        return {"content": None, "reasoning": f"step {turn}", "tool_calls": [call]}

    return policy


def host_processes(marker: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if f"sleep {marker}".encode() in cmdline.replace(b"\0", b" "):
            found.append(pid)
    return found


def test_one_hostile_session_among_six_ordinary_ones(tmp_path: Path) -> None:
    need_engine("bwrap", bubblewrap.works())
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    host_file = host_dir / "precious.txt"
    host_file.write_text("HOST CONTENT\n")
    marker = str(random.randint(10**8, 10**9))
    dataset = write_jsonl(
        tmp_path / "prompts.jsonl",
        [{"prompt": "Break out [hostile]"}] + [{"prompt": f"Ordinary task {i}"} for i in range(6)],
    )
    key_file = Path.home() / f".trajkit-hostile-key-{uuid.uuid4().hex}"  # where keys are kept
    key_file.write_text(KEY + "\n")
    steps = hostile_steps(host_file, host_dir, marker, key_file)
    server = OpenAITestServer(make_policy(steps), api_key=KEY, models={"m"})
    server.start()
    argv = [
        sys.executable, "-m", "trajkit", "run",
        "--dataset_file", str(dataset), "--run_name", "hostile", "--output_dir", str(tmp_path / "data"),
        "--model", "m", "--base_url", server.base_url, "--api_key_file", str(key_file),
        "--distribution", "terminal_only", "--max_turns", "20", "--tool_timeout", "20",
    ]  # fmt: skip
    # The run in a child of its own, so that the peak RSS measured is the runner's alone.
    measure = (
        "import resource, subprocess, sys; "
        "done = subprocess.run(sys.argv[1:], stdin=subprocess.DEVNULL, capture_output=True, text=True); "
        "sys.stderr.write(done.stderr); "
        "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env["OPENAI_API_KEY"] = KEY  # in the runner's environment too: it must not reach a command
    try:
        finished = subprocess.run(
            [sys.executable, "-c", measure, *argv], capture_output=True, text=True, env=env, timeout=600
        )
    finally:
        server.stop()
        key_file.unlink()
    escaped = Path(f"/var/tmp/{host_dir.name}-escaped")
    assert not escaped.exists(), "the host's /var/tmp was written"
    returncode, peak_kib = map(int, finished.stdout.split())
    run_dir = tmp_path / "data" / "hostile"

    assert host_file.read_text() == "HOST CONTENT\n"
    assert sorted(p.name for p in host_dir.iterdir()) == ["precious.txt"]
    encoded = base64.b64encode(KEY.encode() + b"\n")[:40]
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), f"the key is in {path}"
            assert encoded not in path.read_bytes(), f"the key is in {path}, encoded"
    assert KEY not in finished.stderr
    assert peak_kib < PEAK_RSS_LIMIT, f"runner peak RSS {peak_kib} KiB"
    assert host_processes(marker) == []
    records = read_jsonl(run_dir / "trajectories.jsonl") + read_jsonl(run_dir / "rejected.jsonl")
    ordinary = [r for r in records if "[hostile]" not in r["conversations"][1]["value"]]
    assert len(ordinary) == 6 and all(r["completed"] for r in ordinary), finished.stderr
    hostile = next(r for r in records if "[hostile]" in r["conversations"][1]["value"])
    tool_turns = [t["value"] for t in hostile["conversations"] if t["from"] == "tool"]
    assert len(tool_turns) == len(steps)
    assert "planted" in tool_turns[0]
    assert "CapEff:\\t0000000000000000" in tool_turns[1]
    assert "HOST CONTENT" not in "".join(tool_turns)
    assert "trajkit-sandboxes" not in json.dumps(hostile)  # no host path of the sandbox in the data
    assert returncode in (0, 1), finished.stderr


@pytest.mark.parametrize("content", ["", "\n"])
def test_an_empty_key_file_is_refused(tmp_path: Path, content: str) -> None:
    from trajkit.config.resolve import resolve

    host = load_plugins(entry_points=False)
    key_file = tmp_path / "key"
    key_file.write_text(content)
    with pytest.raises(ValueError, match=r"openai.*api_key_file .* is empty"):
        resolve(host, {"model": "m", "api_key_file": key_file})
    key_file.write_text(f"  {KEY}\n")
    config = resolve(host, {"model": "m", "api_key_file": key_file})
    assert config.secret_values() == [KEY]
    assert KEY not in json.dumps(config.manifest())


def test_a_secret_that_reaches_a_record_is_scrubbed_and_counted(tmp_path: Path) -> None:
    def leaky(body: dict[str, Any]) -> dict[str, Any]:
        return {"content": f"the key you gave me is {KEY}", "reasoning": f"I saw {KEY}"}

    dataset = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": "What is the key?"}, {"prompt": "Again?"}])
    with OpenAITestServer(leaky, api_key=KEY, models={"m"}) as server:
        argv = [
            sys.executable, "-m", "trajkit", "run",
            "--dataset_file", str(dataset), "--run_name", "leaky", "--output_dir", str(tmp_path / "data"),
            "--model", "m", "--base_url", server.base_url, "--quiet",
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
        finished = subprocess.run(argv, capture_output=True, text=True, env={**env, "OPENAI_API_KEY": KEY})
    assert finished.returncode == 0, finished.stderr
    run_dir = tmp_path / "data" / "leaky"
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), f"the key is in {path}"
    records = read_jsonl(run_dir / "trajectories.jsonl")
    assert [r["conversations"][-1]["value"] for r in records] == ["the key you gave me is [REDACTED]"] * 2
    assert json.loads((run_dir / "statistics.json").read_text())["secrets_scrubbed"] == 2
