"""Append-only JSON-lines result store: one complete JSON object per line, resumable.

Guarantees (what `flowgp bench` relies on):
- each row is appended with a single `os.write` of one complete line on an O_APPEND descriptor, then
  `fsync`, so an interrupted run loses at most the row in flight;
- on open, a torn tail (a last line without its newline, or one that is not valid JSON) is ignored and cut
  off the file, so the next append starts on a clean line; a bad line in the middle is skipped with a warning;
- `is_done(row)` compares the row's key fields with every stored row, so a rerun skips finished work.

Usage::

    store = ResultStore(out_dir / "uci.jsonl", key_fields=("dataset", "model", "num_inducing", "split"))
    if not store.is_done(job):
        store.append({**job, "nll": ..., "rmse": ...})
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

__all__ = ["ResultStore", "read_rows"]


def _key_value(value):
    # Normalise so 100 and 100.0, or a tuple and a list, give the same key after a JSON round trip.
    return json.dumps(value, sort_keys=True)


def read_rows(path) -> list[dict]:
    """Every valid row of a JSON-lines file (torn or malformed lines are skipped); [] for a missing file."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    with path.open("rb") as fh:
        data = fh.read()
    lines = data.split(b"\n")
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            if i < len(lines) - 1:
                warnings.warn(f"{path}: skipping malformed line {i + 1}", RuntimeWarning, stacklevel=2)
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


class ResultStore:
    """JSON-lines file of result rows, keyed by `key_fields` (see the module docstring for the guarantees)."""

    def __init__(self, path, key_fields):
        if isinstance(key_fields, str) or not key_fields:
            raise ValueError("key_fields must be a non-empty sequence of field names, e.g. ('dataset', 'split')")
        self.path = Path(path)
        self.key_fields = tuple(key_fields)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair()
        self._rows = read_rows(self.path)
        self._keys = {self.key(r) for r in self._rows if all(f in r for f in self.key_fields)}

    def _repair(self) -> None:
        """Cut a torn last line (no trailing newline, or not JSON) so appends start on a clean line."""
        if not self.path.exists():
            return
        with self.path.open("rb") as fh:
            data = fh.read()
        if not data:
            return
        keep = len(data)
        if not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1  # 0 when the whole file is one torn line
        else:
            # A complete-looking but unparsable last line (e.g. a zero-filled block after a crash).
            start = data.rfind(b"\n", 0, len(data) - 1) + 1
            try:
                json.loads(data[start:].decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                keep = start
        if keep != len(data):
            warnings.warn(f"{self.path}: dropping a torn last line ({len(data) - keep} bytes) left by an "
                          "interrupted run", RuntimeWarning, stacklevel=3)
            with self.path.open("r+b") as fh:
                fh.truncate(keep)
                fh.flush()
                os.fsync(fh.fileno())

    def key(self, row: dict) -> tuple:
        missing = [f for f in self.key_fields if f not in row]
        if missing:
            raise ValueError(f"row is missing key fields {missing}; key_fields are {list(self.key_fields)}")
        return tuple(_key_value(row[f]) for f in self.key_fields)

    def is_done(self, row: dict) -> bool:
        return self.key(row) in self._keys

    @property
    def rows(self) -> list[dict]:
        return list(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def append(self, row: dict) -> None:
        """Write one row as one complete line (single write, flush, fsync)."""
        key = self.key(row)
        line = (json.dumps(row, sort_keys=True, allow_nan=True) + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, line)
            while written < len(line):  # short writes are rare but legal
                written += os.write(fd, line[written:])
            os.fsync(fd)
        finally:
            os.close(fd)
        self._rows.append(row)
        self._keys.add(key)
