"""Options shared by the command lines (`flowgp fit`, `flowgp predict`, `flowgp bench ...`); nothing here imports
torch, so that `--help` stays fast."""
from __future__ import annotations

import argparse

__all__ = ["threads_argument", "add_threads_option", "THREADS_HELP"]

#: --threads' help
THREADS_HELP = ("torch threads per process: a positive integer, or 'auto': one thread for small models, else this "
                "process's share of the cores (divided among --nproc, torchrun or --jobs processes) less the cores "
                "other processes keep busy")


def threads_argument(text: str):
    """--threads: "auto" or a positive integer (an argparse type: anything else is argparse's usage error, exit
    status 2, naming --threads)."""
    if text == "auto":
        return text
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer or 'auto', got {text!r}")
    return int(text)


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    """Add --threads N|auto (default "auto", the estimators' `threads`) to `parser`."""
    parser.add_argument("--threads", type=threads_argument, default="auto", metavar="N|auto", help=THREADS_HELP)
