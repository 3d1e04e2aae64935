"""Sampling of the input-dependent flows' weights as an argument (WeightSampling) and from explicit generators."""
import pytest
import torch

from flowgp.flows.networks import BayesianMLP
from flowgp.flows import InputDependentFlow, WeightSampling, make_flow, make_input_dependent, static_flow


def _build(seed, bayesian, dropout):
    return make_input_dependent(make_flow("sal+tanh", param_shape=(2,)), 3, which="all", hidden=(6,),
                                dropout=dropout, bayesian=bayesian, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("bayesian,dropout", [("mc_dropout", 0.3), ("vb", 0.0)])
def test_global_rng_is_untouched_and_seeds_reproduce(bayesian, dropout):
    state = torch.get_rng_state()
    g = torch.Generator().manual_seed(11)
    x = torch.randn(5, 3, generator=g, dtype=torch.float64)  # parameters are float64 whatever the default
    f = torch.randn(5, 2, generator=g, dtype=torch.float64)
    flow = _build(0, bayesian, dropout)
    flow.train()
    draws = flow(f, x, sampling=WeightSampling(4, generator=torch.Generator().manual_seed(3)))
    flow(f, x, sampling=WeightSampling(stochastic=False))
    flow.inverse(flow(f, x, sampling=WeightSampling(stochastic=False)), x, sampling=WeightSampling(stochastic=False))
    flow.log_abs_det_jacobian(f, x, sampling=WeightSampling(2, generator=g))
    assert torch.equal(torch.get_rng_state(), state)

    again = _build(0, bayesian, dropout)
    for a, b in zip(flow.parameters(), again.parameters()):
        assert torch.equal(a, b)
    torch.testing.assert_close(again(f, x, sampling=WeightSampling(4, generator=torch.Generator().manual_seed(3))),
                               draws, rtol=0, atol=0)
    other = again(f, x, sampling=WeightSampling(4, generator=torch.Generator().manual_seed(4)))
    assert draws.shape == (4, 5, 2) and not torch.allclose(other, draws)
    assert not torch.equal(_build(1, bayesian, dropout).flows[0].network.weights[0], flow.flows[0].network.weights[0])
    assert torch.equal(torch.get_rng_state(), state)


def test_sampling_argument_sets_the_sample_dimension_through_compositions():
    flow = _build(0, "mc_dropout", 0.25)
    x, f = torch.randn(6, 3, dtype=torch.float64), torch.randn(6, 2, dtype=torch.float64)
    flow.eval()
    assert flow(f, x).shape == (6, 2)  # eval default: the deterministic pass
    flow.train()
    assert flow(f, x).shape == (1, 6, 2)  # training default: one stochastic pass
    assert flow(f, x, sampling=WeightSampling(5)).shape == (5, 6, 2)
    assert flow(f, x, sampling=WeightSampling(stochastic=False)).shape == (6, 2)
    g, ld = flow.forward_and_log_det(f, x, sampling=WeightSampling(3))
    assert g.shape == ld.shape == (3, 6, 2)
    p = flow.params(x, sampling=WeightSampling(2))
    assert p["0"]["a"].shape == p["1"]["d"].shape == (2, 6, 2)  # sal (4 parameters), then tanh
    low, high = flow.codomain_bounds(x, sampling=WeightSampling(stochastic=False))
    assert low.shape == high.shape == (6, 2)
    assert flow.affine_coefficients(x, sampling=WeightSampling(stochastic=False)) is None
    assert static_flow(flow)(f).shape == (6, 2)


def test_dropout_with_a_generator_has_the_dropout_distribution():
    """Masks drawn from a generator: each unit kept with probability 1 - p and scaled by 1/(1 - p)."""
    net = BayesianMLP(1, 1, hidden=(400,), dropout=0.4, bayesian="mc_dropout")
    with torch.no_grad():
        net.weights[0].fill_(1.0)
        net.biases[0].zero_()
        net.weights[1].fill_(1.0 / 400)
        net.biases[1].zero_()
    out = net(torch.ones(1, 1, dtype=torch.float64), num_samples=2000, generator=torch.Generator().manual_seed(0))
    # out = mean over 400 units of m/(1-p), m ~ Bernoulli(0.6): mean 1, std sqrt(p/(1-p)/400).
    assert out.mean().item() == pytest.approx(1.0, abs=0.01)
    assert out.std().item() == pytest.approx((0.4 / 0.6 / 400) ** 0.5, rel=0.05)


def test_parameters_are_float64_whatever_the_default_dtype():
    assert torch.get_default_dtype() == torch.float32
    flow = make_input_dependent(make_flow("sal"), 2)
    assert all(p.dtype == torch.float64 for p in flow.parameters())
    assert make_flow("exp").dtype == torch.float64 and make_flow("exp").affine_coefficients() is None
    assert make_flow("identity").affine_coefficients()[0].dtype == torch.float64
    single = flow.float()
    assert all(p.dtype == torch.float32 for p in single.parameters())
    stage = InputDependentFlow(make_flow("sinharcsinh").float(), 2)  # the network follows its base's dtype
    assert stage.network.weights[0].dtype == torch.float32


def test_bad_sampling_is_refused():
    with pytest.raises(ValueError, match="num_samples"):
        WeightSampling(0)
    with pytest.raises(ValueError, match="num_samples=1"):
        WeightSampling(3, stochastic=False)
    with pytest.raises(TypeError, match="generator"):
        WeightSampling(generator=3)
    flow = InputDependentFlow(make_flow("sinharcsinh"), 2)
    with pytest.raises(TypeError, match="WeightSampling"):
        flow(torch.zeros(3, 1), torch.zeros(3, 2, dtype=torch.float64), sampling=(2, True))
    with pytest.raises(TypeError, match="generator"):
        BayesianMLP(2, 2, generator=0)
