"""Atomic checkpoints: write to a temporary file in the same folder, fsync, then rename over the target.

A crash mid-write never leaves a truncated file where a good one was; loading uses weights_only=True so a
checkpoint cannot execute code.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

__all__ = ["atomic_save", "safe_load"]


def atomic_save(obj, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def safe_load(path, map_location="cpu"):
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    return torch.load(path, map_location=map_location, weights_only=True)
