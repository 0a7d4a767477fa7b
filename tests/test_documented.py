"""Every hook spec and every setting is documented; every setting is exercised by some test and
every hook implemented by a plugin this repository ships.

"Exercised" is read from the tests' syntax, not from a bare substring: a setting counts when a test
passes it by name (a keyword argument, a dictionary key, a flag, or a ``KEY = VALUE`` line of a
configuration file written by the test). Only the plugins of this repository are held to it: a
third-party package installed beside them is not this repository's to document.
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path

from trajkit import hookspecs
from trajkit.config.cli_options import every_setting, settings_page
from trajkit.manager import PluginHost, load_plugins

ROOT = Path(__file__).resolve().parent.parent
TESTS = sorted(Path(__file__).parent.glob("test_*.py"))
FLAG = re.compile(r"(?<![\w-])--([A-Za-z][\w.-]*)")
ASSIGNED = re.compile(r"(?m)(?:^|[\s\[,{(])([A-Za-z_][\w.]*)\s*(?:=(?!=)|:\s)")
IMPLEMENTED = re.compile(r"def (trajkit_\w+)\(")
TABLE = re.compile(r"(?m)^\s*\[+([\w.]+)\]+\s*$")
WORD = re.compile(r"\w+")


@dataclass
class Vocabulary:
    """What one test module says by name."""

    names: set[str] = field(default_factory=set)
    """Keyword arguments, dictionary keys, flags (without dashes, in snake case), assigned keys."""
    words: set[str] = field(default_factory=set)
    """Every word of every string constant."""
    hooks: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, path: Path) -> Vocabulary:
        found = cls()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg:
                found.names.add(node.arg)
                if node.arg.startswith("trajkit_"):  # plugin_with(trajkit_filters=...)
                    found.hooks.add(node.arg)
            elif isinstance(node, ast.Dict):
                found.names.update(
                    k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
                )
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add_text(node.value)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(
                "trajkit_"
            ):
                found.hooks.add(node.name)
            elif isinstance(node, ast.Attribute) and node.attr.startswith("trajkit_"):
                found.hooks.add(node.attr)
        return found

    def add_text(self, text: str) -> None:
        self.words.update(WORD.findall(text))
        self.names.update(flag.replace("-", "_") for flag in FLAG.findall(text))
        for table in TABLE.findall(text):  # [distributions.x] names distributions and distributions.x
            parts = table.split(".")
            self.names.update(".".join(parts[:end]) for end in range(1, len(parts) + 1))
        self.names.update(ASSIGNED.findall(text))
        self.hooks.update(IMPLEMENTED.findall(text))


def shipped_plugins() -> PluginHost:
    """The installed plugins whose code lives in this repository."""
    host = load_plugins()
    for _name, plugin in host.pm.list_name_plugin():
        source = getattr(plugin, "__file__", None) or inspect.getfile(type(plugin))
        if not Path(source).resolve().is_relative_to(ROOT):
            host.pm.unregister(plugin)
    return host


def vocabularies() -> list[Vocabulary]:
    return [Vocabulary.of(path) for path in TESTS]


def exercised(key: str, flag: str, tests: list[Vocabulary]) -> bool:
    """A core setting (or a model client's bare alias) by its name or its flag's; a plugin's by ``NAME.KEY`` (its
    flag or a ``--sandbox_option`` pair), or by its key in a module that names the plugin; an
    entry of a plugin's table by its key in a module that names the table."""
    parts = key.split(".")
    if len(parts) == 1:
        spelled = {key, *(f.removeprefix("--").replace("-", "_") for f in flag.split(" / ") if f)}
        return any(spelled & test.names for test in tests)
    if len(parts) == 2:  # a core table: [compress] max_tokens = ..., --compress.max_tokens
        return any(key in test.names or (parts[1] in test.names and parts[0] in test.names) for test in tests)
    table, plugin, setting = parts
    if plugin == "NAME":  # an entry of a plugin's table: [mcp_servers.NAME] command = ...
        return any(setting in test.names and table in test.names for test in tests)
    dotted = f"{plugin}.{setting}"
    return any(
        dotted in test.names or (setting in test.names and plugin in test.words | test.names)
        for test in tests
    )


def test_every_setting_is_documented_and_exercised() -> None:
    host = shipped_plugins()
    page = ROOT / "docs" / "settings.md"
    assert page.read_text() == settings_page(host), (
        "stale: run trajkit settings --markdown > docs/settings.md"
    )
    tests = vocabularies()
    undocumented, unexercised = [], []
    for group, key, flag, _variable, setting, aliases in every_setting(host):
        if not (setting.description or "").strip():
            undocumented.append(f"{group}: {key}")
        bare = aliases is not None and exercised(aliases[0], aliases[1], tests)
        if not (bare or exercised(key, flag, tests)):
            unexercised.append(f"{group}: {key}")
    assert not undocumented, f"settings without a description: {undocumented}"
    assert not unexercised, f"settings no test passes: {unexercised}"


def test_every_hook_spec_is_documented_and_implemented_by_a_shipped_plugin() -> None:
    specs = sorted(name for name in vars(hookspecs) if name.startswith("trajkit_"))
    table = (ROOT / "docs" / "plugins.md").read_text()
    host = shipped_plugins()
    for name in specs:
        spec = getattr(hookspecs, name)
        doc = inspect.getdoc(spec) or ""
        assert ":return:" in doc or ":param" in doc, (
            f"{name}: the docstring says neither what it gets nor returns"
        )
        parameters = list(inspect.signature(spec).parameters)
        for parameter in parameters:
            assert f":param {parameter}:" in doc, f"{name}: its argument {parameter!r} is not documented"
        assert inspect.signature(spec).return_annotation is not inspect.Signature.empty, (
            f"{name}: no return type"
        )
        row = re.search(rf"^\| `{name}\(([^)]*)\)", table, re.M)
        assert row, f"{name} is not in docs/plugins.md's table of hooks"
        assert [p.strip() for p in row.group(1).split(",") if p.strip()] == parameters, (
            f"{name}: docs/plugins.md's row names other arguments than the spec's {parameters}"
        )
        implementations = getattr(host.pm.hook, name).get_hookimpls()
        assert implementations, f"no plugin of this repository implements {name}"


def test_the_checks_above_can_fail() -> None:
    """The vocabulary is read from syntax: a substring, a comment or a prose mention is not use."""
    source = Path(__file__).parent / "_probe.py"
    try:
        source.write_text(
            "# --max_turnz and trajkit_probe_hook in a comment\n"
            'text = "a max_turnx mention, pluggy.trajkit_probe_hook in prose"\n'
            'call(max_turnq=3)\nconfig = "max_turnw = 3\\n[sandbox_options.vault]\\nslots = 2\\n"\n'
            'flags = ["--vault.label", "x"]\n'
        )
        probe = [Vocabulary.of(source)]
    finally:
        source.unlink()
    assert not exercised("max_turnz", "", probe) and not exercised("max_turnx", "", probe)
    assert exercised("max_turnq", "", probe) and exercised("max_turnw", "", probe)
    assert exercised("sandbox_options.vault.label", "", probe)
    assert exercised("sandbox_options.vault.slots", "", probe)
    assert not exercised("sandbox_options.safe.slots", "", probe)
    assert "trajkit_probe_hook" not in probe[0].hooks
