"""The variational warped GP (flowgp.models.warped, TGP paper §4.3): with T = identity it is the SVGP; quantiles
are T⁻¹ of the Gaussian ones (the median T⁻¹(μ)); draws of y follow those quantiles; a warping onto part of the
line, or a non-Gaussian likelihood, is refused."""
import pytest
import torch

from flowgp.flows import make_flow
from flowgp.gp.kernels import make_kernel
from flowgp.gp.likelihoods import BernoulliLikelihood, GaussianLikelihood
from flowgp.models import SVGP, WarpedGP
from flowgp.training.initialisation import init_random

pytestmark = pytest.mark.usefixtures("float64_default")


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(25, 1, generator=g) * 4 - 2
    return x, torch.sin(2 * x) + 0.1 * torch.randn(25, 1, generator=g), g


def test_identity_warping_is_the_svgp():
    x, y, g = _data()
    svgp = SVGP(make_kernel("rbf", 1), x[:7].clone(), GaussianLikelihood(0.1))
    with torch.no_grad():
        svgp.gp.q_mu.normal_(generator=g)
    wgp = WarpedGP(make_kernel("rbf", 1), x[:7].clone(), "identity", GaussianLikelihood(0.1))
    wgp.load_state_dict(svgp.state_dict(), strict=False)
    with torch.no_grad():
        torch.testing.assert_close(wgp.elbo(x, y), svgp.elbo(x, y))
        torch.testing.assert_close(wgp.log_predictive_density(x, y), svgp.log_predictive_density(x, y))
        for a, b in zip(wgp.predict(x), svgp.predict(x)):  # the mean and variance by quadrature: exact here
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_quantiles_median_and_draws_are_the_warped_gaussian_ones():
    x, y, g = _data()
    flow = init_random(make_flow("sinharcsinh"), std=0.5, generator=torch.Generator().manual_seed(3))
    wgp = WarpedGP(make_kernel("rbf", 1), x[:7].clone(), flow, GaussianLikelihood(0.1))
    with torch.no_grad():
        wgp.gp.q_mu.normal_(generator=g)
        rows = x[:3]
        mean, var = wgp.likelihood.predictive_moments(*wgp.gp.marginals(rows))  # of z* = T(y*)
        q = wgp.predict_quantiles(rows, [0.1, 0.5, 0.9])
        normal = torch.distributions.Normal(mean, var.sqrt())
        expected = torch.stack([flow.inverse(normal.icdf(torch.tensor(p))) for p in (0.1, 0.5, 0.9)])
        torch.testing.assert_close(q, expected)
        torch.testing.assert_close(wgp.predict_median(rows), q[1])
        draws = wgp.sample_y(rows, 20000, generator=torch.Generator().manual_seed(4))
        below = (draws[None] <= q[:, None]).double().mean(1)  # the fraction of draws under each quantile [P, N, L]
        torch.testing.assert_close(below, torch.tensor([0.1, 0.5, 0.9])[:, None, None].expand(3, 3, 1),
                                   atol=0.015, rtol=0)  # 3.5 standard errors of a fraction of 20 000 draws


def test_a_warping_onto_part_of_the_line_or_a_non_gaussian_likelihood_is_refused():
    x, _, _ = _data()
    with pytest.raises(ValueError, match="whole real line"):
        WarpedGP(make_kernel("rbf", 1), x[:4], "softplus")
    with pytest.raises(TypeError, match="GaussianLikelihood"):
        WarpedGP(make_kernel("rbf", 1), x[:4], "identity", BernoulliLikelihood())
    wgp = WarpedGP(make_kernel("rbf", 1), x[:4], "log")
    with pytest.raises(ValueError, match="positive"):
        wgp.elbo(x, -torch.ones(25, 1))  # y outside T's domain
