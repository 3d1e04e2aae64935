"""Input-dependent flows (TGP paper §3.2; appendix B.4): flowgp.flows.conditional."""
import pytest
import torch

from flowgp.flows import (Affine, Compose, InputDependentFlow, SinhArcsinh, WeightSampling, input_dependent_flows,
                          make_flow, make_input_dependent, static_flow)
from flowgp.flows.conditional import raw_parameter_tree
from flowgp.training.initialisation import init_input_dependent, init_random

pytestmark = pytest.mark.usefixtures("float64_default")

SPECS = ["sal", "sal+tanh", "lincomb3", "sum(sal,arcsinh)", "tukey+affine", "sa+sal"]


def _random_flow(spec, param_shape, seed=0):
    flow = make_flow(spec, param_shape=param_shape)
    init_random(flow, std=0.3, generator=torch.Generator().manual_seed(seed))
    return flow


@pytest.mark.parametrize("param_shape", [(), (2,)])
@pytest.mark.parametrize("spec", SPECS)
def test_constant_network_equals_plain_flow(spec, param_shape):
    base = _random_flow(spec, param_shape)
    flow = InputDependentFlow(base, input_dim=3, hidden=(6, 5), activation="tanh", dropout=0.4)
    flow.network.set_constant_(flow.raw_target())
    x = torch.randn(7, 3)
    f = 1.5 * torch.randn(7, 2)
    y = base(f)
    for sampling in (WeightSampling(1, stochastic=False), WeightSampling(4)):
        g, ld = flow.forward_and_log_det(f, x, sampling=sampling)
        torch.testing.assert_close(g, torch.broadcast_to(y, g.shape), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(ld, torch.broadcast_to(base.log_abs_det_jacobian(f), ld.shape),
                                   rtol=1e-12, atol=1e-12)
        inv = flow.inverse(y, x, sampling=sampling)
        torch.testing.assert_close(inv, torch.broadcast_to(base.inverse(y), inv.shape), rtol=1e-9, atol=1e-9)


def test_parameters_follow_each_input_through_their_constraints():
    """Row n of the input-dependent flow is the plain flow with raw parameters NN(x_n)."""
    base = _random_flow("sal", (2,))
    flow = InputDependentFlow(base, input_dim=2, hidden=(8,), dropout=0.0, bayesian="point")
    flow.eval()
    x = torch.randn(5, 2)
    f = torch.randn(5, 2)
    raw = flow.raw_params(x)  # [N, num_raw]
    assert raw.shape == (5, flow.num_raw) == (5, 8)
    g = flow(f, x)
    for n in range(5):  # reference only; the flow itself is batched
        plain = make_flow("sal", param_shape=(2,))
        with torch.no_grad():
            start = 0
            for path, size in zip(flow._paths, flow._sizes):
                plain.raw_parameter(path[0]).copy_(raw[n, start:start + size[0]])
                start += size[0]
        torch.testing.assert_close(g[n], plain(f[n]), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(g[0] - g[1], base(f[0]) - base(f[1]))  # parameters really vary with x


def test_sampled_parameters_carry_a_leading_sample_dimension():
    flow = InputDependentFlow(make_flow("sinharcsinh", param_shape=(3,)), input_dim=2, hidden=(4,))
    x = torch.randn(6, 2)
    p = flow.params(x, sampling=WeightSampling(5))
    assert p["a"].shape == (5, 6, 3) and p["b"].shape == (5, 6, 3)
    assert bool(torch.all(p["b"] > 0))
    assert flow(torch.randn(2, 1, 6, 3), x, sampling=WeightSampling(5)).shape == (2, 5, 6, 3)
    assert flow.params(x, sampling=WeightSampling(1, stochastic=False))["a"].shape == (6, 3)
    scalar = InputDependentFlow(make_flow("sinharcsinh"), input_dim=2)
    scalar.eval()
    assert scalar.params(x)["a"].shape == (6, 1)  # shared scalar parameters broadcast over outputs


def test_make_input_dependent_wraps_nonlinear_stages_and_shares_modules():
    plain = make_flow("sal")
    flow = make_input_dependent(plain, 3, hidden=(4,))
    # appendix B.6: the sinh-arcsinh's (a, b) follow x, the affine map's (c, d) stay shared
    assert isinstance(flow, InputDependentFlow) and flow.base is plain
    assert flow.parameters_from_network == ("a", "b") and flow.num_raw == 2
    assert static_flow(flow) is plain
    composed = make_input_dependent(make_flow("sinharcsinh+affine+softplus"), 3, hidden=(4,))
    assert isinstance(composed.flows[0], InputDependentFlow) and isinstance(composed.flows[1], Affine)
    every = make_input_dependent(make_flow("sal"), 3, which="all")
    assert every.parameters_from_network is None and every.num_raw == 4
    assert len(input_dependent_flows(make_input_dependent(make_flow("sa+l"), 3, which="all"))) == 2
    single = make_input_dependent(make_flow("tanh"), 3)
    assert isinstance(single, InputDependentFlow)
    with pytest.raises(ValueError, match="no non-affine stage"):
        make_input_dependent(make_flow("affine"), 3)
    with pytest.raises(ValueError, match="which must be"):
        make_input_dependent(make_flow("sal"), 3, which="some")


def test_initialisation_teaches_the_network_the_plain_parameters():
    """Appendix B.4: minibatch MSE between NN(x) and θ̂ from the plain flow's initialisation."""
    plain = _random_flow("sal", ())
    flow = make_input_dependent(plain, 2, hidden=(16,), dropout=0.25)
    x = torch.randn(200, 2)
    target = flow.raw_target()
    before = (flow.network(x, sample=False) - target).square().mean().item()
    mse = init_input_dependent(flow, x, epochs=60, batch_size=50, generator=torch.Generator().manual_seed(0))
    assert mse < 1e-3 < before
    flow.eval()
    f = torch.randn(200, 1)
    torch.testing.assert_close(flow(f, x), plain(f), rtol=0, atol=0.05)


def test_raw_parameter_tree_matches_params_structure():
    flow = _random_flow("sum(sal,arcsinh)+tanh", ())
    tree = raw_parameter_tree(flow)
    constrained = flow.constrain(tree)
    reference = flow.params()

    def flat(d):
        return {k: v for k, v in d.items()} if not any(isinstance(v, dict) for v in d.values()) else \
            {f"{k}.{kk}": vv for k, v in d.items() for kk, vv in flat(v).items()}
    a, b = flat(constrained), flat(reference)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key])


