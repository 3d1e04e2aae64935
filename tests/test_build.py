"""flowgp.build (one way to build a model) and the estimators around it: no global state, objects first,
resumable fits, the named-model registry."""
import dataclasses
import os
import signal

import numpy as np
import pytest
import torch

import flowgp
from flowgp.build import (AMOGPConfig, ClassificationConfig, DeepGPConfig, LatentDeepGPConfig, SparseGPConfig,
                          build, register_builder)
from flowgp.estimators import (AlignedMultiOutputGPRegressor, DeepGPRegressor, LatentDeepGPRegressor, SVGPRegressor,
                               TGPClassifier, TGPRegressor, WarpedGPRegressor)
from flowgp.flows import Flow, ParamSpec
from flowgp.numerics.constraints import Positive


def _data(n=60, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-3, 3, size=(n, 2))
    y = 5.0 + 3.0 * np.sin(x[:, 0]) + 0.5 * x[:, 1] + 0.2 * rng.standard_normal(n)
    return x, y


def _multioutput_data(n=30):
    rng = np.random.default_rng(0)
    t = np.sort(rng.uniform(0, 5, (2, n)), axis=1)
    X = t.reshape(-1, 1)
    y = np.concatenate([np.sin(t[0]), 1.5 * np.sin(t[1] + 0.3)]) + 0.05 * rng.standard_normal(2 * n)
    return X, y, np.repeat([0, 1], n)


FAST = dict(num_inducing=8, epochs=15, verbose=False, kmeans_restarts=1)

ESTIMATORS = {
    "svgp": lambda dtype: SVGPRegressor(dtype=dtype, **FAST),
    "tgp-sal": lambda dtype: TGPRegressor(flow="sal", dtype=dtype, **FAST),
    "cnf-dgp": lambda dtype: DeepGPRegressor(layers=2, posterior="cnf", num_samples_predict=5, dtype=dtype, **FAST),
    "ldgp": lambda dtype: LatentDeepGPRegressor(layers=2, num_samples_predict=5, batch_size=20, dtype=dtype, **FAST),
    "ba-tgp": lambda dtype: TGPRegressor(flow="sal", input_dependent=True, hidden=(4,), mc_samples_predict=3,
                                         flow_init_epochs=2, dtype=dtype, **FAST),
    "tgp-classifier": lambda dtype: TGPClassifier(flow="sal", input_dependent=True, hidden=(4,),
                                                  mc_samples_predict=3, flow_init_epochs=2, predict_samples=8,
                                                  dtype=dtype, **FAST),
    "amogp": lambda dtype: AlignedMultiOutputGPRegressor(num_inducing=6, num_inducing_alignment=4,
                                                         num_inducing_warping=4, epochs=5, num_samples=5,
                                                         dtype=dtype, verbose=False),
}


def _fit_and_predict(est):
    if isinstance(est, AlignedMultiOutputGPRegressor):
        X, y, o = _multioutput_data()
        est.fit(X, y, o)
        est.predict(X[:5], o[:5], return_std=True)
        est.log_predictive_density(X[:5], y[:5], o[:5])
    elif isinstance(est, TGPClassifier):
        x, y = _data()
        labels = (y > np.median(y)).astype(int)
        est.fit(x, labels)
        est.predict_proba(x[:5])
        est.log_predictive_density(x[:5], labels[:5])
    else:
        x, y = _data()
        est.fit(x, y)
        est.predict(x[:5], return_std=True)
        est.log_predictive_density(x[:5], y[:5])
    return est


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_fit_leaves_global_state_alone_and_builds_in_the_dtype(name, dtype):
    np.random.seed(1234)  # the test's own global state, compared below (the library never seeds it)
    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()
    default_dtype = torch.get_default_dtype()
    est = _fit_and_predict(ESTIMATORS[name](dtype))
    assert torch.get_default_dtype() == default_dtype
    assert torch.equal(torch.get_rng_state(), torch_state)
    after = np.random.get_state()
    assert after[0] == numpy_state[0] and np.array_equal(after[1], numpy_state[1]) and after[2:] == numpy_state[2:]
    expected = torch.float32 if dtype == "float32" else torch.float64
    dtypes = {p.dtype for p in est.model_.parameters()}
    assert dtypes == {expected}, dtypes


