"""`flowgp bench images`: model names, a resumable tiny run on the digits, the missing-data error;
and the ECE metric it reports."""
import json
import subprocess
import sys

import numpy as np
import pytest

from flowgp.bench.images import make_classifier, parse_model
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
