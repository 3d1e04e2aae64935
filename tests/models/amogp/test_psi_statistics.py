"""Ψ-statistics (supplement A.3) against Monte Carlo under q(a), and their point-mass limit."""
import pytest
import torch

from flowgp.models.amogp.convolution import ConvolutionKernel
from flowgp.models.amogp.psi_statistics import (cp_psi_statistics, gaussian_psi2_contract, grouped_psi2_contract,
                                   grouped_psi_statistics, own_group_psi_statistics, se_psi_statistics)

NUM_MC = 100_000


def _assert_within_se(closed, samples, k=4.5):
    """closed vs the MC mean of `samples` [S, ...], elementwise within k standard errors (+ tiny slack)."""
    mean = samples.mean(0)
    se = samples.std(0) / samples.shape[0] ** 0.5
    bad = (closed - mean).abs() > k * se + 1e-9
    assert not bad.any(), f"max |z| = {((closed - mean).abs() / (se + 1e-300)).max():.2f}"


def test_se_statistics_match_monte_carlo(float64_default):
    g = torch.Generator().manual_seed(0)
    n, m, dx = 3, 4, 2
    mean = torch.randn(n, dx, generator=g)
    var = 0.5 * torch.rand(n, dx, generator=g) + 0.05
    z = torch.randn(m, dx, generator=g)
    variance, ls = torch.tensor(1.3), torch.tensor([0.7, 1.4])
    stats, xi = se_psi_statistics(mean, var, z, variance, ls, with_mean=True)
    a = mean + var.sqrt() * torch.randn(NUM_MC, n, dx, generator=g)  # [S, N, D]
    k = variance * torch.exp(-0.5 * ((a.unsqueeze(-2) - z) / ls).square().sum(-1))  # [S, N, M]
    torch.testing.assert_close(stats.psi0, torch.full((n,), 1.3))
    _assert_within_se(stats.psi1, k)
    _assert_within_se(stats.psi2, k.unsqueeze(-1) * k.unsqueeze(-2))
    _assert_within_se(xi, a.unsqueeze(-2) * k.unsqueeze(-1))


@pytest.mark.parametrize("latents", [1, 2])
def test_cp_statistics_match_monte_carlo(float64_default, latents):
    g = torch.Generator().manual_seed(latents)
    kern = ConvolutionKernel(3, 1, latents, lengthscale=0.9)
    with torch.no_grad():
        kern.raw_lengthscale.add_(0.4 * torch.randn(kern.raw_lengthscale.shape, generator=g))
        kern.raw_variance.add_(0.4 * torch.randn(kern.raw_variance.shape, generator=g))
    n = 4
    out = torch.tensor([0, 1, 2, 1])
    mean = torch.randn(n, 1, generator=g)
    var = 0.4 * torch.rand(n, 1, generator=g) + 0.02
    z = torch.linspace(-1.5, 1.5, 5)[:, None]
    zo = torch.tensor([0, 1, 2, 2, 0])
    stats = cp_psi_statistics(kern, mean, var, out, z, zo)
    a = mean + var.sqrt() * torch.randn(NUM_MC, n, 1, generator=g)
    with torch.no_grad():
        k = kern(a, out, z, zo)  # [S, N, M]
        kaa = kern.diag(mean, out)
    torch.testing.assert_close(stats.psi0, kaa)
    _assert_within_se(stats.psi1, k)
    _assert_within_se(stats.psi2, k.unsqueeze(-1) * k.unsqueeze(-2))


def test_point_mass_reduces_to_kernel(float64_default):
    kern = ConvolutionKernel(2, 1, 2, lengthscale=0.6)
    x = torch.randn(5, 1)
    out = torch.tensor([0, 1, 1, 0, 1])
    z = torch.randn(3, 1)
    zo = torch.tensor([1, 0, 1])
    stats = cp_psi_statistics(kern, x, torch.zeros_like(x), out, z, zo)
    kxz = kern(x, out, z, zo)
    torch.testing.assert_close(stats.psi1, kxz)
    torch.testing.assert_close(stats.psi2, kxz.unsqueeze(-1) * kxz.unsqueeze(-2))
    se = se_psi_statistics(x, torch.zeros_like(x), z, 2.0, torch.tensor([0.5]))
    kse = 2.0 * torch.exp(-0.5 * (x - z.mT).square() / 0.25)
    torch.testing.assert_close(se.psi1, kse)


