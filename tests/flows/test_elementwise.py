"""Behaviour of the marginal flows (paper eq. 2; appendix B.1 Table 1, eqs. 26-31): the contract for every
registered flow, the closed forms, domain checks and the initialisers. The factory, compositions and the numerical
inverse have their own files (test_factory.py, test_combination.py, test_numerical.py)."""
import math

import pytest
import torch
from torch import nn
from torch.func import functional_call

from flowgp.flows import (FLOW_NAMES, Affine, Arcsinh, ArcsinhCombination, BoxCox, Exp, InverseBoxCox, Log, SAL,
                          Sinh, SinhArcsinh, Softplus, Tanh, TukeyGH, make_flow)
from flowgp.training.initialisation import init_from_data, init_identity, init_random

PYTHON_COMPOSE = "python:arcsinh>>tanh>>exp"
CASES = list(FLOW_NAMES) + ["sal+softplus", "sal+sal+softplus", "boxcox+l", "invboxcox+l", "lincomb5",
                            "sum(sal,tanh)", "log+tukey", PYTHON_COMPOSE]
AFFINE_CASES = {"identity", "affine"}


def build(case, param_shape=(), seed=0, std=0.5):
    if case == PYTHON_COMPOSE:
        flow = Arcsinh(param_shape=param_shape) >> Tanh(param_shape=param_shape) >> Exp()
    else:
        flow = make_flow(case, param_shape=param_shape)
    return init_random(flow, std=std, generator=torch.Generator().manual_seed(seed))


def inputs(flow, shape, seed=1, dtype=None):
    g = torch.Generator().manual_seed(seed)
    f = torch.randn(shape, generator=g, dtype=dtype or torch.get_default_dtype())
    if flow.domain == "positive":
        return torch.exp(0.7 * f)
    return 1.5 * f + 0.1 * torch.sign(f)  # away from 0, where Box-Cox's derivative degenerates


class _Call(nn.Module):
    """Exposes one method of a flow as forward, so functional_call can swap in its raw parameters."""

    def __init__(self, flow, method):
        super().__init__()
        self.flow, self.method = flow, method

    def forward(self, t):
        return getattr(self.flow, self.method)(t, validate=False)


def _gradcheck(flow, method, t):
    module = _Call(flow, method)
    names = [n for n, _ in module.named_parameters()]
    raws = [p.detach().clone().requires_grad_(True) for _, p in module.named_parameters()]

    def fn(t, *raws):
        return functional_call(module, dict(zip(names, raws)), (t,))

    assert torch.autograd.gradcheck(fn, (t.detach().clone().requires_grad_(True), *raws), atol=1e-6, rtol=1e-4)


