"""``trajkit export RUN_DIR --format hf --out DIR``: the kept trajectories as a Hugging Face dataset.

DIR holds what ``datasets.Dataset.save_to_disk`` writes (``datasets.load_from_disk(DIR)`` reads it
back) and a dataset card, ``DIR/README.md``, whose YAML header is what the Hub reads: the features,
the split and its size, the size category, tags, a license placeholder, and the data files. Its
body says how the data was made, from the run's ``run.json`` and ``statistics.json``: the model,
the toolset distribution, the filters, the counts.

The rows are the ``openai`` writer's (messages with tool calls, reasoning and the offered tools),
with their features declared, not inferred: each message and ``metadata`` are ``Json`` (stored as
JSON text, handed back as the object each row had, so a message keeps only its own keys and its
tool-call ``arguments`` objects), ``tools`` a list of schemas whose ``parameters`` are ``Json``. So
the dataset has one schema whatever tools and metadata its rows have. The directory appears whole: it
is built beside the target and renamed into place, replacing an earlier export.

``--push_to_hub REPO`` then uploads the directory, as it is, to the dataset repository REPO
(created if missing) with ``huggingface_hub``, when a token is configured (``HF_TOKEN`` or a stored
login); ``HF_ENDPOINT`` points it at another Hub, which is how the tests reach a local stand-in.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from trajkit.plugins.export.writers import OpenAIWriter
from trajkit.record.filters import Record
from trajkit.record.schema import hf_features
from trajkit.run.rundir import RunDir

DATASETS_MISSING = "the hf export needs the datasets package: pip install 'datasets>=5'"


class HFExportError(Exception):
    """The export could not be made; the message says why."""


def _datasets() -> Any:
    try:
        import datasets
    except ImportError as exc:
        raise HFExportError(f"{DATASETS_MISSING} ({exc})") from None
    if not hasattr(datasets, "Json"):
        raise HFExportError(
            f"{DATASETS_MISSING} (installed: {datasets.__version__}, without the Json feature)"
        )
    return datasets


def features(datasets: Any) -> Any:
    """The declared features of an exported row (an ``openai`` row): its messages and tools, and
    the record fields it carries, typed from the record's definition."""
    string = datasets.Value("string")
    tool = {
        "type": string,
        "function": {"name": string, "description": string, "parameters": datasets.Json()},
    }
    # each message its own object: keys only where they apply, no nulls filled in
    return datasets.Features(
        {"messages": datasets.List(datasets.Json()), "tools": datasets.List(tool), **hf_features(datasets)}
    )


def export_hf(
    records: Iterable[Record],
    run_dir: RunDir,
    target: Path,
    tool_schemas: Mapping[str, Any] | None = None,
    statistics: Mapping[str, Any] | None = None,
) -> int:
    """Save the records as a dataset with its card in ``target``; return the number of rows. The
    card's counts are ``statistics`` (the run's as its ledger stands), else ``statistics.json``'s."""
    datasets = _datasets()
    datasets.disable_progress_bars()
    writer = OpenAIWriter()
    if tool_schemas:
        writer.use_tool_schemas(tool_schemas)
    target = target.absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        rows = (writer.row(record) for record in records)
        dataset = datasets.Dataset.from_generator(
            lambda: rows,
            features=features(datasets),
            cache_dir=str(build / "cache"),  # fresh every time: nothing of another export is reused
            fingerprint=os.urandom(16).hex(),
        )
        out = build / "dataset"
        dataset.save_to_disk(str(out))
        (out / "README.md").write_text(dataset_card(dataset, run_dir, statistics), encoding="utf-8")
        count = int(dataset.num_rows)
        del dataset
        _replace_dir(out, target)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return count


HUB_MISSING = "--push_to_hub needs huggingface_hub: pip install huggingface_hub"


def push_to_hub(folder: Path, repo: str, commit_message: str) -> str:
    """Upload ``folder`` to the dataset repository ``repo``; return the commit's URL."""
    try:
        from huggingface_hub import HfApi, get_token
        from huggingface_hub.errors import HfHubHTTPError
    except ImportError as exc:
        raise HFExportError(f"{HUB_MISSING} ({exc})") from None
    token = get_token()
    if not token:
        raise HFExportError(
            "--push_to_hub: no Hugging Face token is configured (set HF_TOKEN or log in with `hf auth login`); "
            f"the dataset is in {folder}"
        )
    api = HfApi(token=token)
    try:
        api.create_repo(repo, repo_type="dataset", exist_ok=True)
        info = api.upload_folder(
            folder_path=str(folder), repo_id=repo, repo_type="dataset", commit_message=commit_message
        )
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise HFExportError(f"--push_to_hub {repo}: {exc} (the dataset is in {folder})") from None
    except Exception as exc:  # the HTTP layer's own errors (a Hub that cannot be reached...)
        raise HFExportError(
            f"--push_to_hub {repo}: the Hub at {hub_endpoint()} could not be reached or answered "
            f"({type(exc).__name__}: {exc}); nothing was pushed, the dataset is in {folder}"
        ) from None
    return str(info)


def hub_endpoint() -> str:
    from huggingface_hub import constants

    return str(constants.ENDPOINT)


