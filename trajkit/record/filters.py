"""Trajectory filters: keep a finished trajectory, or reject it with a reason."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from trajkit.config.settings import Configurable, StrictSettings

Record = Mapping[str, Any]
"""A trajectory record as stored in the ledger (one JSON object)."""


class TrajectoryFilter(Configurable, ABC):
    """Decides whether a trajectory belongs in the training set.

    A rejected trajectory counts as done (it is not regenerated) and is kept in the ledger; the
    merge writes it to ``rejected.jsonl`` with the reason. Filters must be pure functions of the
    record: the merge re-applies them, and the same ledger must give the same result.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""
    enabled_by_default: ClassVar[bool] = True
    Settings: ClassVar[type[StrictSettings]] = StrictSettings
    """The filter's settings (``--filter_option NAME.KEY=VALUE``, ``--NAME.KEY``, the
    configuration file's ``[filter_options.NAME]``); none by default."""

    def __init__(self, settings: StrictSettings | Mapping[str, Any] | None = None, **options: Any) -> None:
        """``settings`` (or keyword ``options``) are validated against :attr:`Settings`."""
        super().__init__(settings if settings is not None else options)

    @abstractmethod
    def check(self, record: Record) -> str | None:
        """Return None to keep the record, or a short reason a person can read to reject it."""