def test_bad_use_is_refused_clearly():
    flow = InputDependentFlow(make_flow("sal"), input_dim=3)
    with pytest.raises(ValueError, match="needs the inputs x"):
        flow(torch.randn(4, 1))
    with pytest.raises(ValueError, match=r"\[\.\.\., N, 3\]"):
        flow(torch.randn(4, 1), torch.randn(4, 2))
    with pytest.raises(TypeError, match="base must be a flowgp Flow"):
        InputDependentFlow("sal", input_dim=3)
    with pytest.raises(ValueError, match="already"):
        InputDependentFlow(flow, input_dim=3)
    with pytest.raises(ValueError, match="no parameters"):
        InputDependentFlow(make_flow("softplus"), input_dim=3)
    with pytest.raises(ValueError, match="shape"):
        InputDependentFlow(make_flow("sal", param_shape=(2, 2)), input_dim=3)
    with pytest.raises(ValueError, match="num_samples"):
        flow(torch.randn(4, 1), torch.randn(4, 3), sampling=WeightSampling(0))
    with pytest.raises(ValueError, match="x must be a 2-D tensor"):
        init_input_dependent(flow, torch.randn(5))
    with pytest.raises(ValueError, match="no input-dependent stage"):
        init_input_dependent(make_flow("sal"), torch.randn(5, 3))


def test_warping_curves_and_plot(tmp_path):
    from flowgp.flows.conditional import warping_curves
    from flowgp.reporting.plotting import plot_warping_curves

    plain = _random_flow("sal", ())
    flow = make_input_dependent(plain, 2, hidden=(6,), activation="tanh", dropout=0.5)
    x = torch.randn(3, 2)
    grid = torch.linspace(-2, 2, 11)
    curves = warping_curves(flow, x, grid, num_samples=50)
    assert {k: tuple(v.shape) for k, v in curves.items()} == {"point": (11, 3, 1), "mean": (11, 3, 1),
                                                              "std": (11, 3, 1)}
    assert bool(torch.all(curves["std"] > 0))
    assert bool(torch.all(curves["point"][1:] > curves["point"][:-1]))  # every warping is increasing
    flow.network.set_constant_(flow.raw_target())
    const = warping_curves(flow, x, grid, num_samples=5)
    torch.testing.assert_close(const["point"], plain(grid.view(-1, 1, 1)).expand(11, 3, 1))
    torch.testing.assert_close(const["std"], torch.zeros(11, 3, 1), rtol=0, atol=1e-12)
    fig = plot_warping_curves(grid, curves, path=tmp_path / "warp.png")
    assert (tmp_path / "warp.png").stat().st_size > 0 and len(fig.axes) == 6
    with pytest.raises(ValueError, match="input-dependent stage"):
        warping_curves(plain, x, grid)
