"""Append-only JSON-lines result store: one complete JSON object per line, resumable.

Guarantees (what `flowgp bench` relies on):
- each row is appended with a single `os.write` of one complete line on an O_APPEND descriptor, then
  `fsync`, so an interrupted run loses at most the row in flight;
- on open, a torn tail (a last line without its newline, or one that is not valid JSON) is ignored and cut
  off the file, so the next append starts on a clean line; a bad line in the middle is skipped with a warning;
- `is_done(row)` compares the row's key fields with every stored row, so a rerun skips finished work; a key
  field added after rows were written takes its `key_defaults` value in rows that lack it, so they still count;
- one writer per file: the store holds an exclusive lock on `<file>.lock` beside it from construction to
  `close()` (or process exit, even by SIGKILL: the kernel drops the lock with the process), so a second
  `flowgp bench` writing the same output stops at once with `OutputLocked` naming the file and the holder's
  PID, or, with `wait=True` (`--wait`), waits for the first to finish and then skips the rows it wrote.
  Stores of one process on one file share the lock (the lock keeps other *processes* out).

Usage::

    with ResultStore(out_dir / "uci.jsonl", key_fields=("dataset", "model", "num_inducing", "split")) as store:
        if not store.is_done(job):
            store.append({**job, "nll": ..., "rmse": ...})
"""
from __future__ import annotations

import json
import os
import sys
import threading
import warnings
from pathlib import Path

try:  # POSIX advisory locks; released by the kernel when the holding process dies
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None
try:  # Windows byte-range locks, the fallback where fcntl is missing
    import msvcrt
except ImportError:
    msvcrt = None

__all__ = ["ResultStore", "read_rows", "read_row_files", "OutputLocked", "check_output_folder", "lock_path"]


class OutputLocked(RuntimeError):
    """Another process holds the output file's lock (`ResultStore(..., wait=False)`).

    See Also:
        :class:`flowgp.bench.results.ResultStore`.
    """


def lock_path(path) -> Path:
    """The lock file of a result file: `<file>.lock` beside it (never matched by `*.jsonl`).

    Args:
        path: the result file.

    See Also:
        :class:`flowgp.bench.results.ResultStore`.
    """
    path = Path(path)
    return path.with_name(path.name + ".lock")


