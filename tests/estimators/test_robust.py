"""The robust fit of the flow estimators: a TGP / v-WGP never ends below the SVGP it contains.

- warm start: a TGP (or v-WGP) started from a fitted SVGP by `warm_start_from_svgp` has that SVGP's bound
  (to 1e-10 in float64 for flows whose family holds the affine map exactly, with and without a target shift);
- the structural guarantee: the fitted bound >= the bound of the SVGP it was warm-started from - 0.005 per point;
- the warning names both bounds when a fit ends below (forced with a flow that cannot reproduce the SVGP);
- the classifier: its SVGP stage is the SVGPClassifier's own fit and its warm start has that bound to 1e-8, and
  on breast_cancer and digits at a small budget it ends at or above the SVGPClassifier's bound and at most one
  test point below its accuracy;
- the check grid (air-quality folds 0-4, boston/concrete/energy splits 0-2) at 200 epochs, or at the protocol's
  1 500 with FLOWGP_ROBUST_CHECK_EPOCHS=1500 (skipped without the shared data).
"""
import math
import os
import warnings

import numpy as np
import pytest
import torch

from flowgp import SVGPRegressor, TGPRegressor, WarpedGPRegressor
from flowgp.build import SparseGPConfig, build
from flowgp.estimators import BoundBelowSVGPWarning, RobustFit
from flowgp.flows import make_flow
from flowgp.training.initialisation import init_affine, warm_start_from_svgp
from flowgp.training.loop import train


def _skewed(n=120, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, (n, 1))
    y = np.exp(np.sin(6 * x[:, 0]) + 0.3 * rng.standard_normal(n))  # positive, right-skewed
    return x, y


def _fitted_svgp(x, y, steps=40):
    gen = torch.Generator().manual_seed(0)
    svgp = build(SparseGPConfig(model="svgp", num_inducing=8), x, y, dtype=torch.float64, generator=gen)
    train(svgp, x, y, epochs=steps, lr=0.05, verbose=False)
    return svgp


@pytest.mark.parametrize("model, flow", [("tgp", "sal"), ("tgp", "sal+sal"), ("wgp", "sal")])
@pytest.mark.parametrize("shift, scale", [(0.0, 1.0), (0.7, 1.0), (-0.3, 2.5)])
def test_warm_start_has_the_svgp_bound(model, flow, shift, scale):
    x_np, y_np = _skewed(80)
    x = torch.as_tensor(x_np)
    t = torch.as_tensor((y_np - y_np.mean()) / y_np.std())[:, None]
    svgp = _fitted_svgp(x, t)
    gen = torch.Generator().manual_seed(0)
    target = scale * t + shift  # the flow model's targets t' = α t + β
    other = build(SparseGPConfig(model=model, flow=flow, num_inducing=8), x, target, dtype=torch.float64,
                  generator=gen)
    mse = warm_start_from_svgp(other, svgp, shift, scale)
    assert mse < 1e-20
    with torch.no_grad():
        expected = svgp.elbo(x, t).item() - x.shape[0] * math.log(scale)  # the Jacobian of t -> t'
        assert other.elbo(x, target).item() == pytest.approx(expected, abs=1e-10, rel=0)


def test_warm_start_copies_gp_and_noise():
    x_np, y_np = _skewed(60)
    x, t = torch.as_tensor(x_np), torch.as_tensor((y_np - y_np.mean()) / y_np.std())[:, None]
    svgp = _fitted_svgp(x, t)
    tgp = build(SparseGPConfig(model="tgp", flow="sal+softplus", num_inducing=8), x, t + 2.0, dtype=torch.float64)
    warm_start_from_svgp(tgp, svgp, 2.0, 1.5)
    for name, value in svgp.gp.state_dict().items():
        assert torch.equal(tgp.gp.state_dict()[name], value)
    assert torch.allclose(tgp.likelihood.base.noise, svgp.likelihood.noise * 1.5 ** 2)