@pytest.mark.parametrize("bayesian,dropout", [("mc_dropout", 0.25), ("vb", 0.0)])
def test_bayesian_tgp_predictions_draw_from_the_seed_generator_only(bayesian, dropout):
    # BA/VB-TGP predictions average W draws (appendix eq. 20): they come from a generator made from `seed`,
    # so repeated calls agree exactly, another seed gives other draws, and torch's global RNG never moves
    x, y = _data()
    est = TGPRegressor(flow="sal", input_dependent=True, hidden=(4,), bayesian=bayesian, dropout=dropout,
                       mc_samples_predict=3, flow_init_epochs=2, **FAST).fit(x, y)
    torch_state = torch.get_rng_state()

    def outputs():
        return [est.predict(x[:5], return_std=True)[1], est.predict_quantiles(x[:5], [0.1, 0.9]),
                est.log_predictive_density(x[:5], y[:5]), np.array([est.elbo(x, y)]),
                est.sample_f(x[:5], num_samples=2)]

    first, second = outputs(), outputs()
    assert torch.equal(torch.get_rng_state(), torch_state)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    est.set_params(seed=1)
    assert not np.array_equal(outputs()[0], first[0])


# ----- build ---------------------------------------------------------------------------------------------------
def test_build_dispatches_on_the_config_and_casts_after_construction():
    x = torch.randn(30, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = torch.sin(x[:, :1])
    gen = torch.Generator().manual_seed(3)
    default = torch.get_default_dtype()
    svgp = build(SparseGPConfig(num_inducing=5, kmeans_restarts=1), x, y, generator=gen)
    tgp = build(SparseGPConfig(model="tgp", flow="sal", num_inducing=5, kmeans_restarts=1), x, y, generator=gen,
                dtype="float32")
    assert type(svgp).__name__ == "SVGP" and type(tgp).__name__ == "TGP"
    assert {p.dtype for p in svgp.parameters()} == {torch.float64}
    assert {p.dtype for p in tgp.parameters()} == {torch.float32}
    assert torch.get_default_dtype() == default
    # the same generator seed gives the same k-means inducing inputs
    again = build(SparseGPConfig(num_inducing=5, kmeans_restarts=1), x, y, generator=torch.Generator().manual_seed(3))
    assert torch.equal(again.gp.inducing_points, svgp.gp.inducing_points)
    wgp = build(SparseGPConfig(model="wgp", flow="sal", num_inducing=5, kmeans_restarts=1), x, y)
    assert type(wgp).__name__ == "WarpedGP"
    labels = (x[:, 0] > 0).long()
    clf = build(ClassificationConfig(num_inducing=5, kmeans_restarts=1), x, labels)
    assert clf.num_classes == 2
    dgp = build(DeepGPConfig(layers=2, num_inducing=5, kmeans_restarts=1), x, y)
    assert len(dgp.layers) == 2
    ldgp = build(LatentDeepGPConfig(layers=1, num_inducing=5, kmeans_restarts=1), x, y)
    assert len(ldgp.layers) == 1
    amogp = build(AMOGPConfig(num_inducing=4, num_inducing_alignment=3, num_inducing_warping=3), x[:, :1], y[:, 0],
                  output=(x[:, 1] > 0).long())
    assert amogp.num_outputs == 2
    with pytest.raises(ValueError, match="output="):
        build(AMOGPConfig(), x[:, :1], y[:, 0])
    with pytest.raises(ValueError, match="model must be"):
        build(SparseGPConfig(model="gp"), x, y)
    with pytest.raises(ValueError, match="dtype"):
        build(SparseGPConfig(), x, y, dtype="float16")


def test_configs_are_frozen_and_families_can_be_added():
    config = SparseGPConfig(model="tgp", flow="sal")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.flow = "tanh"

    @dataclasses.dataclass(frozen=True)
    class LinearConfig:
        width: int = 3

    with pytest.raises(TypeError, match="no builder for LinearConfig"):
        build(LinearConfig(), torch.zeros(4, 2))
    register_builder(LinearConfig, lambda c, x, y, *, generator=None: torch.nn.Linear(x.shape[1], c.width))
    model = build(LinearConfig(), torch.zeros(4, 2), dtype=torch.float32)
    assert model.weight.dtype == torch.float32 and model.weight.shape == (3, 2)
    with pytest.raises(ValueError, match="already registered"):
        register_builder(LinearConfig, lambda c, x, y, **kw: None)


def test_estimator_config_round_trips_the_sklearn_parameters():
    est = TGPRegressor(flow="sal+softplus", num_inducing=7, noise=0.1, input_dependent=True, bayesian="point")
    config = est.config()
    assert config.model == "tgp" and config.flow == "sal+softplus" and config.num_inducing == 7
    assert config.noise == 0.1 and config.input_dependent.bayesian == "point"
    assert SVGPRegressor().config().model == "svgp" and WarpedGPRegressor().config().model == "wgp"
    assert DeepGPRegressor(layers=4, posterior="cnf").config() == DeepGPConfig(layers=4, posterior="cnf")


# ----- objects first ---------------------------------------------------------------------------------------------
class ScaledSinh(Flow):
    """A flow written outside flowgp: G(f) = sinh(s f) / s, s > 0, borrowing a built-in's name on purpose."""

    name = "sinh"  # the built-in "sinh" has no parameters: rebuilding from the name would lose `s`
    param_specs = (ParamSpec("s", Positive(), 0.7),)

    def _forward(self, f, p):
        return torch.sinh(p["s"] * f) / p["s"]

    def _log_det(self, f, p):
        return torch.log(torch.cosh(p["s"] * f))


@pytest.mark.parametrize("cls", [TGPRegressor, WarpedGPRegressor])
def test_a_users_flow_object_is_used_itself(cls):
    x, y = _data()
    mine = ScaledSinh()
    before = {k: v.clone() for k, v in mine.state_dict().items()}
    est = cls(flow=mine, flow_init="none", **FAST).fit(x, y)
    flow = est.model_.flow
    assert type(flow) is ScaledSinh and flow is not mine
    assert all(torch.equal(mine.state_dict()[k], v) for k, v in before.items())  # the user's object untouched
    assert est.get_params()["flow"] is mine
    assert np.isfinite(est.predict(x[:5])).all()


def test_a_users_flow_survives_save_and_load(tmp_path):
    x, y = _data()
    est = TGPRegressor(flow=ScaledSinh(), flow_init="none", **FAST).fit(x, y)
    path = est.save(tmp_path / "mine.pt")
    back = flowgp.load(path)
    assert type(back.model_.flow) is ScaledSinh
    np.testing.assert_allclose(back.predict(x[:5]), est.predict(x[:5]), rtol=1e-12)


def test_builtin_flow_objects_still_save_and_load(tmp_path):
    x, y = _data()
    est = TGPRegressor(flow=flowgp.make_flow("sal"), **FAST).fit(x, y)
    back = flowgp.load(est.save(tmp_path / "sal.pt"))
    np.testing.assert_allclose(back.predict(x[:5]), est.predict(x[:5]), rtol=1e-12)


# ----- checkpoint: an interrupted fit continues where it stopped --------------------------------------------------
def _count_elbo_calls(monkeypatch, model_cls, interrupt_at=None):
    """Count model_cls.elbo calls (one per training step here); at call `interrupt_at` the process gets a
    SIGINT (Ctrl-C), as a fit killed half-way would: training saves its checkpoint and raises KeyboardInterrupt."""
    original = model_cls.elbo
    count = {"n": 0}

    def elbo(self, *args, **kwargs):
        count["n"] += 1
        if count["n"] == interrupt_at:
            os.kill(os.getpid(), signal.SIGINT)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(model_cls, "elbo", elbo)
    return count


def _state(est):
    return {k: v.clone() for k, v in est.model_.state_dict().items()}


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-10, atol=1e-10, msg=k)


