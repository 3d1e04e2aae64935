"""`flowgp bench images`: model names, a resumable tiny run on the digits, the missing-data error;
the ECE metric it reports; learning curves (`--curve-every`) and their figure (`flowgp bench images-curve`)."""
import json
import subprocess
import sys

import numpy as np
import pytest

from flowgp.bench.images import CURVE_SUBSET_SEED, KEY_FIELDS, curve_lines, curve_recorder, make_classifier, parse_model
from flowgp.reporting.metrics import expected_calibration_error

pytestmark = pytest.mark.usefixtures("bench_state_in_tmp")


def test_model_names():
    assert parse_model("sgp") == (1, "gaussian")
    assert parse_model("dgp4") == (4, "gaussian")
    assert parse_model("cnf-dgp3") == (3, "cnf")
    for bad in ("dgp", "cnf-dgp1", "dgp4x", "nf4"):
        with pytest.raises(ValueError):
            parse_model(bad)
    est = make_classifier("cnf-dgp4", "conv", (1, 28, 28), "paper", 60000, 0)
    assert (est.layers, est.num_inducing, est.likelihood, est.skip, est.batch_size) == (4, 100, "robustmax", "conv", 256)
    assert est.epochs == round(20000 * 256 / 60000)


def _bench(tmp_path, *extra):
    cmd = [sys.executable, "-m", "flowgp", "bench", "images", "--datasets", "digits", "--preset", "tiny",
           "--out", str(tmp_path), "--quiet", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_tiny_run_resumes_and_reports(tmp_path):
    done = _bench(tmp_path, "--models", "sgp,dgp2", "--skip", "conv,dense")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "images.jsonl").read_text().splitlines()]
    assert sorted((r["model"], r["skip"]) for r in rows) == [("dgp2", "conv"), ("dgp2", "dense"), ("sgp", "none")]
    for r in rows:
        assert 0 <= r["accuracy"] <= 1 and 0 <= r["ece"] <= 1 and np.isfinite(r["nll"]) and r["n_train"] == 500
    again = _bench(tmp_path, "--models", "sgp,dgp2", "--skip", "conv,dense")  # nothing left to run
    assert again.returncode == 0 and len((tmp_path / "images.jsonl").read_text().splitlines()) == 3


def test_missing_files_say_where(tmp_path):
    done = subprocess.run([sys.executable, "-m", "flowgp", "bench", "images", "--datasets", "mnist", "--data-dir",
                           str(tmp_path), "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "train-images-idx3-ubyte.gz is missing" in done.stderr and str(tmp_path / "images" / "mnist") in done.stderr


def test_expected_calibration_error():
    # all predictions confident 0.9 and right 90 % of the time: calibrated
    probs = np.tile([0.9, 0.1], (10, 1))
    labels = np.array([0] * 9 + [1])
    assert expected_calibration_error(labels, probs) == pytest.approx(0.0, abs=1e-12)
    # confident 0.9 and always wrong: ECE 0.9
    assert expected_calibration_error(np.ones(10, int), probs) == pytest.approx(0.9)
    with pytest.raises(ValueError, match="probs"):
        expected_calibration_error(labels[:5], probs)


def test_the_flow_classifier_keeps_the_dsvi_fit_as_its_base():
    # the bench's cnf-dgpL trains its Gaussian base with DSVI's own gradient from the first step (no DSVI warm
    # start, whose restarted optimiser would leave a different base): every shared parameter ends equal to the
    # dgpL fit's, and at flow strength 0 the class probabilities are the dgpL model's
    import torch
    from sklearn.datasets import load_digits

    digits = load_digits()
    x, y = digits.data[:240] / 16.0, digits.target[:240]
    fits = {}
    for model in ("dgp2", "cnf-dgp2"):
        est = make_classifier(model, "conv", (1, 8, 8), "tiny", len(y), 0).set_params(epochs=3, num_samples_predict=5)
        fits[model] = est.fit(x, y)
    base, flow = fits["dgp2"].model_.state_dict(), fits["cnf-dgp2"].model_.state_dict()
    shared = [k for k in base if "posterior" not in k]
    assert shared and all(torch.equal(base[k], flow[k]) for k in shared)
    with torch.no_grad():
        for p in fits["cnf-dgp2"].model_.posterior.parameters():
            p.zero_()  # every flow parameter is 0 at the identity: q(U) is the base
    np.testing.assert_allclose(fits["cnf-dgp2"].predict_proba(x[:50]), fits["dgp2"].predict_proba(x[:50]),
                               rtol=1e-10, atol=1e-12)


def test_steps_and_dtype_are_recorded_and_keyed(tmp_path):
    done = _bench(tmp_path, "--models", "sgp", "--steps", "3", "--dtype", "float32")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "images.jsonl").read_text().splitlines()]
    assert [(r["steps"], r["dtype"], r["device"], r["epochs"]) for r in rows] == [(3, "float32", "cpu", 1)]
    assert not (tmp_path / "curve.jsonl").exists()  # no learning curve unless --curve-every asks for one
    est = make_classifier("dgp4", "conv", (1, 28, 28), "paper", 60000, 0, steps=4700, dtype="float32")
    assert est.epochs == round(4700 * 256 / 60000) and est.dtype == "float32"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU: no error to check")
