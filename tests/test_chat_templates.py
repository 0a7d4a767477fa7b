"""``trajkit export --chat_template``: a real run's rows through 18 real chat templates.

A run against the OpenAI-compatible test server, with the ``balanced`` distribution (tools differ
from row to row), parallel tool calls, reasoning on every turn, text beside calls in some rows and
unicode in the prompts and arguments, is exported through every template in
``tests/data/chat_templates/`` (``README.md`` there says where each came from). Each template is
given as a model directory: a tokenizer built here (byte-level, no download) and saved by
transformers with the template and the model's special tokens. For every template the rows it
renders must be what transformers' own ``apply_chat_template`` renders from the exported
messages, and the rows left out must be exactly those the template cannot express, each with its
reason. TRL's own dataset preparation then tokenizes the Qwen2.5, Llama 3.1 and Mistral exports.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import build_tokenizer, read_jsonl, trajkit, write_jsonl
from tests.test_writers import ShapesPolicy
from trajkit.plugins.scripted_model import split_task
from trajkit.testing.openai_server import OpenAITestServer

transformers = pytest.importorskip("transformers")

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
UNICODE = "Tâche: ranger le dépôt ✓ — 日本語のメモ 🚀"
LLAMA = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
CHATML = {"eos_token": "<|im_end|>"}
MISTRAL = {"bos_token": "<s>", "eos_token": "</s>"}
DEEPSEEK = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}


@dataclass(frozen=True)
class Row:
    """What a row holds that a template may be unable to express."""

    parallel: bool
    text_beside_calls: bool


def every_row(row: Row) -> str | None:
    return None


def one_call_a_turn_and_no_text_beside_calls(row: Row) -> str | None:
    if row.parallel:
        return "parallel_tool_calls"
    return "content_with_tool_calls" if row.text_beside_calls else None


def no_text_beside_calls(row: Row) -> str | None:
    return "content_with_tool_calls" if row.text_beside_calls else None


def gpt_oss(row: Row) -> str | None:
    if row.parallel:
        return "parallel_tool_calls"
    return "content_with_reasoning" if row.text_beside_calls else None  # every turn has reasoning


def always(reason: str) -> Callable[[Row], str | None]:
    return lambda row: reason  # a template that loses part of every tool-calling row


# name -> (the model's special tokens, which rows it cannot express and why, adaptations on every row)
CASES: dict[str, tuple[dict[str, str], Callable[[Row], str | None], set[str]]] = {
    "qwen2.5": (CHATML, every_row, set()),
    "qwen3": (CHATML, every_row, set()),
    "qwq": (CHATML, every_row, set()),
    "vllm-qwen3coder": (CHATML, every_row, set()),
    "vllm-internlm2": ({"bos_token": "<s>", "eos_token": "</s>"}, every_row, {"arguments_as_json_strings"}),
    "functionary-v3.2": (LLAMA, every_row, {"arguments_as_json_strings"}),
    "firefunction-v2": (LLAMA, every_row, {"arguments_as_json_strings", "tools_as_functions"}),
    "hermes-2-pro": ({**LLAMA, "eos_token": "<|im_end|>"}, no_text_beside_calls, set()),
    "hermes-3": ({**LLAMA, "eos_token": "<|im_end|>"}, no_text_beside_calls, set()),
    "mistral-small-3.2": (MISTRAL, no_text_beside_calls, {"tool_call_ids_mapped"}),
    "llama3.1": (LLAMA, one_call_a_turn_and_no_text_beside_calls, set()),
    "llama3.2": (LLAMA, one_call_a_turn_and_no_text_beside_calls, set()),
    "gpt-oss": (
        {"bos_token": "<|startoftext|>", "eos_token": "<|return|>"},
        gpt_oss,
        {"reasoning_as_thinking"},
    ),
    # templates that lose part of every tool-calling row
    "granite-3.3": ({"eos_token": "<|end_of_text|>"}, always("tool_calls_dropped"), set()),
    "kimi-k2": ({"eos_token": "<|im_end|>"}, always("tool_calls_dropped"), set()),
    "deepseek-v3.1": (DEEPSEEK, always("tool_list_missing"), set()),
    "deepseek-r1-distill": (DEEPSEEK, always("tool_list_missing"), set()),
    "mistral-nemo": (MISTRAL, always("system_prompt_missing"), set()),
}
NO_SPANS = {
    # drops the reasoning of earlier turns once a final answer follows: a calling turn is not
    # rendered as the model generated it
    "gpt-oss",
    # appends the assistant header after every conversation, generation prompt or not
    "firefunction-v2",
}
"""Templates whose rendered rows hold no span of the text each assistant turn was generated as."""
TEMPLATE_VARS = ["--template_var", "datetime=2024-07-26", "--template_var", "date_string=26 Jul 2024"]


# -- the run, the tokenizers, the exports -------------------------------------------------------


def policy_for(shapes: ShapesPolicy) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """ShapesPolicy (parallel calls, nested and unicode arguments, reasoning on every turn); rows
    marked ``[single]`` make one call a turn, rows marked ``[quiet]`` write no text beside calls."""

    def policy(body: dict[str, Any]) -> dict[str, Any]:
        reply = shapes(body)
        prompt, _ = split_task(body["messages"])
        if "[single]" in prompt and reply.get("tool_calls"):
            reply["tool_calls"] = reply["tool_calls"][:1]
        if "[quiet]" in prompt and reply.get("tool_calls"):
            reply["content"] = None
        return reply

    return policy


@dataclass
class Export:
    rows: list[dict[str, Any]]
    left_out: list[dict[str, Any]]
    report: dict[str, Any]


@dataclass
class Exported:
    kept: list[dict[str, Any]]
    run_dir: Path
    models: dict[str, Path]
    messages: dict[str, Export]
    text: dict[str, Export]


def _exports(out: Path) -> dict[str, Export]:
    reports = json.loads((out / "chat_templates.report.json").read_text())
    return {
        r["template"]: Export(read_jsonl(Path(r["output"])), read_jsonl(Path(r["left_out_file"])), r)
        for r in reports
    }


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    tmp = tmp_path_factory.mktemp("templates")
    rows = [
        {
            "prompt": f"{UNICODE} #{i} [shapes]{' [single]' if i % 3 == 0 else ''}{' [quiet]' if i % 2 == 0 else ''}",
            "source": "unicode-set" if i % 2 else "plain-set",
            "difficulty": i % 4,
        }
        for i in range(12)
    ]
    dataset = write_jsonl(tmp / "prompts.jsonl", rows)
    with OpenAITestServer(policy_for(ShapesPolicy()), models={"test-model"}) as server:
        result = trajkit(
            "run", "--dataset_file", str(dataset), "--run_name", "t", "--output_dir", str(tmp / "data"),
            "--distribution", "balanced", "--disabled_toolsets", "web,vision,browser", "--num_workers", "6", "--quiet",
            "--model", "test-model", "--base_url", server.base_url,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    run_dir = tmp / "data" / "t"
    kept = read_jsonl(run_dir / "trajectories.jsonl")
    assert len(kept) == len(rows), (run_dir / "rejected.jsonl").read_text()
    models = {}
    for name, (special, _, _) in CASES.items():
        models[name] = tmp / "models" / name
        build_tokenizer(models[name], (TEMPLATES / f"{name}.jinja").read_text(encoding="utf-8"), special)
    chosen = [flag for path in models.values() for flag in ("--chat_template", str(path))]
    for out_format in ("messages", "text"):
        result = trajkit(
            "export", str(run_dir), *chosen, *TEMPLATE_VARS, "--out_format", out_format,
            "--out", str(tmp / out_format), timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert "left out" in result.stderr and "qwen2.5" in result.stderr, "the report table"
    return Exported(kept, run_dir, models, _exports(tmp / "messages"), _exports(tmp / "text"))


def features(record: dict[str, Any]) -> Row:
    calling = [t for t in record["conversations"] if t["from"] == "gpt" and t["tool_calls"]]
    return Row(
        parallel=any(len(t["tool_calls"]) > 1 for t in calling),
        text_beside_calls=any(t["value"].strip() for t in calling),
    )


def test_the_run_has_what_the_templates_must_survive(exported: Exported) -> None:
    calls_per_turn = [
        len(t["tool_calls"]) for r in exported.kept for t in r["conversations"] if t["from"] == "gpt"
    ]
    assert max(calls_per_turn) >= 2, "parallel tool calls"
    assert len({tuple(r["tools_offered"]) for r in exported.kept}) > 1, "tools differ per row"
    assert all(t["reasoning"] for r in exported.kept for t in r["conversations"] if t["from"] == "gpt")
    assert any(
        "é ✓" in c["arguments"] for r in exported.kept for t in r["conversations"] for c in t["tool_calls"]
    )
    shapes = {features(r) for r in exported.kept}
    assert shapes == {Row(p, t) for p in (False, True) for t in (False, True)}, "every combination"


# -- every template -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", CASES)
def test_rows_left_out_are_exactly_those_the_template_cannot_express(exported: Exported, name: str) -> None:
    _, cannot, adaptations = CASES[name]
    for export in (exported.messages[name], exported.text[name]):
        expected = {r["prompt_index"]: cannot(features(r)) for r in exported.kept}
        got = {entry["prompt_index"]: entry["reason"] for entry in export.left_out}
        if name in NO_SPANS and export is exported.text[name]:
            expected = {i: reason or "assistant_spans" for i, reason in expected.items()}
        assert got == {i: reason for i, reason in expected.items() if reason}, name
        assert all(entry["detail"] for entry in export.left_out)
        rendered = [r["prompt_index"] for r in export.rows]
        assert rendered == [i for i, reason in expected.items() if not reason], "dataset order, nothing twice"
        report = export.report
        assert (report["rows"], report["rendered"]) == (len(exported.kept), len(rendered))
        assert sum(report["left_out"].values()) == len(got)
        for row in export.rows:
            assert set(row["chat_template_adaptations"]) == adaptations
        assert report["adapted"] == {kind: len(rendered) for kind in adaptations if rendered}


RENDERING = [
    n
    for n in CASES
    if n not in {"granite-3.3", "kimi-k2", "deepseek-v3.1", "deepseek-r1-distill", "mistral-nemo"}
]


@pytest.mark.parametrize("name", RENDERING)
def test_the_text_is_what_transformers_renders_from_the_exported_messages(
    exported: Exported, name: str
) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(exported.models[name]))
    messages = exported.messages[name].rows
    texts = {r["prompt_index"]: r for r in exported.text[name].rows}
    assert messages, f"{name} renders rows of this run"
    assert len(texts) == (0 if name in NO_SPANS else len(messages))
    by_index = {r["prompt_index"]: r for r in exported.kept}
    for row in messages:
        text = tokenizer.apply_chat_template(
            row["messages"], tools=row["tools"], tokenize=False, **row.get("chat_template_kwargs", {})
        )
        assert UNICODE in text, "unicode as written, not escaped"
        record = by_index[row["prompt_index"]]
        for turn in record["conversations"]:
            for call in turn["tool_calls"]:
                arguments = json.loads(call["arguments"])
                if name != "vllm-qwen3coder":  # it writes one tag per parameter, not JSON
                    assert json.dumps(arguments, ensure_ascii=False) in text
                assert json.dumps(json.dumps(arguments, ensure_ascii=False), ensure_ascii=False) not in text
        if name in NO_SPANS:
            continue
        text_row = texts[row["prompt_index"]]
        assert text == text_row["text"], name
        spans = text_row["assistant_spans"]
        inside = "".join(text[start:end] for start, end in spans)
        for turn in record["conversations"]:
            if turn["from"] == "human":
                assert turn["value"].strip() not in inside, "a user turn is not trained on"
            if turn["from"] == "gpt" and turn["value"].strip() and not turn["tool_calls"]:
                assert turn["value"].strip() in inside, "the final answer is in a span"
        assert all(0 <= start < end <= len(text) for start, end in spans)
        assert spans == sorted(spans)
        assert len(spans) == sum(1 for m in row["messages"] if m["role"] == "assistant")


def test_the_report_names_what_each_template_needs(exported: Exported) -> None:
    reports = {name: export.report for name, export in exported.messages.items()}
    assert reports["mistral-small-3.2"]["profile"]["call_ids"] == "alnum9"
    assert reports["deepseek-v3.1"]["profile"]["arguments"] == "string"
    assert reports["firefunction-v2"]["profile"]["tools_variable"] == "functions"
    assert reports["gpt-oss"]["profile"]["reasoning_field"] == "thinking"
    assert reports["gpt-oss"]["reasoning_turns_not_rendered"] > 0, "it drops earlier turns' reasoning"
    assert reports["qwen3"]["reasoning_turns_not_rendered"] == 0
    assert set(reports["llama3.1"]["cannot_express"]) == {"parallel_tool_calls", "content_with_tool_calls"}
    assert not reports["granite-3.3"]["fits_a_tool_calling_sample"]
    assert all(r["transformers"] == transformers.__version__ for r in reports.values())
    ids = [
        c["id"]
        for r in exported.messages["mistral-small-3.2"].rows
        for m in r["messages"]
        for c in m.get("tool_calls", [])
    ]
    assert ids and all(len(i) == 9 and i.isalnum() for i in ids)
    for row in exported.messages["firefunction-v2"].rows:
        listed = json.loads(row["chat_template_kwargs"]["functions"])
        assert [f["name"] for f in listed] == [t["function"]["name"] for t in row["tools"]]
        assert row["chat_template_kwargs"]["datetime"] == "2024-07-26"


# -- TRL's own dataset preparation --------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "split"), [("qwen2.5", False), ("llama3.1", True), ("mistral-small-3.2", False)]
)
def test_trl_prepares_the_exported_rows(exported: Exported, name: str, split: bool, tmp_path: Path) -> None:
    """SFTTrainer (a one-layer model built here, no training) tokenizes the exported messages into
    exactly the text the export checked; Llama 3.1's rows with parallel calls split."""
    import datasets
    import trl

    outputs = {
        "messages": Path(exported.messages[name].report["output"]),
        "text": Path(exported.text[name].report["output"]),
    }
    if split:  # an export of its own
        for out_format in outputs:
            outputs[out_format] = tmp_path / f"{out_format}.jsonl"
            result = trajkit(
                "export", str(exported.run_dir), "--chat_template", str(exported.models[name]), *TEMPLATE_VARS,
                "--out_format", out_format, "--out", str(outputs[out_format]), "--split_parallel_calls",
            )  # fmt: skip
            assert result.returncode == 0, result.stderr
    texts = read_jsonl(outputs["text"])
    assert len(texts) >= 6, "enough rows to prepare"
    if split:
        assert any("parallel_calls_split" in r["chat_template_adaptations"] for r in texts)
    rows = datasets.load_dataset(
        "json", data_files=str(outputs["messages"]), split="train", cache_dir=str(tmp_path / "cache")
    )
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(exported.models[name]))
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1 << 16,
    )  # fmt: skip
    trainer = trl.SFTTrainer(
        model=transformers.LlamaForCausalLM(config),
        args=trl.SFTConfig(
            output_dir=str(tmp_path / "trl"), report_to=[], max_length=None, use_cpu=True, bf16=False
        ),
        train_dataset=rows,
        processing_class=tokenizer,
    )
    prepared = trainer.train_dataset
    assert prepared.num_rows == len(texts)
    for example, text_row in zip(prepared, texts, strict=True):
        assert tokenizer.decode(example["input_ids"]) == text_row["text"]
