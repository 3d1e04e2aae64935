"""The exit codes of the command line (0 success, 1 any other failure, 2 usage error, 75 busy, 130 interrupted),
one test each; an interrupted `flowgp fit`, `flowgp predict` or `flowgp bench` (SIGINT to the process, as Ctrl-C
sends) prints exactly one line on stderr, no traceback, and says what was saved."""
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from bench_fixtures import make_data_dir
from flowgp.cli import main

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to another process is POSIX")


def _sine_csv(path, n=40, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, size=(n, 2))
    y = np.sin(x[:, 0]) + 0.1 * rng.standard_normal(n)
    path.write_text("u,v,target\n" + "\n".join(f"{a},{b},{t}" for (a, b), t in zip(x, y)) + "\n")
    return path


FIT = ["--target", "target", "--model", "svgp", "--num-inducing", "4", "--quiet"]


def test_exit_code_0_on_success_and_every_code_in_the_help(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    shown = capsys.readouterr().out
    for code, meaning in ((0, "success"), (1, "any other failure"), (2, "usage error"), (75, "busy"),
                          (130, "interrupted")):
        assert re.search(rf"^  {code}\s+{meaning}", shown, re.M), (code, shown)
    csv = _sine_csv(tmp_path / "d.csv")
    assert main(["fit", "--data", str(csv), *FIT, "--epochs", "2", "--out", str(tmp_path / "m.pt")]) == 0


def test_exit_code_2_for_a_usage_error_before_any_work(tmp_path, capsys):
    csv = _sine_csv(tmp_path / "d.csv")
    assert main(["fit", "--data", str(csv), *FIT, "--epochs", "2", "--out", str(csv)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flowgp fit: error: --out") and len(err.strip().splitlines()) == 1


def test_exit_code_1_for_any_other_failure_with_its_traceback(tmp_path, capsys, monkeypatch):
    from flowgp.models import SVGP

    def broken(self, *args, **kwargs):
        raise RuntimeError("a failure that is not the user's")

    monkeypatch.setattr(SVGP, "elbo", broken)
    csv = _sine_csv(tmp_path / "d.csv")
    assert main(["fit", "--data", str(csv), *FIT, "--epochs", "2", "--out", str(tmp_path / "m.pt")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().endswith("RuntimeError: a failure that is not the user's")
    assert not (tmp_path / "m.pt").exists()


@posix_only
def test_exit_code_75_when_another_process_writes_the_output(tmp_path, capsys):
    out = tmp_path / "res"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from flowgp.bench.results import ResultStore
        store = ResultStore({str(out / "uci.jsonl")!r}, ("dataset", "split"))
        print("locked", flush=True)
        time.sleep(120)
    """)], env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        code = main(["bench", "uci", "--datasets", "toy", "--models", "svgp", "--splits", "0", "--inducing", "3",
                     "--preset", "tiny", "--data-dir", str(make_data_dir(tmp_path / "data", n=20)),
                     "--out", str(out), "--quiet"])
        err = capsys.readouterr().err
        assert code == 75 and len(err.strip().splitlines()) == 1 and f"PID {holder.pid}" in err
    finally:
        holder.kill()
        holder.wait(timeout=30)


# ----- 130: interrupted ----------------------------------------------------------------------------------------
def _env():
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")
    path = os.pathsep.join([src] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _slowed_cli(argv, method, marker):
    """`flowgp <argv>` in a new process whose `method` ("module:Class.name") sleeps 10 ms a call and touches
    `marker` when first called: the test knows the work has started, and the work lasts long enough to be cut."""
    module, attribute = method.split(":")
    owner, name = attribute.split(".")
    code = textwrap.dedent(f"""
        import importlib, pathlib, sys, time
        owner = getattr(importlib.import_module({module!r}), {owner!r})
        original = getattr(owner, {name!r})

        def slowed(*args, **kwargs):
            pathlib.Path({str(marker)!r}).touch()
            time.sleep(0.01)
            return original(*args, **kwargs)

        setattr(owner, {name!r}, slowed)
        from flowgp.cli import main
        sys.exit(main({list(argv)!r}))
    """)
    return subprocess.Popen([sys.executable, "-c", code], env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _interrupt_when(proc, ready, timeout=120):
    deadline = time.time() + timeout
    while not ready() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, err


@posix_only
@pytest.mark.parametrize("checkpoint", [True, False])
def test_exit_code_130_and_one_line_when_fit_is_interrupted(tmp_path, checkpoint):
    csv = _sine_csv(tmp_path / "d.csv")
    ckpt, marker = tmp_path / "fit.ckpt", tmp_path / "started"
    argv = ["fit", "--data", str(csv), *FIT, "--epochs", "5000", "--out", str(tmp_path / "m.pt")]
    argv += ["--checkpoint", str(ckpt)] if checkpoint else []
    proc = _slowed_cli(argv, "flowgp.models:SVGP.elbo", marker)
    code, err = _interrupt_when(proc, marker.exists)
    assert code == 130 and len(err.splitlines()) == 1, err
    if checkpoint:
        match = re.fullmatch(r"flowgp fit: interrupted at step (\d+); state saved to (.+); rerun the same command "
                             r"to resume\n", err)
        assert match and match.group(2) == str(ckpt) and ckpt.exists(), err
        from flowgp.training.loop import checkpoint_training_seconds  # the file is a complete checkpoint

        assert checkpoint_training_seconds(ckpt) > 0
    else:
        assert re.fullmatch(r"flowgp fit: interrupted at step \d+; nothing saved\n", err), err
    assert not (tmp_path / "m.pt").exists()


@posix_only
def test_exit_code_130_and_one_line_when_predict_is_interrupted(tmp_path):
    csv = _sine_csv(tmp_path / "d.csv", n=3000)
    model, out, marker = tmp_path / "m.pt", tmp_path / "p.csv", tmp_path / "started"
    assert main(["fit", "--data", str(csv), *FIT, "--epochs", "2", "--out", str(model)]) == 0
    argv = ["predict", "--model", str(model), "--data", str(csv), "--out", str(out), "--chunk-rows", "10",
            "--quiet"]
    proc = _slowed_cli(argv, "flowgp.estimators:SVGPRegressor.predict", marker)
    code, err = _interrupt_when(proc, marker.exists)
    assert code == 130 and err == "flowgp predict: interrupted; nothing saved\n", err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.csv", "m.pt", "m.pt.json", "started"]


@posix_only
def test_exit_code_130_and_one_line_when_bench_is_interrupted(tmp_path):
    data_dir = make_data_dir(tmp_path / "data", n=40)
    out = tmp_path / "res"
    cmd = [sys.executable, "-m", "flowgp.cli", "bench", "uci", "--datasets", "toy", "--models", "svgp",
           "--splits", "0", "--inducing", "5", "--preset", "tiny", "--epochs", "3000", "--data-dir", str(data_dir),
           "--out", str(out), "--state-dir", str(tmp_path / "state"), "--quiet"]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    folder = tmp_path / "state"
    code, err = _interrupt_when(proc, lambda: folder.is_dir() and any(folder.glob("*.pt")))
    saved = list(folder.glob("*.pt"))
    assert code == 130 and len(saved) == 1, err
    assert re.fullmatch(rf"flowgp bench uci: interrupted at step \d+; state saved to {re.escape(str(saved[0]))}; "
                        r"rerun the same command to resume\n", err), err
