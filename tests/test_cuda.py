"""Every estimator family trains and predicts on CUDA, in float32 and float64, and a model fitted on
the GPU is the model a CPU user loads.

Each case fits the same small problem on the GPU and on the CPU with the same seed. Minibatch rows are drawn on
the CPU for every device, so the models whose bound is deterministic given the rows (SVGP, TGP, v-WGP, AMO-GP's
closed-form Psi statistics) follow the same path on both devices and must agree to rounding; the ones that draw
samples (deep GPs, latent DGP, MC dropout, classification by sampling) draw them from the device's own generator,
a different stream, so for those the GPU fit must be as good as the CPU fit (error within a margin), not equal.

`_check` takes the device as an argument so that the same checks can be run with device="cpu" where no GPU is
present (python -c "import tests.test_cuda as t; t._check('svgp', 'float64', 'cpu')").
"""
import numpy as np
import pytest
import torch

from flowgp.estimators import (AlignedMultiOutputGPRegressor, DeepGPClassifier, DeepGPRegressor,
                               LatentDeepGPRegressor, SVGPClassifier, SVGPRegressor, TGPClassifier, TGPRegressor,
                               WarpedGPRegressor)

needs_cuda = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

FAST = dict(num_inducing=10, epochs=40, verbose=False, kmeans_restarts=1, lr=0.03)

#: name -> (constructor taking dtype and device, problem kind, whether its predictions are deterministic given the
#: minibatch rows: True, False, or the names of the outputs that are (AMO-GP's mean and std are closed forms, its
#: log density a Monte Carlo average over the warping layer's samples))
CASES = {
    "svgp": (lambda **kw: SVGPRegressor(batch_size=32, **FAST, **kw), "regression", True),
    "svgp-natgrad": (lambda **kw: SVGPRegressor(natural_gradient=0.1, **FAST, **kw), "regression", True),
    "tgp-sal": (lambda **kw: TGPRegressor(flow="sal", batch_size=32, **FAST, **kw), "regression", True),
    "wgp-sal": (lambda **kw: WarpedGPRegressor(flow="sal", **FAST, **kw), "regression", True),
    "ba-tgp": (lambda **kw: TGPRegressor(flow="sal", input_dependent=True, hidden=(4,), mc_samples_predict=3,
                                         flow_init_epochs=2, **FAST, **kw), "regression", False),
    "dgp": (lambda **kw: DeepGPRegressor(layers=2, num_samples_predict=20, **FAST, **kw), "regression", False),
    "cnf-dgp": (lambda **kw: DeepGPRegressor(layers=2, posterior="cnf", num_samples_predict=20, **FAST, **kw),
                "regression", False),
    "cnf-paper-dgp": (lambda **kw: DeepGPRegressor(layers=2, posterior="cnf-paper", num_samples_predict=20,
                                                   **FAST, **kw), "regression", False),
    "ldgp": (lambda **kw: LatentDeepGPRegressor(layers=2, num_samples_predict=20, batch_size=30, **FAST, **kw),
             "regression", False),
    "svgp-classifier": (lambda **kw: SVGPClassifier(**FAST, **kw), "classification", False),
    "tgp-classifier": (lambda **kw: TGPClassifier(flow="sal", predict_samples=16, **FAST, **kw),
                       "classification", False),
    "dgp-classifier": (lambda **kw: DeepGPClassifier(layers=2, num_samples_predict=20, **FAST, **kw),
                       "classification", False),
    "dgp-classifier-csc": (lambda **kw: DeepGPClassifier(layers=2, skip="conv", image_shape=(1, 4, 4),
                                                         num_samples_predict=20, **FAST, **kw), "image", False),
    "amogp": (lambda **kw: AlignedMultiOutputGPRegressor(num_inducing=6, num_inducing_alignment=4,
                                                         num_inducing_warping=4, epochs=40, num_samples=5,
                                                         verbose=False, **kw), "multioutput", ("mean", "std")),
}


