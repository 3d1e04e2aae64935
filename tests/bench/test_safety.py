"""Bench safety: one writer per output file, de-duplicated reports, workers that die with their
parent, and `--out FILE` refused before any work."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import flowgp
from bench_fixtures import make_data_dir
from flowgp.bench import report as R
from flowgp.bench.results import OutputLocked, ResultStore, lock_path
from flowgp.bench.runner import die_with_parent
from flowgp.cli import main

pytestmark = pytest.mark.usefixtures("bench_state_in_tmp")

KEY = ("dataset", "split")
SRC = str(Path(flowgp.__file__).resolve().parents[1])
posix_only = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")


def _env(extra_path=None):
    path = os.pathsep.join(p for p in (SRC, extra_path, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _wait_for(cond, timeout, what):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _hold_lock(path):
    """A separate process holding `path`'s ResultStore (its lock) until killed; returns it once it holds."""
    code = textwrap.dedent(f"""
        import sys, time
        from flowgp.bench.results import ResultStore
        store = ResultStore({str(path)!r}, {KEY!r})
        store.append({{"dataset": "held", "split": 0}})
        print("locked", flush=True)
        time.sleep(300)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], env=_env(), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _kill(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


# ----- 1. exclusive lock on the output file -------------------------------------------------------------
@posix_only
def test_second_writer_stops_with_the_holders_pid_or_waits_for_it(tmp_path):
    path = tmp_path / "r.jsonl"
    holder = _hold_lock(path)
    try:
        with pytest.raises(OutputLocked) as info:
            ResultStore(path, KEY)
        msg = str(info.value)
        assert "\n" not in msg and str(path) in msg and f"PID {holder.pid}" in msg and "--wait" in msg
        assert lock_path(path).exists()

        got = {}

        def waiter():
            with ResultStore(path, KEY, wait=True) as store:
                got["rows"] = store.rows
                store.append({"dataset": "waited", "split": 0})

        t = threading.Thread(target=waiter, daemon=True)
        t.start()
        time.sleep(1.0)
        assert t.is_alive() and "rows" not in got  # queued behind the holder
        _kill(holder)  # the kernel drops a dead process's lock: no stale lock after a crash
        t.join(timeout=20)
        assert not t.is_alive()
        assert got["rows"] == [{"dataset": "held", "split": 0}]  # read after the holder's rows landed
    finally:
        _kill(holder)
    # released on close: another process can take it now
    check = subprocess.run([sys.executable, "-c", f"from flowgp.bench.results import ResultStore; "
                            f"ResultStore({str(path)!r}, {KEY!r})"], env=_env(), capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_stores_of_one_process_share_the_lock(tmp_path):
    path = tmp_path / "r.jsonl"
    with ResultStore(path, KEY) as a:
        b = ResultStore(path, KEY)
        b.append({"dataset": "x", "split": 1})
        b.close()
        a.append({"dataset": "x", "split": 2})  # still held by `a`
    with pytest.raises(RuntimeError, match="closed"):
        a.append({"dataset": "x", "split": 3})


@posix_only
def test_cli_second_run_on_a_held_output_stops_at_once(tmp_path, capsys):
    data_dir = make_data_dir(tmp_path / "data", n=40)
    out = tmp_path / "res"
    holder = _hold_lock(out / "uci.jsonl")
    try:
        start = time.time()
        code = main(["bench", "uci", "--datasets", "toy", "--models", "svgp", "--splits", "0", "--inducing", "3",
                     "--preset", "tiny", "--data-dir", str(data_dir), "--out", str(out), "--quiet"])
        err = capsys.readouterr().err.strip()
        assert code == 75 and time.time() - start < 30
        assert len(err.splitlines()) == 1 and "uci.jsonl" in err and f"PID {holder.pid}" in err
        assert [json.loads(s)["dataset"] for s in (out / "uci.jsonl").read_text().splitlines()] == ["held"]
    finally:
        _kill(holder)


# ----- 2. bench report drops duplicated rows ---------------------------------------------------------------
def _uci_row(model, split, nll, **extra):
    return dict(dataset="d1", model=model, num_inducing=5, split=split, preset="tiny", seed=split,
                task="regression", nll=nll, rmse=nll, coverage95=0.9, **extra)


def test_report_drops_duplicate_rows_and_says_how_many(tmp_path, capsys):
    rows = [_uci_row("svgp", s, v) for s, v in enumerate([1.0, 2.0, 3.0])]
    # a second run on the same output wrote every row again (other timings, same identity) ...
    # (a row without `row_order`, written before the field existed, is a row of the file's order)
    dup = [dict(r, train_seconds=9.0, nll=r["nll"] + 0.5, rmse=r["rmse"] + 0.5, row_order="file") for r in rows]
    # ... while rows that differ in any identifying field are distinct results and stay
    distinct = [_uci_row("svgp", 0, 7.0) | {"num_inducing": 10}, _uci_row("svgp", 0, 7.0) | {"preset": "quick"},
                _uci_row("svgp", 0, 7.0) | {"seed": 5}, _uci_row("svgp", 0, 7.0) | {"row_order": "authors"}]
    app = dict(dataset="airquality", model="svgp", flow="none", flow_init="none", inducing_fraction=0.1,
               fix_noise_fraction=0.6, seed=0, fold=0, protocol="cv", preset="tiny", rmse=4.0, nll=2.0)
    (tmp_path / "uci.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows + dup + distinct + [app, app]))
    kept, dropped = R.deduplicate(R.load_rows([tmp_path]))
    assert dropped == 4 and len(kept) == 3 + 4 + 1
    assert [r["nll"] for r in kept[:3]] == [1.0, 2.0, 3.0]  # the first of each is kept
    # the same folder given twice is not counted twice either
    assert R.deduplicate(R.load_rows([tmp_path, tmp_path]))[1] == 2 * 12 - 8
    assert main(["bench", "report", str(tmp_path), "--no-figures"]) == 0
    err = capsys.readouterr().err
    assert "dropped 4 duplicate row(s)" in err
    text = (tmp_path / "report.md").read_text()
    assert "4 duplicate rows dropped" in text
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["duplicates_dropped"] == 4
    cell = [c for c in summary["benchmark"]["tiny/regression"] if c["model"] == "svgp" and c["num_inducing"] == 5]
    # splits 0-2 once each plus the seed-5 row: 4 values, not 7 (the duplicates would also move the mean)
    assert cell[0]["nll"]["n"] == 4 and cell[0]["nll"]["mean"] == pytest.approx((1 + 2 + 3 + 7) / 4)
    # the split of another row order is a table of its own
    assert summary["benchmark"]["tiny-authors-order/regression"][0]["nll"]["n"] == 1


# ----- 3. workers die with their parent ------------------------------------------------------------------------
def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # a zombie has ended
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@posix_only
def test_jobs_workers_die_when_the_parent_is_killed(tmp_path):
    (tmp_path / "slowjobs.py").write_text(textwrap.dedent("""
        import os, time
        from pathlib import Path

        def work(job):
            Path(job["dir"], f"worker-{os.getpid()}").write_text("")
            time.sleep(300)
            return job
    """))
    (tmp_path / "parent.py").write_text(textwrap.dedent(f"""
        import slowjobs
        from flowgp.bench.results import ResultStore
        from flowgp.bench.runner import run_jobs

        if __name__ == "__main__":
            store = ResultStore({str(tmp_path / "r.jsonl")!r}, ("dataset", "split"))
            jobs = [{{"dataset": "sleep", "split": i, "dir": {str(tmp_path)!r}}} for i in range(4)]
            run_jobs(jobs, slowjobs.work, store, 2, verbose=False)
    """))
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py")], env=_env(str(tmp_path)),
                              cwd=tmp_path)
    workers = []
    try:
        _wait_for(lambda: len(list(tmp_path.glob("worker-*"))) == 2, 120, "both workers to start a job")
        workers = [int(p.name.split("-")[1]) for p in tmp_path.glob("worker-*")]
        assert all(_alive(w) for w in workers)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        _wait_for(lambda: not any(_alive(w) for w in workers), 10, f"workers {workers} to end with their parent")
    finally:
        _kill(parent)
        for w in workers:
            if _alive(w):
                os.kill(w, signal.SIGKILL)


@posix_only
def test_die_with_parent_poll_fallback(tmp_path):
    """The portable fallback (a thread polling os.getppid()) also ends an orphan."""
    code = textwrap.dedent("""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", (
            "import os, sys, time\\n"
            "from flowgp.bench import runner\\n"
            "runner.sys.platform = 'other'  # take the portable branch\\n"
            "assert runner.die_with_parent(os.getppid(), poll_interval=0.05) == 'poll'\\n"
            "print(os.getpid(), flush=True)\\n"
            "time.sleep(300)\\n")], stdout=subprocess.PIPE, text=True)
        print(child.stdout.readline().strip(), flush=True)
        time.sleep(300)
    """)
    parent = subprocess.Popen([sys.executable, "-c", code], env=_env(), stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        _wait_for(lambda: not _alive(child), 10, "the orphan to notice")
    finally:
        _kill(parent)
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)


# ----- 4. --out FILE is refused before any work ------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["uci", "--datasets", "toy", "--models", "svgp", "--splits", "0", "--inducing", "3", "--preset", "tiny"],
    ["airquality", "--models", "svgp", "--seeds", "0", "--folds", "0", "--preset", "tiny"],
    ["timing", "--dataset", "toy", "--epochs", "1", "--repeats", "1"],
    ["snr", "--layers", "1", "--num-importance", "1", "--train-iterations", "1"],
    ["amogp", "--experiment", "artificial", "--epochs", "1", "--baseline-epochs", "1"],
])
@pytest.mark.parametrize("where", ["file", "below-file"])
def test_out_pointing_at_a_file_is_one_line_exit_2(argv, where, tmp_path, capsys, monkeypatch):
    data_dir = make_data_dir(tmp_path / "data", n=40)
    target = tmp_path / "results.txt"
    target.write_text("not a folder\n")
    out = target if where == "file" else target / "sub"
    import flowgp.bench.runner as runner

    def no_work(*a, **k):
        raise AssertionError("work started before --out was checked")

    monkeypatch.setattr(runner, "fit_and_score", no_work)
    extra = ["--data-dir", str(data_dir)] if argv[0] in ("uci", "airquality", "timing") else []
    code = main(["bench", *argv, *extra, "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "Traceback" not in err and str(target) in err and "folder" in err
    assert target.read_text() == "not a folder\n"


def test_out_file_from_the_command_line_and_report_dirs(tmp_path):
    target = tmp_path / "results.txt"
    target.write_text("x\n")
    proc = subprocess.run([sys.executable, "-m", "flowgp.cli", "bench", "uci", "--datasets", "toy",
                           "--out", str(target)], env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "is a file" in proc.stderr
    assert main(["bench", "report", str(tmp_path), "--out", str(target), "--no-figures"]) == 2
    assert main(["bench", "report", str(target), "--no-figures"]) == 2