def test_init_affine_fits_a_flow_without_an_affine_stage():
    flow = make_flow("sinharcsinh").to(torch.float64)  # no affine stage: β + α f is approximated
    mse = init_affine(flow, 0.5, 1.0, -2.0, 2.0)
    assert mse < 0.05
    with pytest.raises(ValueError, match="scale must be positive"):
        init_affine(flow, 0.0, -1.0)


@pytest.mark.parametrize("estimator, flow", [(TGPRegressor, "sal"), (TGPRegressor, "sal+softplus"),
                                             (WarpedGPRegressor, "sal")])
def test_fitted_bound_is_not_below_its_svgp(estimator, flow):
    x, y = _skewed(150, seed=1)
    est = estimator(flow=flow, num_inducing=10, epochs=80, lr=0.03, verbose=False).fit(x, y)
    report = est.fit_report_
    n = len(y)
    assert report["bound"] >= report["svgp_bound"] - 0.005
    assert est.elbo(x, y) / n == pytest.approx(report["bound"], abs=1e-9)
    # and above the SVGPRegressor a user would fit with the same settings (the criterion)
    svgp = SVGPRegressor(num_inducing=10, epochs=80, lr=0.03, verbose=False).fit(x, y)
    assert report["bound"] >= svgp.elbo(x, y) / n - 0.005


def test_warning_names_both_bounds_when_the_fit_ends_below():
    # a softplus TGP cannot reproduce the shifted identity the SVGP needs on data close to 0, and with one
    # epoch of joint training (plateau window 1, huge tolerance) and no refinement it stays below
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (100, 1))
    y = 0.05 + np.abs(np.sin(8 * x[:, 0])) + 0.01 * rng.standard_normal(100) ** 2
    options = RobustFit(refine_flow=False, plateau=(1, 1e9), keep_best=False)
    est = TGPRegressor(flow="softplus", num_inducing=10, epochs=100, lr=0.05, verbose=False, robust=options)
    with pytest.warns(BoundBelowSVGPWarning, match="below the SVGP") as record:
        est.fit(x, y)
    report = est.fit_report_
    message = str(record[0].message)
    assert f"{report['bound']:.4f}" in message and f"{report['svgp_bound']:.4f}" in message
    assert report["bound"] < report["svgp_bound"] - 0.005
    # softplus alone cannot reproduce the SVGP (its warm start is below it): the warning says so
    assert "cannot reproduce that SVGP" in message and "optimisation failure" not in message


def test_warning_blames_the_optimiser_only_when_the_flow_contains_the_svgp():
    """A bare 'log' warping or 'softplus' flow has no affine stage, so it need not reach the SVGP's bound (the
    rainfall bench's v-WGP(log) ends 0.16-0.2 per point below it); the warning must not call that an
    optimisation failure. A flow whose start reached the SVGP and then ended below it is one."""
    from flowgp.estimators.robust import warn_below_svgp

    with pytest.warns(BoundBelowSVGPWarning, match="cannot reproduce that SVGP"):
        assert warn_below_svgp("WarpedGPRegressor", -5.64, -5.47, 0.005, start=-5.70)
    with pytest.warns(BoundBelowSVGPWarning, match="optimisation failure"):
        assert warn_below_svgp("TGPRegressor", -3.40, -3.30, 0.005, start=-3.30)
    with pytest.warns(BoundBelowSVGPWarning, match="optimisation failure"):
        assert warn_below_svgp("TGPRegressor", -3.40, -3.30, 0.005)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BoundBelowSVGPWarning)
        assert not warn_below_svgp("TGPRegressor", -3.302, -3.30, 0.005, start=-3.5)


def test_no_warning_without_a_failure_and_plain_fit_available():
    x, y = _skewed(100)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BoundBelowSVGPWarning)
        TGPRegressor(flow="sal", num_inducing=8, epochs=60, lr=0.03, verbose=False).fit(x, y)
    plain = TGPRegressor(flow="sal", num_inducing=8, epochs=30, verbose=False, robust=False).fit(x, y)
    assert len(plain.history_) == 30 and not hasattr(plain, "fit_report_")
    with pytest.raises(TypeError, match="robust must be"):
        TGPRegressor(robust="yes", epochs=2, verbose=False).fit(x, y)
    with pytest.raises(ValueError, match="restarts"):
        RobustFit(restarts=("bogus",))


