"""``trajkit export RUN_DIR --format hf --out DIR``: a dataset saved with ``save_to_disk`` and its card.

The run uses the ``balanced`` distribution, so rows are offered different tools and call them with
arguments of different shapes, and its rows carry metadata whose shape differs too (a number, a
string, a nested object, a missing key): the saved dataset must still have one declared schema,
and hand every row back exactly as the ``openai`` export has it.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import datasets
import pytest
import yaml

from tests.helpers import read_jsonl, trajkit, write_jsonl
from trajkit.plugins.export.hf import size_category

datasets.disable_progress_bars()

KEPT = "trajectories.jsonl"
DIFFICULTIES: list[Any] = [3, "hard", {"level": [1, None]}, None]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("hf")
    rows = []
    for i in range(10):
        row: dict[str, Any] = {"prompt": f"Task {i}: tidy up the notes ✓", "source": f"set-{i % 3}"}
        if DIFFICULTIES[i % 4] is not None:
            row["difficulty"] = DIFFICULTIES[i % 4]
        rows.append(row)
    dataset = write_jsonl(tmp / "prompts.jsonl", rows)
    result = trajkit(
        "run", "--dataset_file", str(dataset), "--run_name", "hf", "--output_dir", str(tmp / "data"),
        "--distribution", "balanced", "--disabled_toolsets", "web,vision,browser", "--model", "scripted", "--quiet", "--writer", "sharegpt", "--writer", "openai",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return tmp / "data" / "hf"


def card(path: Path) -> tuple[dict[str, Any], str]:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("---\n")
    header, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(header), body


def test_hf_export_saves_the_openai_rows_with_one_declared_schema(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "dataset"
    result = trajkit("export", str(run_dir), "--format", "hf", "--out", str(out))
    assert result.returncode == 0, result.stderr
    kept = read_jsonl(run_dir / "trajectories.jsonl")
    assert f"{len(kept)} rows" in result.stderr
    assert len({tuple(r["tools_offered"]) for r in kept}) > 1, "rows were offered different tools"

    dataset = datasets.load_from_disk(str(out))
    assert isinstance(dataset, datasets.Dataset)
    assert dataset.num_rows == len(kept)
    assert isinstance(dataset.features["messages"].feature, datasets.Json), "each message its own keys"
    assert isinstance(dataset.features["metadata"], datasets.Json)
    assert isinstance(dataset.features["tools"].feature["function"]["parameters"], datasets.Json)

    openai_rows = read_jsonl(run_dir / "trajectories.openai.jsonl")
    for record, row, written in zip(kept, dataset, openai_rows, strict=True):
        assert row["metadata"] == record["metadata"], "each row's own metadata, no keys of other rows"
        assert row == written, "the openai row, unchanged"
    difficulties = [row["metadata"].get("difficulty", "absent") for row in dataset]
    assert {json.dumps(d) for d in difficulties} >= {
        json.dumps(d) for d in [3, "hard", {"level": [1, None]}, "absent"]
    }
    assert [p.name for p in tmp_path.iterdir()] == ["dataset"], "no temporary directory left"


def test_the_openai_jsonl_of_the_same_run_loads_with_json_columns(run_dir: Path, tmp_path: Path) -> None:
    dataset = datasets.load_dataset(
        "json", data_files=str(run_dir / "trajectories.openai.jsonl"), split="train", cache_dir=str(tmp_path)
    )
    assert isinstance(dataset, datasets.Dataset)
    kept = read_jsonl(run_dir / "trajectories.jsonl")
    for record, row in zip(kept, dataset, strict=True):
        assert row["metadata"] == record["metadata"]
        calls = [c for t in record["conversations"] for c in t["tool_calls"]]
        got = [c["function"] for m in row["messages"] for c in m.get("tool_calls", [])]
        assert [(c["name"], c["arguments"]) for c in got] == [
            (c["name"], json.loads(c["arguments"])) for c in calls
        ]


def test_the_card_has_the_header_the_hub_reads_and_how_the_data_was_made(
    run_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "dataset"
    assert trajkit("export", str(run_dir), "--format", "hf", "--out", str(out)).returncode == 0
    header, body = card(out / "README.md")
    dataset = datasets.load_from_disk(str(out))
    assert header["license"] == "unknown"
    assert header["size_categories"] == ["n<1K"]
    assert "text-generation" in header["task_categories"]
    assert header["dataset_info"]["features"] == dataset.features._to_yaml_list()
    assert header["dataset_info"]["splits"] == [{"name": "train", "num_examples": dataset.num_rows}]
    assert header["configs"] == [
        {"config_name": "default", "data_files": [{"split": "train", "path": "data-*.arrow"}]}
    ]
    statistics = json.loads((run_dir / "statistics.json").read_text())
    assert "- model: scripted" in body
    assert "- toolsets: drawn from the distribution balanced" in body
    assert "- filters: the defaults" in body
    assert f"| kept | {statistics['kept']} |" in body
    assert f"| prompt rows | {statistics['dataset_rows']} |" in body
    assert "License:** not set" in body

    data_files = str(out / header["configs"][0]["data_files"][0]["path"])
    hub_style = datasets.load_dataset(
        "arrow", data_files=data_files, split="train", cache_dir=str(tmp_path / "c")
    )
    assert hub_style.num_rows == dataset.num_rows, "the card's data_files find the saved shards"


def test_an_export_replaces_the_previous_one_whole(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "dataset"
    out.mkdir()
    (out / "stale.txt").write_text("from an earlier export\n")
    result = trajkit("export", str(run_dir), "--format", "hf", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert not (out / "stale.txt").exists()
    assert (out / "README.md").is_file() and (out / "dataset_info.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["dataset"]


def test_hf_export_defaults_to_a_directory_in_the_run_and_refuses_a_file(
    run_dir: Path, tmp_path: Path
) -> None:
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    result = trajkit("export", str(run_dir), "--format", "hf", "--out", str(a_file))
    assert result.returncode == 1
    assert "is not a directory" in result.stderr
    assert a_file.read_text() == "x"
    result = trajkit("export", str(run_dir), "--format", "openai", "--out", str(tmp_path))
    assert result.returncode == 2
    assert "is a directory" in result.stderr

    result = trajkit("export", str(run_dir), "--format", "hf")
    assert result.returncode == 0, result.stderr
    assert datasets.load_from_disk(str(run_dir / "hf_dataset")).num_rows == len(read_jsonl(run_dir / KEPT))
    shutil.rmtree(run_dir / "hf_dataset")


def test_size_categories_follow_the_hub_s_names() -> None:
    assert [size_category(n) for n in (0, 999, 1000, 12_345, 2_000_000)] == [
        "n<1K",
        "n<1K",
        "1K<n<10K",
        "10K<n<100K",
        "1M<n<10M",
    ]


# -- --push_to_hub, against a local stand-in for the Hub (HF_ENDPOINT) ---------------------------


class StandInHub:
    """The few Hub API routes an upload of small files takes: create the repository, validate
    the card's YAML, ask how to upload each file (every one "regular": inline in the commit), and
    commit. Records every request; keeps the committed files by path."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str | None]] = []
        self.files: dict[str, bytes] = {}
        self.repos: list[dict[str, Any]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                hub.requests.append(("GET", self.path, self.headers.get("authorization")))
                self._reply(404, {"error": "not here"})

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hub.requests.append(("POST", self.path, self.headers.get("authorization")))
                if self.path == "/api/repos/create":
                    repo = json.loads(body)
                    hub.repos.append(repo)
                    self._reply(200, {"url": f"{hub.url}/datasets/{repo['organization']}/{repo['name']}"})
                elif self.path == "/api/validate-yaml":
                    self._reply(200, {"warnings": []})
                elif "/preupload/" in self.path:
                    files = json.loads(body)["files"]
                    modes = [
                        {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files
                    ]
                    self._reply(200, {"files": modes})
                elif "/commit/" in self.path:
                    for line in body.decode().splitlines():
                        entry = json.loads(line)
                        if entry["key"] == "file":
                            hub.files[entry["value"]["path"]] = base64.b64decode(entry["value"]["content"])
                    oid = "0" * 40
                    self._reply(200, {"commitUrl": f"{hub.url}/datasets/me/x/commit/{oid}", "commitOid": oid})
                else:
                    self._reply(404, {"error": "not here"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> StandInHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def hub_env(hub: StandInHub, tmp_path: Path, token: str | None) -> dict[str, str]:
    env = {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    if token is not None:
        env["HF_TOKEN"] = token
    return env


def test_push_to_hub_uploads_the_dataset_and_its_card(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "dataset"
    with StandInHub() as hub:
        result = trajkit(
            "export", str(run_dir), "--format", "hf", "--out", str(out), "--push_to_hub", "me/trajectories",
            env=hub_env(hub, tmp_path, "hf_standin_token"),
            subprocess=True,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "pushed to me/trajectories" in result.stderr
    assert hub.repos == [{"name": "trajectories", "organization": "me", "type": "dataset"}]
    assert set(hub.files) == {p.name for p in out.iterdir()}, "the whole directory, card included"
    assert all(hub.files[name] == (out / name).read_bytes() for name in hub.files)
    writes = [(method, path, auth) for method, path, auth in hub.requests if method == "POST"]
    assert all(auth == "Bearer hf_standin_token" for _, _, auth in writes)
    assert any(path == "/api/datasets/me/trajectories/commit/main" for _, path, _ in writes)


def test_push_to_hub_without_a_token_says_so_and_keeps_the_export(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "dataset"
    with StandInHub() as hub:
        result = trajkit(
            "export", str(run_dir), "--format", "hf", "--out", str(out), "--push_to_hub", "me/trajectories",
            env={**hub_env(hub, tmp_path, None), "HF_TOKEN": ""},
            subprocess=True,
        )  # fmt: skip
    assert result.returncode == 1
    assert "no Hugging Face token is configured" in result.stderr
    assert not [r for r in hub.requests if r[0] == "POST"], "nothing sent"
    assert datasets.load_from_disk(str(out)).num_rows > 0


def test_push_to_hub_is_for_the_hf_format_only(run_dir: Path, tmp_path: Path) -> None:
    result = trajkit(
        "export",
        str(run_dir),
        "--format",
        "openai",
        "--out",
        str(tmp_path / "x.jsonl"),
        "--push_to_hub",
        "me/x",
    )
    assert result.returncode == 2
    assert "only --format hf can be pushed" in result.stderr


def test_hf_export_without_datasets_names_the_package(run_dir: Path, tmp_path: Path) -> None:
    fake = tmp_path / "site" / "datasets"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('datasets is not installed here')\n")
    out = tmp_path / "dataset"
    result = trajkit(
        "export",
        str(run_dir),
        "--format",
        "hf",
        "--out",
        str(out),
        env={"PYTHONPATH": str(tmp_path / "site")},
        subprocess=True,
    )
    assert result.returncode == 1
    assert "pip install 'datasets>=5'" in result.stderr
    assert not out.exists()


def test_push_to_hub_to_a_hub_that_cannot_be_reached_says_so_without_a_traceback(
    run_dir: Path, tmp_path: Path
) -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    out = tmp_path / "dataset"
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": "hf_x"}
    result = trajkit(
        "export", str(run_dir), "--format", "hf", "--out", str(out), "--push_to_hub", "me/trajectories", env=env,
        subprocess=True,
    )  # fmt: skip
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert f"the Hub at http://127.0.0.1:{port} could not be reached" in result.stderr
    assert f"the dataset is in {out}" in result.stderr
    assert datasets.load_from_disk(str(out)).num_rows > 0
