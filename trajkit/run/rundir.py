"""The run directory: :class:`RunDir`, the one object that knows a run's files.

Every command that reads or writes a run goes through it: ``run``, ``serve --record``, ``compress``,
``status``, ``stats``, ``report``, ``export`` and ``compare``; no other module names a file of the
run. The ledger (``batch_N.jsonl``) is the truth; ``statistics.json``, ``checkpoint.json`` and
``rejected.jsonl`` are derived from it by each merge, and ``run.json`` keeps what the ledger cannot
(the run's settings, each invocation), the spend files (``spend/RUN_ID.jsonl``) what each
invocation's model answers cost, to the last one. ``tools.json`` keeps the tool schemas offered to
the model (:mod:`trajkit.tools.catalog`). A derived file that is damaged or missing is rebuilt with a
warning, never a crash. The invocation that writes a run holds its lock
(:class:`~trajkit.run.invocation.Invocation`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trajkit.run.files import RunIOError, read_json_object, timestamp, write_json_atomic
from trajkit.run.lock import Holder, RunLock, holder_of
from trajkit.tools.catalog import ToolCatalog, ToolSchemas, read_tool_schemas

if TYPE_CHECKING:
    from trajkit.run.invocation import SpendFile
    from trajkit.run.ledger import AppendLog, LedgerWriter

log = logging.getLogger("trajkit")

BATCH_FILE = re.compile(r"^batch_(\d+)\.jsonl$")
MANIFEST_FILE = "run.json"
CHECKPOINT_FILE = "checkpoint.json"
STATISTICS_FILE = "statistics.json"
FAILURES_FILE = "failures.jsonl"
REJECTED_FILE = "rejected.jsonl"
KEPT_FILE = "trajectories.jsonl"
"""The sharegpt writer's output: every kept record in dataset order, what readers of a run use."""
COMPRESSED_FILE = "trajectories.compressed.jsonl"
"""The run's compression step's output (``trajkit compress RUN_DIR`` writes it where it is told)."""
TOOLS_FILE = "tools.json"
"""The tool schemas offered to the model: schema-set key -> the schemas, as the OpenAI ``tools``
list has them, sorted by tool name; each record's ``tool_schemas_key`` names its set."""
LOCK_FILE = "run.lock"
"""Not a dot file: the merge removes dot files (its own temporaries) left by a crash."""
SPEND_DIR = "spend"
"""One append-only file per invocation, ``spend/RUN_ID.jsonl``: a line of what the invocation's
model answers have cost so far (:data:`SPEND_KEYS`) as each answer arrives, so that a killed
invocation's spend is known to its last answer."""
REPORT_FILE = "report.html"
"""Where ``trajkit report`` writes the page unless told otherwise."""
HF_DIR = "hf_dataset"
"""Where ``trajkit export --format hf`` saves the dataset unless told otherwise."""
SPEND_KEYS = ("requests", "prompt_tokens", "completion_tokens", "cost")
"""What a model client counts over every response it received (``ModelClient.statistics``)."""


