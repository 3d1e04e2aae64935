"""atomic_save's file hygiene: orphans of a killed save are cleaned up, the mode follows the umask."""
import os
import stat
import subprocess
import sys
import time

import pytest
import torch

from flowgp.training.checkpoint import atomic_save, safe_load


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.skipif(os.name != "posix", reason="writer liveness is checked with POSIX signals")
def test_orphans_of_a_killed_save_are_removed_by_the_next_save(tmp_path):
    target = tmp_path / "model.pt"
    atomic_save({"w": torch.ones(3)}, target)
    # what `kill -9` during a save leaves: the writer's temporary file, its process gone
    orphan = tmp_path / f".model.pt.{_dead_pid()}.abc12_xy.tmp"
    orphan.write_bytes(b"half a checkpoint")
    legacy = tmp_path / ".model.pt.k3j2h1g0.tmp"  # the naming of earlier versions (no writer id), long ago
    legacy.write_bytes(b"older half")
    old = time.time() - 3600
    os.utime(legacy, (old, old))
    # never touched: a save in progress (a live writer), a fresh unnamed-writer file, other targets, other files
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / f".model.pt.{sleeper.pid}.zzzzzzzz.tmp"
        keep = [live, tmp_path / ".model.pt.freshnow.tmp", tmp_path / f".other.pt.{_dead_pid()}.abcdefgh.tmp",
                tmp_path / "model.pt.tmp", tmp_path / f".model.pt.{_dead_pid()}.notes.txt"]
        for path in keep:
            path.write_bytes(b"x")
        atomic_save({"w": torch.zeros(3)}, target)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not orphan.exists() and not legacy.exists()
    assert all(path.exists() for path in keep)
    assert torch.equal(safe_load(target)["w"], torch.zeros(3))
    # the save itself leaves nothing behind
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".model.pt.") and p not in keep) == []


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_the_saved_file_mode_follows_the_umask(tmp_path, mask):
    # tempfile creates 0o600 files; a saved model must be as readable as any file the user writes
    previous = os.umask(mask)
    try:
        path = atomic_save({"w": torch.ones(2)}, tmp_path / "m.pt")
        plain = tmp_path / "plain.txt"
        plain.write_text("x")
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~mask == stat.S_IMODE(plain.stat().st_mode)


def test_a_save_recreates_its_folder_when_a_parallel_worker_removed_it(tmp_path, monkeypatch):
    """Bench workers remove their shared checkpoint folder once it is empty; a save that created the folder just
    before must create it again, not fail (seen in CI on 2026-11-29: FileNotFoundError naming the temporary file)."""
    import flowgp.training.checkpoint as checkpoint

    folder = tmp_path / "checkpoints"
    real = checkpoint.tempfile.mkstemp
    calls = []

    def mkstemp_after_another_worker_removed_the_folder(*args, **kwargs):
        calls.append(1)
        if len(calls) <= 2:
            folder.rmdir()  # the other worker's `_remove_checkpoint`, between mkdir and mkstemp (twice)
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoint.tempfile, "mkstemp", mkstemp_after_another_worker_removed_the_folder)
    atomic_save({"w": torch.ones(2)}, folder / "fit.pt")
    assert len(calls) == 3
    assert torch.equal(safe_load(folder / "fit.pt")["w"], torch.ones(2))


def test_a_save_into_a_path_under_a_file_still_fails_clearly(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    with pytest.raises((FileExistsError, NotADirectoryError)):
        atomic_save({"w": torch.ones(2)}, blocker / "fit.pt")
