"""``python -m trajkit_atropos serve|process|evaluate`` (Atropos's commands and flags)."""

from __future__ import annotations

import sys


def main() -> None:
    from trajkit.config.resolve import ConfigurationError
    from trajkit.config.run_config import ConfigFileError
    from trajkit.manager import PluginError
    from trajkit.plugins.export.chat_templates.source import TemplateSourceError
    from trajkit.run.dataset import DatasetError
    from trajkit.run.files import RunIOError
    from trajkit.run.lock import RunLocked
    from trajkit.run.plan import RunError
    from trajkit.tools.offer import OfferError
    from trajkit_atropos.config import TrajkitEnvError
    from trajkit_atropos.env import TrajkitEnv
    from trajkit_atropos.tokens import RenderingError

    try:
        TrajkitEnv.cli()
    except (
        TrajkitEnvError, ConfigFileError, ConfigurationError, DatasetError, PluginError, OfferError,
        RunError, TemplateSourceError, RunIOError, RunLocked, RenderingError,
    ) as exc:  # fmt: skip
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