# ----------------------------------------------------------------------------- contract, every flow
@pytest.mark.parametrize("case", CASES)
def test_inverse_round_trips_in_float64(case, float64_default):
    flow = build(case)
    f = inputs(flow, (6, 4))
    y = flow(f)
    torch.testing.assert_close(flow.inverse(y), f, rtol=1e-8, atol=1e-9)
    y2 = flow(inputs(flow, (30,), seed=5))
    torch.testing.assert_close(flow(flow.inverse(y2)), y2, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("case", CASES)
def test_log_det_is_log_of_autograd_derivative(case, float64_default):
    flow = build(case)
    f = inputs(flow, (40,)).requires_grad_(True)
    (deriv,) = torch.autograd.grad(flow(f).sum(), f)
    log_det = flow.log_abs_det_jacobian(f)
    torch.testing.assert_close(log_det, torch.log(deriv), rtol=1e-8, atol=1e-9)
    y, ld = flow.forward_and_log_det(f)
    torch.testing.assert_close(y, flow(f))
    torch.testing.assert_close(ld, log_det)
    assert torch.all(deriv > 0), "every flow must be strictly increasing"


@pytest.mark.parametrize("case", CASES)
def test_shapes_broadcast_with_per_output_and_scalar_parameters(case):
    flow = build(case, param_shape=(3,))
    f = inputs(flow, (7, 5, 3))
    y = flow(f)
    assert y.shape == (7, 5, 3) and flow.log_abs_det_jacobian(f).shape == (7, 5, 3)
    assert flow.inverse(y).shape == (7, 5, 3)
    has_params = any(True for _ in flow.parameters())
    if has_params:  # the three outputs really have their own parameters
        same = flow(inputs(flow, (7, 5, 1)).expand(7, 5, 3))
        assert not torch.allclose(same[..., 0], same[..., 1])

    flow = build(case)
    f = inputs(flow, (20, 5, 1))
    assert flow(f).shape == (20, 5, 1)
    assert flow.inverse(flow(f)).shape == (20, 5, 1)
    assert flow.log_abs_det_jacobian(f).shape == (20, 5, 1)
    # Inputs shared across outputs broadcast against per-output parameters: [20, 5, 1] -> [20, 5, 3].
    assert build(case, param_shape=(3,))(f).shape == ((20, 5, 3) if has_params else (20, 5, 1))


@pytest.mark.parametrize("case", CASES)
def test_float32_works(case):
    flow = build(case).float()
    f = inputs(flow, (50,), dtype=torch.float32)
    y, ld = flow.forward_and_log_det(f)
    assert y.dtype == ld.dtype == torch.float32
    assert torch.all(torch.isfinite(y)) and torch.all(torch.isfinite(ld))
    back = flow.inverse(y)
    assert back.dtype == torch.float32
    torch.testing.assert_close(flow(back), y, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", CASES)
def test_gradcheck_forward_log_det_and_inverse(case, float64_default):
    flow = build(case)
    f = inputs(flow, (4,))
    _gradcheck(flow, "forward", f)
    _gradcheck(flow, "log_abs_det_jacobian", f)
    # For Tukey and the linear combinations this is the numerical inverse's implicit gradient.
    _gradcheck(flow, "inverse", flow(inputs(flow, (4,), seed=2)).detach())


@pytest.mark.parametrize("case", CASES)
def test_spec_round_trips_through_make_flow(case):
    flow = build(case)
    rebuilt = make_flow(flow.spec)
    assert rebuilt.spec == flow.spec
    assert type(rebuilt) is type(flow)
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {k: v.shape for k, v in flow.state_dict().items()}
    rebuilt.load_state_dict(flow.state_dict())
    f = inputs(flow, (10,))
    torch.testing.assert_close(rebuilt(f), flow(f))


@pytest.mark.parametrize("case", CASES)
def test_affine_coefficients_only_for_affine_maps(case, float64_default):
    flow = build(case)
    coef = flow.affine_coefficients()
    if case in AFFINE_CASES:
        a, b = coef
        f = inputs(flow, (10,))
        torch.testing.assert_close(a + b * f, flow(f))
    else:
        assert coef is None
    assert flow.is_identity == (case == "identity")


# ----------------------------------------------------------------------------- closed forms (Table 1)
def _at(flow, f):
    return flow(torch.tensor(f, dtype=torch.float64)).item()


def test_table1_closed_forms_at_hand_computed_values(float64_default):
    ln2, ln3 = math.log(2.0), math.log(3.0)
    assert _at(Log(), math.e ** 2) == pytest.approx(2.0)
    assert _at(Exp(), ln3) == pytest.approx(3.0)
    assert _at(Softplus(), 0.0) == pytest.approx(ln2)
    assert Softplus().inverse(torch.tensor(ln2)).item() == pytest.approx(0.0, abs=1e-15)
    assert _at(Softplus(), 800.0) == pytest.approx(800.0)  # no overflow
    assert _at(Sinh(), ln2) == pytest.approx(0.75)
    assert _at(Arcsinh(a=2.0, b=1.0, c=0.0, d=1.0), 0.75) == pytest.approx(1 + 2 * ln2)  # arcsinh(3/4) = ln 2
    assert _at(Arcsinh(a=1.0, b=2.0, c=1.0, d=0.0), -0.625) == pytest.approx(ln2)
    assert _at(Affine(a=1.0, b=2.0), 3.0) == pytest.approx(7.0)
    assert _at(SinhArcsinh(a=0.0, b=2.0), 0.75) == pytest.approx(1.875)  # sinh(2 ln 2)
    assert _at(SinhArcsinh(a=ln2, b=1.0), 0.0) == pytest.approx(-0.75)
    box = BoxCox(lam=0.5)
    assert [_at(box, v) for v in (4.0, -4.0, 1.0)] == pytest.approx([2.0, -6.0, 0.0])
    assert box.inverse(torch.tensor(2.0)).item() == pytest.approx(4.0)
    inv_box = InverseBoxCox(lam=0.5)
    assert [_at(inv_box, v) for v in (2.0, -6.0)] == pytest.approx([4.0, -4.0])
    tukey = TukeyGH(g=ln2, h=2 * ln2)
    assert [_at(tukey, v) for v in (1.0, -1.0, 0.0)] == pytest.approx([2 / ln2, -1 / ln2, 0.0])
    tanh = Tanh(a=2.0, b=1.0, c=0.0, d=1.0)
    assert _at(tanh, 0.5 * ln3) == pytest.approx(2.0)  # tanh(ln 3 / 2) = 1/2
    low, high = tanh.codomain_bounds()
    assert (low.item(), high.item()) == pytest.approx((-1.0, 3.0))
    # Paper eq. 2, one stage: d·sinh(b·arcsinh(f) - a) + c with a = 0, b = 2, c = 1, d = 3.
    sal = SinhArcsinh(a=0.0, b=2.0) >> Affine(a=1.0, b=3.0)
    assert _at(sal, 0.75) == pytest.approx(1 + 3 * 1.875)
    assert _at(SAL(a=0.0, b=2.0, c=1.0, d=3.0), 0.75) == pytest.approx(1 + 3 * 1.875)  # the one-module stage


def test_eq26_linear_combination_of_arcsinh(float64_default):
    flow = ArcsinhCombination(2)
    a, b, c, d = [1.0, -0.5], [2.0, 0.5], [0.5, -1.0], [2.0, 4.0]
    for i, term in enumerate(flow.flows):  # eq. 26 term i is Arcsinh(A=b_i, B=1/d_i, C=-c_i, D=a_i)
        term.set_params(a=b[i], b=1 / d[i], c=-c[i], d=a[i])
    f = torch.tensor([2.0, -3.0, 0.3])
    expected = sum(a[i] + b[i] * torch.asinh((f - c[i]) / d[i]) for i in range(2))
    torch.testing.assert_close(flow(f), expected)
    assert flow(torch.tensor(2.0)).item() == pytest.approx(1 + 2 * math.log(2) - 0.5 + 0.5 * math.asinh(0.75))
    p = flow.eq26_parameters()
    for name, ref in zip("abcd", (a, b, c, d)):
        torch.testing.assert_close(p[name].detach(), torch.tensor(ref))
    assert flow.spec == "lincomb2"
    # The default centres are spread out, so the terms differ.
    centres = make_flow("lincomb").eq26_parameters()["c"]
    assert len(set(centres.tolist())) == 3


def test_tukey_is_continuous_at_g_zero(float64_default):
    f = torch.linspace(-3, 3, 13)
    h = 0.3
    limit = f * torch.exp(0.5 * h * f ** 2)
    torch.testing.assert_close(TukeyGH(g=0.0, h=h)(f), limit)
    torch.testing.assert_close(TukeyGH(g=1e-12, h=h)(f), limit)
    torch.testing.assert_close(TukeyGH(g=1e-6, h=h)(f), limit, rtol=1e-5, atol=1e-6)
    flow = TukeyGH(g=0.0, h=h)
    x = f.clone().requires_grad_(True)
    (deriv,) = torch.autograd.grad(flow(x).sum(), x)
    torch.testing.assert_close(flow.log_abs_det_jacobian(f), torch.log(deriv))
    # d/dg at g = 0 is f²/2 · exp(h f²/2) (series term), matching a central difference.
    (dg,) = torch.autograd.grad(flow(f).sum(), flow.raw)
    dg = dg[0]  # row 0 of `raw` is g
    fd = (TukeyGH(g=1e-5, h=h)(f) - TukeyGH(g=-1e-5, h=h)(f)).sum() / 2e-5
    assert dg.item() == pytest.approx(fd.item(), rel=1e-6)
    assert torch.all(torch.isfinite(flow.log_abs_det_jacobian(torch.tensor([0.0, 40.0, -40.0]))))


# ----------------------------------------------------------------------------- domain checks
def test_forward_validates_the_domain():
    with pytest.raises(ValueError, match="the log flow needs positive inputs; got min -1.*shift the data"):
        Log()(torch.tensor([1.0, -1.0]))
    with pytest.raises(ValueError, match="needs positive inputs"):
        Log().log_abs_det_jacobian(torch.tensor([0.0]))
    assert torch.isnan(Log()(torch.tensor([-1.0]), validate=False)).all()  # hot loops skip the check
    # An intermediate stage's domain is checked too.
    with pytest.raises(ValueError, match="needs positive inputs"):
        make_flow("affine+log")(torch.tensor([-2.0, 1.0]))
    make_flow("softplus+log")(torch.tensor([-2.0, 1.0]))


def test_inverse_validates_the_codomain():
    with pytest.raises(ValueError, match="y must be > 0 for the inverse of softplus"):
        Softplus().inverse(torch.tensor([-0.5, 1.0]))
    with pytest.raises(ValueError, match=r"y must lie in \(-1, 3\) for the inverse of tanh"):
        Tanh(a=2.0, d=1.0).inverse(torch.tensor([3.5]))
    with pytest.raises(ValueError, match="for the inverse of sal\\+softplus"):
        make_flow("sal+softplus").inverse(torch.tensor([0.0]))
    # Bounds propagate through compositions: exp(tanh(f)) lies in (1/e, e).
    with pytest.raises(ValueError, match="lie in"):
        (Tanh() >> Exp()).inverse(torch.tensor([3.0]))
    assert make_flow("sal+softplus").codomain == "positive" and make_flow("softplus+log").codomain == "real"
    assert (Tanh() >> Affine()).codomain == "bounded" and make_flow("sal").codomain == "real"
    Softplus().inverse(torch.tensor([1.0]), validate=False)


# ----------------------------------------------------------------------------- input-dependent parameters
def test_params_hook_supports_input_dependent_parameters(float64_default):
    class InputAffine(Affine):
        """Parameters from x: the only override an input-dependent flow needs."""

        def params(self, x=None):
            return self.constrain({"a": x, "b": self.raw_parameter("b") + x})

    flow = InputAffine()
    x = torch.linspace(-1, 1, 6)[:, None]  # [N, 1]
    f = torch.randn(6, 2)  # [N, L]
    y = flow(f, x)
    b = torch.nn.functional.softplus(flow.raw_parameter("b") + x)
    torch.testing.assert_close(y, x + b * f)
    torch.testing.assert_close(flow.inverse(y, x), f)
    torch.testing.assert_close(flow.log_abs_det_jacobian(f, x), torch.log(b).expand(6, 2))


# ----------------------------------------------------------------------------- initialisation
@pytest.mark.parametrize("case", ["sal", "affine", "sinharcsinh", "lincomb"])
def test_init_identity_reaches_the_identity(case):
    flow = build(case, seed=4)
    x = torch.linspace(-3, 3, 101)
    before = torch.mean((flow(x) - x) ** 2).item()
    mse = init_identity(flow)
    assert mse < 1e-3 < before
    assert torch.mean((flow(x) - x) ** 2).item() == pytest.approx(mse, rel=0.2, abs=1e-6)


def test_init_identity_reduces_the_error_of_tanh_and_handles_per_output_flows():
    flow = build("tanh")
    x = torch.linspace(-3, 3, 101)
    before = torch.mean((flow(x) - x) ** 2).item()
    assert init_identity(flow) < 0.1 * before
    flow = build("sal", param_shape=(2,))
    assert init_identity(flow) < 1e-3
    assert init_identity(Log()) > 0  # no parameters: just reports the error
    with pytest.raises(ValueError):
        init_identity(flow, low=1.0, high=0.0)


def _true_sal():
    return SinhArcsinh(a=0.5, b=1.4) >> Affine(a=1.0, b=2.0)


def test_init_from_data_recovers_sal_parameters(float64_default):
    true = _true_sal()
    z = torch.randn(20000, generator=torch.Generator().manual_seed(0))
    y = true(z).detach()
    flow = make_flow("sal")
    nll = init_from_data(flow, y)
    p = flow.params()
    fitted = [p["a"], p["b"], p["c"], p["d"]]
    assert [v.item() for v in fitted] == pytest.approx([0.5, 1.4, 1.0, 2.0], abs=0.06)
    grid = torch.linspace(-1.5, 1.5, 7)
    torch.testing.assert_close(flow(grid), true(grid), rtol=0.03, atol=0.05)
    assert nll == pytest.approx(2.7316, abs=0.01)

    # Normalizing direction (v-WGP): T = affine then sinh-arcsinh, the family of SAL's inverse.
    T = make_flow("l+sa")
    init_from_data(T, y, direction="normalizing")
    torch.testing.assert_close(T(true(grid)), grid, rtol=0.03, atol=0.05)


def test_init_from_data_handles_other_flows_and_columns(float64_default):
    g = torch.Generator().manual_seed(1)
    z = torch.randn(400, generator=g)
    y = _true_sal()(z).detach()
    for case in ("tukey", "lincomb", "boxcox+l"):
        flow = make_flow(case)
        nll = init_from_data(flow, y)
        assert math.isfinite(nll) and nll < 3.2, case
    # Tanh's range (-1, 1) misses the data: it is moved and widened first, and the fit stays finite.
    flow = Tanh()
    nll = init_from_data(flow, y)
    low, high = flow.codomain_bounds()
    assert math.isfinite(nll) and low.item() < y.min().item() and high.item() > y.max().item()
    # Per-column parameters: the normalizing affine map standardises each column.
    cols = torch.stack([1.0 + 2.0 * z, -3.0 + 0.5 * torch.randn(400, generator=g)], dim=1)
    flow = Affine(param_shape=(2,))
    init_from_data(flow, cols, direction="normalizing")
    out = flow(cols)
    torch.testing.assert_close(out.mean(0), torch.zeros(2), atol=1e-4, rtol=0)
    torch.testing.assert_close(out.std(0, unbiased=False), torch.ones(2), atol=1e-4, rtol=0)


def test_init_from_data_validates_its_input():
    flow = make_flow("sal+softplus")
    with pytest.raises(ValueError, match="outside the range"):
        init_from_data(flow, torch.tensor([-1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="finite"):
        init_from_data(flow, torch.tensor([1.0, math.nan]))
    with pytest.raises(ValueError, match="1-D"):
        init_from_data(flow, torch.ones(2, 2, 2))
    with pytest.raises(ValueError, match="constant"):
        init_from_data(flow, torch.ones(5))
    with pytest.raises(ValueError, match="direction"):
        init_from_data(flow, torch.rand(5) + 1, direction="sideways")
    with pytest.raises(ValueError, match="domain"):
        init_from_data(Log(), torch.tensor([-1.0, 2.0]), direction="normalizing")
    with pytest.raises(TypeError):
        init_from_data("sal", torch.rand(5))


def test_init_random_is_reproducible_and_perturbs_every_parameter():
    a = init_random(make_flow("sal+tanh"), generator=torch.Generator().manual_seed(7))
    b = init_random(make_flow("sal+tanh"), generator=torch.Generator().manual_seed(7))
    fresh = make_flow("sal+tanh")
    for (name, pa), pb, p0 in zip(a.named_parameters(), b.parameters(), fresh.parameters()):
        assert torch.equal(pa, pb), name
        assert not torch.equal(pa, p0), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", CASES)
def test_cuda(case):
    flow = build(case).cuda()
    f = inputs(flow, (64,)).cuda()
    y, ld = flow.forward_and_log_det(f)
    assert y.device.type == ld.device.type == "cuda"
    torch.testing.assert_close(flow.inverse(y), f, rtol=1e-3, atol=1e-3)
    assert flow.codomain_bounds() is None or flow.codomain_bounds()[0].device.type == "cuda"


def test_vectorised_asinh_matches_math_to_a_few_ulp():
    from flowgp.flows import asinh
    values = [0.0, -0.0, 5e-324, 1e-300, 1e-30, 1e-8, 0.1, 0.5, 1.0, 2.0, 10.0, 1e8, 1e150, 1e300, 1.7e308]
    x = torch.tensor(values + [-v for v in values], dtype=torch.float64)
    expected = torch.tensor([math.asinh(v) for v in x.tolist()], dtype=torch.float64)
    # (atol: the vectorised log1p may flush the subnormal 5e-324 to zero)
    torch.testing.assert_close(asinh(x), expected, rtol=4e-16, atol=torch.finfo(torch.float64).tiny)
    assert torch.equal(torch.signbit(asinh(x)), torch.signbit(x))  # odd, and -0.0 stays -0.0
    # float32, whose squares overflow above 1.8e19
    x32 = torch.tensor([1e-40, 1e-20, 0.3, 3.0, 1e19, 1e30, 3e38], dtype=torch.float32)
    torch.testing.assert_close(asinh(x32), torch.tensor([math.asinh(v) for v in x32.tolist()]), rtol=3e-7,
                               atol=torch.finfo(torch.float32).tiny)
    special = asinh(torch.tensor([math.inf, -math.inf, math.nan], dtype=torch.float64))
    assert special[0] == math.inf and special[1] == -math.inf and math.isnan(special[2])


def test_sinh_arcsinh_node_gradients_with_broadcast_parameters():
    """The hand-written backward of G(f) = sinh(b·asinh f - a), with per-output and per-point parameters."""
    from flowgp.flows.elementwise import _SinhArcsinhMap
    g = torch.Generator().manual_seed(3)
    f = (3.0 * torch.randn(5, 4, 3, generator=g, dtype=torch.float64)).requires_grad_()
    for a_shape, b_shape in (((), ()), ((3,), (3,)), ((4, 1), (1, 3)), ((5, 4, 3), (3,))):
        a = torch.randn(a_shape, generator=g, dtype=torch.float64).requires_grad_()
        b = (0.5 + torch.rand(b_shape, generator=g, dtype=torch.float64)).requires_grad_()
        assert torch.autograd.gradcheck(_SinhArcsinhMap.apply, (f, a, b))
        torch.testing.assert_close(_SinhArcsinhMap.apply(f, a, b), torch.sinh(b * torch.asinh(f) - a), rtol=1e-14,
                                   atol=1e-14)
    # a parameter that broadcasts f up: f's gradient is summed back to f's shape
    f1 = torch.randn(4, 1, generator=g, dtype=torch.float64).requires_grad_()
    b = torch.rand(4, 3, generator=g, dtype=torch.float64).add(0.5).requires_grad_()
    assert torch.autograd.gradcheck(_SinhArcsinhMap.apply, (f1, torch.zeros((), dtype=torch.float64), b))
