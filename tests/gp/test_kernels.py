"""Behavioural tests for flowgp.gp.kernels: closed forms, PSD-ness, diag, broadcasting, gradients, factory."""
import math

import pytest
import torch
from torch.func import functional_call

from flowgp.gp.kernels import (
    KERNEL_NAMES,
    RBF,
    Kernel,
    Linear,
    Matern12,
    Matern32,
    Matern52,
    Periodic,
    Product,
    Scale,
    Sum,
    White,
    make_kernel,
)

F64 = torch.float64


def _x(*shape, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype)


def _all_kernels(d=2, batch_shape=()):
    """One instance of every kernel and a few compositions, with non-default parameters."""
    kw = dict(batch_shape=batch_shape)
    ks = {
        "rbf": RBF(d, lengthscale=torch.tensor([0.7, 1.3]), **kw),
        "rbf_iso": RBF(ard=False, lengthscale=0.8, **kw),
        "matern12": Matern12(d, lengthscale=torch.tensor([0.9, 1.6]), **kw),
        "matern32": Matern32(d, lengthscale=torch.tensor([0.6, 1.1]), **kw),
        "matern52": Matern52(d, lengthscale=torch.tensor([1.2, 0.5]), **kw),
        "periodic": Periodic(d, lengthscale=torch.tensor([0.9, 1.4]), period=torch.tensor([1.5, 2.5]), **kw),
        "periodic_iso": Periodic(ard=False, lengthscale=1.1, period=1.7, **kw),
        "linear": Linear(d, variance=0.6, **kw),
        "white": White(d, variance=0.3, **kw),
        "scale": Scale(Matern52(d, **kw), variance=2.5),
    }
    ks["sum"] = ks["scale"] + Linear(d, variance=0.2, **kw) + White(d, variance=0.1, **kw)
    ks["product"] = Periodic(d, **kw) * Scale(RBF(d, **kw), variance=1.7)
    ks["factory"] = make_kernel("periodic*rbf + linear + matern12", d, batch_shape=batch_shape, variance=0.8)
    return ks


ALL = list(_all_kernels())


# ----------------------------------------------------------------------------------------------------
# closed forms
# ----------------------------------------------------------------------------------------------------
def test_rbf_closed_form_ard():
    k = RBF(2, lengthscale=torch.tensor([0.5, 2.0]))
    x = torch.tensor([[0.0, 0.0]], dtype=F64)
    y = torch.tensor([[1.0, 3.0], [0.0, 0.0]], dtype=F64)
    expected = torch.tensor([[math.exp(-0.5 * (1 / 0.25 + 9 / 4.0)), 1.0]], dtype=F64)
    torch.testing.assert_close(k(x, y), expected)


@pytest.mark.parametrize(
    "cls, value_at_r_equals_lengthscale",
    [
        (Matern12, math.exp(-1.0)),
        (Matern32, (1 + math.sqrt(3)) * math.exp(-math.sqrt(3))),
        (Matern52, (1 + math.sqrt(5) + 5 / 3) * math.exp(-math.sqrt(5))),
        (RBF, math.exp(-0.5)),
    ],
)
def test_stationary_at_r_equals_lengthscale(cls, value_at_r_equals_lengthscale):
    ell = 1.7
    k = cls(2, lengthscale=ell)
    # the displacement (0.6, 0.8)·ℓ has length ℓ, so r = 1 in lengthscale units
    x = torch.tensor([[0.3, -0.2]], dtype=F64)
    y = x + ell * torch.tensor([[0.6, 0.8]], dtype=F64)
    torch.testing.assert_close(k(x, y), torch.tensor([[value_at_r_equals_lengthscale]], dtype=F64))
    # and k(x, x) = 1 exactly on the diagonal of the symmetric matrix
    assert k(torch.cat([x, y])).diagonal().eq(1.0).all()


def test_matern_two_distances_and_isotropic():
    k = Matern32(ard=False, lengthscale=0.5)
    x = torch.tensor([[0.0], [1.0]], dtype=F64)
    s = math.sqrt(3) * 2.0  # r = 1 / 0.5
    K = k(x)
    torch.testing.assert_close(K, torch.tensor([[1.0, (1 + s) * math.exp(-s)], [(1 + s) * math.exp(-s), 1.0]], dtype=F64))


