"""A third-party package's model client and sandbox backend declare settings of their own: they are
flags, configuration-file keys and sections, validated with errors naming the plugin and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import plugin_env, read_jsonl, trajkit, write_jsonl
from trajkit.testing.openai_server import OpenAITestServer

ACME_PLUGIN = '''
    import json

    from pydantic import Field

    from trajkit import hookimpl
    from trajkit.model import AssistantMessage, ModelClient, ModelError, ToolCall
    from trajkit.sandbox import ExecResult, Sandbox, SandboxBackend, SandboxInfo
    from trajkit.config.settings import StrictSettings


    class AcmeClient(ModelClient):
        name = "acme"
        description = "answers with its greeting after one shell command"

        class Settings(StrictSettings):
            greeting: str = "hello"
            """What the model says when it is done."""
            depth: int = Field(2, ge=1)
            """How many times it says it."""

        @classmethod
        def from_config(cls, config):
            client = cls()
            client.settings = config.settings_of(cls)
            return client

        async def complete(self, messages, tools, params=None):
            if "[fail]" in messages[-1]["content"]:
                raise ModelError("the acme model refuses")
            if not any(m["role"] == "tool" for m in messages):
                call = ToolCall("c1", "terminal", '{"command": "whoami"}')
                return AssistantMessage(reasoning="ask the shell", tool_calls=[call])
            result = json.loads([m["content"] for m in messages if m["role"] == "tool"][0])["output"]
            words = " ".join([self.settings.greeting] * self.settings.depth)
            return AssistantMessage(content=f"{words} / {result.split()[0]}", reasoning="done")


    class VaultSandbox(Sandbox):
        cwd = "/"

        def __init__(self, label, image):
            self.info = SandboxInfo(backend="vault", image=image)
            self.label = label

        async def exec(self, command, *, timeout=None, cwd=None, **kwargs):  # caps nothing itself
            return ExecResult(0, f"label={self.label}\\n" + "." * 2000, "")

        async def read_file(self, path, *, limit=1 << 20):
            raise FileNotFoundError(path)

        async def write_file(self, path, data):
            raise PermissionError(path)

        async def close(self):
            pass


    class VaultBackend(SandboxBackend):
        name = "vault"
        image_based = True

        class Settings(StrictSettings):
            label: str = "plain"
            """Printed by every command."""
            slots: int = Field(4, ge=1)
            """Sandboxes at once."""

        async def create(self, spec):
            label = f"{self.settings.label}/{self.settings.slots}/{spec.lifetime:g}"
            return VaultSandbox(label, spec.image)


    @hookimpl
    def trajkit_model_clients():
        return [AcmeClient]


    @hookimpl
    def trajkit_sandbox_backends():
        return [VaultBackend]
'''


@pytest.fixture
def acme(tmp_path: Path) -> dict[str, str]:
    return plugin_env(tmp_path, "acme", ACME_PLUGIN)


def run_acme(tmp_path: Path, env: dict[str, str], name: str, *flags: str) -> tuple[int, str, list[str]]:
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "who are you"}])
    result = trajkit(
        "run", "--dataset_file", str(dataset), "--run_name", name, "--output_dir", str(tmp_path),
        "--distribution", "terminal_only", "--quiet", *flags, env=env, subprocess=True,
    )  # fmt: skip
    if result.returncode != 0:
        return result.returncode, result.stderr, []
    records = read_jsonl(tmp_path / name / "trajectories.jsonl")
    return 0, result.stderr, [r["conversations"][-1]["value"] for r in records]


def test_plugin_settings_appear_in_help_and_the_listing(acme: dict[str, str]) -> None:
    brief = trajkit("run", "--help", env=acme, subprocess=True).stdout
    # The model clients' bare spellings are shown; the plugins' own, --NAME.KEY, are named.
    assert "--greeting TEXT" in brief and "--vault.slots" not in brief and "--acme.greeting" not in brief
    named = " ".join(brief.split("--help-all")[-1].split())
    assert "model client 'acme';" in named and "sandbox backend 'vault';" in named
    help_text = trajkit("run", "--help-all", env=acme, subprocess=True).stdout
    client = help_text.index("model client 'acme':")
    backend = help_text.index("sandbox backend 'vault':")
    assert (
        "--acme.greeting TEXT" in help_text[client:] and "What the model says when it is done." in help_text
    )
    assert "--acme.depth INTEGER" in help_text[client:] and "[default: 2]" in help_text[client:]
    assert "--vault.slots INTEGER" in help_text[backend:] and "Sandboxes at once." in help_text
    assert "--vault.label TEXT" in help_text[backend:]

    listing = [
        json.loads(line)
        for line in trajkit("settings", "--json", env=acme, subprocess=True).stdout.splitlines()
    ]
    by_key = {entry["key"]: entry for entry in listing}
    depth = by_key["model_options.acme.depth"]
    assert depth["group"] == "model client 'acme'" and depth["default"] == 2
    assert (depth["flag"], depth["variable"]) == ("--acme.depth", "TRAJKIT_ACME_DEPTH")
    assert depth["aliases"] == {"key": "depth", "flag": "--depth", "variable": "TRAJKIT_DEPTH"}
    assert by_key["sandbox_options.vault.slots"]["flag"] == "--vault.slots"
    assert by_key["sandbox_options.vault.label"]["description"] == "Printed by every command."


def test_plugin_settings_from_the_file_and_flags_reach_the_plugins(
    tmp_path: Path, acme: dict[str, str]
) -> None:
    config = tmp_path / "run.toml"
    config.write_text(
        'model = "acme"\nsandbox = "vault"\ngreeting = "ahoy"\ndepth = 1\n'
        '[sandbox_options.vault]\nlabel = "from-file"\nslots = 9\n'
    )
    code, stderr, answers = run_acme(tmp_path, acme, "file", "--config", str(config))
    assert code == 0, stderr
    assert answers == ["ahoy / label=from-file/9/1920"]
    saved = json.loads((tmp_path / "file" / "run.json").read_text())["config"]
    assert (saved["greeting"], saved["depth"]) == ("ahoy", 1)
    assert saved["sandbox_options"]["vault"] == {"label": "from-file", "slots": 9}

    code, stderr, answers = run_acme(
        tmp_path, acme, "flags", "--config", str(config), "--depth", "3", "--vault.label", "from-flag",
        "--sandbox-option", "vault.slots=2",
    )  # fmt: skip
    assert code == 0, stderr
    assert answers == ["ahoy ahoy ahoy / label=from-flag/2/1920"]


@pytest.mark.parametrize(
    ("flags", "toml", "expected"),
    [
        ((), "depth = 0\n", "{file}: depth=0: model client 'acme' expects depth to be int >= 1"),
        (("--vault.slots", "0"), "", "--vault.slots=0: sandbox backend 'vault' expects slots to be int >= 1"),
        (
            (),
            '[sandbox_options.vault]\nslots = "many"\n',
            "{file}: sandbox_options.vault.slots=many: sandbox backend 'vault' expects slots to be int >= 1",
        ),
        (
            ("--sandbox_option", "vault.colour=red"),
            "",
            "--sandbox_option vault.colour: sandbox backend 'vault' has no setting 'colour' (its settings: label, slots)",
        ),
        (
            (),
            '[sandbox_options.vault]\ncolour = "red"\n',
            "{file}: sandbox_options.vault.colour: sandbox backend 'vault' has no setting 'colour'",
        ),
        ((), "greetnig = 1\n", "{file}: greetnig: no such setting (did you mean greeting?)"),
        ((), "[sandbox_options.vualt]\nslots = 1\n", "no sandbox backend is called 'vualt'"),
    ],
)
def test_a_wrong_plugin_setting_names_the_plugin_the_key_and_what_it_expects(
    tmp_path: Path, acme: dict[str, str], flags: tuple[str, ...], toml: str, expected: str
) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('model = "acme"\nsandbox = "vault"\n' + toml)
    code, stderr, _ = run_acme(tmp_path, acme, "bad", "--config", str(config), *flags)
    assert code == 2
    assert expected.format(file=config) in stderr
    assert not (tmp_path / "bad").exists()


def test_core_settings_reach_the_sessions_of_a_plugin(tmp_path: Path, acme: dict[str, str]) -> None:
    dataset = write_jsonl(
        tmp_path / "d.jsonl",
        [{"prompt": "in an image", "image": "busybox"}, {"prompt": "[fail] abcdefghijkl"}],
    )
    result = trajkit(
        "run", "--dataset_file", str(dataset), "--run_name", "core", "--output_dir", str(tmp_path),
        "--distribution", "terminal_only", "--model", "acme", "--sandbox", "vault", "--image_backend", "vault",
        "--sandbox_lifetime", "77", "--tool_output_cap", "300", "--system_prompt", "Be brief.",
        "--verbose", "--log_prefix_chars", "8", "--max_attempts", "1", env=acme, subprocess=True,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr  # the [fail] prompt failed
    [record] = read_jsonl(tmp_path / "core" / "trajectories.jsonl")
    assert record["sandbox"]["backend"] == "vault" and record["sandbox"]["image"] == "busybox"
    assert record["conversations"][0]["value"] == "Be brief."
    assert record["conversations"][-1]["value"] == "hello hello / label=plain/4/77"
    tool_output = json.loads(record["conversations"][3]["value"])["output"]
    assert tool_output.startswith("label=plain/4/77\n..") and "bytes truncated" in tool_output
    assert len(record["conversations"][3]["value"].encode()) <= 300
    assert f"finished {record['work_id']} (prompt 0)" in result.stderr  # --verbose
    assert "'[fail] a'" in result.stderr and "'[fail] ab" not in result.stderr  # --log_prefix_chars


CLASHING_PLUGIN = '''
    from trajkit import hookimpl
    from trajkit.record.filters import TrajectoryFilter
    from trajkit.config.settings import StrictSettings


    class Local(TrajectoryFilter):
        name = "local"

        class Settings(StrictSettings):
            isolation: str = "none"
            """A name another plugin's flag already has."""

        def check(self, record):
            return None


    @hookimpl
    def trajkit_filters():
        return [Local]
