import math

import pytest
import torch

from flowgp.gp.likelihoods import GaussianLikelihood, Likelihood
from flowgp.numerics.quadrature import expectation, gh_points


def test_gaussian_closed_forms_match_quadrature():
    lik = GaussianLikelihood(noise=0.3).double()
    y = torch.tensor([[0.2], [-1.0], [3.0]], dtype=torch.float64)
    mean = torch.tensor([[0.0], [0.5], [2.0]], dtype=torch.float64)
    var = torch.tensor([[0.1], [1.5], [0.01]], dtype=torch.float64)
    quad = Likelihood.expected_log_prob(lik, y, mean, var, num_points=20)
    torch.testing.assert_close(lik.expected_log_prob(y, mean, var), quad, rtol=1e-12, atol=1e-12)
    quad_lpd = Likelihood.predictive_log_density(lik, y, mean, var, num_points=200)
    torch.testing.assert_close(lik.predictive_log_density(y, mean, var), quad_lpd, rtol=1e-6, atol=1e-8)
    assert lik.noise.item() == pytest.approx(0.3)


def test_noise_setter_and_validation():
    lik = GaussianLikelihood(noise=0.1, num_outputs=2).double()
    lik.noise = 0.5
    torch.testing.assert_close(lik.noise, torch.full((2,), 0.5, dtype=torch.float64))
    with pytest.raises(ValueError, match="noise"):
        GaussianLikelihood(noise=0.0)


def test_log_prob_is_normal_density():
    lik = GaussianLikelihood(noise=2.0).double()
    got = lik.log_prob(torch.tensor(1.0, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64))
    assert got.item() == pytest.approx(-0.5 * math.log(2 * math.pi * 2.0) - 0.25)


# ---------------------------------------------------------------------------------------------------
# Classification likelihoods (Bernoulli/probit, softmax, robust max)
# ---------------------------------------------------------------------------------------------------
from flowgp.gp.likelihoods import BernoulliLikelihood, RobustMaxLikelihood, SoftmaxLikelihood  # noqa: E402