@pytest.mark.parametrize("n, flow, batch_size", [(80, "sal", None), (300, "sal+softplus", 64)])
def test_robust_fit_with_a_checkpoint_loads_back_the_same_model(tmp_path, n, flow, batch_size):
    # in minibatches the best state seen (once per epoch) is not the last one here: the checkpoint carries it
    x, y = _skewed(n)
    kw = dict(flow=flow, num_inducing=8, epochs=30, verbose=False, checkpoint=tmp_path / "fit.ckpt",
              batch_size=batch_size)
    first = TGPRegressor(**kw).fit(x, y)
    again = TGPRegressor(**kw).fit(x, y)  # every stage finished: loaded back, not retrained
    for name, value in first.model_.state_dict().items():
        torch.testing.assert_close(again.model_.state_dict()[name], value, rtol=0, atol=1e-12)


def test_restarts_choose_by_training_bound():
    x, y = _skewed(100)
    est = TGPRegressor(flow="sal", num_inducing=8, epochs=60, lr=0.03, verbose=False,
                       robust=RobustFit(restarts=("data",))).fit(x, y)
    report = est.fit_report_
    assert set(report["candidates"]) == {"warm", "data"}
    assert report["bound"] == max(report["candidates"].values())
    assert report["chosen"] == max(report["candidates"], key=report["candidates"].get)


#: epochs of the check grid in the suite; FLOWGP_ROBUST_CHECK_EPOCHS=1500 runs the full protocol (about
#: 25 min on 2 cores; its results: docs/results/tgp/robust-fit/README.md section 5)
CHECK_EPOCHS = int(os.environ.get("FLOWGP_ROBUST_CHECK_EPOCHS", "200"))


@pytest.mark.parametrize("dataset, split", [("airquality", k) for k in range(5)]
                         + [(name, k) for name in ("boston", "concrete", "energy") for k in range(3)])
def test_robust_tgp_ends_above_the_svgp_on_the_check_grid(dataset, split):
    """The check grid: on air-quality folds 0-4 (seeded 5-fold permutation, 10 % inducing points) and boston,
    concrete, energy splits 0-2 (M = 100) the default TGPRegressor(flow="sal+softplus") ends with a training
    bound per point >= that of SVGPRegressor with the same settings - 0.005 (both seed 0, full batch)."""
    from flowgp.data.tables import cv_splits, load_air_quality, uci_split

    try:
        if dataset == "airquality":
            x, y = load_air_quality()
            train_rows, _ = cv_splits(len(y), 5, 0)[split]
            x, y, m = x[train_rows], y[train_rows], int(round(0.1 * len(train_rows)))
        else:
            part = uci_split(dataset, split)
            x, y, m = part.x_train, part.y_train, 100
    except (FileNotFoundError, OSError) as err:
        pytest.skip(f"{dataset} not available: {err}")
    kw = dict(num_inducing=m, epochs=CHECK_EPOCHS, seed=0, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BoundBelowSVGPWarning)
        tgp = TGPRegressor(flow="sal+softplus", **kw).fit(x, y)
    svgp = SVGPRegressor(**kw).fit(x, y)
    n = len(y)
    assert tgp.elbo(x, y) / n >= svgp.elbo(x, y) / n - 0.005