@dataclass(frozen=True)
class RunDir:
    """A run directory: the path of each file of the run, their readers, and the objects the
    invocation holding the run writes them with. Readers never take the lock; ``str()`` is the path."""

    path: Path

    def __str__(self) -> str:
        return str(self.path)

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    @property
    def name(self) -> str:
        return self.path.name

    # -- the files ---------------------------------------------------------------------------------

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST_FILE

    @property
    def statistics_path(self) -> Path:
        return self.path / STATISTICS_FILE

    @property
    def checkpoint_path(self) -> Path:
        return self.path / CHECKPOINT_FILE

    @property
    def failures_path(self) -> Path:
        return self.path / FAILURES_FILE

    @property
    def rejected_path(self) -> Path:
        return self.path / REJECTED_FILE

    @property
    def kept_path(self) -> Path:
        return self.path / KEPT_FILE

    @property
    def compressed_path(self) -> Path:
        return self.path / COMPRESSED_FILE

    @property
    def tools_path(self) -> Path:
        return self.path / TOOLS_FILE

    @property
    def lock_path(self) -> Path:
        return self.path / LOCK_FILE

    @property
    def spend_dir(self) -> Path:
        return self.path / SPEND_DIR

    @property
    def report_path(self) -> Path:
        return self.path / REPORT_FILE

    @property
    def hf_dataset_path(self) -> Path:
        return self.path / HF_DIR

    def batch_path(self, number: int) -> Path:
        return self.path / f"batch_{number}.jsonl"

    def spend_path(self, run_id: str) -> Path:
        return self.path / SPEND_DIR / f"{run_id}.jsonl"

    def output_path(self, filename: str) -> Path:
        """An output writer's file (its ``filename``) in the run directory."""
        return self.path / filename

    # -- reading -----------------------------------------------------------------------------------

    def batch_files(self) -> list[tuple[int, Path]]:
        """Ledger files in numeric order (batch_2 before batch_10)."""
        found = []
        if self.path.is_dir():
            for path in self.path.iterdir():
                match = BATCH_FILE.match(path.name)
                if match:
                    found.append((int(match.group(1)), path))
        return sorted(found)

    def holds_a_run(self) -> bool:
        """A ledger or a failure log: some invocation ran sessions here."""
        return bool(self.batch_files()) or self.failures_path.exists()

    def is_a_run(self) -> bool:
        """A run of any kind: one that ran sessions, or only its settings or its merged outputs."""
        return self.manifest_path.exists() or self.kept_path.exists() or self.holds_a_run()

    def ledger_state(self) -> dict[str, list[int]]:
        """The size and modification time of every file the statistics are made from (the ledger,
        the failure log, the spend files): a merge notes them in ``statistics.json``, so a reader
        can tell whether the ledger has changed since (:mod:`trajkit.run.view`)."""
        paths = [path for _, path in self.batch_files()] + [self.failures_path]
        if self.spend_dir.is_dir():
            paths += sorted(self.spend_dir.iterdir())
        state = {}
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                stat = path.stat()
                state[str(path.relative_to(self.path))] = [stat.st_size, stat.st_mtime_ns]
        return state

    def run_json(
        self, remedy: str, required: dict[str, type | tuple[type, ...]] | None = None
    ) -> dict[str, Any] | None:
        """``run.json`` as a reader of the run sees it: None, with a warning naming ``remedy``,
        when it is damaged (not an object with the ``required`` fields, by default an
        ``invocations`` list); None when the run has none."""
        fields: dict[str, type | tuple[type, ...]] = {"invocations": list} if required is None else required
        return read_json_object(self.manifest_path, fields, remedy)

    def statistics(self) -> dict[str, Any] | None:
        """The last merge's statistics; None (with a warning when damaged) if there are none."""
        return read_json_object(
            self.statistics_path,
            {"dataset_rows": int, "done": int, "pending": int},
            "the next merge (trajkit run --resume) rebuilds it from the ledger",
        )

    def failures(self) -> Iterator[dict[str, Any]]:
        """Every failed attempt in ``failures.jsonl``, oldest first (a torn line is passed over)."""
        from trajkit.run.ledger import read_jsonl

        return read_jsonl(self.failures_path)

    def tool_schemas(self) -> dict[str, ToolSchemas]:
        """``tools.json``: every schema set offered in the run, by key (:mod:`trajkit.tools.catalog`)."""
        return read_tool_schemas(self.tools_path)

    def holder(self) -> Holder | None:
        """Who holds the run directory now, or None. Probes with a shared lock taken for an instant."""
        return holder_of(self.lock_path)

    def spend(self) -> dict[str, dict[str, float]]:
        """Run id -> what that invocation's model answers cost: the last whole line of its spend file."""
        found: dict[str, dict[str, float]] = {}
        try:
            paths = sorted(self.spend_dir.iterdir()) if self.spend_dir.is_dir() else []
        except OSError as exc:
            raise RunIOError(self.spend_dir, exc) from None
        for path in paths:
            if path.suffix == ".jsonl" and not path.name.startswith("."):
                last = _last_spend_line(path)
                if last is not None:
                    found[path.stem] = last
        return found

    def spent(self, invocations: list[dict[str, Any]]) -> dict[str, float]:
        """What every invocation of the run sent and paid for: each one's spend file (to its last
        answer, killed invocations included), else what ``run.json`` says it spent (invocations
        made before spend files, served sessions); a spend file whose invocation ``run.json`` lost
        counts too."""
        files = self.spend()
        entries = list(files.values())
        for invocation in invocations:
            client = invocation.get("model_client")
            if invocation.get("run_id") not in files and isinstance(client, dict):
                entries.append(client)
        return spend_total(entries)

    # -- writing (the invocation holding the lock) -------------------------------------------------

    def lock(self) -> RunLock:
        return RunLock(self.lock_path)

    def manifest(self, run_name: str, version: str) -> Manifest:
        """``run.json`` to keep: read once (or made afresh), written whole each time it changes."""
        return Manifest(self, run_name, version)

    def ledger_writer(self, batch_size: int) -> LedgerWriter:
        """A writer appending to new batch files after the existing ones."""
        from trajkit.run.ledger import LedgerWriter

        return LedgerWriter(self, batch_size)

    def failure_log(self) -> AppendLog:
        from trajkit.run.ledger import AppendLog

        return AppendLog(self.failures_path)

    def spend_file(self, run_id: str) -> SpendFile:
        """The spend file of the invocation ``run_id`` (``spend/`` made if need be)."""
        from trajkit.run.invocation import SpendFile

        try:
            self.spend_dir.mkdir(exist_ok=True)
        except OSError as exc:
            raise RunIOError(self.spend_dir, exc) from None
        return SpendFile(self.spend_path(run_id))

    def tools_catalog(self) -> ToolCatalog:
        return ToolCatalog(self.tools_path)

    def write_statistics(self, statistics: dict[str, Any]) -> None:
        write_json_atomic(self.statistics_path, statistics)

    def write_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """``checkpoint.json``: where the run stood at the end of its last merge, for people and
        scripts. Resume never reads it (the ledger is the truth), so a damaged one costs nothing."""
        write_json_atomic(self.checkpoint_path, checkpoint)

    def remove_merge_temporaries(self, outputs: Sequence[str]) -> None:
        """Temporary files of a merge that a crash cut short, of the writers' ``outputs`` and the
        merge's own files; only those: `trajkit export` may be writing beside them right now."""
        for name in [*outputs, REJECTED_FILE, STATISTICS_FILE, CHECKPOINT_FILE, MANIFEST_FILE]:
            for leftover in self.path.glob(f".{name}.*"):
                leftover.unlink(missing_ok=True)

    def clear(self) -> None:
        """Every file of the run but its lock (``--overwrite``, holding it)."""
        for path in self.path.iterdir():
            if path.is_file() and path.name != LOCK_FILE:
                path.unlink()
        shutil.rmtree(self.spend_dir, ignore_errors=True)