@pytest.mark.parametrize("make", [lambda **kw: SVGPRegressor(**FAST, **kw),
                                  lambda **kw: TGPRegressor(flow="sal", robust=False, **FAST, **kw)])
def test_interrupted_fit_resumes_to_the_uninterrupted_result(make, tmp_path, monkeypatch):
    x, y = _data()
    reference = _state(make().fit(x, y))
    path = tmp_path / "fit.ckpt"
    from flowgp.models import SVGP

    with monkeypatch.context() as m:
        _count_elbo_calls(m, SVGP, interrupt_at=7)  # full batch: one ELBO per epoch, killed in the 7th epoch
        with pytest.raises(KeyboardInterrupt):
            make(checkpoint=path).fit(x, y)
    assert path.exists()
    with monkeypatch.context() as m:
        calls = _count_elbo_calls(m, SVGP)
        resumed = make(checkpoint=path).fit(x, y)
    # only the steps that had not finished ran again (the 7th is finished before saving, or run again)
    assert FAST["epochs"] - 7 <= calls["n"] <= FAST["epochs"] - 6
    _assert_same(_state(resumed), reference)


def test_fit_interrupted_mid_epoch_with_minibatches_resumes_exactly(tmp_path, monkeypatch):
    from flowgp.models import TGP

    x, y = _data()
    kw = dict(flow="sal", batch_size=16, epochs=6, num_inducing=8, verbose=False, kmeans_restarts=1, robust=False)
    reference = _state(TGPRegressor(**kw).fit(x, y))
    path = tmp_path / "minibatch.ckpt"
    with monkeypatch.context() as m:
        _count_elbo_calls(m, TGP, interrupt_at=11)  # 4 minibatches per epoch: killed at the 3rd of epoch 3
        with pytest.raises(KeyboardInterrupt):
            TGPRegressor(checkpoint=path, **kw).fit(x, y)
    with monkeypatch.context() as m:
        calls = _count_elbo_calls(m, TGP)
        resumed = TGPRegressor(checkpoint=path, **kw).fit(x, y)
    assert 6 * 4 - 11 <= calls["n"] <= 6 * 4 - 10
    _assert_same(_state(resumed), reference)