def test_periodic_closed_form():
    k = Periodic(2, lengthscale=torch.tensor([0.5, 2.0]), period=torch.tensor([2.0, 3.0]))
    x = torch.tensor([[0.0, 0.0]], dtype=F64)
    y = torch.tensor([[0.7, -1.1], [2.0, 3.0], [1.0, 0.0]], dtype=F64)

    def ref(a, b):
        s = sum(math.sin(math.pi * abs(a[d] - b[d]) / p) ** 2 / l**2 for d, (p, l) in enumerate([(2.0, 0.5), (3.0, 2.0)]))
        return math.exp(-2 * s)

    expected = torch.tensor([[ref([0, 0], yy.tolist()) for yy in y]], dtype=F64)
    torch.testing.assert_close(k(x, y), expected)
    # one full period in every dimension gives back k = 1; half a period in dim 0 gives exp(-2/ℓ0²)
    assert k(x, y)[0, 1].item() == pytest.approx(1.0, abs=1e-12)
    assert k(x, y)[0, 2].item() == pytest.approx(math.exp(-2 / 0.25), rel=1e-12)


def test_linear_white_scale_closed_form():
    x = torch.tensor([[1.0, 2.0], [0.5, -1.0]], dtype=F64)
    y = torch.tensor([[3.0, 1.0]], dtype=F64)
    torch.testing.assert_close(Linear(2, variance=0.5)(x, y), torch.tensor([[2.5], [0.25]], dtype=F64))
    torch.testing.assert_close(White(2, variance=0.3)(x), 0.3 * torch.eye(2, dtype=F64))
    k = Scale(RBF(2, lengthscale=1.0), variance=4.0)
    torch.testing.assert_close(k(x, y), 4.0 * torch.exp(-0.5 * torch.tensor([[5.0], [10.25]], dtype=F64)))


def test_sum_product_and_operators():
    a, b, c = RBF(2), Linear(2, variance=0.4), Matern32(2)
    x, y = _x(4, 2), _x(3, 2, seed=1)
    torch.testing.assert_close((a + b)(x, y), a(x, y) + b(x, y))
    torch.testing.assert_close((a * b)(x, y), a(x, y) * b(x, y))
    s = a + b + c
    assert isinstance(s, Sum) and len(s.kernels) == 3  # flattened
    p = a * b * c
    assert isinstance(p, Product) and len(p.kernels) == 3
    torch.testing.assert_close(p(x, y), a(x, y) * b(x, y) * c(x, y))
    assert sum([a, b]).spec == "rbf+linear"
    assert ((a + b) * c).spec == "(rbf+linear)*matern32"


# ----------------------------------------------------------------------------------------------------
# symmetry, PSD, diag
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
def test_symmetric_psd(name):
    k = _all_kernels()[name]
    x = _x(25, 2, seed=3)
    x = torch.cat([x, x[:2]])  # duplicated points must not break symmetry or PSD
    K = k(x)
    assert K.shape == (27, 27)
    assert torch.equal(K, K.mT)
    assert torch.linalg.eigvalsh(K).min().item() > -1e-10


@pytest.mark.parametrize("name", ALL)
def test_diag_matches_full_matrix(name):
    k = _all_kernels(batch_shape=(3,))[name]
    x = _x(2, 1, 6, 2, seed=4) * 3.0
    d = k.diag(x)
    assert d.shape == (2, 3, 6)
    torch.testing.assert_close(d, k(x).diagonal(dim1=-2, dim2=-1), rtol=1e-12, atol=1e-12)


def test_white_zero_off_diagonal_and_across_sets():
    k = White(2, variance=0.7, batch_shape=(2,))
    x = _x(5, 2)
    K = k(x)
    assert K.shape == (2, 5, 5)
    assert torch.equal(K, 0.7 * torch.eye(5, dtype=F64).expand(2, 5, 5))
    # distinct input sets (even the same values passed explicitly as x2) are uncorrelated noise
    assert torch.equal(k(x, x), torch.zeros(2, 5, 5, dtype=F64))
    assert torch.equal(k(x, _x(3, 2, seed=1)), torch.zeros(2, 5, 3, dtype=F64))
    torch.testing.assert_close(k.diag(x), torch.full((2, 5), 0.7, dtype=F64))


