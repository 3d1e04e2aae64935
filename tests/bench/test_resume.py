"""Kill `flowgp bench uci` mid-run (SIGKILL after the first row lands), rerun, and get the same final rows."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import flowgp
from bench_fixtures import make_data_dir
from flowgp.cli import main

pytestmark = pytest.mark.usefixtures("bench_state_in_tmp")

TIMING = ("train_seconds", "predict_seconds", "resumed_train_seconds")


def _cmd(data_dir, out):
    return [sys.executable, "-m", "flowgp.cli", "bench", "uci", "--datasets", "toy", "--models", "svgp,tgp",
            "--splits", "0-2", "--inducing", "5", "--preset", "tiny", "--data-dir", str(data_dir),
            "--out", str(out), "--quiet"]


SRC = str(Path(flowgp.__file__).resolve().parents[1])


def _env():
    # the subprocesses run in the test's tmp_path (conftest), so flowgp's path must not be relative
    path = os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _rows(path):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return sorted(({k: v for k, v in r.items() if k not in TIMING} for r in rows),
                  key=lambda r: (r["model"], r["split"]))


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_kill_and_resume_gives_same_rows(tmp_path):
    data_dir = make_data_dir(tmp_path / "data", n=40)
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    assert main(_cmd(data_dir, ref)[3:]) == 0  # uninterrupted reference run, in-process
    proc = subprocess.Popen(_cmd(data_dir, cut), env=_env())
    out = cut / "uci.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and not (out.exists() and out.read_text().count("\n") >= 1):
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    done_before = out.read_text().count("\n")
    assert 1 <= done_before < 6  # really interrupted mid-run
    # a torn tail left by a kill during a write must not break the rerun
    with open(out, "a") as fh:
        fh.write('{"dataset": "toy", "mod')
    subprocess.run(_cmd(data_dir, cut), check=True, env=_env(), timeout=120)
    got, want = _rows(out), _rows(ref / "uci.jsonl")
    assert len(want) == 6
    assert [(r["model"], r["split"]) for r in got] == [(r["model"], r["split"]) for r in want]  # no duplicates
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in ("nll", "rmse", "coverage95"):
            assert g[k] == pytest.approx(w[k], rel=1e-9, abs=1e-12)


def test_parallel_jobs_give_the_same_rows(tmp_path):
    data_dir = make_data_dir(tmp_path / "data", n=40)
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(_cmd(data_dir, one)[3:]) == 0
    assert main(_cmd(data_dir, two)[3:] + ["--jobs", "2"]) == 0
    got, want = _rows(two / "uci.jsonl"), _rows(one / "uci.jsonl")
    assert len(got) == len(want) == 6
    for g, w in zip(got, want):
        assert (g["model"], g["split"]) == (w["model"], w["split"])
        assert g["nll"] == pytest.approx(w["nll"], rel=1e-9)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_a_fit_killed_mid_way_continues_from_its_checkpoint(tmp_path, monkeypatch):
    """SIGKILL during a fit, after its first checkpoint (every 100 epochs) and before its row: the rerun loads that
    checkpoint, writes the row an uninterrupted run writes, and removes the fit's checkpoint files. The state lives
    in runs/bench/<name of OUT> under the current directory (here tmp_path), never in the results folder."""
    import flowgp.training.loop as training

    data_dir = make_data_dir(tmp_path / "data", n=40)
    ref, cut = tmp_path / "ref", tmp_path / "cut"

    def cmd(out):
        return [sys.executable, "-m", "flowgp.cli", "bench", "uci", "--datasets", "toy", "--models", "svgp",
                "--splits", "0", "--inducing", "5", "--preset", "tiny", "--epochs", "1000",
                "--data-dir", str(data_dir), "--out", str(out), "--quiet"]

    assert main(cmd(ref)[3:]) == 0
    assert not (tmp_path / "runs" / "bench" / "ref").exists()  # removed once the row was written
    proc = subprocess.Popen(cmd(cut), env=_env())
    deadline = time.time() + 120
    folder = tmp_path / "runs" / "bench" / "cut"
    while time.time() < deadline and not (folder.is_dir() and any(folder.glob("*.pt"))):
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    saved = list(folder.glob("*.pt"))
    assert len(saved) == 1 and not (cut / "uci.jsonl").exists()  # killed mid-fit, state on disk
    assert not any(p.suffix == ".pt" for p in cut.rglob("*"))  # nothing of the fit's state in the results folder
    import flowgp.training.run_state as run_state

    loads = []
    original = training.safe_load
    for module in (training, run_state):  # the file's training seconds are read by the one, the state by the other
        monkeypatch.setattr(module, "safe_load", lambda path, **kw: loads.append(str(path)) or original(path, **kw))
    assert main(cmd(cut)[3:]) == 0
    # the rerun continued from it (the bench reads the file's training seconds first, the loop then loads it)
    assert [Path(p).resolve() for p in loads] == [saved[0].resolve()] * 2
    assert not folder.exists()
    got, want = _rows(cut / "uci.jsonl"), _rows(ref / "uci.jsonl")
    assert len(got) == len(want) == 1
    # the row's training time counts the killed process's loop too
    raw_ref, raw_cut = (json.loads((d / "uci.jsonl").read_text()) for d in (ref, cut))
    assert "resumed_train_seconds" not in raw_ref
    assert 0 < raw_cut["resumed_train_seconds"] < raw_cut["train_seconds"]
    for k in ("nll", "rmse", "coverage95", "train_elbo"):
        assert got[0][k] == pytest.approx(want[0][k], rel=1e-9, abs=1e-12)


def test_a_checkpoint_that_cannot_be_continued_is_replaced(tmp_path, capsys):
    """A fit's checkpoint left by other code or damaged (here: garbage bytes) is not a dead end: the bench says so,
    removes it and fits from the start, writing the row an uninterrupted run writes. Here the state folder is given
    with --state-dir."""
    from flowgp.bench.runner import checkpoint_file
    from flowgp.bench.uci import KEY_DEFAULTS, KEY_FIELDS

    data_dir = make_data_dir(tmp_path / "data", n=40)
    ref, out, state = tmp_path / "ref", tmp_path / "out", tmp_path / "elsewhere" / "state"
    args = ["bench", "uci", "--datasets", "toy", "--models", "svgp", "--splits", "0", "--inducing", "5",
            "--preset", "tiny", "--data-dir", str(data_dir), "--quiet"]
    assert main(args + ["--out", str(ref)]) == 0
    job = {"dataset": "toy", "model": "svgp", "num_inducing": 5, "split": 0, "preset": "tiny", "seed": 0}
    stale = checkpoint_file(state, job, KEY_FIELDS, KEY_DEFAULTS)
    os.makedirs(os.path.dirname(stale))
    with open(stale, "wb") as fh:
        fh.write(b"not a checkpoint")
    assert main(args + ["--out", str(out), "--state-dir", str(state)]) == 0
    assert "could not continue from" in capsys.readouterr().err
    assert not state.exists() and not (tmp_path / "runs").exists()
    got, want = _rows(out / "uci.jsonl"), _rows(ref / "uci.jsonl")
    assert got[0]["nll"] == pytest.approx(want[0]["nll"], rel=1e-9)