def _problem(kind, seed=0):
    """(fit arguments, test arguments, scorer) for a problem of `kind`; the scorer returns an error (lower is
    better) of a fitted estimator on the test arguments."""
    rng = np.random.default_rng(seed)
    if kind == "multioutput":
        t = np.sort(rng.uniform(0, 5, (2, 40)), axis=1)
        X = t.reshape(-1, 1)
        y = np.concatenate([np.sin(t[0]), 1.5 * np.sin(t[1] + 0.3)]) + 0.05 * rng.standard_normal(80)
        o = np.repeat([0, 1], 40)
        return (X, y, o), (X[::4], y[::4], o[::4]), lambda est, X, y, o: float(
            np.sqrt(np.mean((est.predict(X, o) - y) ** 2)))
    if kind == "image":
        # 4x4 one-channel images: class 1 has a bright upper half
        n = 120
        labels = rng.integers(0, 2, n)
        img = 0.3 * rng.standard_normal((n, 4, 4))
        img[labels == 1, :2, :] += 1.0
        X = img.reshape(n, 16)
        return (X[:90], labels[:90]), (X[90:], labels[90:]), lambda est, X, y: float(np.mean(est.predict(X) != y))
    X = rng.uniform(-3, 3, (120, 2))
    f = np.sin(X[:, 0]) + 0.5 * X[:, 1]
    if kind == "classification":
        labels = (f + 0.2 * rng.standard_normal(120) > 0).astype(int)
        return (X[:90], labels[:90]), (X[90:], labels[90:]), lambda est, X, y: float(np.mean(est.predict(X) != y))
    y = 2.0 + f + 0.1 * rng.standard_normal(120)
    return (X[:90], y[:90]), (X[90:], y[90:]), lambda est, X, y: float(np.sqrt(np.mean((est.predict(X) - y) ** 2)))


def _predict_all(est, kind, test):
    """Everything a user asks of a fitted estimator on the test rows, as float64 NumPy arrays."""
    if kind == "multioutput":
        X, y, o = test
        mean, std = est.predict(X, o, return_std=True)
        return {"mean": mean, "std": std, "lpd": est.log_predictive_density(X, y, o)}
    X, y = test
    if kind in ("classification", "image"):
        return {"proba": est.predict_proba(X), "lpd": est.log_predictive_density(X, y)}
    mean, std = est.predict(X, return_std=True)
    return {"mean": mean, "std": std, "lpd": est.log_predictive_density(X, y)}