@pytest.mark.parametrize("classes", [2, 3])
def test_tgp_classifier_ends_at_or_above_its_svgp_classifier(classes):
    from flowgp import TGPClassifier

    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (90, 2))
    score = np.sin(2 * x[:, 0]) + x[:, 1] + 0.3 * rng.standard_normal(90)
    y = np.digitize(score, np.quantile(score, np.linspace(0, 1, classes + 1)[1:-1]))
    est = TGPClassifier(flow="sal", num_inducing=8, epochs=40, lr=0.03, mc_samples=8, verbose=False).fit(x, y)
    report = est.fit_report_
    assert report["warm_start_bound"] == pytest.approx(report["svgp_bound"], abs=1e-10)  # flow at the identity
    assert report["bound"] >= report["svgp_bound"] - 0.005
    assert est.elbo(x, y) / len(y) == pytest.approx(report["bound"], abs=1e-9)


def test_minibatch_fits_use_the_minibatch_step_in_the_svgp_stage(monkeypatch):
    """γ = 1 on minibatch estimates put the SVGP stage below an Adam SVGP (UCI power/energy); minibatch fits take
    `svgp_natural_gradient_minibatch` (0.1) after steps of 1/(t+1) (annealed), full-batch fits
    `svgp_natural_gradient` (1)."""
    import flowgp.estimators.regression as regression

    steps = []
    original = regression.NaturalGradient

    def spy(params, lr, anneal=False):
        steps.append(lr if not anneal else ("annealed to", lr))
        return original(params, lr=lr, anneal=anneal)

    monkeypatch.setattr(regression, "NaturalGradient", spy)
    x, y = _skewed(60)
    TGPRegressor(flow="sal", num_inducing=6, epochs=4, verbose=False, kmeans_restarts=1).fit(x, y)
    assert steps[0] == 1.0
    steps.clear()
    TGPRegressor(flow="sal", num_inducing=6, epochs=4, batch_size=20, verbose=False, kmeans_restarts=1).fit(x, y)
    assert steps[0] == ("annealed to", 0.1)
    with pytest.raises(ValueError, match="svgp_natural_gradient_minibatch"):
        RobustFit(svgp_natural_gradient_minibatch=0)


@pytest.mark.parametrize("estimator, flow", [(TGPRegressor, "sal+softplus"), (WarpedGPRegressor, "sal")])
def test_a_streamed_fit_is_robust_too(tmp_path, estimator, flow):
    """`fit(path, target)` takes the robust fit: SVGP stage, warm start and flow stage all read the table; with
    the whole table in the sample the bounds that steer the fit are the exact ones, and the guarantee holds.
    sal+softplus has positive targets unshifted (y_shift_ = 0) while the SVGP stage shifts by the mean."""
    x, y = _skewed(150, seed=1)
    np.save(tmp_path / "d.npy", np.column_stack([x, y]))
    est = estimator(flow=flow, num_inducing=10, epochs=80, lr=0.03, verbose=False).fit(tmp_path / "d.npy")
    report, n = est.fit_report_, len(y)
    assert hasattr(est, "svgp_") and report["bounds_from_sample_rows"] == n
    assert report["bound"] >= report["svgp_bound"] - 0.005
    assert est.elbo(x, y) / n == pytest.approx(report["bound"], abs=1e-8)


def test_a_streamed_minibatch_fit_estimates_its_bounds_on_the_sample(tmp_path):
    x, y = _skewed(400, seed=2)
    np.save(tmp_path / "d.npy", np.column_stack([x, y]))
    est = TGPRegressor(flow="sal", num_inducing=10, epochs=20, batch_size=50, lr=0.03, verbose=False,
                       kmeans_restarts=2)
    est.fit_stream(tmp_path / "d.npy", sample_size=200)
    report = est.fit_report_
    assert report["bounds_from_sample_rows"] == 200 and report["n"] == 400
    # the sample's estimate of the bound per point is close to the bound on all the rows
    assert abs(est.elbo(x, y) / 400 - report["bound"]) < 0.1
    assert report["bound"] >= report["svgp_bound"] - 0.005
    plain = TGPRegressor(flow="sal", num_inducing=10, epochs=2, batch_size=50, verbose=False, robust=False,
                         kmeans_restarts=2).fit_stream(tmp_path / "d.npy", sample_size=200)
    assert not hasattr(plain, "fit_report_") and not hasattr(plain, "svgp_")