def test_gradcheck_psi2(float64_default):
    kern = ConvolutionKernel(2, 1, 1, lengthscale=0.8)
    out, zo = torch.tensor([0, 1]), torch.tensor([1, 0, 0])
    z = torch.randn(3, 1)
    mean = torch.randn(2, 1, requires_grad=True)
    var = (0.3 * torch.ones(2, 1)).requires_grad_()
    assert torch.autograd.gradcheck(lambda m, v: cp_psi_statistics(kern, m, v, out, z, zo).psi2, (mean, var))


def test_bad_input_refused(float64_default):
    with pytest.raises(ValueError, match="non-negative"):
        se_psi_statistics(torch.zeros(2, 1), -torch.ones(2, 1), torch.zeros(3, 1), 1.0, 1.0)
    with pytest.raises(ValueError, match="same shape"):
        se_psi_statistics(torch.zeros(2, 1), torch.ones(3, 1), torch.zeros(3, 1), 1.0, 1.0)


# ----- tr(Φ_n W) without per-point blocks (grouped_psi2_contract) ---------------------------------------------
def _grouped_problem(seed, n=6, g=3, mg=4, dx=1, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    mean = torch.randn(n, dx, generator=gen, dtype=dtype)
    var = 0.4 * torch.rand(n, dx, generator=gen, dtype=dtype)
    var[0] = 0.0  # a point mass among random inputs
    z = torch.randn(g, mg, dx, generator=gen, dtype=dtype)
    x = torch.randn(g * mg, g * mg, generator=gen, dtype=dtype)
    amp = 0.5 + torch.rand(n, g, generator=gen, dtype=dtype)
    lsq = 0.2 + torch.rand(n, g, dx, generator=gen, dtype=dtype)
    return mean, var, z, x, amp, lsq


def _sym(x, g, mg):
    return (x + x.T).reshape(g, mg, g, mg)


def _reference(mean, var, z, weight, amp, lsq):
    """Today's contraction, point by point, on the ungrouped inducing inputs (eq. 25 materialised)."""
    g, mg, dx = z.shape
    rows = [gaussian_psi2_contract(mean[n:n + 1], var[n:n + 1], z.reshape(-1, dx), weight.reshape(g * mg, -1),
                                   amp[n].repeat_interleave(mg), lsq[n].repeat_interleave(mg, 0))
            for n in range(mean.shape[0])]
    return torch.cat(rows)


@pytest.mark.parametrize("dx", [1, 2])
def test_grouped_contract_equals_materialised_contract(dx):
    mean, var, z, x, amp, lsq = _grouped_problem(dx, dx=dx)
    w = _sym(x, 3, 4)
    fast = grouped_psi2_contract(mean, var, z, w, amp, lsq)
    torch.testing.assert_close(fast, _reference(mean, var, z, w, amp, lsq), rtol=1e-12, atol=1e-12)
    # an asymmetric W counts through its symmetric part (Φ_n is symmetric)
    w_asym = x.reshape(3, 4, 3, 4)
    torch.testing.assert_close(grouped_psi2_contract(mean, var, z, w_asym, amp, lsq),
                               _reference(mean, var, z, w_asym, amp, lsq), rtol=1e-12, atol=1e-12)


def test_grouped_contract_matches_monte_carlo():
    mean, var, z, x, amp, lsq = _grouped_problem(5, n=3, g=2, mg=3)
    w = _sym(x, 2, 3)
    gen = torch.Generator().manual_seed(11)
    a = mean + var.sqrt() * torch.randn(NUM_MC, 3, 1, generator=gen, dtype=torch.float64)  # [S, N, 1]
    zf = z.reshape(-1)  # [M]
    lsq_f = lsq[..., 0].repeat_interleave(3, -1)  # [N, M]
    k = amp.repeat_interleave(3, -1) * torch.exp(-0.5 * (a - zf).square() / lsq_f)  # [S, N, M]
    samples = torch.einsum("snm,mk,snk->sn", k, w.reshape(6, 6), k)
    _assert_within_se(grouped_psi2_contract(mean, var, z, w, amp, lsq), samples)


def test_grouped_contract_point_mass_is_psi1_quadratic_form():
    mean, var, z, x, amp, lsq = _grouped_problem(7)
    w = _sym(x, 3, 4)
    psi1 = amp.repeat_interleave(4, -1) * torch.exp(-0.5 * (mean - z.reshape(-1)).square()
                                                    / lsq[..., 0].repeat_interleave(4, -1))
    expected = torch.einsum("nm,mk,nk->n", psi1, w.reshape(12, 12), psi1)
    torch.testing.assert_close(grouped_psi2_contract(mean, torch.zeros_like(var), z, w, amp, lsq), expected)


def test_grouped_contract_gradcheck():
    mean, var, z, x, amp, lsq = _grouped_problem(3, n=4, g=2, mg=3, dx=2)
    var = var + 0.05
    inputs = [t.clone().requires_grad_() for t in (mean, var, z, x, amp, lsq)]
    assert torch.autograd.gradcheck(lambda m, v, zz, xx, a, l: grouped_psi2_contract(m, v, zz, _sym(xx, 2, 3), a, l),
                                    inputs)


def test_grouped_contract_float32_and_bad_shapes():
    mean, var, z, x, amp, lsq = _grouped_problem(2)
    w = _sym(x, 3, 4)
    ref = grouped_psi2_contract(mean, var, z, w, amp, lsq)
    f32 = grouped_psi2_contract(*(t.float() for t in (mean, var, z, w, amp, lsq)))
    assert f32.dtype == torch.float32
    torch.testing.assert_close(f32.double(), ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="weight"):
        grouped_psi2_contract(mean, var, z, w.reshape(12, 12), amp, lsq)
    with pytest.raises(ValueError, match="amp"):
        grouped_psi2_contract(mean, var, z, w, amp[:, :2], lsq)


def _small_chunks(monkeypatch):
    """Chunks of a few points, none kept: the sorted, windowed, recomputing path of larger problems."""
    from flowgp.models.amogp.psi_statistics import _BlockedExpContract

    monkeypatch.setattr(_BlockedExpContract, "_CHUNK_ELEMENTS", 1 << 12)
    monkeypatch.setattr(_BlockedExpContract, "_MIN_CHUNK", 1)
    monkeypatch.setattr(_BlockedExpContract, "_KEEP_ELEMENTS", 0)


def test_grouped_contract_skips_negligible_rows_exactly(monkeypatch):
    """Short lengthscales over a long input range: chunks of sorted points work on narrow windows of the
    inducing inputs (terms below e^-40 skipped); values and gradients equal the materialised contraction."""
    _small_chunks(monkeypatch)
    gen = torch.Generator().manual_seed(8)
    n, g, mg = 150, 2, 40  # several chunks of points
    mean = (10 * torch.rand(n, 1, generator=gen, dtype=torch.float64) - 5).requires_grad_()
    var = (0.01 * torch.rand(n, 1, generator=gen, dtype=torch.float64)).requires_grad_()
    z = (torch.linspace(-5, 5, mg, dtype=torch.float64)[torch.randperm(mg, generator=gen)].repeat(g, 1)[..., None]
         + 0.05 * torch.randn(g, mg, 1, generator=gen, dtype=torch.float64)).requires_grad_()
    x = torch.randn(g * mg, g * mg, generator=gen, dtype=torch.float64)
    w = _sym(x, g, mg)
    amp = torch.ones(n, g, dtype=torch.float64)
    lsq = (0.01 + 0.01 * torch.rand(n, g, 1, generator=gen, dtype=torch.float64)).requires_grad_()
    fast = grouped_psi2_contract(mean, var, z, w, amp, lsq)
    ref = _reference(mean, var, z, w, amp, lsq)
    torch.testing.assert_close(fast, ref, rtol=1e-12, atol=1e-12)
    probe = torch.randn(n, generator=gen, dtype=torch.float64)
    g_fast = torch.autograd.grad((fast * probe).sum(), (mean, var, z, lsq))
    g_ref = torch.autograd.grad((ref * probe).sum(), (mean, var, z, lsq))
    for a, b in zip(g_fast, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("keep", [True, False])
def test_grouped_contract_kept_or_recomputed_exponentials(monkeypatch, keep):
    """The backward reads the forward's exponentials when they fit the budget (and forms E ∘ w in place on them),
    recomputes them otherwise: the same gradients either way, and a second backward with retain_graph agrees."""
    if keep:
        from flowgp.models.amogp.psi_statistics import _BlockedExpContract

        monkeypatch.setattr(_BlockedExpContract, "_KEEP_ELEMENTS", 1 << 23)
    else:
        _small_chunks(monkeypatch)
    mean, var, z, x, amp, lsq = _grouped_problem(4, n=300, g=2, mg=5)  # several chunks of points
    inputs = [t.clone().requires_grad_() for t in (mean, var, z, x, amp, lsq)]
    out = grouped_psi2_contract(*inputs[:3], _sym(inputs[3], 2, 5), *inputs[4:])
    probe = torch.randn(300, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    first = torch.autograd.grad((out * probe).sum(), inputs, retain_graph=True)
    second = torch.autograd.grad((out * probe).sum(), inputs)
    mean_r, var_r, z_r, x_r, amp_r, lsq_r = [t.clone().requires_grad_() for t in (mean, var, z, x, amp, lsq)]
    ref = _reference(mean_r, var_r, z_r, _sym(x_r, 2, 5), amp_r, lsq_r)
    expected = torch.autograd.grad((ref * probe).sum(), (mean_r, var_r, z_r, x_r, amp_r, lsq_r))
    for a, b, c in zip(first, second, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-10)


# ----- block-diagonal W (grouped_psi_statistics) and one group per point (own_group_psi_statistics) ---------
def _block_diagonal(w):
    """[G, Mg, Mg] blocks as the full [G, Mg, G, Mg] weight."""
    g, mg, _ = w.shape
    full = torch.zeros(g, mg, g, mg, dtype=w.dtype)
    for i in range(g):
        full[i, :, i, :] = w[i]
    return full


def _psi1_reference(mean, var, z, amp, lsq):
    """Eq. 24 per point and group, [N, G, Mg]."""
    den = lsq.unsqueeze(2) + var[:, None, None, :]  # [N, G, 1, Dx]
    log = 0.5 * (lsq.unsqueeze(2) / den).log() - 0.5 * (mean[:, None, None, :] - z).square() / den
    return amp.unsqueeze(-1) * log.sum(-1).exp()


@pytest.mark.parametrize("chunks,z_sorted", [(False, False), (True, False), (True, True)])
def test_block_diagonal_statistics_equal_materialised(monkeypatch, chunks, z_sorted):
    """Ψ₁ and tr(Φ_n W) with a block-diagonal W (the diagonal-block node, one kept chunk or sorted, windowed and
    recomputed chunks; inducing inputs in any order or sorted already, which skips their permutation) equal eq. 24
    and the materialised contraction, values and gradients (W through its symmetric part)."""
    if chunks:
        _small_chunks(monkeypatch)
    gen = torch.Generator().manual_seed(12)
    n, g, mg = 60, 2, 20
    mean = (6 * torch.rand(n, 1, generator=gen, dtype=torch.float64) - 3).requires_grad_()
    var = (0.02 * torch.rand(n, 1, generator=gen, dtype=torch.float64)).requires_grad_()
    z = (torch.linspace(-3, 3, mg, dtype=torch.float64)[torch.randperm(mg, generator=gen)].repeat(g, 1)[..., None]
         + 0.05 * torch.randn(g, mg, 1, generator=gen, dtype=torch.float64))
    z = (z.sort(dim=1).values if z_sorted else z).requires_grad_()
    w = torch.randn(g, mg, mg, generator=gen, dtype=torch.float64).requires_grad_()
    amp = (0.5 + torch.rand(n, g, generator=gen, dtype=torch.float64)).requires_grad_()
    lsq = (0.02 + 0.02 * torch.rand(n, g, 1, generator=gen, dtype=torch.float64)).requires_grad_()
    psi, phi = grouped_psi_statistics(mean, var, z, w, amp, lsq)
    ref_psi = _psi1_reference(mean, var, z, amp, lsq)
    ref_phi = _reference(mean, var, z, _block_diagonal(0.5 * (w + w.mT)), amp, lsq)
    torch.testing.assert_close(psi, ref_psi, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(phi, ref_phi, rtol=1e-12, atol=1e-12)
    probe_psi = torch.randn(psi.shape, generator=gen, dtype=torch.float64)
    probe_phi = torch.randn(n, generator=gen, dtype=torch.float64)
    inputs = (mean, var, z, w, amp, lsq)
    fast = torch.autograd.grad((psi * probe_psi).sum() + (phi * probe_phi).sum(), inputs)
    ref = torch.autograd.grad((ref_psi * probe_psi).sum() + (ref_phi * probe_phi).sum(), inputs)
    for a, b in zip(fast, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dx", [1, 2])
def test_block_diagonal_statistics_gradcheck(monkeypatch, dx):
    """gradcheck of the diagonal-block node (hand-written chain rule through Ψ₁, the row factors, κ and the
    prefactors), in one chunk and in sorted chunks."""
    gen = torch.Generator().manual_seed(dx)
    n, g, mg = 9, 2, 3
    inputs = [torch.randn(n, dx, generator=gen, dtype=torch.float64),
              0.3 * torch.rand(n, dx, generator=gen, dtype=torch.float64) + 0.01,
              torch.randn(g, mg, dx, generator=gen, dtype=torch.float64),
              torch.randn(g, mg, mg, generator=gen, dtype=torch.float64),
              0.5 + torch.rand(n, g, generator=gen, dtype=torch.float64),
              0.3 + torch.rand(n, g, dx, generator=gen, dtype=torch.float64)]
    inputs = [t.requires_grad_() for t in inputs]
    assert torch.autograd.gradcheck(grouped_psi_statistics, inputs)
    from flowgp.models.amogp.psi_statistics import _BlockedExpContract

    monkeypatch.setattr(_BlockedExpContract, "_CHUNK_ELEMENTS", 1 << 4)
    monkeypatch.setattr(_BlockedExpContract, "_MIN_CHUNK", 1)
    monkeypatch.setattr(_BlockedExpContract, "_KEEP_ELEMENTS", 0)
    monkeypatch.setattr(_BlockedExpContract, "_MIN_WINDOWED", 1)
    assert torch.autograd.gradcheck(grouped_psi_statistics, inputs)


@pytest.mark.parametrize("dx", [1, 2])
def test_full_weight_statistics_gradcheck_in_sorted_chunks(monkeypatch, dx):
    """gradcheck of Ψ₁ and the contraction with a full W [G, Mg, G, Mg] when the points and the (unsorted)
    inducing inputs are sorted for chunked evaluation: every input, W and the prefactors included, gets its
    gradient back in the caller's order."""
    from flowgp.models.amogp.psi_statistics import _BlockedExpContract

    monkeypatch.setattr(_BlockedExpContract, "_CHUNK_ELEMENTS", 1 << 4)
    monkeypatch.setattr(_BlockedExpContract, "_MIN_CHUNK", 1)
    monkeypatch.setattr(_BlockedExpContract, "_KEEP_ELEMENTS", 0)
    monkeypatch.setattr(_BlockedExpContract, "_MIN_WINDOWED", 1)
    mean, var, z, x, amp, lsq = _grouped_problem(40 + dx, n=7, g=2, mg=3, dx=dx)
    z = z.flip(1)  # not sorted within the groups
    inputs = [t.clone().requires_grad_() for t in (mean, var + 0.01, z, _sym(x, 2, 3), amp, lsq)]
    assert torch.autograd.gradcheck(grouped_psi_statistics, inputs)


@pytest.mark.parametrize("dx", [1, 2])
def test_own_group_statistics(dx):
    """Each point against its own group only: equal to the diagonal-block statistics with the other groups'
    prefactors zero, and gradcheck of its hand-written backward."""
    gen = torch.Generator().manual_seed(20 + dx)
    n, g, mg = 8, 3, 4
    mean = torch.randn(n, dx, generator=gen, dtype=torch.float64)
    var = 0.3 * torch.rand(n, dx, generator=gen, dtype=torch.float64) + 0.01
    z = torch.randn(g, mg, dx, generator=gen, dtype=torch.float64)
    w = torch.randn(g, mg, mg, generator=gen, dtype=torch.float64)
    amp = 0.5 + torch.rand(n, generator=gen, dtype=torch.float64)
    lsq = 0.3 + torch.rand(n, dx, generator=gen, dtype=torch.float64)
    group = torch.tensor([0, 2, 1, 1, 0, 2, 2, 0])
    psi, phi = own_group_psi_statistics(mean, var, z, w, amp, lsq, group)
    onehot = torch.nn.functional.one_hot(group, g).to(torch.float64)
    psi_all, phi_all = grouped_psi_statistics(mean, var, z, w, onehot * amp[:, None],
                                              lsq[:, None, :].expand(n, g, dx))
    torch.testing.assert_close(phi, phi_all, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(psi, psi_all[torch.arange(n), group], rtol=1e-12, atol=1e-12)
    inputs = [t.clone().requires_grad_() for t in (mean, var, z, w, amp, lsq)]
    assert torch.autograd.gradcheck(lambda *a: own_group_psi_statistics(*a, group), inputs)


def test_own_group_one_dimension_equals_general_node():
    """The one-dimensional own-group node (gathers and products over [N, Mg²]) equals the general one (per-point
    [N, Mg, Mg, Dx] blocks) in values and gradients."""
    from flowgp.models.amogp.psi_statistics import _OwnGroupPsiContract, _OwnGroupPsiContract1D

    gen = torch.Generator().manual_seed(31)
    n, g, mg = 40, 3, 5
    group = torch.randint(0, g, (n,), generator=gen)
    inputs = [torch.randn(n, 1, generator=gen, dtype=torch.float64),
              0.3 * torch.rand(n, 1, generator=gen, dtype=torch.float64),
              torch.randn(g, mg, 1, generator=gen, dtype=torch.float64),
              torch.randn(g, mg, mg, generator=gen, dtype=torch.float64),
              0.5 + torch.rand(n, generator=gen, dtype=torch.float64),
              0.3 + torch.rand(n, 1, generator=gen, dtype=torch.float64)]
    inputs = [t.requires_grad_() for t in inputs]
    probes = [torch.randn(n, mg, generator=gen, dtype=torch.float64), torch.randn(n, generator=gen, dtype=torch.float64)]
    results = []
    for node in (_OwnGroupPsiContract1D, _OwnGroupPsiContract):
        out = node.apply(*inputs, group)
        loss = sum((o * p).sum() for o, p in zip(out, probes))
        results.append((out, torch.autograd.grad(loss, inputs)))
    (out1, grad1), (out2, grad2) = results
    for a, b in zip(out1 + grad1, out2 + grad2):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


# ----- the contraction as a series of products where the coupling is weak (_taylor_forward) -----------------
def _series_problem(seed, diagonal: bool, var_kind: str, n=80, g=2, mg=12):
    gen = torch.Generator().manual_seed(seed)
    mean = 4 * torch.rand(n, 1, generator=gen, dtype=torch.float64) - 2
    if var_kind == "zero":  # point masses: no coupling at all
        var = torch.zeros(n, 1, dtype=torch.float64)
    elif var_kind == "constant":  # one coupling per block: the series' centre, one term
        var = torch.full((n, 1), 3e-4, dtype=torch.float64)
    else:  # couplings spread over a range: several terms
        var = 2e-3 * torch.rand(n, 1, generator=gen, dtype=torch.float64)
    z = torch.linspace(-2, 2, mg, dtype=torch.float64).repeat(g, 1)[..., None] + 0.1 * torch.randn(
        g, mg, 1, generator=gen, dtype=torch.float64)
    shape = (g, mg, mg) if diagonal else (g, mg, g, mg)
    w = torch.randn(*shape, generator=gen, dtype=torch.float64)
    amp = 0.5 + torch.rand(n, g, generator=gen, dtype=torch.float64)
    lsq = 0.3 + 0.3 * torch.rand(n, g, 1, generator=gen, dtype=torch.float64)
    if var_kind == "constant":  # κ = ½ v/(AB + (A + B) v) then depends on the block only
        lsq = lsq[:1].expand(n, g, 1).clone()
    return [mean, var, z, w, amp, lsq]


def _force_series(monkeypatch):
    """The series wherever its terms are bounded (cost model off); returns the list of term counts used."""
    from flowgp.models.amogp import psi_statistics as ps

    used = []
    original = ps._taylor_forward

    def spy(state, *args):
        used.append(state.coef.shape[-1])
        return original(state, *args)

    monkeypatch.setattr(ps, "_taylor_forward", spy)
    monkeypatch.setattr(ps._BlockedExpContract, "_TAYLOR_COST", 0.0)
    return used


@pytest.mark.parametrize("diagonal", [True, False])
@pytest.mark.parametrize("var_kind", ["zero", "constant", "spread"])
def test_series_contraction_equals_materialised(monkeypatch, diagonal, var_kind):
    """The series of products equals eq. 25 materialised per point, values and gradients, for a block-diagonal W
    (the diagonal-block node) and a full one (every block pair), with point masses (no coupling), one coupling per
    block (the centre: one term plus one for the gradients) and couplings spread around the centre."""
    used = _force_series(monkeypatch)
    inputs = [t.requires_grad_() for t in _series_problem(40, diagonal, var_kind)]
    mean, var, z, w, amp, lsq = inputs
    phi = grouped_psi_statistics(*inputs)[1]
    assert used, "the series was not used"
    if var_kind != "spread":
        assert used[-1] == 2  # one term for the value, one more for the gradients
    else:
        assert 3 <= used[-1] <= 16
    full_w = _block_diagonal(0.5 * (w + w.mT)) if diagonal else w
    ref = _reference(mean, var, z, full_w, amp, lsq)
    torch.testing.assert_close(phi, ref, rtol=1e-12, atol=1e-12)
    probe = torch.randn(phi.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    fast = torch.autograd.grad((phi * probe).sum(), inputs)
    slow = torch.autograd.grad((ref * probe).sum(), inputs)
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("diagonal", [True, False])
def test_series_contraction_gradcheck(monkeypatch, diagonal):
    """gradcheck of the series' hand-written backward (∂la, ∂lb, ∂κ through the coefficients, ∂w and ∂dz through
    the shifted powers and the centre's factor)."""
    used = _force_series(monkeypatch)
    inputs = [t.requires_grad_() for t in _series_problem(41, diagonal, "spread", n=7, g=2, mg=3)]
    inputs[1] = (inputs[1].detach() + 1e-3).requires_grad_()  # away from 0: finite differences stay in range
    assert torch.autograd.gradcheck(lambda *a: grouped_psi_statistics(*a)[1], inputs)
    assert used


def test_series_terms_bound_the_remainder():
    """_taylor_terms gives the least T with ρ^T/sqrt(2πT) <= 2^-8 eps, 1 without coupling, None beyond the cap or
    for a non-finite ρ; float32 needs fewer terms than float64."""
    import math

    from flowgp.models.amogp.psi_statistics import _BlockedExpContract, _taylor_terms

    for dtype in (torch.float64, torch.float32):
        tol = torch.finfo(dtype).eps / 256
        for rho in (1e-9, 1e-6, 1e-4, 1e-3, 1e-2, 0.05):
            t = _taylor_terms(rho, dtype)
            if t is None:
                assert rho ** _BlockedExpContract._TAYLOR_MAX_TERMS > tol
                continue
            assert rho ** t / math.sqrt(2 * math.pi * t) <= tol
            assert t == 1 or rho ** (t - 1) / math.sqrt(2 * math.pi * (t - 1)) > tol
        assert _taylor_terms(0.0, dtype) == 1
        assert _taylor_terms(float("nan"), dtype) is None
        assert _taylor_terms(0.9, dtype) is None
    assert _taylor_terms(1e-3, torch.float32) < _taylor_terms(1e-3, torch.float64)


def test_series_float32_matches_float64(monkeypatch):
    used = _force_series(monkeypatch)
    inputs = _series_problem(42, True, "spread")
    ref = grouped_psi_statistics(*inputs)[1]
    f32 = grouped_psi_statistics(*(t.float() for t in inputs))[1]
    assert len(used) == 2
    torch.testing.assert_close(f32.double(), ref, rtol=1e-5, atol=1e-5)


def test_series_on_windows_equals_materialised(monkeypatch):
    """Short lengthscales over a long input range, points in sorted chunks: the series runs on each chunk's
    window of rows and columns (those outside add less than e^-40 of |w|) and equals the materialised
    contraction in values and gradients; where its terms cost more than the exponentials (terms x _TAYLOR_COST
    > 1) the exponential path runs and agrees."""
    from flowgp.models.amogp import psi_statistics as ps

    _small_chunks(monkeypatch)
    used = _force_series(monkeypatch)
    gen = torch.Generator().manual_seed(43)
    n, g, mg = 150, 2, 40
    mean = (10 * torch.rand(n, 1, generator=gen, dtype=torch.float64) - 5).requires_grad_()
    var = (1e-4 * torch.rand(n, 1, generator=gen, dtype=torch.float64)).requires_grad_()
    z = (torch.linspace(-5, 5, mg, dtype=torch.float64)[torch.randperm(mg, generator=gen)].repeat(g, 1)[..., None]
         + 0.05 * torch.randn(g, mg, 1, generator=gen, dtype=torch.float64)).requires_grad_()
    w = _sym(torch.randn(g * mg, g * mg, generator=gen, dtype=torch.float64), g, mg)
    amp = torch.ones(n, g, dtype=torch.float64)
    lsq = (0.01 + 0.01 * torch.rand(n, g, 1, generator=gen, dtype=torch.float64)).requires_grad_()
    probe = torch.randn(n, generator=gen, dtype=torch.float64)
    inputs = (mean, var, z, lsq)
    ref = _reference(mean, var, z, w, amp, lsq)
    g_ref = torch.autograd.grad((ref * probe).sum(), inputs)
    results = {}
    for cost in (0.0, 1.0):  # series forced / exponentials (every series has more than one term here)
        monkeypatch.setattr(ps._BlockedExpContract, "_TAYLOR_COST", cost)
        used.clear()
        fast = grouped_psi2_contract(mean, var, z, w, amp, lsq)
        results[cost] = list(used)
        torch.testing.assert_close(fast, ref, rtol=1e-12, atol=1e-12)
        for a, b in zip(torch.autograd.grad((fast * probe).sum(), inputs), g_ref):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    assert results[0.0] and min(results[0.0]) > 1 and not results[1.0]


@pytest.mark.parametrize("chunks", [False, True])
def test_nodes_leave_no_reference_cycles(monkeypatch, chunks):
    """After forward and backward, every node's state is freed by reference counting: a node that keeps a tensor it
    returns refers to itself through that tensor's grad_fn, and the cycle holds its state (megabytes per training
    step) until Python's cyclic collector runs."""
    import gc

    if chunks:
        _small_chunks(monkeypatch)
    gen = torch.Generator().manual_seed(31)
    n, g, mg = 40, 2, 6
    mean = torch.randn(n, 1, generator=gen, dtype=torch.float64, requires_grad=True)
    var = (0.01 * torch.rand(n, 1, generator=gen, dtype=torch.float64)).requires_grad_()
    z = torch.randn(g, mg, 1, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(g, mg, mg, generator=gen, dtype=torch.float64, requires_grad=True)
    amp = (0.5 + torch.rand(n, g, generator=gen, dtype=torch.float64)).requires_grad_()
    lsq = (0.3 + torch.rand(n, g, 1, generator=gen, dtype=torch.float64)).requires_grad_()
    group = torch.randint(0, g, (n,), generator=gen)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # keep what the next collection finds only in cycles, to look at it
    try:
        for stats in (grouped_psi_statistics(mean, var, z, w, amp, lsq),
                      grouped_psi_statistics(mean, var, z, w.new_zeros(g, mg, g, mg) + w[0, 0, 0], amp, lsq),
                      own_group_psi_statistics(mean, var, z, w, amp[:, 0], lsq[:, 0], group)):
            sum(s.sum() for s in stats).backward()
        del stats
        gc.collect()
        # only the nodes' own objects count: other tests may leave unrelated garbage behind
        cyclic = {type(o).__name__ for o in gc.garbage} & {
            "_DiagonalPsiContractBackward", "_OwnGroupPsiContract1DBackward", "_OwnGroupPsiContractBackward",
            "_BlockedExpContractBackward", "_ContractState", "_TaylorState", "_SortedPoints"}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert not cyclic


def test_exp_or_zero_zeros_below_its_level_keeps_nan_and_differentiates():
    from flowgp.models.amogp.psi_statistics import exp_or_zero

    x = torch.tensor([0.0, -1.0, -99.0, -101.0, -800.0, float("nan")], dtype=torch.float64, requires_grad=True)
    y = exp_or_zero(x)
    torch.testing.assert_close(y[:3], x[:3].exp())
    assert torch.equal(y[3:5], torch.zeros(2, dtype=torch.float64)) and torch.isnan(y[5])
    torch.testing.assert_close(exp_or_zero(x.detach() * 1.4426950408889634, base2=True)[:3], x[:3].detach().exp())
    (g,) = torch.autograd.grad(y[:5].sum(), x)
    torch.testing.assert_close(g[:5], torch.cat([x[:3].detach().exp(), torch.zeros(2, dtype=torch.float64)]))