def check_output_folder(path, option: str = "--out") -> Path:
    """`path` as a folder that exists or can be created and written; ValueError naming `option` otherwise.

    Run before any work, so that `--out FILE` (a file where a folder is expected) fails at once.

    Args:
        path: the folder.
        option: the option's name for the message.

    See Also:
        :class:`flowgp.bench.results.ResultStore`.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option} {path} is a file, but a folder is expected (results are written inside it); "
                         "pass a folder path")
    ancestor = path
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if ancestor.exists() and not ancestor.is_dir():
        raise ValueError(f"{option} {path}: {ancestor} is a file, so the folder cannot be created; "
                         "pass a folder path")
    if ancestor.exists() and not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {path}: no permission to write in {ancestor}")
    return path


# One lock per file and process, shared by that process's stores: {resolved lock path: [fd, users, pid]}
# (the pid, so that a forked child does not take its parent's entry for its own lock).
_HELD: dict[str, list] = {}
_HELD_GUARD = threading.Lock()


def _holder_pid(fd) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 64).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return text if text.isdigit() else "unknown"


def _try_lock(fd, blocking: bool) -> bool:
    """Take the exclusive lock on `fd`; False when another process holds it and `blocking` is False."""
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            return False
        return True
    if msvcrt is not None:  # pragma: no cover - Windows: lock byte 0 (LK_LOCK retries for ~10 s, so loop)
        os.lseek(fd, 0, os.SEEK_SET)
        while True:
            try:
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
                return True
            except OSError:
                if not blocking:
                    return False
                import time

                time.sleep(0.5)
    # Neither: run unlocked, but say so (the report still drops duplicated rows).
    warnings.warn("no file locking on this platform (neither fcntl nor msvcrt): two runs writing the same "
                  "output can duplicate rows; `flowgp bench report` drops such duplicates", RuntimeWarning,
                  stacklevel=4)
    return True


def _acquire(path: Path, wait: bool) -> str:
    """Hold the exclusive lock of `path` (shared within this process); returns the registry key."""
    lock = lock_path(path)
    key = str(lock.resolve())
    with _HELD_GUARD:
        held = _HELD.get(key)
        if held is not None and held[2] == os.getpid():
            held[1] += 1
            return key
    # Not under the guard: a wait can be long, and other stores of this process must not queue behind it.
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        if not _try_lock(fd, blocking=False):
            if not wait:
                raise OutputLocked(f"{path} is being written by another flowgp process (PID "
                                   f"{_holder_pid(fd)}, lock file {lock}); wait for it to finish, pass "
                                   "--wait to queue behind it, or choose another --out")
            print(f"waiting for {path}: another flowgp process (PID {_holder_pid(fd)}) is writing it",
                  file=sys.stderr)
            _try_lock(fd, blocking=True)
        # Say who holds it, for the message of the next writer (a stale PID is harmless: only the lock counts).
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
    except BaseException:
        os.close(fd)  # closing the descriptor also drops a lock taken on it
        raise
    with _HELD_GUARD:
        _HELD[key] = [fd, 1, os.getpid()]
    return key


def _release(key: str) -> None:
    with _HELD_GUARD:
        held = _HELD.get(key)
        if held is None or held[2] != os.getpid():
            return
        held[1] -= 1
        if held[1] == 0:
            del _HELD[key]
            os.close(held[0])  # releases the flock; the lock file stays (removing it would race a waiter)


def _key_value(value):
    # Normalise so 100 and 100.0, or a tuple and a list, give the same key after a JSON round trip.
    return json.dumps(value, sort_keys=True)


def read_rows(path) -> list[dict]:
    """Every valid row of a JSON-lines file (torn or malformed lines are skipped); [] for a missing file.

    Args:
        path: the JSON-lines file.

    See Also:
        :class:`flowgp.bench.results.ResultStore` (an example).
    """
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


def read_row_files(paths) -> list[dict]:
    """The rows of several JSON-lines files read as one, in order (`read_rows` each); a file that does not exist
    is an error (FileNotFoundError naming it), not an empty result: these are a command's inputs.

    Args:
        paths: the JSON-lines files, in order.

    See Also:
        :func:`flowgp.bench.results.read_rows`.
    """
    rows = []
    for path in paths:
        if not Path(path).is_file():
            raise FileNotFoundError(f"rows file {path} does not exist (give the .jsonl a bench run wrote)")
        rows += read_rows(path)
    return rows

class ResultStore:
    """JSON-lines file of result rows, keyed by `key_fields` (see the module docstring for the guarantees).

    Holds the file's exclusive lock until `close()` (also a context manager); `wait=False` raises
    `OutputLocked` when another process writes the file, `wait=True` blocks until it is done.

    Args:
        path: the JSON-lines file (created with its folder when missing).
        key_fields: the names of the fields that identify a row (a non-empty sequence).
        wait: as above.
        key_defaults: {field: value} for key fields that rows written before the field existed lack.

    Examples:
        >>> import os, tempfile
        >>> from flowgp.bench.results import ResultStore, read_rows
        >>> path = os.path.join(tempfile.mkdtemp(), "rows.jsonl")
        >>> with ResultStore(path, key_fields=("dataset", "split")) as store:
        ...     store.append({"dataset": "boston", "split": 0, "nll": 2.5})
        >>> read_rows(path)
        [{'dataset': 'boston', 'nll': 2.5, 'split': 0}]
    """

    def __init__(self, path, key_fields, wait: bool = False, key_defaults=None):
        if isinstance(key_fields, str) or not key_fields:
            raise ValueError("key_fields must be a non-empty sequence of field names, e.g. ('dataset', 'split')")
        self.path = Path(path)
        self.key_fields = tuple(key_fields)
        self.key_defaults = dict(key_defaults or {})
        unknown = sorted(set(self.key_defaults) - set(self.key_fields))
        if unknown:
            raise ValueError(f"key_defaults names {unknown}, which are not key fields; key_fields are "
                             f"{list(self.key_fields)}")
        self._lock_key = None
        if self.path.is_dir():
            raise ValueError(f"result file {self.path} is a folder; pass a file path such as {self.path / 'results.jsonl'}")
        check_output_folder(self.path.parent, "result folder")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock_key = _acquire(self.path, wait)  # before reading: the rows of a writer we waited for count
        self._repair()
        self._rows = read_rows(self.path)
        self._keys = {self.key(r) for r in self._rows
                      if all(f in r or f in self.key_defaults for f in self.key_fields)}

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

    def close(self) -> None:
        """Release the lock (idempotent); the process's exit releases it too."""
        if self._lock_key is not None:
            key, self._lock_key = self._lock_key, None
            _release(key)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def key(self, row: dict) -> tuple:
        missing = [f for f in self.key_fields if f not in row and f not in self.key_defaults]
        if missing:
            raise ValueError(f"row is missing key fields {missing}; key_fields are {list(self.key_fields)}")
        return tuple(_key_value(row[f] if f in row else self.key_defaults[f]) for f in self.key_fields)

    def is_done(self, row: dict) -> bool:
        return self.key(row) in self._keys

    @property
    def rows(self) -> list[dict]:
        return list(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def append(self, row: dict) -> None:
        """Write one row as one complete line (single write, flush, fsync)."""
        if self._lock_key is None:
            raise RuntimeError(f"result store {self.path} is closed (its lock was released); open a new one")
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
