"""Output writers: render the run's kept trajectories into one file of some format."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar

from trajkit.filters import Record


class OutputWriter(ABC):
    """Renders kept trajectories, in dataset order, into ``filename`` inside the run directory.

    The core hands the writer a temporary path and renames it into place once ``write`` returns,
    so a crash mid-write never leaves a half-written output behind.
    """

    name: ClassVar[str]
    filename: ClassVar[str]
    description: ClassVar[str] = ""
    default: ClassVar[bool] = False
    """Written when the run names no ``--writer``."""

    @abstractmethod
    def write(self, records: Iterable[Record], path: Path) -> int:
        """Write every record to ``path``; return how many rows were written."""
