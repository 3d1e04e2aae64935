"""The estimators' training defaults: natural-gradient steps on q(u) for the SVGP, a plateau stop with `epochs` as
the cap (reported by `n_iter_`), and the robust flow fit's L-BFGS refinement sized by the epoch budget."""
import warnings

import numpy as np
import pytest
import torch

import flowgp
from flowgp import SVGPRegressor, TGPRegressor
from flowgp.compat import SavedFileUpgradeWarning
from flowgp.estimators import RobustFit
from flowgp.gp.defaults import DEFAULTS
from flowgp.training.checkpoint import atomic_save, safe_load
from flowgp.training.loop import EarlyStop


def _data(n=120, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-3, 3, (n, 1))
    return x, np.sin(2 * x[:, 0]) + 0.2 * rng.standard_normal(n)


def _collapsed_bound(model, x, y):
    """Titsias' (2009) collapsed bound log N(y; 0, AᵀA + σ²I) - tr(K_XX - AᵀA)/(2σ²) (whitened A = L⁻¹K_ZX): the
    SVGP's bound at the optimal q(u) for its current hyperparameters."""
    a, _ = model.gp.projection(x)
    a = a.reshape(a.shape[-2:])
    noise = model.likelihood.noise.reshape(())
    cov = a.T @ a + noise * torch.eye(x.shape[0], dtype=x.dtype)
    value = torch.distributions.MultivariateNormal(torch.zeros(x.shape[0], dtype=x.dtype), cov).log_prob(y[:, 0])
    return value - (model.gp.kernel.diag(x).reshape(-1) - a.square().sum(0)).sum() / (2 * noise)


def test_default_svgp_fit_puts_q_u_at_its_closed_form_optimum():
    # full batch, a step too small to move the hyperparameters: the default's natural-gradient step (γ = 1) on
    # the conjugate Gaussian likelihood lands q(u) on its optimum, where the ELBO equals the collapsed bound
    x, y = _data()
    est = SVGPRegressor(num_inducing=8, epochs=1, lr=1e-12, kmeans_restarts=1, verbose=False).fit(x, y)
    xt, yt = est.scaled_inputs(x), est.scaled_targets(y)
    with torch.no_grad():
        elbo = est.model_.elbo(xt, yt)
        torch.testing.assert_close(elbo, _collapsed_bound(est.model_, xt, yt), rtol=0, atol=1e-6)
    # Adam alone (the explicit opt-out) leaves q(u) far from it after the same step
    adam = SVGPRegressor(num_inducing=8, epochs=1, lr=1e-12, kmeans_restarts=1, verbose=False,
                         natural_gradient=None).fit(x, y)
    with torch.no_grad():
        gap = _collapsed_bound(adam.model_, xt, yt) - adam.model_.elbo(xt, yt)
    assert gap > 10.0


def test_auto_takes_the_minibatch_step_in_minibatches(monkeypatch):
    import flowgp.estimators.regression as regression

    steps = []
    real = regression.NaturalGradient

    def recording(params, lr, anneal=False):
        steps.append((lr, anneal))
        return real(params, lr=lr, anneal=anneal)

    monkeypatch.setattr(regression, "NaturalGradient", recording)
    x, y = _data(60)
    SVGPRegressor(num_inducing=5, epochs=1, batch_size=20, kmeans_restarts=1, verbose=False).fit(x, y)
    SVGPRegressor(num_inducing=5, epochs=1, kmeans_restarts=1, verbose=False).fit(x, y)
    SVGPRegressor(num_inducing=5, epochs=1, kmeans_restarts=1, verbose=False, natural_gradient=0.3).fit(x, y)
    # minibatches: γ_t = max(γ, 1/(t+1)); an explicit γ is used as given
    assert steps == [(DEFAULTS.natural_gradient_minibatch, True), (DEFAULTS.natural_gradient_full_batch, False),
                     (0.3, False)]


