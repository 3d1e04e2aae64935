"""flowgp.numerics.needed_gradients: a hand-written backward learns which inputs the running pass needs, and the
Functions that use it give the same gradients in restricted and full passes."""
import pytest
import torch

from flowgp.numerics.linalg import shared_left_products
from flowgp.numerics.needed_gradients import needed_inputs, record_inputs
from flowgp.gp.variational import whitened_marginal_terms


class _Spy(torch.autograd.Function):
    """x @ m, recording what `needed_inputs` said in its backward."""
    seen = []

    @staticmethod
    def forward(ctx, x, m):
        record_inputs(ctx, x, m)
        ctx.save_for_backward(x, m)
        return x @ m

    @staticmethod
    def backward(ctx, g):
        x, m = ctx.saved_tensors
        need = needed_inputs(ctx)
        _Spy.seen.append(need)
        return (g @ m.mT if need[0] else None), (x.mT @ g if need[1] else None)


def _run(target):
    _Spy.seen.clear()
    a = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    p = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    x, m = a * 2.0, p.tanh()  # non-leaf inputs, as in the models
    out = _Spy.apply(x, m).sum()
    grads = target(out, a, p, x, m)
    return _Spy.seen[-1], grads


def test_a_restricted_pass_marks_the_other_input_not_needed():
    need, _ = _run(lambda out, a, p, x, m: torch.autograd.grad(out, a))
    assert need == (True, False)
    need, _ = _run(lambda out, a, p, x, m: torch.autograd.grad(out, m))
    assert need == (False, True)
    need, _ = _run(lambda out, a, p, x, m: torch.autograd.grad(out, [a, p]))
    assert need == (True, True)


def test_a_full_backward_and_untracked_inputs_keep_the_static_flags():
    need, _ = _run(lambda out, a, p, x, m: out.backward())
    assert need == (True, True)
    _Spy.seen.clear()
    a = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    m = torch.randn(4, 2, dtype=torch.float64)  # needs no gradient: the static flag is False and stays so
    torch.autograd.grad(_Spy.apply(a, m).sum(), a)  # a leaf asked for directly: the engine cannot say, flag kept
    assert _Spy.seen[-1] == (True, False)


def test_shared_left_products_restricted_gradient_equals_the_full_one():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(6, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    r = torch.randn(3, 4, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(3, 6, 4, dtype=torch.float64, generator=gen)
    x, mats = a.sin(), r.tril()
    out = (shared_left_products(x, mats) * w).sum()
    full_x, full_m = torch.autograd.grad(out, [x, mats], retain_graph=True)
    only_x, = torch.autograd.grad(out, x, retain_graph=True)
    only_m, = torch.autograd.grad(out, mats)
    torch.testing.assert_close(only_x, full_x, rtol=0, atol=0)
    torch.testing.assert_close(only_m, full_m, rtol=0, atol=0)


@pytest.mark.parametrize("num_points", [3, 40])  # the square-root form (N < 1.5 M) and the kernel-space form
def test_marginal_terms_restricted_gradient_equals_the_full_one(num_points):
    gen = torch.Generator().manual_seed(1)
    m = 8
    z = torch.randn(m, 1, dtype=torch.float64, generator=gen)
    kzz = torch.exp(-0.5 * (z - z.mT) ** 2) + 1e-6 * torch.eye(m, dtype=torch.float64)
    chol = torch.linalg.cholesky(kzz)
    h = torch.randn(num_points, 1, dtype=torch.float64, generator=gen, requires_grad=True)
    q_mu = torch.randn(2, m, dtype=torch.float64, generator=gen, requires_grad=True)
    r = (0.3 * torch.randn(2, m, m, dtype=torch.float64, generator=gen)).tril().requires_grad_(True)
    cholp = chol.clone().requires_grad_(True)
    kzx = torch.exp(-0.5 * (z - h.mT) ** 2)  # [M, N], a function of the inputs h
    mean, quad = whitened_marginal_terms(cholp.tril(), kzx, q_mu, r.tril())
    out = (mean.sin() + quad).sum()
    full = torch.autograd.grad(out, [h, q_mu, r, cholp], retain_graph=True)
    only_h, = torch.autograd.grad(out, h)
    torch.testing.assert_close(only_h, full[0], rtol=1e-12, atol=1e-14)
