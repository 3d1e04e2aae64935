"""scikit-learn's conformance suite on every public estimator (the scikit-learn contract).

`parametrize_with_checks` runs every check of `check_estimator` on each estimator with a tiny budget (4 inducing
points, 3 epochs), so the suite stays fast. `check_regressors_train` (R^2 > 0.5 on a toy problem) and
`check_classifiers_train` (accuracy > 0.83) measure learning and cannot pass at that budget (the deep GP
classifier's does): they are expected to fail here (not strictly: a library update may let a model learn the toy
problem in 3 epochs, as the deep GP classifier already does), and `benchmarks/studies/sklearn_conformance.py` runs every check at 150-400 epochs, where all pass
(docs/results/checks/sklearn-conformance/summary.md). The multi-output estimator's `fit(X, y, output)` is covered at
the end of this file.
"""
import warnings

import pytest
from sklearn.utils import estimator_checks as checks
from sklearn.utils.estimator_checks import parametrize_with_checks

import flowgp

TINY = dict(num_inducing=4, epochs=3, verbose=False, kmeans_restarts=1)
ESTIMATORS = [flowgp.SVGPRegressor(**TINY), flowgp.TGPRegressor(**TINY), flowgp.WarpedGPRegressor(**TINY),
              flowgp.SVGPClassifier(**TINY), flowgp.TGPClassifier(**TINY),
              flowgp.DeepGPRegressor(layers=2, num_samples_predict=5, **TINY),
              flowgp.DeepGPClassifier(layers=2, num_samples_predict=5, **TINY),
              flowgp.LatentDeepGPRegressor(num_samples_predict=10, **TINY)]
_BUDGET = "learning at the suite's 3-epoch budget; passes at the conformance benchmark's (module doc)"


def _expected_failures(estimator):
    if isinstance(estimator, flowgp.DeepGPClassifier):
        return {}
    return {"check_regressors_train": _BUDGET, "check_classifiers_train": _BUDGET}


