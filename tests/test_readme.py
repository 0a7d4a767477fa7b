"""The manual's commands and configuration files stay valid as the settings move into plugins."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from trajkit.cli import run_params
from trajkit.config.resolve import resolve
from trajkit.manager import load_plugins

DOCS = Path(__file__).resolve().parent.parent / "docs"


def page(name: str) -> str:
    return (DOCS / name).read_text()


def test_the_manual_s_configuration_file_is_valid() -> None:
    block = re.search(r"```toml\n(dataset_file = .*?)```", page("configuration.md"), re.S)
    assert block is not None
    data = tomllib.loads(block.group(1))
    config = resolve(load_plugins(), data)
    assert config.num_workers == 256 and config.distribution == "mostly_files"
    assert config.settings_of(load_plugins().model_clients["openai"]).max_rpm == 600
    assert config.sandbox_options["docker"].network == "host"
    assert config.filter_options["min_tool_calls"].minimum == 3


def test_every_flag_the_readme_names_for_run_is_accepted() -> None:
    text = page("configuration.md")
    table = text[text.index("| flag |") : text.index("A configuration file")]
    flags = set(re.findall(r"`(--[a-z][\w.-]*)", table))
    assert len(flags) > 40
    params = run_params(load_plugins())
    accepted = {opt for param in params for opt in param.opts} | {"--help"}
    pairs = {"--sandbox_option", "--filter_option", "--writer_option", "--executor_option"}
    assert flags - accepted == set()
    assert pairs <= accepted


def test_the_manual_s_compression_step_is_valid() -> None:
    from trajkit.compress import step

    block = re.search(r"```toml\n(\[compress\].*?)```", page("compress.md"), re.S)
    assert block is not None
    host = load_plugins()
    config = resolve(host, {**tomllib.loads(block.group(1)), "model": "scripted"})
    assert config.compress.max_tokens == 8192 and config.compress.strategy == "pipeline"
    step.check(config, host)  # the strategy takes these options, the counter exists


def test_the_architecture_page_names_every_package_and_top_level_module() -> None:
    """The picture of the packages is where a newcomer starts: a package or module it leaves out
    is one they will not find from it."""
    text = page("architecture.md")
    source = DOCS.parent / "trajkit"
    packages = {init.parent for init in source.rglob("__init__.py")} - {source}
    names = [f"{package.name}/" for package in packages if "chat_templates" not in package.parts]
    names += [module.name for module in (*source.glob("*.py"), *(source / "plugins").glob("*.py"))]
    assert [name for name in sorted(names) if name != "__init__.py" and name not in text] == []
