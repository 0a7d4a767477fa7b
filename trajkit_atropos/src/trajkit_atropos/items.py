"""The dataset's rows as Atropos items: one group per row in dataset order, round after round, each
with an id that a restarted environment gives the same group again (so a trainer that has seen it
can tell)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trajkit.config.run_config import RunConfig
from trajkit.manager import PluginHost
from trajkit.run.dataset import WorkItem
from trajkit.run.plan import read_work
from trajkit.sandbox.check_files import CheckFile


@dataclass(frozen=True)
class GroupItem:
    """One group to roll out: a row and the group's identity."""

    position: int
    """Its place in the stream of groups (round * rows + row)."""
    group_id: str
    row: dict[str, Any]
    """The row's fields as the environment takes them (backend routed)."""
    work_id: str
    """The row's identity in the dataset (``prompt_id.occurrence``)."""
    check_files: tuple[CheckFile, ...] = ()
    """The row's ``check_files``, resolved against the dataset's directory."""


class DatasetItems:
    """The valid rows of a trajkit dataset, read and routed as ``trajkit run`` reads them (invalid
    rows logged with their file and line, and left out)."""

    def __init__(self, config: RunConfig, host: PluginHost, dataset_file: str, namespace: str) -> None:
        work = read_work(config.model_copy(update={"dataset_file": Path(dataset_file)}), host)
        self.items: list[WorkItem] = work.items
        self.rows = [_fields(item, work.routes[item.index]) for item in work.items]
        """Each item's row fields, in the order of :attr:`items`."""
        self.namespace = namespace

    def __len__(self) -> int:
        return len(self.items)

    def at(self, position: int) -> GroupItem:
        rounds, place = divmod(position, len(self.items))
        item = self.items[place]
        identity = group_id(self.namespace, item.work_id, rounds)
        return GroupItem(position, identity, self.rows[place], item.work_id, item.row.check_files)


def group_id(namespace: str, work_id: str, rounds: int) -> str:
    """The id of a row's group in a given round over the dataset: the same in every process."""
    digest = hashlib.sha256(f"{namespace}\0{work_id}\0{rounds}".encode()).hexdigest()
    return digest[:24]


def _fields(item: WorkItem, backend: str) -> dict[str, Any]:
    row = item.row
    return {**row.extra_fields, "prompt": row.prompt, "image": row.image, "cwd": row.cwd, "backend": backend}