@parametrize_with_checks(ESTIMATORS, expected_failed_checks=_expected_failures, xfail_strict=False)
def test_check_estimator(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        check(estimator)


def test_warped_gp_on_tied_targets_fits_and_a_degenerate_warping_raises_instead_of_predicting_nan():
    """scikit-learn's checks fit integer targets. The v-WGP bound's Jacobian term grows without bound on tied
    targets, and the robust fit's L-BFGS flow refinement drove the warping to a step: NaN predictions after 3
    epochs, inf/NaN losses at 400 (5 checks failed). The refinement now runs only after an inexact warm start,
    and a warping that still degenerates gives FloatingPointError, not NaN."""
    import numpy as np
    import torch
    from sklearn.datasets import make_blobs

    X, y = make_blobs(n_samples=30, centers=[[0, 0, 0], [1, 1, 1]], random_state=0, cluster_std=0.1)
    est = flowgp.WarpedGPRegressor(**TINY).fit(X, y)
    assert "refined_bound" not in est.fit_report_  # SAL starts exactly at the SVGP: nothing to refine
    assert np.isfinite(est.predict(X)).all()
    with torch.no_grad():  # the step-like warping and z-noise (variance ~720) that refinement reached
        sal = est.model_.flow
        sal.raw_parameter("b").fill_(805.0)  # the sinh-arcsinh's b
        sal.raw_parameter("d").fill_(-705.0)  # the affine map's scale
        est.model_.likelihood.raw_noise.fill_(720.0)
    with pytest.raises(FloatingPointError, match="non-finite mean .*few distinct values"):
        est.predict(X)


@pytest.mark.parametrize("check", ["check_methods_sample_order_invariance", "check_methods_subset_invariance"])
def test_deep_regressor_predictions_do_not_depend_on_other_rows(check):
    from flowgp import DeepGPRegressor
    est = DeepGPRegressor(layers=2, num_inducing=4, epochs=2, num_samples_predict=5, verbose=False,
                          kmeans_restarts=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        getattr(checks, check)("DeepGPRegressor", est)


@pytest.mark.parametrize("check", ["check_methods_sample_order_invariance", "check_methods_subset_invariance"])
@pytest.mark.parametrize("name", ["TGPRegressor", "TGPClassifier"])
def test_mc_dropout_predictions_do_not_depend_on_other_rows(name, check):
    """BA-TGP (MC dropout): each prediction sample is one dropout network shared by every row, so a row's
    prediction is the same whatever rows are predicted with it (per-row masks changed it by up to 0.09)."""
    import flowgp
    est = getattr(flowgp, name)(num_inducing=4, epochs=2, verbose=False, kmeans_restarts=1, input_dependent=True,
                                bayesian="mc_dropout", flow_init_epochs=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        getattr(checks, check)(name, est)


@pytest.mark.parametrize("check", ["check_methods_sample_order_invariance", "check_methods_subset_invariance"])
def test_latent_deep_gp_predictions_do_not_depend_on_other_rows(check):
    """Prediction sample s uses one z_s ~ p(z) and one hidden-layer ε for every row (common random numbers), so
    a row's prediction is the same whatever rows are predicted with it (per-row draws moved it by ~2e-3)."""
    from flowgp import LatentDeepGPRegressor
    est = LatentDeepGPRegressor(num_inducing=4, epochs=2, num_samples_predict=20, verbose=False, kmeans_restarts=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        getattr(checks, check)("LatentDeepGPRegressor", est)


# ----- the multi-output estimator: fit(X, y, output) -------------------------------------------------------
#: scikit-learn's checks that run on AlignedMultiOutputGPRegressor as it is (none calls fit or predict)
MULTIOUTPUT_APPLICABLE = ["check_estimator_cloneable", "check_estimator_repr", "check_no_attributes_set_in_init",
                          "check_do_not_raise_errors_in_init_or_set_params", "check_mixin_order",
                          "check_parameters_default_constructible", "check_get_params_invariance",
                          "check_set_params", "check_non_transformer_estimators_n_iter"]


@pytest.mark.parametrize("check", MULTIOUTPUT_APPLICABLE)
def test_multioutput_checks_that_apply(check):
    """The other checks of `check_estimator` cannot apply to AlignedMultiOutputGPRegressor: they call fit(X, y)
    and predict(X) without the per-row series index `output` the model needs (a row's series cannot be guessed),
    on toy data with several features where AMO-GP is a model of one input (time). Their input-contract parts
    are asserted with `output` given in test_multioutput_input_contract below."""
    from flowgp import AlignedMultiOutputGPRegressor

    getattr(checks, check)("AlignedMultiOutputGPRegressor", AlignedMultiOutputGPRegressor(epochs=2, verbose=False))


def test_multioutput_input_contract():
    """scikit-learn's input contract with fit(X, y, output): the messages of check_estimators_unfitted,
    check_estimators_empty_data_messages, check_estimators_nan_inf, check_estimator_sparse_*,
    check_complex_data, check_regressors_train (length mismatch), check_supervised_y_2d, check_fit2d_predict1d,
    check_requires_y_none and check_n_features_in, plus the output index's own checks."""
    import numpy as np
    import scipy.sparse as sp
    from sklearn.exceptions import DataConversionWarning, NotFittedError

    from flowgp import AlignedMultiOutputGPRegressor

    x = np.linspace(0, 1, 12)[:, None]
    y, o = np.sin(6 * x[:, 0]), np.arange(12) % 2

    def est():
        return AlignedMultiOutputGPRegressor(epochs=2, verbose=False, num_samples=10)

    with pytest.raises(NotFittedError, match=r"fit\(X, y, output\)"):
        est().predict(x, o)
    with pytest.raises(ValueError, match="0 sample"):
        est().fit(np.empty((0, 1)), np.empty(0), np.empty(0))
    bad = x.copy()
    bad[0] = np.nan
    with pytest.raises(ValueError, match="NaN or inf"):
        est().fit(bad, y, o)
    with pytest.raises(ValueError, match="NaN or inf"):
        est().fit(x, np.where(o == 0, np.inf, y), o)
    with pytest.raises(TypeError, match="[Ss]parse"):
        est().fit(sp.csr_matrix(x), y, o)
    with pytest.raises(ValueError, match="Complex data not supported"):
        est().fit(x + 1j, y, o)
    with pytest.raises(ValueError, match="y has 11 values but X has 12 rows"):
        est().fit(x, y[:-1], o)
    with pytest.raises(ValueError, match="requires y to be passed"):
        est().fit(x, None, o)
    with pytest.raises(ValueError, match="Reshape your data"):
        est().fit(x[:, 0], y, o)
    with pytest.raises(ValueError, match="output is required"):
        est().fit(x, y, None)
    with pytest.raises(ValueError, match="integer series indices"):
        est().fit(x, y, o + 0.5)
    with pytest.warns(DataConversionWarning):
        fitted = est().fit(x, y[:, None], o)
    assert fitted.n_features_in_ == 1
    with pytest.raises(ValueError, match="exactly one feature"):
        fitted.predict(np.hstack([x, x]), o)
    with pytest.raises(ValueError, match=r"0\.\.1"):
        fitted.predict(x, o + 5)


@pytest.mark.parametrize("check", ["check_n_features_in", "check_fit_check_is_fitted"])
@pytest.mark.parametrize("name", ["DeepGPRegressor", "DeepGPClassifier"])
def test_deep_estimators_take_sklearn_warm_start_setting(name, check):
    """scikit-learn's checks set `warm_start=False` on an estimator that has a parameter of that name (its
    meaning there: reuse the previous fit); the deep estimators' DSVI warm-up fraction was named so and refused
    False. It is `dsvi_warmup` now, and these checks fit."""
    import flowgp

    est = getattr(flowgp, name)(layers=2, num_inducing=4, epochs=2, num_samples_predict=5, verbose=False,
                                kmeans_restarts=1)
    assert "warm_start" not in est.get_params()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        getattr(checks, check)(name, est)