# ----------------------------------------------------------------------------------------------------
# batch shapes
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
def test_batch_broadcasting(name):
    k = _all_kernels(batch_shape=(3,))[name]
    assert k.batch_shape == torch.Size([3])
    x, z = _x(5, 1, 7, 2), _x(3, 4, 2, seed=1)
    assert k(x, z).shape == (5, 3, 7, 4)
    assert k(x).shape == (5, 3, 7, 7)
    assert k.diag(x).shape == (5, 3, 7)
    assert k(_x(7, 2), z).shape == (3, 7, 4)
    k0 = _all_kernels()[name]
    assert k0(_x(7, 2), _x(4, 2)).shape == (7, 4)
    assert k0(_x(7, 2)).shape == (7, 7)
    assert k0.diag(_x(7, 2)).shape == (7,)


def test_per_output_parameters_give_different_slices():
    ls = torch.tensor([0.5, 1.0, 2.0]).reshape(3, 1, 1) * torch.tensor([1.0, 1.5])
    var = torch.tensor([1.0, 2.0, 3.0]).reshape(3, 1, 1)
    k = Scale(Matern52(2, lengthscale=ls, batch_shape=(3,)), variance=var)
    assert k.base.lengthscale.shape == (3, 1, 2) and k.variance.shape == (3, 1, 1)
    x, z = _x(5, 1, 7, 2), _x(3, 4, 2, seed=1)
    K = k(x, z)
    for l in range(3):
        ref = Scale(Matern52(2, lengthscale=ls[l, 0]), variance=var[l, 0, 0])
        torch.testing.assert_close(K[:, l], ref(x[:, 0], z[l]))
    assert not torch.allclose(K[:, 0], K[:, 1])


def test_incompatible_batch_shapes_raise():
    k = RBF(2, batch_shape=(3,))
    with pytest.raises(ValueError, match="batch_shape"):
        k(_x(4, 7, 2), _x(3, 4, 2))


# ----------------------------------------------------------------------------------------------------
# gradients
# ----------------------------------------------------------------------------------------------------
def _raw_params(k):
    return {n: p.detach().clone().requires_grad_(True) for n, p in k.named_parameters()}


@pytest.mark.parametrize("name", ALL)
def test_gradcheck_inputs_and_parameters(name):
    k = _all_kernels(batch_shape=(2,))[name]
    x = _x(1, 4, 2, seed=5).requires_grad_(True)
    z = _x(2, 3, 2, seed=6).requires_grad_(True)
    params = _raw_params(k)
    names = list(params)

    def full(x, z, *ps):
        return functional_call(k, dict(zip(names, ps)), (x, z))

    def sym(x, *ps):
        return functional_call(k, dict(zip(names, ps)), (x,))

    def diag(x, *ps):
        return functional_call(_Diag(k), {"k." + n: p for n, p in zip(names, ps)}, (x,))

    ps = tuple(params.values())
    assert torch.autograd.gradcheck(full, (x, z, *ps))
    # the symmetric call includes the diagonal r = 0 (the Matérn square root's singular point)
    assert torch.autograd.gradcheck(sym, (x, *ps))
    if name in ("linear", "white", "scale", "sum", "factory", "product"):
        assert torch.autograd.gradcheck(diag, (x, *ps))


class _Diag(torch.nn.Module):
    """Exposes kernel.diag as forward so torch.func.functional_call can substitute its parameters."""

    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, x):
        return self.k.diag(x)


@pytest.mark.parametrize("cls", [Matern12, Matern32, Matern52, RBF, Periodic])
def test_gradient_finite_at_coinciding_points(cls):
    k = cls(2)
    x = _x(5, 2, seed=7)
    x = torch.cat([x, x[:2]]).requires_grad_(True)  # duplicated rows: r = 0 off the diagonal too
    (k(x).sum() + k(x, x.detach() + 0.0).sum()).backward()
    assert torch.isfinite(x.grad).all()
    assert torch.isfinite(k.raw_lengthscale.grad).all()


def test_matern32_diagonal_gradient_is_zero_and_finite():
    # k(x, x) = 1 regardless of x and ℓ, so the gradient of the diagonal must be exactly zero
    k = Matern32(2)
    x = _x(4, 2).requires_grad_(True)
    k(x).diagonal().sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


