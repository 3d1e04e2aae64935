"""Every reachable bad value is a ValueError or TypeError naming the argument and the fix, raised before any work
(`flowgp.estimators.validation`); `seed` follows scikit-learn's `random_state` convention and the seed a fit
used is `seed_`, which `save()` records."""
import inspect
import math
import warnings

import numpy as np
import pytest
import torch
from sklearn.base import BaseEstimator

import flowgp
import flowgp.estimators as E
from flowgp.estimators import validation
from flowgp.training.loop import train

TINY = dict(num_inducing=4, epochs=2, verbose=False, kmeans_restarts=1)


def _data(n=30, d=2, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    return x, np.sin(x[:, 0]) + 0.1 * rng.normal(size=n)


def _labels(n=30):
    return np.arange(n) % 2


def _make(name, **params):
    extra = {"DeepGPRegressor": dict(layers=2, num_samples_predict=5),
             "DeepGPClassifier": dict(layers=2, num_samples_predict=5),
             "LatentDeepGPRegressor": dict(num_samples_predict=10),
             "AlignedMultiOutputGPRegressor": dict(epochs=2, verbose=False, num_samples=10)}
    base = {} if name == "AlignedMultiOutputGPRegressor" else TINY
    return getattr(flowgp, name)(**{**base, **extra.get(name, {}), **params})


def _fit(est):
    x, y = _data()
    if isinstance(est, flowgp.AlignedMultiOutputGPRegressor):
        return est.fit(x[:, :1], y, np.arange(len(y)) % 2)
    if "Classifier" in type(est).__name__:
        return est.fit(x, _labels(len(y)))
    return est.fit(x, y)


PUBLIC = sorted(n for n in E.__all__ if isinstance(getattr(E, n), type) and issubclass(getattr(E, n), BaseEstimator)
                and n != "Estimator")

#: (estimator, parameter, bad value, exception, text the message must hold besides the parameter's name)
BAD = [
    # the cases found by hand
    ("SVGPRegressor", "lr", math.inf, ValueError, "finite"),
    ("SVGPRegressor", "lr", -0.1, ValueError, "(0, inf)"),
    ("SVGPRegressor", "lr", "0.01", TypeError, "number"),
    ("SVGPRegressor", "learn_inducing", "no", TypeError, "True or False"),
    ("AlignedMultiOutputGPRegressor", "num_samples", 0, ValueError, ">= 1"),
    ("SVGPRegressor", "epochs", 0, ValueError, ">= 1"),
    ("SVGPClassifier", "epochs", 0, ValueError, ">= 1"),
    ("LatentDeepGPRegressor", "epochs", 0, ValueError, ">= 1"),
    ("SVGPRegressor", "seed", -1, ValueError, "2**32 - 1"),
    ("SVGPRegressor", "seed", 2 ** 70, ValueError, "2**32 - 1"),
    ("SVGPRegressor", "seed", 1.5, TypeError, "Generator"),
    ("SVGPRegressor", "seed", "3", TypeError, "Generator"),
    ("TGPClassifier", "seed", True, TypeError, "Generator"),
    ("SVGPRegressor", "device", "gpu", ValueError, "not a device"),
    ("DeepGPRegressor", "device", 3, TypeError, "device name"),
    # siblings: integers that must be >= 1 (or >= 0), fractions, enums, booleans given as strings
    ("SVGPRegressor", "quadrature_points", 0, ValueError, ">= 1"),
    ("SVGPRegressor", "predict_quadrature_points", 0, ValueError, ">= 1"),
    ("SVGPRegressor", "kmeans_restarts", 0, ValueError, ">= 1"),
    ("SVGPRegressor", "num_inducing", 10.0, TypeError, "integer"),
    ("SVGPRegressor", "batch_size", 0, ValueError, ">= 1"),
    ("SVGPRegressor", "verbose", "no", TypeError, "True, False or 'auto'"),
    ("SVGPRegressor", "compile", "no", ValueError, "torch.compile mode"),
    ("SVGPRegressor", "lengthscale", 0.0, ValueError, "positive"),
    ("SVGPRegressor", "lengthscale", np.array([1.0, -1.0]), ValueError, "positive"),
    ("SVGPRegressor", "period", math.nan, ValueError, "positive"),
    ("SVGPRegressor", "noise", 0.0, ValueError, "(0, inf)"),
    ("SVGPRegressor", "fix_noise_fraction", 1.5, ValueError, "[0, 1]"),
    ("SVGPRegressor", "checkpoint", 3, TypeError, "file path"),
    ("TGPRegressor", "flow_init", "bogus", ValueError, "'identity'"),
    ("TGPClassifier", "flow_init", "data", ValueError, "'identity'"),
    ("TGPRegressor", "robust", "yes", TypeError, "RobustFit"),
    ("TGPRegressor", "input_dependent", "some", ValueError, "'all'"),
    ("TGPRegressor", "dropout", 1.0, ValueError, "[0, 1)"),
    ("TGPRegressor", "activation", "gelu", ValueError, "'relu'"),
    ("TGPRegressor", "mc_samples_predict", 0, ValueError, ">= 1"),
    ("TGPRegressor", "hidden", (50, 0), ValueError, "positive layer widths"),
    ("TGPRegressor", "prior_precision", -1.0, ValueError, "(0, inf)"),
    ("WarpedGPRegressor", "learn_inducing", 1, TypeError, "True or False"),
    ("SVGPClassifier", "mc_samples", 0, ValueError, ">= 1"),
    ("SVGPClassifier", "predict_samples", -5, ValueError, ">= 1"),
    ("SVGPClassifier", "fix_variance_epochs", -1, ValueError, ">= 0"),
    ("SVGPClassifier", "likelihood", "probit", ValueError, "'softmax'"),
    ("DeepGPClassifier", "likelihood", "probit", ValueError, "'robustmax'"),
    ("DeepGPRegressor", "num_samples_predict", 0, ValueError, ">= 1"),
    ("DeepGPRegressor", "hidden_width", 0, ValueError, ">= 1"),
    ("DeepGPRegressor", "flow_selection", "yes", TypeError, "True or False"),
    ("LatentDeepGPRegressor", "amortized", "no", TypeError, "True or False"),
    ("LatentDeepGPRegressor", "natgrad", 0, TypeError, "True or False"),
    ("LatentDeepGPRegressor", "lr_decay", 0.0, ValueError, "(0, inf)"),
    ("LatentDeepGPRegressor", "q_var_init", -1.0, ValueError, "(0, inf)"),
    ("LatentDeepGPRegressor", "extend_checkpoint", "yes", TypeError, "True or False"),
    ("AlignedMultiOutputGPRegressor", "start_from_mogp", "no", TypeError, "True or False"),
    ("AlignedMultiOutputGPRegressor", "latent_noise", 0.0, ValueError, "(0, inf)"),
    ("AlignedMultiOutputGPRegressor", "batch_size", "full", ValueError, "'auto'"),
    ("AlignedMultiOutputGPRegressor", "epochs", 0, ValueError, ">= 1"),
    ("SVGPRegressor", "shard_reads", "yes", TypeError, "'auto'"),
    ("DeepGPClassifier", "shard_reads", 0, TypeError, "True"),
    ("AlignedMultiOutputGPRegressor", "shard_reads", None, ValueError, "exact mode"),
]


@pytest.mark.parametrize("name, param, value, error, text", BAD,
                         ids=[f"{n}-{p}={v!r}" for n, p, v, _, _ in BAD])
def test_bad_parameter_is_refused_at_fit_naming_it_before_any_work(name, param, value, error, text):
    est = _make(name, **{param: value})
    with pytest.raises(error) as caught:
        _fit(est)
    message = str(caught.value)
    assert message.startswith(param) and text in message, message
    assert not hasattr(est, "model_")  # nothing was built


@pytest.mark.parametrize("name", PUBLIC)
def test_every_parameter_of_every_estimator_has_a_rule(name):
    cls = getattr(E, name)
    est = cls()
    params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    assert [p for p in params if validation.rule_for(est, p) is None] == []


@pytest.mark.parametrize("name", PUBLIC)
def test_defaults_and_numpy_typed_values_pass_the_rules(name):
    """No false alarm: the defaults pass, and so do NumPy scalars of the same values (what GridSearchCV over
    np.arange / np.logspace / boolean arrays hands over)."""
    est = getattr(E, name)()
    validation.check_parameters(est)
    numpy_typed = {}
    for param, value in est.get_params(deep=False).items():
        if isinstance(value, bool):
            numpy_typed[param] = np.bool_(value)
        elif isinstance(value, int) and param != "seed":
            numpy_typed[param] = np.int64(value)
        elif isinstance(value, float):
            numpy_typed[param] = np.float64(value)
    est.set_params(**numpy_typed)
    validation.check_parameters(est)
    est.set_params(seed=np.int64(3))
    validation.check_parameters(est)


# ----- the seed ----------------------------------------------------------------------------------------------------
def test_seed_follows_scikit_learns_random_state_convention():
    assert validation.resolve_seed(7) == 7 and validation.resolve_seed(np.uint32(2 ** 32 - 1)) == 2 ** 32 - 1
    fresh = {validation.resolve_seed(None) for _ in range(5)}
    assert len(fresh) > 1 and all(0 <= s <= validation.SEED_MAX for s in fresh)
    g1, g2 = np.random.default_rng(5), np.random.default_rng(5)
    assert validation.resolve_seed(g1) == validation.resolve_seed(g2)  # a seeded Generator repeats
    assert validation.resolve_seed(g1) != validation.resolve_seed(np.random.default_rng(5))  # and advances
    assert 0 <= validation.resolve_seed(np.random.RandomState(0)) <= validation.SEED_MAX
    for bad, error in [(-1, ValueError), (2 ** 32, ValueError), (2 ** 70, ValueError), (1.5, TypeError),
                       ("3", TypeError), (True, TypeError), (np.float64(2.0), TypeError)]:
        with pytest.raises(error, match="^seed must be"):
            validation.resolve_seed(bad)


def test_seed_used_is_recorded_in_seed_and_saved_for_reproducibility(tmp_path):
    x, y = _data()
    a = flowgp.SVGPRegressor(**TINY, seed=None).fit(x, y)
    b = flowgp.SVGPRegressor(**TINY, seed=None).fit(x, y)
    assert isinstance(a.seed_, int) and a.seed_ != b.seed_ and a.seed is None
    # the file records the seed the fit used: a refit of the loaded estimator repeats the fit bit for bit
    a.save(tmp_path / "a.pt")
    back = flowgp.load(tmp_path / "a.pt")
    assert back.seed == a.seed_ and back.seed_ == a.seed_
    np.testing.assert_array_equal(back.predict(x), a.predict(x))
    np.testing.assert_array_equal(back.sample_f(x, 3), a.sample_f(x, 3))  # draws from the fit's seed
    refit = flowgp.SVGPRegressor(**TINY, seed=back.seed).fit(x, y)
    np.testing.assert_array_equal(refit.predict(x), a.predict(x))
    # a Generator: each fit draws its seed from it, as scikit-learn's estimators do
    est = flowgp.SVGPRegressor(**TINY, seed=np.random.default_rng(0))
    first = est.fit(x, y).seed_
    assert est.fit(x, y).seed_ != first
    est.save(tmp_path / "g.pt")  # a Generator is not saved: the integer seed is
    assert flowgp.load(tmp_path / "g.pt").seed == est.seed_
    # an int: seed_ is the seed itself
    assert flowgp.SVGPRegressor(**TINY, seed=np.int64(3)).fit(x, y).seed_ == 3


def test_a_methods_own_seed_is_checked_as_the_parameter():
    x, y = _data()
    est = flowgp.SVGPRegressor(**TINY).fit(x, y)
    np.testing.assert_array_equal(est.sample_f(x, 2, seed=4), est.sample_f(x, 2, seed=np.int64(4)))
    with pytest.raises(ValueError, match="^seed must be"):
        est.sample_f(x, 2, seed=-1)


# ----- device --------------------------------------------------------------------------------------------------
def test_cuda_without_cuda_is_refused_by_fit_load_and_the_cli_with_one_check(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    x, y = _data()
    for name in PUBLIC:
        with pytest.raises(ValueError, match="^device='cuda': CUDA is not available on this machine; use device='cpu'"):
            _fit(_make(name, device="cuda"))
    flowgp.SVGPRegressor(**TINY).fit(x, y).save(tmp_path / "m.pt")
    with pytest.raises(ValueError, match="^device='cuda:1': CUDA is not available"):
        flowgp.load(tmp_path / "m.pt", device="cuda:1")
    with pytest.raises(ValueError, match="not a device"):
        flowgp.load(tmp_path / "m.pt", device="gpu")
    from flowgp.cli import main

    csv = tmp_path / "d.csv"
    csv.write_text("a,b\n1,2\n3,4\n")
    assert main(["predict", "--model", str(tmp_path / "m.pt"), "--data", str(csv), "--out", str(tmp_path / "p.csv"),
                 "--device", "cuda"]) == 2
    assert "--device cuda: CUDA is not available on this machine; use --device cpu" in capsys.readouterr().err


# ----- the other reachable cases ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["SVGPRegressor", "TGPRegressor", "DeepGPRegressor", "LatentDeepGPRegressor"])
def test_sample_f_refuses_a_bad_number_of_samples(name):
    x, y = _data()
    est = _make(name).fit(x, y)
    for bad in (-1, 0, 1.5):
        with pytest.raises(ValueError, match="^num_samples must be a positive integer"):
            est.sample_f(x, bad)


def test_a_step_size_that_blows_the_parameters_up_says_lower_lr():
    """lr=1e6: the first steps move the kernel hyperparameters so far that K_uu is singular; the training loop
    says so with the guard's advice instead of a Cholesky failure from deep inside the model."""
    x, y = _data()
    with pytest.raises(FloatingPointError, match="lower lr") as caught:
        flowgp.SVGPRegressor(**{**TINY, "epochs": 20}, lr=1e6).fit(x, y)
    assert "Cholesky" in str(caught.value)
    with pytest.raises(ValueError, match="^lr must be a positive finite step size"):
        train(torch.nn.Linear(2, 1), torch.as_tensor(x), torch.as_tensor(y)[:, None], epochs=1, lr=math.inf,
              verbose=False)


def test_a_checkpoint_of_another_model_is_refused_clearly(tmp_path):
    x, y = _data()
    params = dict(**{**TINY, "epochs": 4}, checkpoint=str(tmp_path / "ck.pt"))
    # Adam alone, as the plain TGP trains: the same optimisers, so the fingerprint is what differs
    flowgp.SVGPRegressor(**params, natural_gradient=None).fit(x, y)
    with pytest.raises(ValueError, match="written by another fit.*estimator: SVGPRegressor in the checkpoint, "
                                         "TGPRegressor now"):
        flowgp.TGPRegressor(**params, robust=False).fit(x, y)


def test_train_refuses_a_checkpoint_holding_another_models_state(tmp_path):
    from flowgp import SVGP, TGP, GaussianLikelihood, make_flow, make_kernel

    x = torch.linspace(0, 1, 20, dtype=torch.float64)[:, None]
    y = torch.sin(6 * x)
    path = tmp_path / "ck.pt"
    train(SVGP(make_kernel("rbf", 1), x[:4].clone(), GaussianLikelihood(0.05)), x, y, epochs=2, verbose=False,
          checkpoint_path=path)
    tgp = TGP(make_kernel("rbf", 1), x[:4].clone(), make_flow("sal"), GaussianLikelihood(0.05))
    with pytest.raises(ValueError, match="holds the state of another model .* own checkpoint path"):
        train(tgp, x, y, epochs=2, verbose=False, checkpoint_path=path)


@pytest.mark.parametrize("labels", [
    np.array(["2020-01-01", "2021-06-01"] * 15, dtype="datetime64[D]"),
    np.array([1, 2] * 15, dtype="timedelta64[s]"),
    [np.datetime64("2020-01-01"), np.datetime64("2021-01-01")] * 15,
])
@pytest.mark.parametrize("name", ["SVGPClassifier", "DeepGPClassifier"])
def test_date_labels_are_refused_at_fit(name, labels):
    x, _ = _data()
    est = _make(name)
    with pytest.raises(TypeError, match="^y holds labels of .*integers, booleans or strings"):
        est.fit(x, labels)
    assert not hasattr(est, "model_")


def test_datetime_objects_as_labels_are_refused_at_fit():
    import datetime

    x, _ = _data()
    labels = [datetime.date(2020, 1, 1), datetime.date(2021, 1, 1)] * 15
    with pytest.raises(TypeError, match="^y holds labels of type date"):
        flowgp.SVGPClassifier(**TINY).fit(x, labels)


@pytest.mark.parametrize("name", PUBLIC)
def test_a_table_path_with_an_array_of_targets_names_the_fix(tmp_path, name):
    x, y = _data()
    csv = tmp_path / "d.csv"
    csv.write_text("a,b,y\n" + "\n".join(f"{a},{b},{t}" for (a, b), t in zip(x, y)) + "\n")
    est = _make(name)
    with pytest.raises(TypeError, match="^y: when X is a table .*names its target column"):
        est.fit(str(csv), y)
    assert not hasattr(est, "model_")
