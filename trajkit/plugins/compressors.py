"""Built-in compressors (``summary``, ``mask_observations``, ``pipeline``) and ``trajkit compress``."""

from __future__ import annotations

from collections.abc import Sequence

import click

from trajkit import hookimpl
from trajkit.compress.base import Compressor


@hookimpl
def trajkit_compressors() -> Sequence[type[Compressor]]:
    from trajkit.compress.mask import MaskObservations
    from trajkit.compress.summary import Pipeline, Summary

    return [Summary, MaskObservations, Pipeline]


@hookimpl
def trajkit_commands(cli: click.Group) -> None:
    from trajkit.compress.command import compress

    cli.add_command(compress)
