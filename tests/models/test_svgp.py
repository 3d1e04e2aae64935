"""SVGP (flowgp.models.svgp, Hensman et al. 2013) in closed form: at the prior q(v) = N(0, I) the bound is the
expected Gaussian log-likelihood under the prior marginals; the predictive adds the noise to q(f); draws of y
have the predictive's moments; bad likelihoods and inputs are refused."""
import math

import pytest
import torch

from flowgp.gp.kernels import make_kernel
from flowgp.gp.likelihoods import GaussianLikelihood
from flowgp.models import SVGP

pytestmark = pytest.mark.usefixtures("float64_default")


def _model(noise=0.1, m=6):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(20, 2, generator=g) * 4 - 2
    y = torch.sin(x[:, :1]) + 0.1 * torch.randn(20, 1, generator=g)
    return SVGP(make_kernel("rbf", 2, lengthscale=0.7), x[:m].clone(), GaussianLikelihood(noise)), x, y


def test_at_the_prior_the_bound_is_the_expected_log_likelihood_under_the_prior():
    model, x, y = _model(noise=0.1)
    with torch.no_grad():
        model.gp.q_mu.zero_()
        model.gp.q_sqrt.copy_(torch.eye(6).expand_as(model.gp.q_sqrt))  # q(v) = p(v): KL = 0
        assert model.gp.kl_divergence().abs().item() < 1e-12
        prior_var = model.gp.kernel(x).diagonal()  # q(f_n) = N(0, k(x_n, x_n)) (zero mean function)
        # E_N(f; 0, k)[log N(y; f, σ²)] = log N(y; 0, σ²) - k / (2σ²)
        expected = (-0.5 * math.log(2 * math.pi * 0.1) - y[:, 0].square() / 0.2 - prior_var / 0.2).sum()
        torch.testing.assert_close(model.elbo(x, y), expected, rtol=1e-10, atol=0)


def test_the_predictive_is_q_f_plus_the_noise():
    model, x, _ = _model(noise=0.3)
    with torch.no_grad():
        f_mean, f_var = model.predict_f(x)
        mean, var = model.predict(x)
        torch.testing.assert_close(mean, f_mean)
        torch.testing.assert_close(var, f_var + 0.3)
        full = model.predict_f(x[:5], full_cov=True)
        torch.testing.assert_close(full[1].diagonal(dim1=-2, dim2=-1).T, f_var[:5])


def test_draws_of_y_have_the_predictive_moments_and_follow_the_generator():
    model, x, _ = _model(noise=0.2)
    with torch.no_grad():
        model.gp.q_mu.normal_(generator=torch.Generator().manual_seed(1))
        mean, var = model.predict(x[:4])
        draws = model.sample_y(x[:4], 20000, generator=torch.Generator().manual_seed(2))  # [S, N, L]
        assert draws.shape == (20000, 4, 1)
        se = (var / 20000).sqrt()
        assert ((draws.mean(0) - mean).abs() < 5 * se).all()
        torch.testing.assert_close(draws.var(0), var, rtol=0.05, atol=0)
        one = model.sample_y(x[:4], 3, generator=torch.Generator().manual_seed(2))
        torch.testing.assert_close(model.sample_y(x[:4], 3, generator=torch.Generator().manual_seed(2)), one)
        assert not torch.allclose(model.sample_y(x[:4], 3, generator=torch.Generator().manual_seed(3)), one)


def test_bad_likelihoods_and_inputs_are_refused():
    model, x, y = _model()
    with pytest.raises(TypeError, match="likelihood must be a flowgp Likelihood"):
        SVGP(make_kernel("rbf", 2), x[:4], likelihood=torch.nn.Linear(1, 1))
    with pytest.raises(ValueError):
        model.predict(x[:, :1])  # one input column where the model has two
    with pytest.raises(ValueError):
        model.elbo(x, y[:5])  # rows of y do not match x
