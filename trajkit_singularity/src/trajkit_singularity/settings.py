"""The singularity backend's settings (``--sandbox_option singularity.KEY=VALUE``,
``[sandbox_options.singularity]``).

Values arrive as text from the command line or typed from a configuration file; a typo or a bad
value stops the run before any model call rather than surfacing as an engine error in the middle of
it. Safe by default: no network, 4 GiB of memory and 1024 processes per instance where Apptainer can
use cgroups.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, model_validator

from trajkit.config.settings import StrictSettings
from trajkit.sandbox import ByteLimit, CountLimit, SandboxError, lowered

CACHE_VARIABLE = "TRAJKIT_SIF_CACHE"
"""The environment variable naming the cache directory when ``cache_dir`` is not set."""
DEFAULT_CACHE_DIR = "~/.cache/trajkit/sif"
DIRS_UNDER_CACHE = {"tmp_dir": "tmp", "scratch_dir": "sandboxes"}
"""Directories that default to a subdirectory of ``cache_dir``, wherever that is."""
# Apptainer's --bind splits on ',' and ':'; a path holding either cannot be bound safely.
_BIND_UNSAFE = re.compile(r"[,:]")
_NETWORK = re.compile(r"^[A-Za-z0-9_.-]+$")


def bindable_path(path: Path) -> Path:
    """``path`` made absolute (``~`` expanded); ValueError if Apptainer could not bind it."""
    path = path.expanduser().absolute()
    if _BIND_UNSAFE.search(str(path)):
        raise ValueError(f"{path}: Apptainer cannot bind a path containing ',' or ':'")
    return path


def default_cache_dir() -> Path:
    return bindable_path(Path(os.environ.get(CACHE_VARIABLE) or DEFAULT_CACHE_DIR))


BindablePath = Annotated[Path, AfterValidator(bindable_path)]


def network_name(name: str) -> str:
    if not _NETWORK.match(name):
        raise ValueError(f"{name!r} is no network: expected none, host or a CNI network name")
    return name


class SingularitySettings(StrictSettings):
    """One Apptainer/Singularity instance per prompt: the engine, its directories, network and limits."""

    model_config = ConfigDict(str_strip_whitespace=True)

    binary: str | None = Field(
        None,
        description="Apptainer or Singularity executable (a name or a path); unset: apptainer, else "
        "singularity, on PATH",
    )
    cache_dir: BindablePath = Field(
        default_factory=default_cache_dir,
        description=f"SIFs converted from remote references, their locks and digests, Apptainer's layer "
        f"cache; unset: ${CACHE_VARIABLE}, else {DEFAULT_CACHE_DIR}",
    )
    tmp_dir: BindablePath = Field(
        default_factory=lambda: default_cache_dir() / "tmp",
        description="build scratch (APPTAINER_TMPDIR), kept off /tmp; unset: <cache_dir>/tmp",
    )
    scratch_dir: BindablePath = Field(
        default_factory=lambda: default_cache_dir() / "sandboxes",
        description="one directory per live sandbox, its state and its working directory; unset: "
        "<cache_dir>/sandboxes",
    )
    network: Annotated[str, AfterValidator(network_name)] = Field(
        "none",
        description="none: loopback only; host: the host's network; else the name of a CNI network",
    )
    writable: Annotated[Literal["overlay", "tmpfs"], BeforeValidator(lowered)] = Field(
        "overlay",
        description="where writes outside the working directory go: overlay, a directory on the "
        "host's disk beside the working directory; tmpfs, memory (--writable-tmpfs)",
    )
    user: Annotated[Literal["auto", "caller"], BeforeValidator(lowered)] = Field(
        "auto",
        description="who commands run as: auto, user 65534 when trajkit runs as root (entered through "
        "the image's setpriv or su; an image with neither is refused), else the user running trajkit; "
        "caller, the user running trajkit whoever it is (root without capabilities: the explicit "
        "opt-out). Commands keep no capability either way",
    )
    build_timeout: float = Field(
        1800.0, gt=0, description="seconds one conversion of a remote reference to a SIF may take"
    )
    start_timeout: float = Field(120.0, gt=0, description="seconds one instance start may take")
    memory: ByteLimit = Field(
        4 * 1024**3,
        gt=0,
        description="memory an instance may use (its cgroup's limit), e.g. 512m or 2g (default 4g); "
        "none lifts it",
    )
    pids_limit: CountLimit = Field(
        1024, gt=0, description="processes an instance may hold at once; none lifts it"
    )

    @model_validator(mode="before")
    @classmethod
    def _dirs_under_cache_dir(cls, data: Any) -> Any:
        """``tmp_dir`` and ``scratch_dir``, when unset, go under ``cache_dir`` wherever that is."""
        if not isinstance(data, Mapping):
            return data
        unset = [key for key in ("binary", "cache_dir", *DIRS_UNDER_CACHE) if data.get(key) in ("", None)]
        data = {key: value for key, value in data.items() if key not in unset}
        cache = data.setdefault("cache_dir", os.environ.get(CACHE_VARIABLE) or DEFAULT_CACHE_DIR)
        for key, name in DIRS_UNDER_CACHE.items():
            if key not in data and isinstance(cache, str | Path) and not _BIND_UNSAFE.search(str(cache)):
                data[key] = Path(cache).expanduser() / name
        return data

    @property
    def limits_required(self) -> bool:
        """True when ``memory`` or ``pids_limit`` was set: then an engine that cannot enforce them
        (no usable cgroups) fails the sandbox instead of running it without them."""
        return bool({"memory", "pids_limit"} & self.model_fields_set)

    def resolve_binary(self) -> str:
        """Absolute path of the engine's executable; SandboxError says how to get one when missing."""
        candidates = [self.binary] if self.binary else ["apptainer", "singularity"]
        for candidate in candidates:
            found = shutil.which(candidate)
            if found:
                return found
        raise SandboxError(
            f"no Apptainer/Singularity executable found (looked for {', '.join(candidates)} on PATH); "
            "install Apptainer (on Debian 12: scripts/engines/apptainer.sh start) or set "
            "--sandbox_option singularity.binary=PATH"
        )
