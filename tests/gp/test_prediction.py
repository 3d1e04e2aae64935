"""The quantile solver of flowgp.gp.prediction: safeguarded Newton against plain bisection (scale:
TGP predict_interval on 200 000 rows took 63 s with 80 bisection steps over a 100-node mixture)."""
import pytest
import torch

from flowgp.gp.prediction import mixture_quantiles

PROBS = [1e-6, 0.025, 0.3, 0.5, 0.975, 1 - 1e-6]


def _mixture(kind, generator):
    k, n = 50, 40
    if kind == "unimodal":
        loc = torch.randn(k, n, generator=generator, dtype=torch.float64)
        spread = 0.5 + torch.rand(k, n, generator=generator, dtype=torch.float64)
    elif kind == "bimodal":  # two far clusters with narrow components: Newton from the moment match overshoots
        loc = torch.where(torch.arange(k)[:, None] < k // 3, -20.0, 30.0).to(torch.float64).expand(k, n).clone()
        loc += 0.1 * torch.randn(k, n, generator=generator, dtype=torch.float64)
        spread = torch.full((k, n), 0.05, dtype=torch.float64)
    else:  # spreads over nine orders of magnitude
        loc = 100 * torch.randn(k, n, generator=generator, dtype=torch.float64)
        spread = 10 ** (-6 + 9 * torch.rand(k, n, generator=generator, dtype=torch.float64))
    weights = torch.softmax(torch.randn(k, n, generator=generator, dtype=torch.float64), 0)
    return weights, loc, spread


def _cdf(loc, spread):
    return lambda t: torch.special.ndtr((t - loc) / spread)


def _cdf_pdf(loc, spread, calls):
    def f(t):
        calls.append(1)
        u = (t - loc) / spread
        return torch.special.ndtr(u), torch.exp(-0.5 * u.square()) / (spread * (2 * torch.pi) ** 0.5)
    return f


@pytest.mark.parametrize("kind", ["unimodal", "bimodal", "scales"])
def test_newton_quantiles_match_bisection(kind):
    weights, loc, spread = _mixture(kind, torch.Generator().manual_seed(3))
    bisected = mixture_quantiles(_cdf(loc, spread), weights, loc, spread, PROBS)
    calls = []
    newton = mixture_quantiles(None, weights, loc, spread, PROBS, component_cdf_pdf=_cdf_pdf(loc, spread, calls))
    scale = (loc.amax(0) - loc.amin(0) + spread.amax(0))
    torch.testing.assert_close(newton, bisected, atol=1e-9 * float(scale.max()), rtol=0)
    # the mixture CDF at the answer is the probability asked for
    cdf = (weights * _cdf(loc, spread)(newton.unsqueeze(1))).sum(1)
    torch.testing.assert_close(cdf, torch.tensor(PROBS, dtype=torch.float64)[:, None].expand_as(cdf),
                               atol=1e-9, rtol=0)
    # measured: 12, 20 and 35 (bisection: 80); a bound well below the cap of 80, so a lost Newton step fails
    assert len(calls) <= {"unimodal": 12, "bimodal": 30, "scales": 50}[kind], f"{len(calls)} iterations ({kind})"


def test_newton_quantiles_of_point_masses_and_float32():
    """Zero-variance components (a staircase CDF) stalled Newton below tol and returned the bracket's middle;
    float32 at p = 1e-6 must stay as close to the float64 answer as bisection does."""
    from flowgp.gp.prediction import gaussian_mixture_quantiles

    q = gaussian_mixture_quantiles(torch.tensor([[1.0], [2.0], [3.0]], dtype=torch.float64),
                                   torch.zeros(3, 1, dtype=torch.float64), [1e-6, 0.025, 0.975])
    torch.testing.assert_close(q[:, 0], torch.tensor([1.0, 1.0, 3.0], dtype=torch.float64))
    g = torch.Generator().manual_seed(0)
    mean = torch.randn(50, 30, generator=g)
    var = torch.rand(50, 30, generator=g) + 0.5
    q32 = gaussian_mixture_quantiles(mean, var, [1e-6, 0.5, 1 - 1e-4]).double()
    q64 = gaussian_mixture_quantiles(mean.double(), var.double(), [1e-6, 0.5, 1 - 1e-4])
    assert (q32 - q64).abs().max() < 2e-3


def test_newton_quantiles_do_not_depend_on_the_other_rows():
    """The stopping test is over the whole chunk, but a converged row stays put, so a row's quantile is the
    same (to float64 resolution) whatever rows are solved with it."""
    weights, loc, spread = _mixture("scales", torch.Generator().manual_seed(5))
    calls = []
    together = mixture_quantiles(None, weights, loc, spread, PROBS, component_cdf_pdf=_cdf_pdf(loc, spread, calls))
    alone = mixture_quantiles(None, weights[:, :1], loc[:, :1], spread[:, :1], PROBS,
                              component_cdf_pdf=_cdf_pdf(loc[:, :1], spread[:, :1], calls))
    torch.testing.assert_close(alone[:, 0], together[:, 0], atol=1e-12 * float(loc.abs().max()), rtol=1e-12)


def test_silverman_kde_log_density_is_sklearns_kernel_density_with_silvermans_bandwidth():
    """The IWVI authors' script: KernelDensity(bandwidth=1.06·std(draws)·S^(-1/5)).fit(draws).score(y)."""
    import numpy as np
    from sklearn.neighbors import KernelDensity

    from flowgp.gp.prediction import silverman_kde_log_density

    gen = torch.Generator().manual_seed(0)
    draws = torch.randn((500, 4), generator=gen, dtype=torch.float64) * torch.tensor([1.0, 0.1, 3.0, 2.0])
    draws[:250, 3] += 8.0  # a bimodal column
    y = torch.tensor([0.3, -0.05, 10.0, 4.0], dtype=torch.float64)
    ours = silverman_kde_log_density(draws, y)
    for j in range(4):
        d = draws[:, j].numpy()
        kde = KernelDensity(bandwidth=float(1.06 * np.std(d) * 500 ** -0.2)).fit(d[:, None])
        assert float(ours[j]) == pytest.approx(kde.score(np.array([[float(y[j])]])), abs=1e-10)
    # batched over leading dimensions other than the draws'
    np.testing.assert_allclose(silverman_kde_log_density(draws[:, None, :].expand(500, 3, 4), y),
                               ours.expand(3, 4).numpy(), atol=1e-12)
