"""trajkit: turn a JSONL file of prompts into tool-calling agent trajectories for training.

Plugin authors need only::

    from trajkit import hookimpl
"""

from trajkit.hookspecs import hookimpl

__version__ = "0.1.0"
__all__ = ["__version__", "hookimpl"]
