"""The bound of a deep GP with image-shaped layers (convolutional skip, C·H·W GPs sharing one kernel) against the
plain DSVI formula, value and gradients.

The reference writes Salimbeni & Deisenroth's estimator out directly (CNF-DGP eq. 3; TGP appendix eq. 12 for the
whitened marginals): A = Lz⁻¹ K_ZX by a triangular solve, mean = Aᵀm + skip(x), var = diag K_XX - Σ A² + Σ (RᵀA)²,
f = mean + √var ε with the ε `layer_noise` draws, the robust max's expected log-likelihood on the last layer, and
the closed-form KL. The model's fast paths (hand-written backwards, shared projections, kernel-space forms) must
give the same number to 1e-10 and the same gradients.
"""
import pytest
import torch

from flowgp.build import DeepGPConfig, build
from flowgp.models.deep_gp import layer_noise
from flowgp.gp.variational import gaussian_kl_whitened, whitened_marginal_terms
from flowgp.numerics.linalg import robust_cholesky


def _reference_bound(model, x, y, num_data, generator):
    noise = layer_noise(model.layers, 1, x.shape[0], generator, x.dtype, x.device)
    h, kl = x, 0.0
    for layer, eps in zip(model.layers, noise):
        gp = layer.gp
        z = gp.inducing_points
        chol = robust_cholesky(gp.kernel(z), memory=gp.jitter_memory)
        kzx = gp.kernel(z, h.unsqueeze(-3))  # [Lb, M, N]
        a = torch.linalg.solve_triangular(chol, kzx, upper=False)
        r = gp.q_sqrt_tril()  # [L, M, M]
        mean = (gp.q_mu.unsqueeze(-1) * a).sum(-2).mT  # [N, L]
        var = gp.kernel.diag(h.unsqueeze(-3)) - a.square().sum(-2) + (r.mT @ a).square().sum(-2)
        var = var.mT.clamp_min(1e-12)
        if gp.mean_function is not None:
            mean = mean + gp.mean_function(h)
        kl = kl + layer.kl_divergence()
        if layer is model.layers[-1]:
            ell = model.likelihood.expected_log_prob(y, mean, var, model.quadrature_points)
        else:
            h = mean + var.sqrt() * eps[0]
    return ell.sum() * num_data / x.shape[0] - kl


def _image_model(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(40, 2 * 3 * 4, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (40,), generator=gen)
    config = DeepGPConfig(layers=4, skip="conv", image_shape=(2, 3, 4), likelihood="robustmax", num_classes=3,
                          num_inducing=8, kmeans_restarts=1)
    model = build(config, x, y, dtype=dtype)
    with torch.no_grad():  # away from the initial state: q(v), skips, kernels and Z all matter
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=gen, dtype=torch.float64).to(dtype))
        for layer in model.layers:
            layer.gp.q_sqrt.mul_(torch.tensor(30.0, dtype=dtype))
    return model, x.to(dtype), y


@pytest.mark.parametrize("rows", [5, 11, 17, 40])  # N < 1.5 M, 1.5 M <= N < 2 M, N >= 2 M
def test_the_image_deep_gp_bound_is_the_plain_dsvi_formula(rows):
    model, x, y = _image_model(torch.float64)
    params = [p for p in model.parameters() if p.requires_grad]
    xb, yb = x[:rows], y[:rows]
    bound = model.elbo(xb, yb, num_data=1000, generator=torch.Generator().manual_seed(7))
    fast = torch.autograd.grad(bound, params)
    expected = _reference_bound(model, xb, yb, 1000, torch.Generator().manual_seed(7))
    slow = torch.autograd.grad(expected, params)
    assert abs(bound.item() - expected.item()) <= 1e-10 * abs(expected.item())
    for p, g, e in zip(params, fast, slow):
        torch.testing.assert_close(g, e, rtol=1e-7, atol=1e-9 * max(1.0, float(e.abs().max())))



def _shared_inputs(dtype, outputs=4, m=6, n=15, seed=1):
    gen = torch.Generator().manual_seed(seed)
    z, x = torch.randn(m, 3, generator=gen, dtype=torch.float64), torch.randn(n, 3, generator=gen, dtype=torch.float64)
    kzz = torch.exp(-0.5 * torch.cdist(z, z).square()) + 1e-6 * torch.eye(m, dtype=torch.float64)
    kzx = torch.exp(-0.5 * torch.cdist(z, x).square()).unsqueeze(0)  # [1, M, N]: one kernel for every output
    q_mu = torch.randn(outputs, m, generator=gen, dtype=torch.float64)
    r = torch.randn(outputs, m, m, generator=gen, dtype=torch.float64).tril()
    return [t.to(dtype) for t in (kzz, kzx, q_mu, r)]


def _plain_terms(kzz, kzx, q_mu, r):
    a = torch.linalg.solve_triangular(torch.linalg.cholesky(kzz), kzx, upper=False)
    return (q_mu.unsqueeze(-1) * a).sum(-2), (r.mT @ a).square().sum(-2) - a.square().sum(-2)