def _replace_dir(new: Path, target: Path) -> None:
    if target.exists() and not target.is_dir():
        raise HFExportError(f"{target} exists and is not a directory")
    old = None
    if target.exists():
        old = target.parent / f".{target.name}.old-{os.getpid()}"
        os.replace(target, old)
    os.replace(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# -- the dataset card -----------------------------------------------------------------------------


def size_category(rows: int) -> str:
    """The Hub's ``size_categories`` value for a number of rows."""
    bounds = [
        (1_000, "n<1K"),
        (10_000, "1K<n<10K"),
        (100_000, "10K<n<100K"),
        (1_000_000, "100K<n<1M"),
        (10_000_000, "1M<n<10M"),
        (100_000_000, "10M<n<100M"),
        (1_000_000_000, "100M<n<1B"),
    ]
    for bound, name in bounds:
        if rows < bound:
            return name
    return "n>1T" if rows >= 10**12 else "1B<n<10B"


def card_header(dataset: Any) -> dict[str, Any]:
    info = dataset.info._to_yaml_dict()
    return {
        "license": "unknown",
        "task_categories": ["text-generation"],
        "tags": ["tool-calling", "agent-trajectories", "function-calling", "trajkit"],
        "size_categories": [size_category(dataset.num_rows)],
        "configs": [
            {
                "config_name": "default",
                "data_files": [{"split": "train", "path": "data-*.arrow"}],
            }
        ],
        "dataset_info": {
            "features": info["features"],
            "splits": [{"name": "train", "num_examples": int(dataset.num_rows)}],
        },
    }


def dataset_card(dataset: Any, run_dir: RunDir, statistics: Mapping[str, Any] | None = None) -> str:
    """README.md: the YAML header the Hub reads, then how the data was generated."""
    header = yaml.safe_dump(card_header(dataset), sort_keys=False, allow_unicode=True)
    manifest = run_dir.run_json("the card omits it") or {}
    if statistics is None:
        statistics = run_dir.statistics() or {}
    config = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
    assert isinstance(config, dict)
    name = manifest.get("run_name") or run_dir.name
    lines = [
        f"---\n{header}---",
        "",
        f"# {name}",
        "",
        "Tool-calling agent trajectories generated with trajkit: each row is one prompt's session,",
        "OpenAI chat messages (`tool_calls` with their `arguments` objects, `reasoning_content`)",
        "plus the tools offered to that prompt (`tools`, a list of schemas) and the row's `metadata`.",
        "",
        "**License:** not set. Choose one before publishing; the terms of the model that wrote",
        "the trajectories and of the prompt dataset apply.",
        "",
        "## How it was generated",
        "",
        f"- trajkit version: {_value(manifest.get('trajkit_version'))}",
        f"- model: {_value(config.get('model'))}",
        f"- toolsets: {_toolsets(config)}",
        f"- filters: {_filters(config)}",
        f"- samples per prompt: {_value(config.get('samples_per_prompt', 1))}",
        f"- max turns: {_value(config.get('max_turns'))}",
        f"- prompt dataset: {_value(config.get('dataset_file'))}",
        "",
        "## Counts",
        "",
        "| | |",
        "|---|---|",
        f"| rows in this dataset | {dataset.num_rows} |",
        *_count_lines(statistics),
    ]
    lines += [
        "",
        "## Loading",
        "",
        "```python",
        "import datasets",
        "",
        'rows = datasets.load_from_disk("PATH")  # or load_dataset("REPO") once pushed',
        "```",
        "",
    ]
    return "\n".join(lines)


def _count_lines(statistics: Mapping[str, Any]) -> list[str]:
    """The card's counts: the run's statistics a reader of the dataset wants."""
    lines = []
    for key, label in (
        ("dataset_rows", "prompt rows"),
        ("done", "sessions done"),
        ("kept", "kept"),
        ("rejected", "rejected by a filter"),
        ("completed", "completed (gave a final answer)"),
        ("partial", "partial"),
        ("api_calls", "model calls"),
        ("invalid_tool_calls", "invalid tool calls"),
        ("cost", "cost"),
    ):
        if key in statistics:
            lines.append(f"| {label} | {_value(statistics[key])} |")
    tokens = statistics.get("tokens")
    if isinstance(tokens, dict):
        lines.append(
            f"| tokens (prompt / completion) | {tokens.get('prompt')} / {tokens.get('completion')} |"
        )
    rejected = statistics.get("rejected_by_filter")
    if isinstance(rejected, dict) and rejected:
        lines += ["", "Rejected by filter: " + ", ".join(f"{k}: {v}" for k, v in sorted(rejected.items()))]
    tools = statistics.get("tools")
    if isinstance(tools, dict) and tools:
        used = {k: v.get("count", 0) for k, v in tools.items() if isinstance(v, dict)}
        lines += ["", "Tool calls: " + ", ".join(f"{k}: {v}" for k, v in sorted(used.items()))]
    return lines


def _filters(config: Mapping[str, Any]) -> str:
    named = config.get("filters") or []
    disabled = config.get("disabled_filters") or []
    text = ", ".join(str(f) for f in named) if named else "the defaults"
    if disabled:
        text += f" (disabled: {', '.join(str(f) for f in disabled)})"
    return text


def _toolsets(config: dict[str, Any]) -> str:
    """The distribution drawn, or the toolsets every prompt was offered (``--toolsets``)."""
    if config.get("toolsets"):
        return f"{', '.join(config['toolsets'])} for every prompt"
    return f"drawn from the distribution {_value(config.get('distribution'))}"


def _value(value: Any) -> str:
    return "unknown" if value is None or value == "" else str(value)