# ----------------------------------------------------------------------------------------------------
# parameters
# ----------------------------------------------------------------------------------------------------
def test_parameter_round_trip():
    k = Periodic(2, batch_shape=(3,))
    raw = k.raw_lengthscale
    new = torch.tensor([[0.3, 4.0]], dtype=F64).expand(3, 1, 2) * torch.tensor([1.0, 2.0, 3.0], dtype=F64).reshape(3, 1, 1)
    k.lengthscale = new
    assert k.raw_lengthscale is raw  # updated in place: optimisers keep tracking the same Parameter
    torch.testing.assert_close(k.lengthscale, new, rtol=1e-12, atol=0)
    k.period = 2.5  # scalars broadcast
    torch.testing.assert_close(k.period, torch.full((3, 1, 2), 2.5, dtype=F64))
    s = Scale(k, variance=1e-3)
    s.variance = torch.tensor([1e-4, 1.0, 1e4], dtype=F64).reshape(3, 1, 1)
    torch.testing.assert_close(s.variance, torch.tensor([1e-4, 1.0, 1e4], dtype=F64).reshape(3, 1, 1), rtol=1e-10, atol=0)
    assert {n for n, _ in s.named_parameters()} == {"raw_variance", "base.raw_lengthscale", "base.raw_period"}
    with pytest.raises(ValueError):
        k.lengthscale = -1.0
    with pytest.raises(ValueError, match="broadcast"):
        k.lengthscale = torch.ones(4)
    with pytest.raises(AttributeError, match="no parameter 'lengthscale'"):
        s.lengthscale = 0.5  # lives on s.base, must not silently become a plain attribute


def test_parameter_shapes():
    assert RBF(3).raw_lengthscale.shape == (1, 3)
    assert RBF(ard=False).raw_lengthscale.shape == (1, 1)
    assert Matern12(3, batch_shape=(4,)).lengthscale.shape == (4, 1, 3)
    assert Periodic(3, batch_shape=(4,)).period.shape == (4, 1, 3)
    assert Linear(batch_shape=(4,)).variance.shape == (4, 1, 1)
    assert Scale(RBF(2, batch_shape=(4,))).variance.shape == (4, 1, 1)
    with pytest.raises(ValueError, match="input_dim is required"):
        RBF()


