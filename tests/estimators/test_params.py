"""The scikit-learn parameter contract of every estimator (the constructors store their arguments through
`Estimator._store_arguments`): signatures and defaults as published, every argument kept unchanged
under its own name and nothing else, get_params / set_params / clone round trips."""
import inspect

import pytest
from sklearn.base import clone

import flowgp.estimators as E

# The published signatures (before the constructors moved to Estimator._store_arguments); a change here is an API change.
# Compared without their type annotations (names, order and defaults are the contract). verbose's default is
# "auto" since progress bars follow scikit-learn's quiet default (flowgp.reporting.progress); the regressors'
# natural_gradient and early_stop are "auto" since the defaults were chosen by time to a fitted bound. `threads`
# (torch threads per call, flowgp.estimators.threads) and then `shard_reads` (how the processes of a data-parallel run
# read a streamed table) were appended last, so positional calls keep their meaning.
SIGNATURES = {
    "SVGPRegressor": "(self, num_inducing=100, kernel='rbf', batch_size=None, epochs=1000, lr=0.01, seed=0, "
    "dtype='float64', device='cpu', noise=0.05, lengthscale=1.0, period=1.0, fix_noise_fraction=0.0, "
    "kmeans_restarts=10, learn_inducing=True, quadrature_points=20, predict_quadrature_points=100, verbose='auto', "
    "checkpoint=None, natural_gradient='auto', compile=False, early_stop='auto', threads='auto', shard_reads='auto')",
    "WarpedGPRegressor": "(self, flow='sal', flow_init='identity', num_inducing=100, kernel='rbf', batch_size=None, "
    "epochs=1000, lr=0.01, seed=0, dtype='float64', device='cpu', noise=0.05, lengthscale=1.0, period=1.0, "
    "fix_noise_fraction=0.0, kmeans_restarts=10, learn_inducing=True, quadrature_points=20, "
    "predict_quadrature_points=100, verbose='auto', robust=True, checkpoint=None, compile=False, early_stop='auto', threads='auto', shard_reads='auto')",
    "TGPRegressor": "(self, flow='sal', flow_init='identity', num_inducing=100, kernel='rbf', batch_size=None, "
    "epochs=1000, lr=0.01, seed=0, dtype='float64', device='cpu', noise=0.05, lengthscale=1.0, period=1.0, "
    "fix_noise_fraction=0.0, kmeans_restarts=10, learn_inducing=True, quadrature_points=20, "
    "predict_quadrature_points=100, verbose='auto', input_dependent=False, hidden=(50,), activation='relu', "
    "dropout=0.25, bayesian='mc_dropout', mc_samples_train=1, mc_samples_predict=100, prior_precision=None, "
    "flow_init_epochs=100, robust=True, checkpoint=None, compile=False, early_stop='auto', threads='auto', shard_reads='auto')",
    "SVGPClassifier": "(self, num_inducing=100, kernel='rbf', batch_size=None, epochs=1000, lr=0.01, seed=0, "
    "dtype='float64', device='cpu', lengthscale=1.0, period=1.0, likelihood='softmax', fix_variance_epochs=0, "
    "kmeans_restarts=10, learn_inducing=True, quadrature_points=20, mc_samples=20, predict_samples=256, "
    "verbose='auto', checkpoint=None, compile=False, threads='auto', shard_reads='auto')",
    "TGPClassifier": "(self, flow='sal', flow_init='identity', num_inducing=100, kernel='rbf', batch_size=None, "
    "epochs=1000, lr=0.01, seed=0, dtype='float64', device='cpu', lengthscale=1.0, period=1.0, "
    "likelihood='softmax', fix_variance_epochs=0, kmeans_restarts=10, learn_inducing=True, quadrature_points=20, "
    "mc_samples=20, predict_samples=256, verbose='auto', input_dependent=False, hidden=(50,), activation='relu', "
    "dropout=0.25, bayesian='mc_dropout', mc_samples_train=1, mc_samples_predict=100, prior_precision=None, "
    "flow_init_epochs=100, robust=True, checkpoint=None, compile=False, threads='auto', shard_reads='auto')",
    "DeepGPRegressor": "(self, layers=3, posterior='gaussian', num_samples_train=1, num_samples_predict=100, "
    "hidden_width=None, flow_steps=2, flow_base='network', num_inducing=100, kernel='rbf', batch_size=None, "
    "epochs=1000, lr=0.01, seed=0, dtype='float64', device='cpu', noise=0.05, lengthscale=1.0, period=1.0, "
    "fix_noise_fraction=0.0, kmeans_restarts=10, learn_inducing=True, quadrature_points=20, "
    "predict_quadrature_points=100, verbose='auto', checkpoint=None, flow_elementwise='entry', dsvi_warmup=0.0, "
    "skip='linear', image_shape=None, draws=None, compile=False, base_gradient=None, flow_selection=True, flow_lr_scale=0.1, flow_rows=32, threads='auto', shard_reads='auto')",
    "DeepGPClassifier": "(self, layers=3, posterior='gaussian', num_samples_train=1, num_samples_predict=100, "
    "hidden_width=None, flow_steps=2, flow_base='network', likelihood='robustmax', num_inducing=100, kernel='rbf', "
    "batch_size=None, epochs=1000, lr=0.01, seed=0, dtype='float64', device='cpu', lengthscale=1.0, period=1.0, "
    "kmeans_restarts=10, learn_inducing=True, quadrature_points=20, predict_quadrature_points=100, verbose='auto', "
    "checkpoint=None, flow_elementwise='entry', dsvi_warmup=0.0, skip='linear', image_shape=None, draws=None, compile=False, base_gradient=None, flow_selection=True, flow_lr_scale=0.1, flow_rows=32, threads='auto', shard_reads='auto')",
    "LatentDeepGPRegressor": "(self, layers=2, latent_dim=1, num_importance=5, gradient='dreg', amortized=True, "
    "natgrad=False, hidden_width=5, num_inducing=128, kernel='rbf', batch_size=None, epochs=1000, lr=0.005, "
    "lr_decay=0.98, natgrad_lr=0.01, seed=0, dtype='float64', device='cpu', noise=0.01, kmeans_restarts=10, "
    "learn_inducing=True, num_samples_predict=10000, verbose='auto', checkpoint=None, hidden_layer='pca', "
    "q_var_init=1e-05, hidden_q_var_init=None, learn_hidden_variance=True, compile=False, "
    "extend_checkpoint=False, encoder_skips='dense', objective='bound', threads='auto', shard_reads='auto')",
    "AlignedMultiOutputGPRegressor": "(self, num_inducing=None, num_inducing_alignment=10, num_inducing_warping=10, "
    "latent_processes=1, alignment='gp', warping='gp', num_outputs=None, batch_size='auto', epochs=500, lr=0.01, "
    "seed=0, dtype='float64', device='cpu', noise=0.05, lengthscale=0.3, alignment_variance=0.01, "
    "alignment_lengthscale=1.0, warping_variance=0.05, warping_lengthscale=1.0, alignment_noise=1e-05, "
    "latent_noise=0.001, num_samples=200, verbose='auto', checkpoint=None, natural_gradient=0.5, "
    "natural_gradient_layers='latent', tol=0.0001, patience=50, full_batch_max=2048, cp_inducing='latent', start_from_mogp=False, compile=False, "
    "cp_grid=None, threads='auto', shard_reads='auto')",
}