def _class_marginals(n=6, c=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    mean = 1.5 * torch.randn(n, c, generator=g, dtype=torch.float64)
    var = 0.1 + torch.rand(n, c, generator=g, dtype=torch.float64)
    y = torch.randint(0, c, (n,), generator=g)
    return mean, var, y


def _mc_agrees(estimate, draws, sigmas=4.0):
    """|estimate - mean(draws)| within `sigmas` standard errors of the Monte Carlo mean (per element)."""
    mc = draws.mean(0)
    se = draws.std(0) / math.sqrt(draws.shape[0])
    assert torch.all((estimate - mc).abs() <= sigmas * se + 1e-5), (estimate, mc, se)


def test_bernoulli_log_prob_is_probit():
    lik = BernoulliLikelihood()
    f = torch.tensor([-2.0, 0.0, 1.3], dtype=torch.float64)
    phi = 0.5 * (1 + torch.erf(f / math.sqrt(2)))
    torch.testing.assert_close(lik.log_prob(torch.ones(3, dtype=torch.float64), f), phi.log())
    torch.testing.assert_close(lik.log_prob(torch.zeros(3, dtype=torch.float64), f), (1 - phi).log())
    # stays finite far in the tails where Φ underflows
    assert torch.isfinite(lik.log_prob(torch.ones(1, dtype=torch.float64), torch.tensor([-40.0], dtype=torch.float64)))


def test_bernoulli_quadrature_ell_agrees_with_monte_carlo():
    lik = BernoulliLikelihood()
    mean, var, _ = _class_marginals(c=1)
    y = (torch.arange(6) % 2).double().unsqueeze(-1)
    quad = lik.expected_log_prob(y, mean, var, num_points=40)
    g = torch.Generator().manual_seed(1)
    f = mean + var.sqrt() * torch.randn((100000,) + mean.shape, generator=g, dtype=torch.float64)
    _mc_agrees(quad, lik.log_prob(y, f))


def test_bernoulli_predictive_closed_form_matches_quadrature():
    lik = BernoulliLikelihood()
    mean, var, _ = _class_marginals(c=1)
    p = lik.predictive_prob(mean, var)
    quad = expectation(lambda f: torch.special.ndtr(f), mean, var, 80)
    torch.testing.assert_close(p, quad, rtol=1e-8, atol=1e-10)
    y = torch.ones_like(mean)
    torch.testing.assert_close(lik.predictive_log_density(y, mean, var),
                               Likelihood.predictive_log_density(lik, y, mean, var, 100), rtol=1e-7, atol=1e-9)


def test_softmax_log_prob_and_shapes():
    lik = SoftmaxLikelihood(4)
    mean, var, y = _class_marginals()
    lp = lik.log_prob(y, mean)
    torch.testing.assert_close(lp, torch.log_softmax(mean, -1)[torch.arange(6), y])
    f = torch.randn(7, 6, 4, dtype=torch.float64)  # extra leading (sample) dimension
    assert lik.log_prob(y, f).shape == (7, 6)
    probs = lik.predictive_probs(mean, var, num_samples=50)
    assert probs.shape == (6, 4)
    torch.testing.assert_close(probs.sum(-1), torch.ones(6, dtype=torch.float64))


def test_softmax_mc_ell_is_unbiased_against_a_large_reference():
    lik = SoftmaxLikelihood(4)
    mean, var, y = _class_marginals()
    reference = lik.expected_log_prob(y, mean, var, num_samples=200000, generator=torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(6)
    small = torch.stack([lik.expected_log_prob(y, mean, var, num_samples=10, generator=g) for _ in range(2000)])
    _mc_agrees(reference, small)
    # reparameterised: gradients reach the variational mean and variance
    mean.requires_grad_(True)
    var.requires_grad_(True)
    lik.expected_log_prob(y, mean, var, 10).sum().backward()
    assert torch.isfinite(mean.grad).all() and mean.grad.abs().sum() > 0 and var.grad.abs().sum() > 0


def test_robustmax_quadrature_agrees_with_monte_carlo():
    lik = RobustMaxLikelihood(4, epsilon=0.01)
    mean, var, y = _class_marginals()
    quad = lik.expected_log_prob(y, mean, var, num_points=40)
    g = torch.Generator().manual_seed(2)
    f = mean + var.sqrt() * torch.randn((200000,) + mean.shape, generator=g, dtype=torch.float64)
    _mc_agrees(quad, lik.log_prob(y, f))
    # predictive probabilities: argmax frequencies, and they sum to one
    probs = lik.predictive_probs(mean, var, num_points=60)
    torch.testing.assert_close(probs.sum(-1), torch.ones(6, dtype=torch.float64), rtol=0, atol=1e-6)
    freq = torch.stack([(f.argmax(-1) == c).double() for c in range(4)], -1)
    low = 0.01 / 3
    _mc_agrees(probs, low + (1 - 0.01 - low) * freq)


def test_robustmax_log_prob_levels_and_gradient():
    lik = RobustMaxLikelihood(3, epsilon=0.1)
    f = torch.tensor([[0.0, 2.0, 1.0]], dtype=torch.float64)
    torch.testing.assert_close(lik.log_prob(torch.tensor([1]), f), torch.tensor([math.log(0.9)], dtype=torch.float64))
    torch.testing.assert_close(lik.log_prob(torch.tensor([0]), f), torch.tensor([math.log(0.05)], dtype=torch.float64))
    mean = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    var = (0.2 + torch.rand(4, 3, dtype=torch.float64)).requires_grad_(True)
    y = torch.tensor([0, 1, 2, 1])
    assert torch.autograd.gradcheck(lambda m, v: lik.expected_log_prob(y, m, v, 20), (mean, var))


def test_classification_likelihoods_refuse_bad_input():
    with pytest.raises(ValueError, match="num_classes"):
        SoftmaxLikelihood(1)
    with pytest.raises(ValueError, match="epsilon"):
        RobustMaxLikelihood(3, epsilon=0.9)
    lik = SoftmaxLikelihood(3)
    f = torch.zeros(2, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="class indices"):
        lik.log_prob(torch.tensor([0, 3]), f)
    with pytest.raises(ValueError, match="integer"):
        lik.log_prob(torch.tensor([0.5, 1.0]), f)


# ---------------------------------------------------------------------------------------------------
# The flow-warped likelihood (TGP: p(y | f₀) = base(y | G(f₀)); appendix eqs. 14, 19, 20, A.3)
# ---------------------------------------------------------------------------------------------------
from flowgp.numerics.constraints import Positive  # noqa: E402
from flowgp.flows import Flow, ParamSpec, make_flow, make_input_dependent  # noqa: E402
from flowgp.gp.likelihoods import WarpedLikelihood  # noqa: E402
from flowgp.registry import LIKELIHOODS  # noqa: E402


class _Cubic(Flow):
    """A user's flow defined outside flowgp: G(f) = s + f + c f³ (c > 0), strictly increasing on the reals."""

    name = "user_cubic"
    param_specs = (ParamSpec("c", Positive(), 0.1), ParamSpec("s", None, 0.0))

    def _forward(self, f, p):
        return p["s"] + f + p["c"] * f ** 3

    def _log_det(self, f, p):
        return torch.log1p(3.0 * p["c"] * f.square())


def _gaussian_marginals(seed=0, n=7):
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(n, 1, generator=g, dtype=torch.float64)
    var = 0.05 + torch.rand(n, 1, generator=g, dtype=torch.float64)
    y = torch.randn(n, 1, generator=g, dtype=torch.float64)
    return mean, var, y, g


@pytest.mark.parametrize("flow", ["sal+softplus", "user"])
def test_warped_expected_log_prob_agrees_with_monte_carlo(flow):
    flow = _Cubic(c=0.3, s=0.2).double() if flow == "user" else make_flow(flow).double()
    lik = WarpedLikelihood(flow, GaussianLikelihood(0.2, dtype=torch.float64))
    mean, var, y, g = _gaussian_marginals()
    with torch.no_grad():
        quad = lik.expected_log_prob(y, mean, var, num_points=40)
        f = mean + var.sqrt() * torch.randn((200_000,) + mean.shape, generator=g, dtype=torch.float64)
        vals = lik.base.log_prob(y, flow(f))
        mc, se = vals.mean(0), vals.std(0) / math.sqrt(200_000)
    assert torch.all((quad - mc).abs() < 5 * se + 1e-8), (quad - mc, se)
    # and log_prob is the base's density at G(f)
    torch.testing.assert_close(lik.log_prob(y, f[:3]), lik.base.log_prob(y, flow(f[:3])))


@pytest.mark.parametrize("base", ["gaussian", "bernoulli"])
def test_warped_affine_closed_form_equals_quadrature(base):
    flow = make_flow("affine").double()
    with torch.no_grad():
        flow.raw.copy_(torch.tensor([0.7, 0.4]))  # raw (a, b)
    mean, var, y, _ = _gaussian_marginals(1)
    if base == "bernoulli":
        y = (y > 0).to(torch.float64)
    make = lambda closed: WarpedLikelihood(flow, LIKELIHOODS.create(base), closed_form_affine=closed).double()
    closed, quad = make(True), make(False)
    with torch.no_grad():
        torch.testing.assert_close(closed.expected_log_prob(y, mean, var, 30), quad.expected_log_prob(y, mean, var, 30),
                                   rtol=1e-10, atol=1e-12)
        for a, b in zip(closed.predictive_moments(mean, var, 100), quad.predictive_moments(mean, var, 100)):
            torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)
        tol = 1e-10 if base == "bernoulli" else 1e-4  # quadrature of a Gaussian density is not exact
        torch.testing.assert_close(closed.predictive_log_density(y, mean, var, 100),
                                   quad.predictive_log_density(y, mean, var, 100), rtol=tol, atol=tol)


def test_warped_predictive_quantiles_invert_the_mixture_cdf():
    flow = _Cubic(c=0.5, s=-0.1).double()
    lik = WarpedLikelihood(flow, GaussianLikelihood(0.1, dtype=torch.float64))
    mean, var, _, _ = _gaussian_marginals(2)
    with torch.no_grad():
        q = lik.predictive_quantiles(mean, var, [0.1, 0.5, 0.9], 60)
        f, w = gh_points(mean, var, 60)
        for i, p in enumerate((0.1, 0.5, 0.9)):
            cdf = (w * lik.cdf(q[i], f)).sum(0)
            torch.testing.assert_close(cdf, torch.full_like(cdf, p), rtol=0, atol=1e-9)
        # latent quantiles are G of the Gaussian quantiles (G increasing)
        lq = lik.latent_quantiles(mean, var, [0.5])
        torch.testing.assert_close(lq[0], flow(mean))


def test_warped_input_dependent_penalty_is_a_kl_term():
    flow = make_input_dependent(make_flow("sal"), 2, hidden=(3,), bayesian="vb", dropout=0.0).double()
    lik = WarpedLikelihood(flow, GaussianLikelihood(0.1, dtype=torch.float64), mc_samples_train=3)
    assert lik.input_dependent and lik.accepts_inputs
    (term,) = lik.kl_terms()
    torch.testing.assert_close(term, flow.network.penalty())
    assert WarpedLikelihood("sal").kl_terms() == []
    mean, var, y, _ = _gaussian_marginals(3)
    x = torch.randn(mean.shape[0], 2, dtype=torch.float64)
    lik.train()
    assert lik.expected_log_prob(y, mean, var, 5, x=x).shape == y.shape
    with pytest.raises(ValueError, match="needs the inputs x"):
        lik.expected_log_prob(y, mean, var, 5)


def test_warped_likelihood_checks_its_arguments():
    with pytest.raises(ValueError, match="positive"):
        WarpedLikelihood("log")
    with pytest.raises(TypeError, match="Likelihood"):
        WarpedLikelihood("sal", base="gaussian")
    with pytest.raises(TypeError, match="Flow"):
        WarpedLikelihood(3)
    with pytest.raises(ValueError, match="mc_samples_train"):
        WarpedLikelihood("sal", mc_samples_train=0)
    with pytest.raises(TypeError, match="compose"):
        WarpedLikelihood("sal", WarpedLikelihood("sal"))


def test_likelihood_registry_and_float64_parameters():
    assert isinstance(LIKELIHOODS.create("gaussian"), GaussianLikelihood)
    assert isinstance(LIKELIHOODS.create("probit"), BernoulliLikelihood)
    assert isinstance(LIKELIHOODS.create("softmax", 3), SoftmaxLikelihood)
    assert isinstance(LIKELIHOODS.create("robustmax", 3), RobustMaxLikelihood)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    try:  # parameters do not follow the global default dtype
        assert GaussianLikelihood(0.1).raw_noise.dtype == torch.float64
    finally:
        torch.set_default_dtype(previous)
    assert GaussianLikelihood(0.1, dtype=torch.float32).raw_noise.dtype == torch.float32


def test_gaussian_log_prob_at_nodes_is_the_weighted_sum_of_log_probs():
    g = torch.Generator().manual_seed(2)
    lik = GaussianLikelihood(0.3, num_outputs=2, dtype=torch.float64)
    y = torch.randn(7, 2, generator=g, dtype=torch.float64)
    f = torch.randn(5, 7, 2, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.rand(5, 1, 1, generator=g, dtype=torch.float64)  # any weights, not only normalised ones
    got = lik.log_prob_at_nodes(y, f, w)
    want = Likelihood.log_prob_at_nodes(lik, y, f, w)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    dg = torch.autograd.grad(got.sum(), (f, lik.raw_noise))
    dw = torch.autograd.grad(want.sum(), (f, lik.raw_noise))
    for u, v in zip(dg, dw):
        torch.testing.assert_close(u, v, rtol=1e-12, atol=1e-12)