def test_device_cuda_without_a_gpu_is_an_error_before_any_work(tmp_path):
    done = _bench(tmp_path, "--models", "sgp", "--device", "cuda")
    assert done.returncode != 0
    assert "--device cuda" in done.stderr and "CUDA is not available" in done.stderr
    assert not (tmp_path / "images.jsonl").exists()


def test_device_cuda_runs_on_the_gpu(tmp_path):
    if not __import__("torch").cuda.is_available():
        pytest.skip("needs a CUDA device")
    done = _bench(tmp_path, "--models", "sgp,dgp2", "--steps", "3", "--device", "cuda")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "images.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["device"] == "cuda" and 0 <= r["accuracy"] <= 1 for r in rows)


@pytest.mark.slow
def test_images_nproc_2_writes_rows_of_world_size_2(tmp_path):
    import torch

    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    done = _bench(tmp_path, "--models", "sgp", "--steps", "2", "--nproc", "2")
    assert done.returncode == 0, done.stderr
    done = _bench(tmp_path, "--models", "sgp", "--steps", "2")  # one process: a row of its own, the same fit
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "images.jsonl").read_text().splitlines()]
    assert [(r["world_size"], r["device"]) for r in rows] == [(2, "cpu"), (1, "cpu")]
    assert abs(rows[0]["nll"] - rows[1]["nll"]) <= 1e-6 * abs(rows[1]["nll"])


# ----- learning curves ----------------------------------------------------------------------------------------
def _main(*argv) -> int:
    from flowgp.bench.cli import main

    return main([str(a) for a in argv])


_CURVE = ("images", "--datasets", "digits", "--preset", "tiny", "--quiet", "--curve-test", "60", "--curve-samples", "2")


def _points(path):
    from flowgp.bench.results import read_rows

    return read_rows(path)


def test_curve_points_land_every_k_steps_and_after_the_last(tmp_path):
    # tiny: 500 training images in batches of 128 = 4 steps per epoch; --steps 10 rounds to 3 epochs = 12 steps
    assert _main(*_CURVE, "--models", "sgp", "--steps", 10, "--curve-every", 5, "--out", tmp_path / "out") == 0
    points = _points(tmp_path / "out" / "curve.jsonl")
    row, = _points(tmp_path / "out" / "images.jsonl")
    assert [(p["step"], p["epoch"], p["steps_total"]) for p in points] == [(5, 1.25, 12), (10, 2.5, 12), (12, 3.0, 12)]
    for p in points:
        assert {k: p[k] for k in KEY_FIELDS} == {k: row[k] for k in KEY_FIELDS}
        assert (p["curve_test"], p["curve_images"], p["n_test"], p["curve_samples"]) == (60, 60, 450, 2)
        assert 0 <= p["accuracy"] <= 1 and 0 <= p["ece"] <= 1 and p["nll"] > 0 and p["eval_seconds"] > 0
        assert np.isfinite(p["train_objective"]) and p["train_objective"] < 0  # the bound per image, nats
    assert points[0]["train_seconds"] < points[1]["train_seconds"] < points[2]["train_seconds"]
    # the row's training time leaves the curve's evaluations out, and says how long they took
    assert row["curve_eval_seconds"] >= sum(p["eval_seconds"] for p in points) * 0.999


def test_the_curve_subset_is_stratified_and_fixed():
    from flowgp.bench.learning_curve import stratified_subset
    from flowgp.data.images import load_images

    labels = load_images("digits").y_test
    rows = stratified_subset(labels, 60, seed=CURVE_SUBSET_SEED)
    assert len(rows) == len(set(rows)) == 60
    share = np.bincount(labels[rows], minlength=10) / 60
    assert np.all(np.abs(share - np.bincount(labels, minlength=10) / len(labels)) <= 1 / 60)
    assert np.array_equal(rows, stratified_subset(labels, 60, seed=CURVE_SUBSET_SEED))