def _check(name, dtype, device, tmp_path=None):
    make, kind, deterministic = CASES[name]
    train, test, score = _problem(kind)
    gpu = make(dtype=dtype, device=device).fit(*train)
    cpu = make(dtype=dtype, device="cpu").fit(*train)
    expected = torch.float32 if dtype == "float32" else torch.float64
    params = list(gpu.model_.parameters())
    assert params and {p.device.type for p in params} == {torch.device(device).type}, name
    assert {p.dtype for p in params} == {expected}, name
    on_gpu, on_cpu = _predict_all(gpu, kind, test), _predict_all(cpu, kind, test)
    for key, value in on_gpu.items():
        assert isinstance(value, np.ndarray) and np.all(np.isfinite(value)), (name, key)
    if "proba" in on_gpu:
        np.testing.assert_allclose(on_gpu["proba"].sum(1), 1.0, atol=1e-5)
    if "std" in on_gpu:
        assert np.all(on_gpu["std"] > 0)
    exact = () if deterministic is False else tuple(on_gpu) if deterministic is True else deterministic
    if exact:
        # the same rows in the same order on both devices: the same fit up to rounding (which Adam amplifies
        # a little over the 40 epochs in float32)
        tol = 2e-2 if dtype == "float32" else 1e-6
        for key in exact:
            np.testing.assert_allclose(on_gpu[key], on_cpu[key], rtol=tol, atol=tol, err_msg=f"{name} {key}")
    if deterministic is not True:
        # another random stream: as good a fit, not the same one
        assert score(gpu, *test) <= score(cpu, *test) + (0.15 if kind != "regression" else 0.25), name
    if tmp_path is not None:
        # saved on the GPU, loaded on a CPU-only machine: the same model (deterministic predictions agree;
        # sampled ones use the CPU's stream, so as good a fit)
        path = tmp_path / f"{name}-{dtype}.pt"
        gpu.save(path)
        back = type(gpu).load(path, device="cpu")
        assert {p.device.type for p in back.model_.parameters()} == {"cpu"}
        for a, b in zip(gpu.model_.state_dict().values(), back.model_.state_dict().values()):
            if torch.is_tensor(a):
                assert torch.equal(a.cpu(), b), name
        if exact:
            for key, value in _predict_all(back, kind, test).items():
                if key not in exact:
                    continue
                # float32: the CPU's and the GPU's kernels round differently (quadrature sums, exp/log)
                tol = 1e-3 if dtype == "float32" else 1e-10
                np.testing.assert_allclose(value, on_gpu[key], rtol=tol, atol=tol, err_msg=f"{name} {key} loaded")
        if deterministic is not True:
            assert score(back, *test) <= score(gpu, *test) + 0.15, name


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_estimator_fits_and_predicts_on_cuda(name, dtype, tmp_path):
    _check(name, dtype, "cuda", tmp_path)


for _mark in needs_cuda:
    test_every_estimator_fits_and_predicts_on_cuda = _mark(test_every_estimator_fits_and_predicts_on_cuda)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("compile", [True, "reduce-overhead"])
def test_compiled_step_on_cuda_gives_the_eager_bound(dtype, compile):
    # the compiled training step on the GPU (`compile=True`, or CUDA graphs) trains the same model as the eager one
    train, test, score = _problem("regression")
    kw = dict(batch_size=32, dtype=dtype, device="cuda", **FAST)
    eager = SVGPRegressor(**kw).fit(*train)
    compiled = SVGPRegressor(compile=compile, **kw).fit(*train)
    tol = 2e-2 if dtype == "float32" else 1e-6
    np.testing.assert_allclose(compiled.predict(test[0]), eager.predict(test[0]), rtol=tol, atol=tol)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cli_fits_on_cuda_and_the_saved_model_predicts_anywhere(tmp_path, capsys):
    from flowgp.cli import main

    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, size=(200, 2))
    y = np.sin(x[:, 0]) + 0.1 * rng.standard_normal(200)
    csv = tmp_path / "train.csv"
    csv.write_text("u,v,target\n" + "\n".join(f"{a},{b},{t}" for (a, b), t in zip(x, y)) + "\n")
    for model in ("svgp", "tgp", "dgp"):
        out = tmp_path / f"{model}.pt"
        assert main(["fit", "--data", str(csv), "--target", "target", "--model", model, "--epochs", "30",
                     "--num-inducing", "8", "--device", "cuda", "--quiet", "--out", str(out)]) == 0
        pred = tmp_path / f"{model}.parquet"
        assert main(["predict", "--model", str(out), "--data", str(csv), "--out", str(pred)]) == 0
        assert '"rmse"' in capsys.readouterr().out
        import pyarrow.parquet as pq

        table = pq.read_table(pred)
        assert table.num_rows == 200 and np.all(np.isfinite(table.column("mean").to_numpy()))
        on_cpu = tmp_path / f"{model}-cpu.parquet"
        assert main(["predict", "--model", str(out), "--data", str(csv), "--out", str(on_cpu), "--device", "cpu"]) == 0
        if model != "dgp":  # closed-form / quadrature predictions: the same on both devices
            np.testing.assert_allclose(pq.read_table(on_cpu).column("mean").to_numpy(),
                                       table.column("mean").to_numpy(), rtol=1e-8, atol=1e-8)
