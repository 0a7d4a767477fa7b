"""Token counters: the offline estimate, and a real ``tokenizers`` tokenizer built here (no download)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import read_jsonl, trajkit, write_jsonl
from trajkit.compress.counters import EstimateCounter, HFTokenizerCounter, TokenizerError
from trajkit.testing.trajectories import trajkit_record

WORDS = ["hello", "world", "system", "user", "assistant", "tool"]


def build_tokenizer(path: Path, *, chatml: bool) -> Path:
    """A word-level tokenizer saved as tokenizer.json: one token per word or punctuation mark."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocabulary = {"[UNK]": 0, **{word: i + 1 for i, word in enumerate(WORDS)}}
    tokenizer = Tokenizer(models.WordLevel(vocabulary, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    if chatml:
        tokenizer.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    path.parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return path


def test_a_local_tokenizer_counts_tokens_and_the_chatml_overhead(tmp_path: Path) -> None:
    path = build_tokenizer(tmp_path / "chatml" / "tokenizer.json", chatml=True)
    counter = HFTokenizerCounter(HFTokenizerCounter.Settings(source=str(path.parent)))
    assert counter.count_text("hello world, hello") == 4
    assert counter.template == "chatml" and counter.turn_overhead == 3  # <|im_start|> ROLE <|im_end|>
    turns = [{"from": "human", "value": "hello world"}, {"from": "gpt", "value": "hello"}]
    assert counter.count(turns) == 3 + 2 * 3
    assert counter.describe() == f"hf({path.parent}, chatml template)"

    plain = build_tokenizer(tmp_path / "plain.json", chatml=False)
    unknown = HFTokenizerCounter(HFTokenizerCounter.Settings(source=str(plain)))
    assert unknown.template is None and unknown.turn_overhead == 0  # template unknown: not guessed
    given = HFTokenizerCounter(HFTokenizerCounter.Settings(source=str(plain), turn_overhead=7))
    assert given.count(turns) == 3 + 2 * 7


def test_missing_tokenizers_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="does not exist"):
        HFTokenizerCounter(HFTokenizerCounter.Settings(source=str(tmp_path / "nope.json")))
    with pytest.raises(TokenizerError, match=r"holds no tokenizer\.json"):
        HFTokenizerCounter(HFTokenizerCounter.Settings(source=str(tmp_path)))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(TokenizerError, match=r"not a tokenizers tokenizer\.json"):
        HFTokenizerCounter(HFTokenizerCounter.Settings(source=str(tmp_path / "bad.json")))


def test_the_estimate_counts_characters_and_turn_overhead() -> None:
    counter = EstimateCounter(EstimateCounter.Settings(chars_per_token=2.0, turn_overhead=1))
    assert counter.count([{"from": "human", "value": "abcde"}]) == 3 + 1
    calls = [{"id": "c", "name": "terminal", "arguments": '{"command": "ls"}'}]
    assert counter.count([{"from": "gpt", "value": "", "reasoning": "why", "tool_calls": calls}]) > 10


def test_compress_with_a_model_from_the_local_hf_cache_only(tmp_path: Path) -> None:
    """A model id resolves through the cache directory (as a download would have left it), offline."""
    hub = tmp_path / "hub"
    snapshot = hub / "models--acme--tiny" / "snapshots" / "0123abcd"
    build_tokenizer(snapshot / "tokenizer.json", chatml=True)
    (hub / "models--acme--tiny" / "refs").mkdir()
    (hub / "models--acme--tiny" / "refs" / "main").write_text("0123abcd")
    source = write_jsonl(tmp_path / "in.jsonl", [trajkit_record(0, steps=4)])
    env = {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "out.jsonl"
    done = trajkit(
        "compress", str(source), "--out", str(out), "--max_tokens", "100000", "--tokenizer", "acme/tiny",
        "--quiet", env=env, subprocess=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [row] = read_jsonl(out)
    assert row["compression"]["counter"].endswith("chatml template)")
    same = HFTokenizerCounter(HFTokenizerCounter.Settings(source=str(snapshot / "tokenizer.json")))
    assert row["compression"]["tokens_before"] == same.count(row["conversations"])
    assert row["compression"]["under_budget"] and not row["compression"]["compressed"]

    missing = trajkit(
        "compress", str(source), "--out", str(tmp_path / "x.jsonl"), "--max_tokens", "100", "--tokenizer",
        "acme/absent", env=env, subprocess=True,
    )  # fmt: skip
    assert missing.returncode == 2
    assert "'acme/absent' is neither a tokenizer file nor a model with a tokenizer.json" in missing.stderr
    bad = trajkit(
        "compress", str(source), "--out", str(tmp_path / "x.jsonl"), "--max_tokens", "100", "--tokenizer",
        "acme/tiny", "--tokenizer_option", "turn_overhead=-1", env=env, subprocess=True,
    )  # fmt: skip
    assert "token counter 'hf' expects turn_overhead to be" in bad.stderr