def test_every_public_estimator_is_covered():
    from sklearn.base import BaseEstimator

    public = {n for n in E.__all__ if isinstance(getattr(E, n), type) and issubclass(getattr(E, n), BaseEstimator)
              and n != "Estimator"}
    assert public == set(SIGNATURES)


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature_and_defaults_unchanged(name):
    signature = inspect.signature(getattr(E, name).__init__)
    plain = signature.replace(parameters=[p.replace(annotation=inspect.Parameter.empty)
                                          for p in signature.parameters.values()],
                              return_annotation=inspect.Signature.empty)
    assert str(plain) == SIGNATURES[name]


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_every_constructor_argument_has_a_type_annotation(name):
    signature = inspect.signature(getattr(E, name).__init__)
    missing = [p.name for p in signature.parameters.values()
               if p.name != "self" and p.annotation is inspect.Parameter.empty]
    assert missing == []


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_arguments_stored_unchanged_and_nothing_else(name):
    cls = getattr(E, name)
    names = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    # one distinct object per argument: each must come back as the very object given, under its own name
    given = {p: object() for p in names}
    est = cls(**given)
    assert set(vars(est)) == set(names)  # no `self`, no `__class__` cell, no derived attribute
    params = est.get_params(deep=False)
    assert params.keys() == given.keys() and all(params[p] is given[p] for p in names)
    # defaults: get_params of a default-constructed estimator is the signature's defaults
    defaults = {p: v.default for p, v in inspect.signature(cls.__init__).parameters.items() if p != "self"}
    assert cls().get_params(deep=False) == defaults


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_clone_and_set_params_round_trip(name):
    cls = getattr(E, name)
    est = cls(seed=7, epochs=3, verbose=False, checkpoint="run.pt")
    copy = clone(est)
    assert type(copy) is cls and copy is not est
    assert copy.get_params(deep=False) == est.get_params(deep=False)
    copy.set_params(seed=11, lr=0.5)
    assert (copy.seed, copy.lr, est.seed) == (11, 0.5, 7)
    with pytest.raises(ValueError):
        copy.set_params(not_a_parameter=1)
