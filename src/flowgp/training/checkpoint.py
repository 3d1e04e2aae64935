"""Atomic, checksummed checkpoints: write to a temporary file in the same folder, fsync, then rename over the target.

A crash mid-write never leaves a truncated file where a good one was. A dict is stored with one more entry,
`flowgp_sha256`, the SHA-256 digest of its content (every tensor's dtype, shape and bytes, every key and plain
value, in a fixed order); `safe_load` recomputes it and refuses a file whose content does not match (a bit flip,
a file edited by hand). Loading uses weights_only=True, so a checkpoint cannot execute code, and the file stays a
plain torch file: `torch.load(path, weights_only=True)` reads it without flowgp. Files written before the
checksum existed (no `flowgp_sha256` entry) still load.

The temporary file is named `.<target name>.<writer pid>.<8 random characters>.tmp`. A save killed before its
rename (kill -9, power loss) leaves that file behind; the next save to the same target removes such orphans
(those whose writer process is gone, and unnamed-writer ones from older versions after ten minutes). The saved
file gets the mode an ordinary `open(path, "w")` would give, 0o666 less the user's umask (tempfile's own files
are 0o600).

A training checkpoint is only ever resumed by the run that wrote it: `flowgp.training.loop.train` records the run's
fingerprint in it (a flat dict of strings: the digest of the training rows, `flowgp.data.sources.DataDigest`,
and for an estimator its class, the flowgp version and its parameters) and refuses a file whose fingerprint is
not this run's with `FingerprintMismatch`, a ValueError naming every field that differs and the fix. The
estimators hand their fingerprint to `train` with the path, as a `FingerprintedPath`.
"""
from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
from pathlib import Path

import torch

__all__ = ["atomic_save", "safe_load", "content_digest", "remove_orphans", "current_umask", "CHECKSUM_KEY",
           "FingerprintedPath", "FingerprintMismatch", "fingerprint_differences", "check_fingerprint"]

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
    remove_orphans(path)
    fd, tmp = _temporary_file(path)
    try:
        os.chmod(tmp, 0o666 & ~current_umask())
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


#: how often `atomic_save` re-creates its target's folder when another process removed it in the meantime
FOLDER_RETRIES = 5


def _temporary_file(path: Path) -> tuple[int, str]:
    """A new temporary file beside `path` (named as the module doc says), its folder created first.

    Parallel bench workers share a checkpoint folder and each removes it once it is empty
    (`flowgp.bench.runner`), so the folder can vanish between creating it and creating the file in it; it is
    then created again. Once the file exists the folder is not empty and cannot be removed under the save.
    """
    for attempt in range(FOLDER_RETRIES + 1):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            return tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
        except FileNotFoundError:
            if attempt == FOLDER_RETRIES or path.parent.exists():
                raise  # not the race above: something else is missing
    raise AssertionError("unreachable")


#: a temporary file of `atomic_save` whose writer left no process id (versions before the id was written) is
#: taken for an orphan once it is this old; no save takes that long
LEGACY_ORPHAN_AGE_S = 600.0


def current_umask() -> int:
    """The process's file-creation mask, read without changing it where the system allows (Linux /proc)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere the only way to read it is to set it; put it straight back
    os.umask(mask)
    return mask


def _writer_alive(pid: int) -> bool:
    if os.name != "posix":
        return True  # os.kill(pid, 0) would terminate the process on Windows; the age rule applies there
    if pid == os.getpid():
        return True  # another thread of this process may be saving to the same target right now
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists under another user, or the system cannot tell: leave the file alone
    return True


def remove_orphans(path) -> list[Path]:
    """Delete the temporary files a killed `atomic_save` to `path` left behind; returns the paths removed.

    Only files of this writer's naming scheme for this target are considered, and only those whose writer
    process no longer exists (or, for names without a process id, older than `LEGACY_ORPHAN_AGE_S`): a save
    in progress elsewhere is never disturbed.
    """
    path = Path(path)
    name = re.escape(path.name)
    with_pid = re.compile(rf"\.{name}\.(\d+)\.[a-z0-9_]{{8}}\.tmp")
    legacy = re.compile(rf"\.{name}\.[a-z0-9_]{{8}}\.tmp")
    removed = []
    try:
        candidates = list(path.parent.glob(f".{glob_escape(path.name)}.*.tmp"))
    except OSError:
        return removed
    now = time.time()
    for tmp in candidates:
        match = with_pid.fullmatch(tmp.name)
        try:
            if match:
                orphan = not _writer_alive(int(match.group(1))) or (
                    os.name != "posix" and now - tmp.stat().st_mtime > LEGACY_ORPHAN_AGE_S)
            elif legacy.fullmatch(tmp.name):
                orphan = now - tmp.stat().st_mtime > LEGACY_ORPHAN_AGE_S
            else:
                continue
            if orphan and tmp.is_file():
                tmp.unlink()
                removed.append(tmp)
        except OSError:
            continue  # gone already, or not ours to delete: the save itself goes on
    return removed


def glob_escape(name: str) -> str:
    """`name` with glob's special characters ([, ], *, ?) made literal."""
    return re.sub(r"([\[\]*?])", r"[\1]", name)


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


class FingerprintedPath(os.PathLike):
    """A checkpoint path with the fingerprint of the run that writes it (`flowgp.training.loop.train` records it
    in the checkpoint and resumes only a file that holds the same). `fingerprint`: a flat dict of strings."""

    def __init__(self, path, fingerprint: dict):
        self.path = Path(path)
        if not isinstance(fingerprint, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in fingerprint.items()):
            raise TypeError("a checkpoint fingerprint is a dict of strings (field name -> value)")
        self.fingerprint = dict(fingerprint)

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"FingerprintedPath({str(self.path)!r})"


class FingerprintMismatch(ValueError):
    """A checkpoint was written by a run on other data or with other settings than the one resuming it."""


def fingerprint_differences(saved: dict, current: dict) -> list[str]:
    """'field: <saved> in the checkpoint, <current> now' for every field that differs (absent: 'none')."""
    out = []
    for key in sorted(set(saved) | set(current)):
        old, new = saved.get(key, "none"), current.get(key, "none")
        if old != new:
            out.append(f"{key}: {_short(old)} in the checkpoint, {_short(new)} now")
    return out


def _short(value: str, limit: int = 80) -> str:
    return value if len(value) <= limit else value[:limit - 3] + "..."


def check_fingerprint(path, saved, current: dict) -> None:
    """FingerprintMismatch naming the differing fields and the fix unless the checkpoint at `path` (whose
    recorded fingerprint is `saved`) was written by this run (`current`)."""
    if not isinstance(saved, dict):
        raise FingerprintMismatch(f"the checkpoint {path} holds no readable fingerprint; delete it to train afresh, "
                                  "or pass another checkpoint path")
    differences = fingerprint_differences(saved, current)
    if differences:
        raise FingerprintMismatch(
            f"the checkpoint {path} was written by another fit, so resuming from it would hand back that fit's "
            f"model: {'; '.join(differences)}. Delete {path} to train afresh, or pass another checkpoint path "
            "(one per fit: e.g. checkpoint=None for cross-validation, whose folds are different fits)")
