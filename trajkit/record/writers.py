"""Output writers: render the run's kept trajectories into one file of some format."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from trajkit.config.settings import Configurable, StrictSettings
from trajkit.record.filters import Record


class OutputWriter(Configurable, ABC):
    """Renders kept trajectories, in dataset order, into ``filename`` inside the run directory.

    The core hands the writer a temporary path and renames it into place once ``write`` returns,
    so a crash mid-write never leaves a half-written output behind.
    """

    name: ClassVar[str]
    filename: ClassVar[str]
    description: ClassVar[str] = ""
    default: ClassVar[bool] = False
    """Written when the run names no ``--writer``."""
    Settings: ClassVar[type[StrictSettings]] = StrictSettings
    """The writer's settings (``--writer_option NAME.KEY=VALUE``, ``--NAME.KEY``, the
    configuration file's ``[writer_options.NAME]``); none by default."""

    renders_tools: ClassVar[bool] = False
    """Whether rows carry the schemas of the tools offered; such a writer is handed the run's
    saved schemas (:meth:`use_tool_schemas`) before :meth:`write`."""

    def use_tool_schemas(self, saved: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
        """The run's saved tool schema sets (``tools.json``: key -> the schemas of one offer),
        handed over by the merge and ``trajkit export`` to a writer that :attr:`renders_tools`,
        so it writes what the model saw without loading plugins. Nothing by default."""

    @abstractmethod
    def write(self, records: Iterable[Record], path: Path) -> int:
        """Write every record to ``path``; return how many rows were written."""
