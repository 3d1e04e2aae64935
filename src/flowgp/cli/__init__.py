"""The `flowgp` command line: demo, fit, predict and bench (also `python -m flowgp`), with its exit codes
(`flowgp.cli.exit_codes`)."""
from .commands import DEMO_PERIODS, demo, main

__all__ = ["main", "demo", "DEMO_PERIODS"]