def test_the_resolved_natural_gradient_is_the_step_and_the_annealing_of_the_fit():
    full, mini = (DEFAULTS.natural_gradient_full_batch, False), (DEFAULTS.natural_gradient_minibatch, True)
    assert SVGPRegressor().resolved_natural_gradient(60) == full
    assert SVGPRegressor(batch_size=60).resolved_natural_gradient(60) == full  # one batch of every row
    assert SVGPRegressor(batch_size=20).resolved_natural_gradient(60) == mini
    assert SVGPRegressor(batch_size=20, natural_gradient=0.3).resolved_natural_gradient(60) == (0.3, False)
    assert SVGPRegressor(natural_gradient=None).resolved_natural_gradient(60) == (None, False)
    assert TGPRegressor(batch_size=20).resolved_natural_gradient(60) == (None, False)  # a plain flow fit: Adam
    with pytest.raises(ValueError, match="natural_gradient"):
        SVGPRegressor(natural_gradient=1.5).resolved_natural_gradient(60)


def test_plateau_stop_ends_a_converged_fit_before_its_epochs():
    x, y = _data()
    est = SVGPRegressor(num_inducing=8, epochs=3000, lr=0.05, kmeans_restarts=1, verbose=False).fit(x, y)
    window, tol = DEFAULTS.plateau_window, DEFAULTS.plateau_tol
    assert est.n_iter_ == len(est.history_) < 3000
    assert est.n_iter_ % window == 0  # the rule is tested after every window of epochs
    # "stopped moving": the best loss of the last window improved on the best before it by at most tol per point
    before, last = min(est.history_[:-window]), min(est.history_)
    assert before - last <= tol
    # and it had not stopped one window earlier
    if est.n_iter_ > 2 * window:
        assert min(est.history_[:-2 * window]) - before > tol


def test_early_stop_none_trains_every_epoch_and_a_rule_object_is_used():
    x, y = _data()
    common = dict(num_inducing=8, epochs=300, lr=0.05, kmeans_restarts=1, verbose=False)
    assert SVGPRegressor(early_stop=None, **common).fit(x, y).n_iter_ == 300
    stopped = SVGPRegressor(early_stop=EarlyStop(window=5, rel_tol=0.0, min_delta=1.0), **common).fit(x, y)
    assert stopped.n_iter_ == 10  # the first window sets the reference, the second is tested against it


def test_bad_early_stop_is_a_clear_error():
    x, y = _data(20)
    with pytest.raises(ValueError, match="early_stop"):
        SVGPRegressor(early_stop="sometimes", verbose=False).fit(x, y)
    with pytest.raises(ValueError, match="natural_gradient"):
        SVGPRegressor(natural_gradient="fast", verbose=False).fit(x, y)


def test_early_stop_object_saves_and_loads(tmp_path):
    x, y = _data(40)
    rule = EarlyStop(window=3, rel_tol=0.0, min_delta=0.5)
    est = SVGPRegressor(num_inducing=4, epochs=30, kmeans_restarts=1, verbose=False, early_stop=rule).fit(x, y)
    est.save(tmp_path / "m.pt")
    loaded = flowgp.load(tmp_path / "m.pt")
    assert loaded.early_stop == rule and loaded.n_iter_ == est.n_iter_ == 6  # stopped after its second window


def test_files_saved_before_the_plateau_stop_keep_training_every_epoch(tmp_path):
    x, y = _data(40)
    est = SVGPRegressor(num_inducing=4, epochs=2, kmeans_restarts=1, verbose=False).fit(x, y)
    est.save(tmp_path / "new.pt")
    state = safe_load(tmp_path / "new.pt")
    del state["format_version"], state["params"]["early_stop"], state["params"]["natural_gradient"], state["n_iter"]
    atomic_save(state, tmp_path / "old.pt")
    with pytest.warns(SavedFileUpgradeWarning, match="early_stop=None"):
        loaded = flowgp.load(tmp_path / "old.pt")
    assert loaded.early_stop is None and loaded.natural_gradient is None and loaded.n_iter_ == 2
    np.testing.assert_array_equal(loaded.predict(x), est.predict(x))


class _CountingLBFGS(torch.optim.LBFGS):
    evaluations = []  # (max_eval, evaluations) of every step

    def step(self, closure):
        calls = [0]

        def counted():
            calls[0] += 1
            return closure()

        out = super().step(counted)
        _CountingLBFGS.evaluations.append((self.defaults["max_eval"], calls[0]))
        return out