# -- the manifest (run.json) and the spend ---------------------------------------------------------


class Manifest:
    """``run.json`` as the invocation holding the lock keeps it: read once, written whole each time
    it changes (the configuration, and each invocation's entry as it goes)."""

    def __init__(self, run_dir: RunDir, run_name: str, version: str) -> None:
        self.run_dir = run_dir
        self.data = self._read(run_name, version)

    def _read(self, run_name: str, version: str) -> dict[str, Any]:
        """``run.json``, or a fresh one. A damaged one is kept as ``run.json.damaged`` and rebuilt:
        the configuration is written again by the next invocation; the history of earlier ones is
        lost."""
        path = self.run_dir.manifest_path
        manifest = self.run_dir.run_json("rebuilding it")
        if manifest is not None and all(isinstance(i, dict) for i in manifest["invocations"]):
            return manifest
        fresh: dict[str, Any] = {"trajkit_version": version, "run_name": run_name, "invocations": []}
        if path.exists():
            log.warning(
                "%s: kept as %s.damaged; the spend and history of earlier invocations are not known",
                path,
                MANIFEST_FILE,
            )
            try:
                os.replace(path, path.with_name(f"{MANIFEST_FILE}.damaged"))
            except OSError as exc:
                raise RunIOError(path, exc) from None
            fresh["rebuilt"] = timestamp()
        return fresh

    @property
    def invocations(self) -> list[dict[str, Any]]:
        invocations: list[dict[str, Any]] = self.data["invocations"]
        return invocations

    def start(
        self,
        config: dict[str, Any],
        plugins: dict[str, str],
        entry: dict[str, Any],
        changes: Mapping[str, list[Any]],
    ) -> None:
        """Record a new invocation, the settings it runs with (the run's settings from now on) and
        the output-shaping ``changes`` it makes to them (:mod:`trajkit.run.settings`)."""
        self.data["config"] = config
        self.data["plugins"] = plugins
        self.invocations.append({**entry, "config_changes": dict(changes)})
        self.save()

    def update(self, **fields: Any) -> None:
        """Update the running invocation's entry and write the manifest."""
        self.invocations[-1].update(fields)
        self.save()

    def save(self) -> None:
        write_json_atomic(self.run_dir.manifest_path, self.data)


_TAIL = 64 * 1024


def _last_spend_line(path: Path) -> dict[str, float] | None:
    """The last whole line of a spend file (one cut short by a kill is passed over)."""
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - _TAIL))
            lines = handle.read().split(b"\n")[:-1]  # what follows the last newline is no whole line
            if size > _TAIL:
                lines = lines[1:]  # the first may start mid-line
    except OSError as exc:
        raise RunIOError(path, exc) from None
    for raw in reversed(lines):
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if isinstance(entry, dict) and all(isinstance(entry.get(k), int | float) for k in SPEND_KEYS):
            return {k: entry[k] for k in SPEND_KEYS}
    return None


def spend_total(entries: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    total = dict.fromkeys(SPEND_KEYS, 0.0)
    for entry in entries:
        for key in SPEND_KEYS:
            value = entry.get(key)
            if isinstance(value, int | float):
                total[key] += value
    return {k: (round(v, 6) if k == "cost" else int(v)) for k, v in total.items()}


def summed(entries: list[dict[str, Any]]) -> dict[str, float]:
    """Every numeric counter of the entries, summed."""
    total: dict[str, float] = {}
    for entry in entries:
        for key, value in entry.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                total[key] = total.get(key, 0) + value
    return {k: round(v, 6) for k, v in sorted(total.items())}
