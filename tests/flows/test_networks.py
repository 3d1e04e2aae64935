"""Networks for input-dependent flows with point / MC-dropout / VB weights (flowgp.flows.networks)."""
import math

import pytest
import torch
from torch.distributions import Normal, kl_divergence

from flowgp.flows.networks import BayesianMLP, default_prior_precision, gaussian_kl_to_prior

pytestmark = pytest.mark.usefixtures("float64_default")


def _perturb_std(net, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in list(net.weight_raw_std) + list(net.bias_raw_std):
            p.copy_(torch.randn(p.shape, generator=g) - 1.0)


def test_vb_kl_matches_closed_form_and_torch():
    net = BayesianMLP(3, 2, hidden=(4, 5), dropout=0.0, bayesian="vb", prior_precision=2.5)
    _perturb_std(net)
    lam = 2.5
    expected = 0.0
    for mu, raw in zip(list(net.weights) + list(net.biases), list(net.weight_raw_std) + list(net.bias_raw_std)):
        sd = torch.nn.functional.softplus(raw)
        # KL[N(μ, σ²) || N(0, 1/λ)] = log(σ_p/σ) + (σ² + μ²)/(2σ_p²) - 1/2, written out per weight
        sp2 = 1.0 / lam
        expected += (0.5 * math.log(sp2) - torch.log(sd) + (sd ** 2 + mu ** 2) / (2 * sp2) - 0.5).sum()
        reference = kl_divergence(Normal(mu, sd), Normal(torch.zeros_like(mu), math.sqrt(sp2))).sum()
        torch.testing.assert_close(gaussian_kl_to_prior(mu, sd, lam), reference)
    torch.testing.assert_close(net.penalty(), expected)


def test_vb_kl_agrees_with_monte_carlo():
    mu = torch.tensor([0.3, -1.0, 2.0])
    sd = torch.tensor([0.5, 1.5, 0.1])
    lam = 0.7
    g = torch.Generator().manual_seed(1)
    w = mu + sd * torch.randn(400_000, 3, generator=g)
    log_q = Normal(mu, sd).log_prob(w).sum(-1)
    log_p = Normal(0.0, 1 / math.sqrt(lam)).log_prob(w).sum(-1)
    mc = (log_q - log_p).mean()
    assert abs(mc.item() - gaussian_kl_to_prior(mu, sd, lam).item()) < 0.02


def test_point_and_dropout_penalty_is_weight_decay():
    net = BayesianMLP(3, 2, hidden=(4,), bayesian="mc_dropout", prior_precision=0.1)
    sq = sum(p.square().sum() for p in net.parameters())
    torch.testing.assert_close(net.penalty(), 0.05 * sq)
    assert default_prior_precision("point") == default_prior_precision("mc_dropout") == 1e-5
    assert default_prior_precision("vb") == 1.0


def test_dropout_zero_samples_equal_deterministic_pass():
    net = BayesianMLP(3, 4, hidden=(6, 6), dropout=0.0, bayesian="mc_dropout")
    x = torch.randn(9, 3)
    samples = net(x, num_samples=5)
    assert samples.shape == (5, 9, 4)
    torch.testing.assert_close(samples, net(x, sample=False).expand(5, 9, 4), rtol=0, atol=0)


def test_mc_dropout_mean_matches_deterministic_pass_with_one_hidden_layer():
    """Inverted dropout keeps E[h] = h, and the output layer is linear in h."""
    net = BayesianMLP(2, 3, hidden=(10,), dropout=0.5, bayesian="mc_dropout")
    x = torch.randn(4, 2)
    samples = net(x, num_samples=40_000)
    assert samples.std(0).min() > 0  # masks really vary
    torch.testing.assert_close(samples.mean(0), net(x, sample=False), rtol=0, atol=0.03)


def test_vb_samples_share_weights_across_rows_and_reparameterise():
    net = BayesianMLP(1, 1, hidden=(3,), activation="tanh", dropout=0.0, bayesian="vb")
    _perturb_std(net)
    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 5)[:, None]
    out = net(x, num_samples=3)
    assert out.shape == (3, 5, 1)
    # Same seed, same draws, computed by hand: w = μ + σ ε per sample, one draw for all rows.
    torch.manual_seed(0)
    w_std = [torch.nn.functional.softplus(r) for r in net.weight_raw_std]
    b_std = [torch.nn.functional.softplus(r) for r in net.bias_raw_std]
    eps_w = [torch.randn((3,) + w.shape) for w in net.weights]
    eps_b = [torch.randn((3,) + b.shape) for b in net.biases]
    for s in range(3):
        w0 = net.weights[0] + w_std[0] * eps_w[0][s]
        w1 = net.weights[1] + w_std[1] * eps_w[1][s]
        b0 = net.biases[0] + b_std[0] * eps_b[0][s]
        b1 = net.biases[1] + b_std[1] * eps_b[1][s]
        torch.testing.assert_close(out[s], torch.tanh(x @ w0 + b0) @ w1 + b1)
    out.sum().backward()  # gradients reach both μ and σ
    assert net.weights[0].grad is not None and net.weight_raw_std[0].grad.abs().sum() > 0


