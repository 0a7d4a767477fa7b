"""``python -m trajkit_atropos serve|process|evaluate`` (Atropos's commands and flags)."""

from __future__ import annotations


def main() -> None:
    from trajkit_atropos.env import TrajkitEnv

    TrajkitEnv.cli()


if __name__ == "__main__":
    main()