@pytest.mark.parametrize("epochs", [20, 60])
def test_robust_refinement_is_sized_by_the_epoch_budget(monkeypatch, epochs):
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 1, (80, 1))
    y = np.exp(np.sin(6 * x[:, 0]) + 0.3 * rng.standard_normal(80))
    _CountingLBFGS.evaluations = []
    monkeypatch.setattr(torch.optim, "LBFGS", _CountingLBFGS)
    est = TGPRegressor(flow="sal+softplus", num_inducing=6, epochs=epochs, lr=0.03, kmeans_restarts=1,
                       verbose=False).fit(x, y)
    budget = RobustFit().refine_evaluations(epochs)
    assert budget == int(DEFAULTS.refine_budget * epochs)
    # one refinement on the data, its full-data evaluations within the share of the epochs (the other L-BFGS
    # runs fit the flow's start on a fixed grid of 500 points, whatever the data size)
    refinements = [calls for max_eval, calls in _CountingLBFGS.evaluations if max_eval == budget]
    assert len(refinements) == 1 and 2 <= refinements[0] <= budget
    assert est.fit_report_["refine_evaluations"] == budget
    assert set(est.fit_report_["seconds"]) >= {"svgp", "warm_start", "refine", "flow"}
    assert est.n_iter_ == est.fit_report_["svgp_epochs"] + len(est.history_)


def test_refinement_budget_rule():
    options = RobustFit()
    assert options.refine_evaluations(5) == 0  # too small a budget: no refinement
    assert options.refine_evaluations(50) == 10 and options.refine_evaluations(200) == 40
    assert options.refine_evaluations(10_000) == options.refine_max_evaluations
    assert RobustFit(refine_budget=0.0).refine_evaluations(1000) == 0
    with pytest.raises(ValueError, match="refine_budget"):
        RobustFit(refine_budget=1.5)


@pytest.mark.parametrize("estimator", [SVGPRegressor, TGPRegressor])
def test_a_short_minibatch_fit_with_the_defaults_learns_the_function(estimator):
    # 15 epochs of 4 batches: a constant γ = 0.1 left q(u) near the prior while Adam moved the hyperparameters, and
    # the fits ended near the mean (RMSE 0.45 SVGP, 0.40 robust TGP, against 0.05 with Adam alone); the default
    # natural-gradient steps start at 1/(t+1)
    rng = np.random.default_rng(2)
    x = rng.uniform(-2, 2, (400, 2))
    y = np.sin(2 * x[:, 0]) + 0.1 * rng.standard_normal(400)
    xt = np.random.default_rng(5).uniform(-2, 2, (200, 2))
    extra = {"flow": "sal"} if estimator is TGPRegressor else {}
    est = estimator(num_inducing=12, epochs=15, batch_size=100, lr=0.05, kmeans_restarts=2, verbose=False,
                    **extra).fit(x, y)
    rmse = np.sqrt(np.mean((est.predict(xt) - np.sin(2 * xt[:, 0])) ** 2))
    assert rmse < 0.1, rmse


@pytest.mark.parametrize("robust", [False, True])
def test_an_identity_flow_in_minibatches_is_fitted_as_the_svgp(robust):
    """TGP(identity) is the SVGP: in minibatches its fit takes the SVGP's annealed natural-gradient steps, so the
    two estimators give the same model (they used to differ: the flow estimator kept a constant γ = 0.1)."""
    x, y = _data(60, seed=2)
    kw = {"batch_size": 20, "epochs": 6, "num_inducing": 8, "seed": 3, "early_stop": None}
    svgp = SVGPRegressor(**kw).fit(x, y)
    tgp = TGPRegressor(flow="identity", robust=robust, **kw).fit(x, y)
    assert TGPRegressor(flow="identity", batch_size=20).resolved_natural_gradient(60) == (
        DEFAULTS.natural_gradient_minibatch, True)
    np.testing.assert_allclose(tgp.predict(x), svgp.predict(x), rtol=1e-9, atol=1e-10)
