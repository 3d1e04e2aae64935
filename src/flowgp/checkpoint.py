"""Atomic, checksummed checkpoints: write to a temporary file in the same folder, fsync, then rename over the target.

A crash mid-write never leaves a truncated file where a good one was. A dict is stored with one more entry,
`flowgp_sha256`, the SHA-256 digest of its content (every tensor's dtype, shape and bytes, every key and plain
value, in a fixed order); `safe_load` recomputes it and refuses a file whose content does not match (a bit flip,
a file edited by hand). Loading uses weights_only=True, so a checkpoint cannot execute code, and the file stays a
plain torch file: `torch.load(path, weights_only=True)` reads it without flowgp. Files written before the
checksum existed (no `flowgp_sha256` entry) still load.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import torch

__all__ = ["atomic_save", "safe_load", "content_digest", "CHECKSUM_KEY"]

#: the entry of a saved dict that holds the digest of the rest of it
CHECKSUM_KEY = "flowgp_sha256"


def _update(digest, obj) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        digest.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            # a fresh row-major copy: expanded or strided tensors have no byte view of their own
            flat = torch.empty(t.numel(), dtype=t.dtype).copy_(t.reshape(-1))
            digest.update(flat.view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, dict):
        digest.update(f"D{len(obj)}".encode())
        for key in sorted(obj, key=repr):  # the order is fixed whatever the insertion order was
            digest.update(f"K{key!r}".encode())
            _update(digest, obj[key])
    elif isinstance(obj, (list, tuple)):
        digest.update(f"{'L' if isinstance(obj, list) else 'U'}{len(obj)}".encode())
        for item in obj:
            _update(digest, item)
    elif isinstance(obj, (bytes, bytearray)):
        digest.update(b"B" + bytes(obj))
    elif obj is None or isinstance(obj, (bool, int, float, complex, str, torch.dtype, torch.device, torch.Size)):
        # repr of a float round-trips exactly, so equal values give equal digests
        digest.update(f"{type(obj).__name__}:{obj!r}".encode())
    else:
        raise TypeError(f"cannot checksum a {type(obj).__name__} in a checkpoint; store tensors, numbers, strings, "
                        "lists, tuples and dicts only (what torch.load(weights_only=True) reads back)")


def content_digest(obj) -> str:
    """Hex SHA-256 of a checkpoint's content (tensors by dtype, shape and bytes; containers in a fixed order)."""
    digest = hashlib.sha256()
    _update(digest, obj)
    return digest.hexdigest()


def atomic_save(obj, path, checksum: bool = True) -> Path:
    """torch.save(obj) to `path` atomically; a dict gets its content digest under `CHECKSUM_KEY` (see module doc)."""
    path = Path(path)
    if checksum and isinstance(obj, dict):
        if CHECKSUM_KEY in obj:
            raise ValueError(f"the key {CHECKSUM_KEY!r} is reserved for the checkpoint's checksum")
        obj = {**obj, CHECKSUM_KEY: content_digest(obj)}
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
    """torch.load(path, weights_only=True), checking and removing the content digest written by `atomic_save`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch reports damage as any of a dozen exception types
        # one clear error for every damaged or foreign file; torch's own message is not passed on, since it
        # suggests retrying with weights_only=False, which would run whatever code the file holds
        raise ValueError(
            f"{path} is not a readable flowgp file: it is empty, truncated or corrupted, or it holds objects other "
            f"than tensors and plain values, which are refused without running them ({type(err).__name__}); "
            "restore a good copy or save it again") from None
    if isinstance(obj, dict) and CHECKSUM_KEY in obj:
        obj = dict(obj)
        expected = obj.pop(CHECKSUM_KEY)
        if content_digest(obj) != expected:
            raise ValueError(f"the checkpoint {path} is corrupted: its content does not match its SHA-256 checksum; "
                             "delete it (training then starts afresh) or restore a good copy")
    return obj