'''


def test_two_plugins_claiming_one_flag_is_a_usage_error_naming_both(tmp_path: Path) -> None:
    env = plugin_env(tmp_path, "clash", CLASHING_PLUGIN)
    result = trajkit("run", "--help", env=env, subprocess=True)
    assert result.returncode == 2
    assert (
        "the flag --local.isolation is claimed by sandbox backend 'local' and by filter 'local'"
        in result.stderr
    )
    assert (
        trajkit("status", "--help", env=env, subprocess=True).returncode == 0
    )  # other commands are not held up


def test_plugin_and_core_settings_from_the_environment_sit_between_flags_and_the_file(
    tmp_path: Path, acme: dict[str, str]
) -> None:
    config = tmp_path / "run.toml"
    config.write_text('sandbox = "vault"\ngreeting = "ahoy"\n[sandbox_options.vault]\nlabel = "from-file"\n')
    env = {**acme, "TRAJKIT_MODEL": "acme", "TRAJKIT_DEPTH": "2", "TRAJKIT_VAULT_LABEL": "from-env"}
    code, stderr, answers = run_acme(tmp_path, env, "env", "--config", str(config))
    assert code == 0, stderr
    assert answers == ["ahoy ahoy / label=from-env/4/1920"]

    code, stderr, answers = run_acme(tmp_path, env, "flag", "--config", str(config), "--vault.label", "flag")
    assert code == 0, stderr
    assert answers == ["ahoy ahoy / label=flag/4/1920"]

    code, stderr, _ = run_acme(
        tmp_path, {**env, "TRAJKIT_VAULT_SLOTS": "none"}, "bad", "--config", str(config)
    )
    assert code == 2
    assert "$TRAJKIT_VAULT_SLOTS=none: sandbox backend 'vault' expects slots to be int >= 1" in stderr

    listing = [
        json.loads(line)
        for line in trajkit("settings", "--json", env=acme, subprocess=True).stdout.splitlines()
    ]
    by_key = {entry["key"]: entry["variable"] for entry in listing}
    assert by_key["model_options.acme.depth"] == "TRAJKIT_ACME_DEPTH"
    assert by_key["max_turns"] == "TRAJKIT_MAX_TURNS"
    assert by_key["sandbox_options.vault.slots"] == "TRAJKIT_VAULT_SLOTS"
    variables = [name for name in by_key.values() if name]
    assert len(variables) == len(set(variables)), "two settings read one variable"


# One model client setting, KEY of the client NAME, given each way a setting can be given: by
# the plugin's own spelling (as every plugin's) and by the bare one (as the reference runner's).
SPELLINGS = {
    "--NAME.KEY": lambda name, key: ([f"--{name}.{key}", "3"], {}, ""),
    "--KEY": lambda name, key: ([f"--{key}", "3"], {}, ""),
    "$TRAJKIT_NAME_KEY": lambda name, key: ([], {f"TRAJKIT_{name}_{key}".upper(): "3"}, ""),
    "$TRAJKIT_KEY": lambda name, key: ([], {f"TRAJKIT_{key}".upper(): "3"}, ""),
    "[model_options.NAME] KEY": lambda name, key: ([], {}, f"[model_options.{name}]\n{key} = 3\n"),
    "KEY in the file": lambda name, key: ([], {}, f"{key} = 3\n"),
}


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_third_party_model_client_is_configured_like_the_built_in(
    tmp_path: Path, acme: dict[str, str], spelling: str
) -> None:
    flags, env, toml = SPELLINGS[spelling]("acme", "depth")
    config = tmp_path / "acme.toml"
    config.write_text('model = "acme"\n' + toml)
    code, stderr, answers = run_acme(tmp_path, {**acme, **env}, "acme", "--config", str(config), *flags)
    assert code == 0, stderr
    assert len(answers) == 1 and answers[0].startswith("hello hello hello / ")
    assert json.loads((tmp_path / "acme" / "run.json").read_text())["config"]["depth"] == 3

    flags, env, toml = SPELLINGS[spelling]("openai", "max_retries")
    config = tmp_path / "openai.toml"
    config.write_text(toml)
    assert built_in_setting(tmp_path / "openai", config, flags, env, "max_retries") == 3


def built_in_setting(out: Path, config: Path, flags: list[str], env: dict[str, str], key: str) -> object:
    """The value of the OpenAI client's setting ``key`` a run with these settings saved."""
    dataset = write_jsonl(out.parent / "d.jsonl", [{"prompt": "say hi"}])
    with OpenAITestServer(lambda _body: {"content": "hi"}) as server:
        result = trajkit(
            "run", "--dataset_file", str(dataset), "--run_name", "r", "--output_dir", str(out),
            "--model", "m", "--base_url", server.base_url, "--distribution", "terminal_only",
            "--quiet", "--overwrite", "--config", str(config), *flags, env=env,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads((out / "r" / "run.json").read_text())["config"][key]


@pytest.mark.parametrize(
    ("toml", "env", "flags", "expected"),
    [
        ("max_retries = 1\n[model_options.openai]\nmax_retries = 2\n", {}, [], 2),
        ("[model_options.openai]\nmax_retries = 2\n", {"TRAJKIT_MAX_RETRIES": "3"}, [], 3),
        ("", {"TRAJKIT_MAX_RETRIES": "3", "TRAJKIT_OPENAI_MAX_RETRIES": "4"}, [], 4),
        ("", {"TRAJKIT_OPENAI_MAX_RETRIES": "4"}, ["--max_retries", "5"], 5),
        ("", {}, ["--openai.max_retries", "6", "--max_retries", "5"], 6),
    ],
)
def test_a_client_s_own_spelling_wins_in_its_place_and_flags_over_environment_over_file(
    tmp_path: Path, toml: str, env: dict[str, str], flags: list[str], expected: int
) -> None:
    config = tmp_path / "run.toml"
    config.write_text(toml)
    assert built_in_setting(tmp_path / "out", config, flags, env, "max_retries") == expected