# ----- the classifier: its robust fit contains the SVGP classifier's own fit ------------------------------------

def _class_data(classes, n=90):
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (n, 2))
    score = np.sin(2 * x[:, 0]) + x[:, 1] + 0.3 * rng.standard_normal(n)
    return x, np.digitize(score, np.quantile(score, np.linspace(0, 1, classes + 1)[1:-1]))


@pytest.mark.parametrize("flow", ["sal", "sal+sal", "sinharcsinh"])
@pytest.mark.parametrize("classes, likelihood, batch_size", [(2, "softmax", None), (2, "softmax", 32),
                                                             (3, "softmax", None), (3, "robustmax", 32)])
def test_tgp_classifier_starts_exactly_at_the_svgp_classifier_fit(flow, classes, likelihood, batch_size):
    """The flow model's warm start is the SVGPClassifier a user fits with the same settings: the SVGP stage is
    that fit (all `epochs`, its optimiser and seeds; the best state kept can only be higher), and with the flow
    at the identity the classifier's bound (probit quadrature, softmax Monte Carlo with the same draws, robust
    max) equals that SVGP's to 1e-8 per point."""
    from flowgp import SVGPClassifier, TGPClassifier

    x, y = _class_data(classes)
    kw = dict(num_inducing=8, epochs=6, lr=0.03, mc_samples=8, likelihood=likelihood, batch_size=batch_size,
              kmeans_restarts=2, verbose=False, seed=1)
    est = TGPClassifier(flow=flow, **kw).fit(x, y)
    report = est.fit_report_
    svgp = SVGPClassifier(**kw).fit(x, y)
    assert report["svgp_bound"] >= svgp.elbo(x, y) / len(y) - 1e-10
    assert report["warm_start_bound"] == pytest.approx(report["svgp_bound"], abs=1e-8, rel=0)
    assert report["bound"] >= report["svgp_bound"]
    with torch.no_grad():  # svgp_ is the SVGP the report measured (the same Monte Carlo draws)
        svgp_bound = est.svgp_.elbo(est.scaled_inputs(x), est.encoded_labels(y), generator=est.generator()).item()
    assert svgp_bound / len(y) == pytest.approx(report["svgp_bound"], abs=1e-12, rel=0)


def _sklearn_split(name):
    from sklearn.datasets import load_breast_cancer, load_digits
    from sklearn.model_selection import train_test_split

    x, y = {"breast_cancer": load_breast_cancer, "digits": load_digits}[name](return_X_y=True)
    return train_test_split(x, y, test_size=0.25, stratify=y, random_state=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["breast_cancer", "digits"])
def test_robust_tgp_classifier_is_not_below_the_svgp_classifier_at_a_small_budget(name):
    """scikit-learn's breast_cancer and digits (stratified 75/25, random_state 0), M = 50, 100 epochs, batches of
    256: the robust TGPClassifier's full-data training bound is at or above SVGPClassifier's, and its test
    accuracy at most one test point below (breast_cancer was 131/143 against 135/143 while the SVGP stage had half
    of the epochs; about 2 s for breast_cancer, 20 s for digits on one core)."""
    from flowgp import SVGPClassifier, TGPClassifier

    x_train, x_test, y_train, y_test = _sklearn_split(name)
    kw = dict(num_inducing=50, epochs=100, batch_size=256, seed=0, verbose=False)
    svgp = SVGPClassifier(**kw).fit(x_train, y_train)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BoundBelowSVGPWarning)
        tgp = TGPClassifier(**kw).fit(x_train, y_train)
    n = len(y_train)
    assert tgp.elbo(x_train, y_train) / n >= svgp.elbo(x_train, y_train) / n
    correct_svgp = int((svgp.predict(x_test) == y_test).sum())
    correct_tgp = int((tgp.predict(x_test) == y_test).sum())
    assert correct_tgp >= correct_svgp - 1, (correct_tgp, correct_svgp, len(y_test))