def test_multioutput_fit_resumes(tmp_path, monkeypatch):
    from flowgp.models.amogp.model import AMOGP

    X, y, o = _multioutput_data()
    kw = dict(num_inducing=6, num_inducing_alignment=4, num_inducing_warping=4, batch_size=None, epochs=6,
              verbose=False)
    reference = _state(AlignedMultiOutputGPRegressor(**kw).fit(X, y, o))
    path = tmp_path / "amogp.ckpt"
    with monkeypatch.context() as m:
        _count_elbo_calls(m, AMOGP, interrupt_at=4)
        with pytest.raises(KeyboardInterrupt):
            AlignedMultiOutputGPRegressor(checkpoint=path, **kw).fit(X, y, o)
    with monkeypatch.context() as m:
        calls = _count_elbo_calls(m, AMOGP)
        resumed = AlignedMultiOutputGPRegressor(checkpoint=path, **kw).fit(X, y, o)
    assert 6 - 4 <= calls["n"] <= 6 - 3
    _assert_same(_state(resumed), reference)


def test_checkpoint_must_be_a_path():
    x, y = _data(20)
    with pytest.raises(TypeError, match="checkpoint"):
        SVGPRegressor(checkpoint=3, **FAST).fit(x, y)


# ----- public seams ----------------------------------------------------------------------------------------------
def test_scaled_inputs_and_targets_are_what_the_model_sees():
    x, y = _data()
    est = SVGPRegressor(**FAST).fit(x, y)
    xt, yt = est.scaled_inputs(x), est.scaled_targets(y)
    np.testing.assert_allclose(xt.numpy(), (x - x.mean(0)) / x.std(0), rtol=1e-12)
    np.testing.assert_allclose(yt[:, 0].numpy(), (y - y.mean()) / y.std(), rtol=1e-12)
    with pytest.raises(ValueError, match="rows"):
        est.scaled_targets(y, 3)
