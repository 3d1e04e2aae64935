"""flowgp.models.amogp.psi_grid: Ψ₁ and tr(Φ_n W) on grid inducing inputs against the general grouped node, gradients by
gradcheck, float32 against float64, the floor far from the grid, and clear errors."""
from __future__ import annotations

import pytest
import torch

from flowgp.models.amogp.psi_grid import grid_psi_statistics
from flowgp.models.amogp.psi_statistics import grouped_psi_statistics

F64 = torch.float64


def _inputs(n=37, g=2, m=7, seed=1, dtype=F64, spread=3.0):
    gen = torch.Generator().manual_seed(seed)
    mean = (torch.rand(n, 1, generator=gen, dtype=F64) * spread - spread / 2).to(dtype).requires_grad_()
    var = (0.05 * torch.rand(n, 1, generator=gen, dtype=F64)).to(dtype).requires_grad_()
    start = torch.tensor([-1.6, -1.2][:g], dtype=dtype)
    step = torch.tensor([0.5, 0.4][:g], dtype=dtype)
    weight = torch.randn(g, m, m, generator=gen, dtype=F64).to(dtype).requires_grad_()
    amp = (0.5 + torch.rand(n, g, generator=gen, dtype=F64)).to(dtype).requires_grad_()
    lsq = (0.1 + 0.3 * torch.rand(n, g, 1, generator=gen, dtype=F64)).to(dtype).requires_grad_()
    return mean, var, start, step, weight, amp, lsq


def _grid(start, step, m):
    return (start[:, None] + step[:, None] * torch.arange(m, dtype=start.dtype)).unsqueeze(-1)


def test_equals_the_grouped_node_with_every_gradient():
    """Per-point lengthscales and prefactors, two groups with different grids: Ψ₁, the contraction and the
    gradients in every input equal `grouped_psi_statistics` on the same inducing inputs to rounding."""
    mean, var, start, step, weight, amp, lsq = _inputs()
    m = weight.shape[-1]
    ref = grouped_psi_statistics(mean, var, _grid(start, step, m), weight, amp, lsq)
    got = grid_psi_statistics(mean, var, start, step, weight, amp, lsq)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    gen = torch.Generator().manual_seed(4)
    up = [torch.randn(t.shape, generator=gen, dtype=F64) for t in ref]
    params = [mean, var, weight, amp, lsq]
    g_ref = torch.autograd.grad(sum((t * u).sum() for t, u in zip(ref, up)), params)
    g_got = torch.autograd.grad(sum((t * u).sum() for t, u in zip(got, up)), params)
    for name, a, b in zip(["mean", "var", "weight", "amp", "lsq"], g_got, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12 * float(b.abs().max()), msg=name)


def test_gradcheck():
    mean, var, start, step, weight, amp, lsq = _inputs(n=9, m=5)
    assert torch.autograd.gradcheck(
        lambda *p: grid_psi_statistics(p[0], p[1], start, step, p[2], p[3], p[4]), (mean, var, weight, amp, lsq))


def test_only_the_symmetric_part_of_w_counts_and_its_gradient_is_symmetric():
    mean, var, start, step, weight, amp, lsq = _inputs()
    sym = 0.5 * (weight + weight.mT)
    torch.testing.assert_close(grid_psi_statistics(mean, var, start, step, weight, amp, lsq)[1],
                               grid_psi_statistics(mean, var, start, step, sym, amp, lsq)[1], rtol=1e-13, atol=0.0)
    (g_w,) = torch.autograd.grad(grid_psi_statistics(mean, var, start, step, weight, amp, lsq)[1].sum(), weight)
    torch.testing.assert_close(g_w, g_w.mT, rtol=0.0, atol=0.0)


def test_float32_follows_float64():
    """The backward's sums of powers of the midpoints are taken about the grid's centre: in float32 the values and
    gradients stay within float32 rounding of the float64 ones, also for inputs offset far from zero."""
    for offset in (0.0, 50.0):
        ins64 = _inputs(n=40, m=12)
        ins64 = (ins64[0].detach().add(offset).requires_grad_(),) + ins64[1:2] + (ins64[2] + offset,) + ins64[3:]
        ins32 = [t.detach().float().requires_grad_(t.requires_grad) for t in ins64]
        out64 = grid_psi_statistics(*ins64)
        out32 = grid_psi_statistics(*ins32)
        for a, b in zip(out32, out64):
            torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-5 * float(b.abs().max()))
        idx = [0, 1, 4, 5, 6]
        g64 = torch.autograd.grad(out64[1].sum() + out64[0].sum(), [ins64[i] for i in idx])
        g32 = torch.autograd.grad(out32[1].sum() + out32[0].sum(), [ins32[i] for i in idx])
        for a, b in zip(g32, g64):
            torch.testing.assert_close(a.double(), b, rtol=1e-3, atol=1e-4 * float(b.abs().max()))


def test_points_far_from_the_grid_give_zeros_not_nans():
    """Inputs 40 lengthscales from every inducing input: exponents far below the floor, finite zeros and finite
    gradients (the general node's values there are zeros too)."""
    mean, var, start, step, weight, amp, lsq = _inputs(n=6)
    far = torch.full_like(mean, 30.0).requires_grad_()
    psi, phi = grid_psi_statistics(far, var, start, step, weight, amp, lsq)
    assert torch.all(psi == 0) and torch.all(phi.abs() < 1e-100)
    grads = torch.autograd.grad(phi.sum() + psi.sum(), [far, var, weight, amp, lsq])
    assert all(torch.isfinite(g).all() for g in grads)


def test_bad_input_is_refused():
    mean, var, start, step, weight, amp, lsq = _inputs()
    with pytest.raises(ValueError, match="start and step: the grid is fixed"):
        grid_psi_statistics(mean, var, start.clone().requires_grad_(), step, weight, amp, lsq)
    with pytest.raises(ValueError, match=r"start and step must be \[2\]"):
        grid_psi_statistics(mean, var, start[:1], step[:1], weight, amp, lsq)
    with pytest.raises(ValueError, match="one input dimension"):
        grid_psi_statistics(mean.expand(-1, 2), var.expand(-1, 2), start, step, weight, amp, lsq)
    with pytest.raises(ValueError, match="block-diagonal"):
        grid_psi_statistics(mean, var, start, step, weight[0], amp, lsq)
    with pytest.raises(ValueError, match="amp must be"):
        grid_psi_statistics(mean, var, start, step, weight, amp[:, :1], lsq)
    with pytest.raises(ValueError, match="var must be >= 0"):
        grid_psi_statistics(mean, -var, start, step, weight, amp, lsq)