def test_a_fit_with_a_curve_ends_with_the_same_model(tmp_path):
    # the curve's evaluations (eval mode, no gradients, global random states restored) leave the fit as it is:
    # the same parameters bit for bit, and the same global random state afterwards
    import torch
    from flowgp.data.images import load_images

    data = load_images("digits")
    x, y = data.x_train[:240], data.y_train[:240]
    fits, states = [], []
    for with_curve in (False, True):
        est = make_classifier("dgp2", "conv", (1, 8, 8), "tiny", len(y), 0).set_params(epochs=4, num_samples_predict=5)
        job = {"dataset": "digits", "model": "dgp2", "skip": "conv", "seed": 0, "preset": "tiny", "max_train": 240,
               "steps": None, "dtype": "float64", "device": "cpu", "world_size": 1, "curve_path": tmp_path / "curve.jsonl",
               "curve_every": 3, "curve_test": 60, "curve_samples": 2}
        recorder, modes = curve_recorder(job, est, data, len(y)), []

        def watched(step, loss, model):
            recorder(step, loss, model)
            modes.append(model.training)  # back in training mode after every point

        torch.manual_seed(5)
        fits.append(est.fit(x, y, callback=watched if with_curve else None))
        states.append(torch.get_rng_state())
    assert [p["step"] for p in _points(tmp_path / "curve.jsonl")] == [3, 6, 8]  # 2 steps per epoch
    assert len(modes) == 8 and all(modes)
    plain, curved = fits[0].model_.state_dict(), fits[1].model_.state_dict()
    assert plain.keys() == curved.keys() and all(torch.equal(plain[k], curved[k]) for k in plain)
    assert torch.equal(states[0], states[1])
    np.testing.assert_array_equal(fits[0].predict_proba(data.x_test[:50]), fits[1].predict_proba(data.x_test[:50]))


def test_a_resumed_fit_continues_its_curve(tmp_path, monkeypatch):
    # a fit interrupted (Ctrl-C) while writing its point at step 9 saves that point and its state (in the
    # --state-dir given, an absolute path outside OUT), the points a killed process would have left after the
    # checkpoint are dropped on resume, and the curve ends as an uninterrupted run's: every point once
    from flowgp.bench import learning_curve

    run = (*_CURVE, "--models", "dgp2", "--steps", 16, "--curve-every", 3)  # 4 epochs of 4 steps
    assert _main(*run, "--out", tmp_path / "ref", "--state-dir", tmp_path / "ref-state") == 0
    reference = _points(tmp_path / "ref" / "curve.jsonl")
    assert [p["step"] for p in reference] == [3, 6, 9, 12, 15, 16]

    out, state = tmp_path / "results" / "out", (tmp_path / "elsewhere" / "state").resolve()
    original = learning_curve.append_point

    def interrupted(path, row):
        if row["step"] == 9:
            monkeypatch.setattr(learning_curve, "append_point", original)  # once
            raise KeyboardInterrupt
        original(path, row)

    monkeypatch.setattr(learning_curve, "append_point", interrupted)
    assert _main(*run, "--out", out, "--state-dir", state) == 130
    assert [p["step"] for p in _points(out / "curve.jsonl")] == [3, 6, 9]
    assert len(list(state.glob("*.pt"))) == 1 and not list(out.rglob("*.pt")) and not (out / "images.jsonl").exists()
    for leftover in reference[3:5]:  # what a process killed after step 15 would have left behind
        learning_curve.append_point(out / "curve.jsonl", {**leftover, "accuracy": -1.0})
    assert _main(*run, "--out", out, "--state-dir", state) == 0
    points = _points(out / "curve.jsonl")
    assert [p["step"] for p in points] == [3, 6, 9, 12, 15, 16]
    for p, r in zip(points, reference):
        assert (p["accuracy"], p["nll"], p["ece"]) == (r["accuracy"], r["nll"], r["ece"])
        assert p["train_objective"] == pytest.approx(r["train_objective"], rel=1e-12, abs=0)
    assert all(a["train_seconds"] < b["train_seconds"] for a, b in zip(points, points[1:]))
    assert not state.exists()  # the finished fit's state is removed with its row in place
    assert _points(out / "images.jsonl")[0]["accuracy"] == _points(tmp_path / "ref" / "images.jsonl")[0]["accuracy"]