# ----------------------------------------------------------------------------------------------------
# dtypes
# ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALL)
def test_float32(name):
    k = _all_kernels()[name]
    x = _x(20, 2, seed=8, dtype=torch.float32)
    # float32 inputs with the default float64 parameters, and after module.to(float32)
    for cast in (False, True):
        if cast:
            k = k.to(torch.float32)
            assert all(p.dtype == torch.float32 for p in k.parameters())
        else:
            assert all(p.dtype == F64 for p in k.parameters())
        K = k(x)
        assert K.dtype == torch.float32
        assert torch.equal(K, K.mT)
        assert torch.linalg.eigvalsh(K.double()).min().item() > -1e-4
        assert k.diag(x).dtype == torch.float32
    torch.testing.assert_close(k(x), _all_kernels()[name](x.double()).float(), rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------------------------------
# validation and factory
# ----------------------------------------------------------------------------------------------------
def test_input_validation_messages():
    k = RBF(2)
    with pytest.raises(ValueError, match="x1 has 3 features but the kernel was built for input_dim=2"):
        k(_x(4, 3))
    with pytest.raises(ValueError, match="x2 has 3 features"):
        k(_x(4, 2), _x(4, 3))
    with pytest.raises(ValueError, match=r"\[\.\.\., N, D\]"):
        k(_x(4))
    with pytest.raises(TypeError, match="floating-point"):
        k(torch.ones(3, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="features but x2 has"):
        Linear()(_x(4, 2), _x(4, 3))


@pytest.mark.parametrize(
    "name, spec, top",
    [
        ("rbf", "rbf", Scale),
        ("SE", "rbf", Scale),
        ("Squared_Exponential", "rbf", Scale),
        ("matern12", "matern12", Scale),
        ("Matern32", "matern32", Scale),
        ("matern52", "matern52", Scale),
        ("periodic", "periodic", Scale),
        ("linear", "linear", Linear),
        ("white", "white", White),
        ("rbf+linear", "rbf+linear", Sum),
        ("periodic*rbf", "periodic*rbf", Scale),
        ("rbf + periodic*matern32 + white", "rbf+periodic*matern32+white", Sum),
        ("(rbf+linear)*periodic", "(rbf+linear)*periodic", Product),
    ],
)
def test_make_kernel_parses(name, spec, top):
    k = make_kernel(name, 2, batch_shape=(2,), lengthscale=0.7, variance=1.3, period=2.0)
    assert isinstance(k, Kernel) and isinstance(k, top)
    assert k.spec == spec
    assert k.batch_shape == (2,)
    assert make_kernel(k.spec, 2).spec == spec  # spec round-trips through the factory
    x = _x(2, 1, 5, 2)
    assert k(x).shape == (2, 2, 5, 5)


def test_make_kernel_precedence_and_values():
    k = make_kernel("linear+rbf*periodic", 1, variance=2.0, lengthscale=0.5, period=3.0)
    assert isinstance(k, Sum)
    lin, prod = k.kernels
    assert isinstance(lin, Linear) and isinstance(prod, Scale) and isinstance(prod.base, Product)
    x, y = _x(4, 1), _x(3, 1, seed=1)
    ref = 2.0 * x @ y.T + 2.0 * RBF(1, lengthscale=0.5)(x, y) * Periodic(1, lengthscale=0.5, period=3.0)(x, y)
    torch.testing.assert_close(k(x, y), ref)
    # one amplitude per additive term: exactly two variances here
    assert sum(n.endswith("raw_variance") for n, _ in k.named_parameters()) == 2
    assert set(KERNEL_NAMES) == {"rbf", "matern12", "matern32", "matern52", "periodic", "linear", "white"}


@pytest.mark.parametrize("bad", ["foo", "rbf+", "rbf*+linear", "", "rbf linear", "(rbf", "rbf)", "rbf-linear"])
def test_make_kernel_rejects_bad_names(bad):
    with pytest.raises(ValueError) as info:
        make_kernel(bad, 2)
    if bad == "foo":
        assert "matern32" in str(info.value) and "valid names" in str(info.value)


def test_make_kernel_rejects_bad_types_and_dims():
    with pytest.raises(TypeError):
        make_kernel(3, 2)
    with pytest.raises(TypeError):
        make_kernel(None, 2)
    with pytest.raises(ValueError, match="input_dim"):
        make_kernel("rbf", 0)
    with pytest.raises((TypeError, ValueError)):
        make_kernel("rbf", 2.0)
    k = make_kernel("rbf+linear", 2)
    with pytest.raises(ValueError, match="x1 has 3 features but the kernel was built for input_dim=2"):
        k(_x(4, 3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda():
    k = make_kernel("matern32*periodic+linear", 2, batch_shape=(3,)).cuda()
    x, z = _x(5, 1, 7, 2).cuda(), _x(3, 4, 2).cuda()
    K = k(x, z)
    assert K.device.type == "cuda" and K.shape == (5, 3, 7, 4)
    torch.testing.assert_close(K.cpu(), k.cpu()(x.cpu(), z.cpu()))


def _brute_force(k, x1, x2):
    """Reference K from explicit per-dimension differences [..., N, M, D] (the textbook definitions)."""
    diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)
    ell = k.lengthscale.unsqueeze(-2)  # batch + (1, 1, D|1)
    if isinstance(k, Periodic):
        p = k.period.unsqueeze(-2)
        return torch.exp(-2 * (torch.sin(math.pi * diff.abs() / p) ** 2 / ell**2).sum(-1))
    r = torch.sqrt(((diff / ell) ** 2).sum(-1))
    if isinstance(k, RBF):
        return torch.exp(-0.5 * r**2)
    if isinstance(k, Matern12):
        return torch.exp(-r)
    if isinstance(k, Matern32):
        return (1 + math.sqrt(3) * r) * torch.exp(-math.sqrt(3) * r)
    return (1 + math.sqrt(5) * r + 5 / 3 * r**2) * torch.exp(-math.sqrt(5) * r)


@pytest.mark.parametrize("cls", [RBF, Matern12, Matern32, Matern52, Periodic])
@pytest.mark.parametrize("ard", [True, False])
def test_stationary_matches_brute_force_batched(cls, ard):
    k = cls(3, ard=ard, batch_shape=(2,))
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for raw in k.parameters():  # distinct parameters per output and per dimension
            raw.copy_(torch.randn(raw.shape, generator=g, dtype=F64))
    # far from the origin (1e4): centring keeps the ||a||²+||b||²-2a·b expansion accurate
    x, z = 1e4 + _x(4, 1, 6, 3), 1e4 + _x(2, 5, 3, seed=1)
    torch.testing.assert_close(k(x, z), _brute_force(k, x, z).detach(), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(k(x), _brute_force(k, x, x).detach(), rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------------------------------------------
# names through flowgp.registry.KERNELS
# ---------------------------------------------------------------------------------------------------
from flowgp.gp.kernels import RBF, Kernel, Linear  # noqa: E402
from flowgp.registry import KERNELS  # noqa: E402


class _Cosine(Kernel):
    """A user's kernel: k(x, x') = cos(Σ_d (x_d - x'_d) / ℓ), unit variance (wrapped in Scale by make_kernel)."""

    def __init__(self, input_dim=None, *, lengthscale=1.0, batch_shape=(), dtype=torch.float64):
        super().__init__(input_dim, batch_shape, dtype)
        self.raw_ell = torch.nn.Parameter(torch.as_tensor(float(lengthscale), dtype=dtype))

    def _forward(self, x1, x2):
        x2 = x1 if x2 is None else x2
        return torch.cos((x1.sum(-1, keepdim=True) - x2.sum(-1, keepdim=True).mT) / self.raw_ell)

    def _diag(self, x):
        return x.new_ones(x.shape[:-1])


def test_builtin_kernels_are_registered():
    for name in KERNEL_NAMES:
        assert name in KERNELS
    assert KERNELS.get("se") is RBF and KERNELS.get("Squared_Exponential") is RBF
    assert KERNELS.get("linear") is Linear


def test_user_kernel_registered_under_a_name_works_in_specs():
    KERNELS.register("cosine_user", _Cosine)
    try:
        k = make_kernel("rbf+cosine_user", 2, lengthscale=0.5, variance=2.0)
        x = torch.randn(5, 2, dtype=torch.float64)
        user = k.kernels[1]
        assert isinstance(user.base, _Cosine) and user.base.raw_ell.item() == 0.5  # lengthscale passed on
        expected = 2.0 * RBF(2, lengthscale=0.5)(x) + 2.0 * _Cosine(2, lengthscale=0.5)(x)
        torch.testing.assert_close(k(x), expected)
        assert k.spec == "rbf+kernel"
    finally:
        KERNELS.unregister("cosine_user")
    with pytest.raises(ValueError, match="valid names"):
        make_kernel("rbf+cosine_user", 2)


def test_registering_a_builtin_name_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        KERNELS.register("rbf", _Cosine)


@pytest.mark.parametrize("x_shape", [(7, 4), (1, 7, 4)])
def test_rbf_with_inputs_shared_by_the_batch_is_one_product_with_the_same_values_and_gradients(x_shape):
    """A deep GP layer's K_ZX: Z and ℓ per output, X shared. Both 1/ℓ go on Z's side (one GEMM): the values and
    every gradient must be those of the same X expanded to the batch (the batched product)."""
    g = torch.Generator().manual_seed(3)
    k = Scale(RBF(4, batch_shape=(3,)), variance=torch.tensor([0.5, 1.0, 2.0], dtype=F64).reshape(3, 1, 1))
    with torch.no_grad():
        for raw in k.parameters():
            raw.add_(0.5 * torch.randn(raw.shape, generator=g, dtype=F64))
    z = (10.0 + torch.randn(3, 5, 4, generator=g, dtype=F64)).requires_grad_(True)
    x = (10.0 + torch.randn(*x_shape, generator=g, dtype=F64)).requires_grad_(True)
    shared = k(z, x)
    expanded = k(z, x.expand(3, 7, 4))
    assert shared.shape == expanded.shape == (3, 5, 7)
    torch.testing.assert_close(shared, expanded, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(shared, _brute_force(k.base, z, x.expand(3, 7, 4)) * k.variance, rtol=1e-9, atol=1e-9)
    weights = torch.randn(3, 5, 7, generator=g, dtype=F64)
    inputs = [z, x] + list(k.parameters())
    for a, b in zip(torch.autograd.grad((shared * weights).sum(), inputs),
                    torch.autograd.grad((expanded * weights).sum(), inputs)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