def test_outputs_sharing_one_projection_give_the_plain_terms_and_gradients():
    kzz, kzx, q_mu, r = (t.requires_grad_() for t in _shared_inputs(torch.float64))

    def fast(kzz, kzx, q_mu, r):
        return whitened_marginal_terms(torch.linalg.cholesky(kzz.detach()), kzx, q_mu, r, kzz)

    for got, want in zip(fast(kzz, kzx, q_mu, r), _plain_terms(kzz, kzx, q_mu, r)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    sym = lambda k, *rest: fast(0.5 * (k + k.mT), *rest)  # K_ZZ's gradient is taken for symmetric changes
    assert torch.autograd.gradcheck(sym, (kzz, kzx, q_mu, r))
    # R read through a lower-triangular mask from a stored factor (the layers' q_sqrt): R's gradient, masked
    mask = torch.ones(r.shape[-1], r.shape[-1], dtype=r.dtype).tril()
    stored = (r.detach() + torch.triu(torch.ones_like(r), 1)).requires_grad_()
    masked = whitened_marginal_terms(torch.linalg.cholesky(kzz.detach()), kzx, q_mu, stored, kzz, mask)
    plain = _plain_terms(kzz, kzx, q_mu, r)
    for got, want in zip(masked, plain):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    g_got = torch.autograd.grad(masked[1].sum() + masked[0].square().sum(), stored)[0]
    g_want = torch.autograd.grad(plain[1].sum() + plain[0].square().sum(), r)[0]
    torch.testing.assert_close(g_got, g_want * mask, rtol=1e-12, atol=1e-12)
    # and with the gradient through the factor instead of K_ZZ, and for an unused output
    chol = torch.linalg.cholesky(kzz.detach()).requires_grad_()
    assert torch.autograd.gradcheck(lambda c, *rest: whitened_marginal_terms(c, *rest)[1], (chol, kzx, q_mu, r))
    assert torch.autograd.gradcheck(lambda c, *rest: whitened_marginal_terms(c, *rest)[0], (chol, kzx, q_mu, r))


def test_the_shared_projection_terms_hold_single_precision():
    inputs64 = _shared_inputs(torch.float64, outputs=50, m=20, n=64)
    kzz, kzx, q_mu, r = _shared_inputs(torch.float32, outputs=50, m=20, n=64)
    got = whitened_marginal_terms(torch.linalg.cholesky(kzz), kzx, q_mu, r)
    want = _plain_terms(*inputs64)
    for g, w in zip(got, want):
        assert g.dtype == torch.float32
        assert float((g.double() - w).abs().max()) <= 1e-5 * float(w.abs().max())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_whitened_kl_and_its_gradient_are_autograds_of_the_plain_formula(dtype):
    gen = torch.Generator().manual_seed(0)
    r = (0.7 * torch.randn(7, 9, 9, generator=gen, dtype=torch.float64).tril()).to(dtype).requires_grad_()
    mu = torch.randn(7, 9, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
    diag = torch.diagonal(r, dim1=-2, dim2=-1)
    plain = 0.5 * (r.square().sum((-2, -1)) + mu.square().sum(-1) - 9 - diag.square().log().sum(-1)).sum()
    eps = torch.finfo(dtype).eps
    stored = (r.detach() + torch.triu(torch.ones_like(r), 1)).requires_grad_()  # R read through the mask
    mask = torch.ones(9, 9, dtype=dtype).tril()
    wants = torch.autograd.grad(1.37 * plain, [r, mu])
    for kl, wrt in ((gaussian_kl_whitened(mu, r), r), (gaussian_kl_whitened(mu, stored, mask), stored)):
        assert abs(kl.item() - plain.item()) <= 20 * eps * abs(plain.item())
        for got, want in zip(torch.autograd.grad(1.37 * kl, [wrt, mu]), wants):
            torch.testing.assert_close(got, want * (mask if wrt is stored and got.dim() == 3 else 1),
                                       rtol=20 * eps, atol=20 * eps)
    assert torch.autograd.gradcheck(gaussian_kl_whitened, (mu.detach().double().requires_grad_(),
                                                           r.detach().double().requires_grad_()))


def test_shared_projection_terms_without_gradients_match_in_column_blocks():
    kzz, kzx, q_mu, r = _shared_inputs(torch.float64, outputs=3, m=5, n=2500)  # more points than one block
    with torch.no_grad():
        got = whitened_marginal_terms(torch.linalg.cholesky(kzz), kzx, q_mu, r)
    for g, w in zip(got, _plain_terms(kzz, kzx, q_mu, r)):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_single_precision_kernels_emit_no_subnormal_values():
    """Far points' kernel values underflow into float32's subnormal range, where every product costs a microcode
    assist (a 784-pixel deep GP step ran 14x slower); they are exactly 0 instead, and nothing else changes."""
    from flowgp.gp.kernels import exp_without_subnormals, make_kernel

    log_k = torch.tensor([0.0, -1.0, -59.9, -60.1, -90.0, -200.0])
    for dtype in (torch.float32, torch.float64):
        arg = log_k.to(dtype).requires_grad_()
        got = exp_without_subnormals(arg)
        kept = log_k > -60 if dtype == torch.float32 else torch.ones_like(log_k, dtype=torch.bool)
        assert torch.equal(got[kept], torch.exp(log_k.to(dtype))[kept]) and bool((got[~kept] == 0).all())
        (grad,) = torch.autograd.grad(got.sum(), arg)
        assert torch.equal(grad, got.detach())  # exp's own derivative where kept, 0 where set to 0
    z = torch.zeros(3, 4)
    x = torch.cat([torch.zeros(1, 4), torch.full((1, 4), 30.0)])  # one point far from every inducing input
    for spec in ("rbf", "rbf+white"):
        k = make_kernel(spec, 4, dtype=torch.float32)(z, x)
        tiny = torch.finfo(torch.float32).tiny
        assert not bool(((k != 0) & (k.abs() < tiny)).any()) and bool((k[:, 1] == 0).all())