@pytest.mark.parametrize("option,value", [("--curve-every", "-1"), ("--curve-every", "2.5"), ("--curve-every", "ten"),
                                          ("--curve-test", "0"), ("--curve-samples", "-3")])
def test_bad_curve_options_are_errors_before_any_work(tmp_path, capsys, option, value):
    assert _main("images", "--datasets", "digits", "--models", "sgp", option, value, "--out", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert f"{option} must be" in err and repr(value) in err
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def _synthetic_curve(path, dataset="fashion-mnist"):
    rows = []
    for model, skip in (("sgp", "none"), ("dgp4", "conv")):
        for step in (100, 200, 300):
            rows.append({"dataset": dataset, "model": model, "skip": skip, "seed": 0, "preset": "paper",
                         "max_train": None, "steps": None, "dtype": "float32", "batch_size": 256, "curve_test": 2000,
                         "curve_images": 2000, "n_test": 10000, "curve_samples": 5, "step": step,
                         "accuracy": 0.5 + step / 1000, "nll": 1.0 - step / 1000})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_curve_figure_is_written(tmp_path, capsys):
    curve = tmp_path / "out" / "curve.jsonl"
    curve.parent.mkdir()
    _synthetic_curve(curve)
    assert _main("images-curve", curve, "--figure", tmp_path / "fig" / "curve.png") == 0
    png = (tmp_path / "fig" / "curve.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10000
    assert _main("images-curve", curve) == 0 and (curve.parent / "curve.png").stat().st_size > 10000
    dataset, lines, title, xlabel = curve_lines(_points(curve))
    assert dataset == "fashion-mnist" and list(lines) == ["dgp4, skip conv", "sgp"]
    assert lines["sgp"]["step"] == [100, 200, 300] and lines["sgp"]["accuracy"] == pytest.approx([60, 70, 80])
    assert "2000 of the 10000 test images, 5 prediction samples" in title and "256" in xlabel
    _synthetic_curve(tmp_path / "two.jsonl", "digits")
    with (tmp_path / "two.jsonl").open("a") as fh:
        fh.write(curve.read_text())
    capsys.readouterr()
    assert _main("images-curve", tmp_path / "two.jsonl", "--figure", tmp_path / "two.png") == 2
    assert "--dataset" in capsys.readouterr().err and not (tmp_path / "two.png").exists()


def test_training_state_goes_to_runs_bench_never_under_the_results_folder(tmp_path, monkeypatch):
    # by default a fit's state lives in runs/bench/<name of OUT> under the current directory (the repository
    # root for the commands of docs/results), apart from the rows: an interrupted fit leaves none under OUT
    from flowgp.bench import learning_curve

    original = learning_curve.append_point

    def interrupted(path, row):
        monkeypatch.setattr(learning_curve, "append_point", original)  # once: a Ctrl-C at the first point
        raise KeyboardInterrupt

    monkeypatch.setattr(learning_curve, "append_point", interrupted)
    out = tmp_path / "docs" / "results" / "table3" / "fashion"
    assert _main(*_CURVE, "--models", "sgp", "--steps", 8, "--curve-every", 2, "--out", out) == 130
    assert len(list((tmp_path / "runs" / "bench" / "fashion").glob("*.pt"))) == 1
    assert not list((tmp_path / "docs").rglob("*.pt"))


def test_a_fit_continues_its_curve_only_with_the_subset_and_samples_it_began_with(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    begun = {"dataset": "digits", "model": "sgp", "skip": "none", "seed": 0, "preset": "tiny", "max_train": None,
             "steps": 8, "dtype": "float64", "device": "cpu", "world_size": 1, "curve_test": 60, "curve_samples": 2,
             "step": 2, "accuracy": 0.5}
    (out / "curve.jsonl").write_text(json.dumps(begun) + "\n")
    run = ("images", "--datasets", "digits", "--preset", "tiny", "--models", "sgp", "--steps", 8, "--curve-every", 2,
           "--out", out, "--quiet")
    assert _main(*run, "--curve-test", 100, "--curve-samples", 2) == 2
    err = capsys.readouterr().err
    assert "--curve-test 60 images with --curve-samples 2" in err and not (out / "images.jsonl").exists()
    assert _main(*run, "--curve-test", 60, "--curve-samples", 2) == 0  # the same settings continue it
    assert [p["step"] for p in _points(out / "curve.jsonl")] == [2, 4, 6, 8]