def test_network_gradcheck_in_float64():
    net = BayesianMLP(2, 2, hidden=(3,), activation="tanh", dropout=0.0, bayesian="vb")
    x = torch.randn(4, 2, requires_grad=True)

    def fn(inp):
        torch.manual_seed(3)  # the same weight draws at every evaluation
        return net(inp, num_samples=2)
    assert torch.autograd.gradcheck(fn, (x,))


def test_switch_point_and_mc_dropout_but_not_vb():
    net = BayesianMLP(2, 2, bayesian="point")
    assert not net.stochastic_prediction
    net.bayesian = "mc_dropout"
    assert net.stochastic_prediction
    with pytest.raises(ValueError, match="only 'point' <-> 'mc_dropout'"):
        net.bayesian = "vb"


@pytest.mark.parametrize("kwargs, match", [
    (dict(activation="sigmoid"), "activation must be one of"),
    (dict(dropout=1.0), "dropout must lie in"),
    (dict(dropout=0.25, bayesian="vb"), "uses no dropout"),
    (dict(bayesian="laplace"), "bayesian must be one of"),
    (dict(hidden=()), "hidden must list"),
    (dict(hidden=(0,)), "hidden must list"),
    (dict(hidden="50"), "hidden must list"),
    (dict(prior_precision=0.0), "prior_precision"),
])
def test_bad_options_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BayesianMLP(2, 2, **kwargs)


def test_bad_call_is_refused():
    net = BayesianMLP(2, 2)
    with pytest.raises(ValueError, match=r"expects inputs \[\.\.\., 2\]"):
        net(torch.randn(3, 4))
    with pytest.raises(ValueError, match="num_samples"):
        net(torch.randn(3, 2), num_samples=0)


def test_rows_share_masks_gives_one_dropout_network_per_sample():
    """rows_share_masks=True: every row of a sample sees the same dropout mask, so identical rows give
    identical outputs within a sample, while samples still differ; per-row masks make identical rows differ."""
    net = BayesianMLP(3, 4, hidden=(16,), dropout=0.5, bayesian="mc_dropout", init_std=0.5,
                      generator=torch.Generator().manual_seed(0)).double()
    x = torch.ones(5, 3, dtype=torch.float64)
    shared = net(x, num_samples=7, generator=torch.Generator().manual_seed(1), rows_share_masks=True)
    assert shared.shape == (7, 5, 4)
    assert torch.equal(shared, shared[:, :1].expand_as(shared))
    assert not torch.allclose(shared[0], shared[1])
    per_row = net(x, num_samples=7, generator=torch.Generator().manual_seed(1))
    assert not torch.allclose(per_row[:, 0], per_row[:, 1])
