"""The Atropos environment under load: rollouts per second and its CPU per step.

``python -m bench.atropos [--concurrency 64,512] [--group-size 8] [--waves 3] [--latency 1.0]
[--tool-calls 3] [--json FILE]``

The environment (``trajkit_atropos.env.TrajkitEnv``) runs in this process and is driven as
Atropos drives it: each group is ``collect_trajectories(get_next_item())`` (``group_size``
sessions of one row, scored by the row's ``check`` in its local sandbox, tokenized through the
Qwen2.5 chat template), with as many groups at once as make ``--concurrency`` sessions in flight,
``--waves`` times over. The policy is the load server (``trajkit.testing.openai_server``) in its
own process with ``--latency`` seconds per answer and ``--tool-calls`` calls of the no-op tool
before it answers. A step is one model turn of a session (the model's reply and the tool calls it
makes); CPU is this process's (all its threads) over the measured span, with the part spent
rendering and tokenizing groups, and how long its threads were runnable but waiting for a CPU
(``/proc/PID/schedstat``); the sandboxes' own processes (the check's shell) are counted apart.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    REPO,
    LoadServer,
    install_noop_plugin,
    machine,
    raise_fd_limit,
    save_json,
    schedstat,
    table,
)

TEMPLATE = REPO / "tests" / "data" / "chat_templates" / "qwen2.5.jinja"


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def measure(work: Path, base_url: str, concurrency: int, group_size: int, waves: int) -> dict[str, Any]:
    from atroposlib.envs.server_handling.server_baseline import APIServerConfig
    from trajkit_atropos.config import TrajkitEnvConfig
    from trajkit_atropos.env import TrajkitEnv

    groups_at_once = max(1, concurrency // group_size)
    groups = groups_at_once * waves
    dataset = work / f"rows-{concurrency}.jsonl"
    dataset.write_text(
        "".join(json.dumps({"prompt": f"task {i}", "check": "true"}) + "\n" for i in range(groups))
    )
    sandboxes = work / f"sandboxes-{concurrency}"
    sandboxes.mkdir()
    settings = {
        "distribution": "noop_only",
        "disabled_filters": ["no_reasoning"],
        "max_turns": 20,
        "sandbox_options": {"local": {"root": str(sandboxes)}},
    }
    config = TrajkitEnvConfig(
        dataset_file=str(dataset), tokenizer_name=str(work / "tokenizer"), use_wandb=False,
        group_size=group_size, concurrency=concurrency, trajkit_settings=json.dumps(settings),
    )  # fmt: skip
    server = APIServerConfig(
        base_url=base_url, model_name="policy", api_key="k", num_max_requests_at_once=concurrency * 2
    )
    env = TrajkitEnv(config, [server])
    await env.setup()
    assert env.renderer is not None
    tokenizing = 0.0
    tokenize = env.renderer.tokenize

    def timed_tokenize(*args: Any) -> Any:
        nonlocal tokenizing
        started = time.thread_time()
        try:
            return tokenize(*args)
        finally:
            tokenizing += time.thread_time() - started

    env.renderer.tokenize = timed_tokenize  # type: ignore[method-assign]
    limit = asyncio.Semaphore(groups_at_once)

    async def one_group() -> bool:
        async with limit:
            item = await env.get_next_item()
            group, _ = await env.collect_trajectories(item)
            return group is not None

    try:
        cpu, children, wall = time.process_time(), children_cpu(), time.monotonic()
        waited = schedstat(os.getpid())[1]
        done = await asyncio.gather(*(one_group() for _ in range(groups)))
        wall = time.monotonic() - wall
        cpu = time.process_time() - cpu
        waited = schedstat(os.getpid())[1] - waited
    finally:
        await env.teardown()
    children = children_cpu() - children
    rollouts = sum(done) * group_size
    return {
        "concurrency": concurrency,
        "groups": groups,
        "groups_ok": sum(done),
        "rollouts": rollouts,
        "wall_s": round(wall, 2),
        "rollouts_per_s": round(rollouts / wall, 2),
        "cpu_s": round(cpu, 2),
        "sandbox_children_cpu_s": round(children, 2),
        "tokenize_ms_per_rollout": round(tokenizing * 1000 / max(1, rollouts), 2),
        "waited_for_cpu_s": round(waited, 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", default="64,512", help="sessions in flight, comma-separated")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--waves", type=int, default=3)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--tool-calls", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--source", type=Path, help="unused; accepted like the other benchmarks")
    args = parser.parse_args(argv)
    raise_fd_limit()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("WANDB_MODE", "disabled")
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-atropos-") as tmp:
        work = Path(tmp)
        os.chmod(work, 0o711)
        sys.path.insert(0, str(install_noop_plugin(work / "site")))
        sys.path.insert(0, str(REPO))
        from tests.helpers import build_tokenizer

        build_tokenizer(
            work / "tokenizer",
            TEMPLATE.read_text(encoding="utf-8"),
            {"eos_token": "<|im_end|>"},
            ["<|im_start|>", "<tool_call>", "</tool_call>"],
        )
        steps_per_rollout = args.tool_calls + 1
        with LoadServer("--latency", str(args.latency), "--tool-calls", str(args.tool_calls), "--tool", "noop",
                        "--arguments", "{}") as server:  # fmt: skip
            for concurrency in [int(c) for c in args.concurrency.split(",")]:
                server.mark()
                row = asyncio.run(measure(work, server.base_url, concurrency, args.group_size, args.waves))
                row["server_cpu_s"] = round(server.cpu_since_mark(), 2)
                steps = row["rollouts"] * steps_per_rollout
                row["cpu_ms_per_step"] = round(row["cpu_s"] * 1000 / max(1, steps), 3)
                row["cpu_ms_per_rollout"] = round(row["cpu_s"] * 1000 / max(1, row["rollouts"]), 2)
                row["ideal_rollouts_per_s"] = round(concurrency / (steps_per_rollout * args.latency), 2)
                row["load_avg_1m"] = round(os.getloadavg()[0], 2)
                results.append(row)
    columns = {
        "concurrency": "in flight", "rollouts": "rollouts", "wall_s": "wall s", "rollouts_per_s": "rollouts/s",
        "ideal_rollouts_per_s": "ideal/s", "cpu_ms_per_step": "CPU ms/step", "cpu_ms_per_rollout": "CPU ms/rollout",
        "tokenize_ms_per_rollout": "of which tokenizing", "waited_for_cpu_s": "waited for a CPU s",
        "sandbox_children_cpu_s": "sandbox CPU s", "server_cpu_s": "server CPU s", "load_avg_1m": "load 1m",
    }  # fmt: skip
    print(table([[row[key] for key in columns] for row in results], list(columns.values())))
    save_json(
        args.json,
        {
            "machine": machine(),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
