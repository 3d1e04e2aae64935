import math

import pytest
import torch

from flowgp.gp.kernels import make_kernel
from flowgp.gp.variational import (SparseVariationalGP, _KernelSpaceMarginalTerms, _SquareRootMarginalTerms,
                                _WhitenedMarginalTerms, gaussian_kl_whitened, whitened_marginal_terms)

pytestmark = pytest.mark.usefixtures("float64_default")


def _random_q(gp, generator):
    with torch.no_grad():
        gp.q_mu.copy_(torch.randn(gp.q_mu.shape, generator=generator))
        gp.q_sqrt.copy_(torch.tril(0.3 * torch.randn(gp.q_sqrt.shape, generator=generator)))
        gp.q_sqrt.diagonal(dim1=-2, dim2=-1).abs_().add_(0.2)


def assert_same_gradients(got, want, inputs, generator, rtol=1e-9, atol=1e-11):
    """Gradients of two tuples of outputs w.r.t. `inputs` agree, under the same random output weights."""
    weights = [torch.randn(t.shape, generator=generator) for t in want]
    grads_got = torch.autograd.grad(sum((w * t).sum() for w, t in zip(weights, got)), inputs)
    grads_want = torch.autograd.grad(sum((w * t).sum() for w, t in zip(weights, want)), inputs)
    for u, v in zip(grads_got, grads_want):
        torch.testing.assert_close(u, v, rtol=rtol, atol=atol)


@pytest.mark.parametrize("num_points", [9, 23])  # both evaluation orders (N < 2M and N >= 2M)
def test_marginals_match_dense_formula(num_points):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(num_points, 2, generator=g)
    z = torch.randn(5, 2, generator=g)
    kernel = make_kernel("rbf", 2, lengthscale=0.8)
    gp = SparseVariationalGP(kernel, z, jitter=1e-12)
    _random_q(gp, g)
    with torch.no_grad():
        kzz = kernel(z) + 1e-12 * torch.eye(5)
        kxz = kernel(x, z)
        lz = torch.linalg.cholesky(kzz)
        a = torch.linalg.solve_triangular(lz, kxz.T, upper=False)  # Lz^-1 Kzx
        s = gp.q_sqrt_tril()[0] @ gp.q_sqrt_tril()[0].T
        mean = a.T @ gp.q_mu[0]
        cov = kernel(x) - a.T @ a + a.T @ s @ a
        got = gp.marginals(x)
        full = gp.marginals(x, full_cov=True)
    torch.testing.assert_close(got.mean[:, 0], mean)
    torch.testing.assert_close(got.var[:, 0], cov.diagonal())
    torch.testing.assert_close(full.var[0], cov)


def _autograd_marginal_terms(chol, kzx, q_mu, c):
    chol_b = chol.expand(kzx.shape[:-2] + chol.shape[-2:]) if chol.dim() < kzx.dim() else chol
    a = torch.linalg.solve_triangular(chol_b, kzx, upper=False)
    return (q_mu.unsqueeze(-2) @ a).squeeze(-2), (a * (c @ a)).sum(-2)


# each evaluation of the marginal terms, called with the factor R of S = R Rᵀ (the S-forms get C = S - I)
MARGINAL_TERMS = {
    "A-space": lambda ch, k, m, r, *kzz: _WhitenedMarginalTerms.apply(ch, k, m, r @ r.mT - torch.eye(5), *kzz),
    "kernel-space": lambda ch, k, m, r, *kzz: _KernelSpaceMarginalTerms.apply(ch, k, m, r @ r.mT - torch.eye(5),
                                                                              *kzz),
    "square-root": _SquareRootMarginalTerms.apply,
    "dispatch": whitened_marginal_terms,
}


@pytest.mark.parametrize(
    "chol_shape, kzx_shape, num_outputs",
    [((5, 5), (1, 5, 11), 1), ((3, 5, 5), (3, 5, 11), 3), ((5, 5), (2, 1, 5, 11), 3), ((1, 5, 5), (4, 1, 5, 11), 2),
     ((5, 5), (2, 1, 5, 4), 3)],  # the last with N < 1.5 M: the dispatch takes the square-root form
)
@pytest.mark.parametrize("impl", sorted(MARGINAL_TERMS))
def test_fused_marginal_terms_match_autograd_and_gradcheck(chol_shape, kzx_shape, num_outputs, impl):
    # the hand-written backwards (symmetric C, no second [M, N] solve; B = Lz⁻ᵀ C Lz⁻¹ without A; or R without
    # S) against autograd of the plain formula, for shared and per-output factors and for sample dims
    # broadcast over outputs
    terms = MARGINAL_TERMS[impl]
    g = torch.Generator().manual_seed(3)
    b = torch.randn(chol_shape, generator=g)
    chol = torch.linalg.cholesky(b @ b.mT + 5 * torch.eye(5)).requires_grad_()
    kzx = torch.randn(kzx_shape, generator=g, requires_grad=True)
    q_mu = torch.randn(num_outputs, 5, generator=g, requires_grad=True)
    r = torch.randn(num_outputs, 5, 5, generator=g, requires_grad=True)

    def fused(ch, k, m, rr):  # tril'd inside so gradcheck's perturbations stay in the domain
        return terms(ch.tril(), k, m, rr)

    def plain(ch, k, m, rr):
        return _autograd_marginal_terms(ch.tril(), k, m, rr @ rr.mT - torch.eye(5))

    got, want = fused(chol, kzx, q_mu, r), plain(chol, kzx, q_mu, r)
    for u, v in zip(got, want):
        torch.testing.assert_close(u, v, rtol=1e-10, atol=1e-12)
    assert_same_gradients(got, want, (chol, kzx, q_mu, r), g)
    assert torch.autograd.gradcheck(fused, (chol, kzx, q_mu, r))
    # only one output used: the other's gradient is taken as zero
    for used in (0, 1):
        (gm,) = torch.autograd.grad(fused(chol, kzx, q_mu, r)[used].sum(), (kzx,))
        torch.testing.assert_close(gm, torch.autograd.grad(plain(chol, kzx, q_mu, r)[used].sum(), (kzx,))[0])


def test_batched_outputs_and_sample_dims():
    g = torch.Generator().manual_seed(1)
    kernel = make_kernel("matern32", 3, batch_shape=(4,))
    gp = SparseVariationalGP(kernel, torch.randn(6, 3, generator=g), num_outputs=4)
    _random_q(gp, g)
    x = torch.randn(7, 11, 3, generator=g)  # 7 samples propagated through, e.g., a deep GP
    mean, var = gp.marginals(x)
    assert mean.shape == (7, 11, 4) and var.shape == (7, 11, 4)
    assert torch.all(var > 0)
    # each sample slice equals the unbatched computation
    m0, v0 = gp.marginals(x[3])
    torch.testing.assert_close(mean[3], m0)
    torch.testing.assert_close(var[3], v0)
    # per-output inducing inputs
    gp2 = SparseVariationalGP(kernel, torch.randn(4, 6, 3, generator=g), num_outputs=4)
    assert gp2.marginals(x).mean.shape == (7, 11, 4)
    samples = gp.sample(x[0], num_samples=5, full_cov=True, generator=g)
    assert samples.shape == (5, 11, 4)


def test_kl_matches_torch_distributions():
    g = torch.Generator().manual_seed(2)
    gp = SparseVariationalGP(make_kernel("rbf", 1), torch.randn(4, 1, generator=g), num_outputs=3)
    _random_q(gp, g)
    r = gp.q_sqrt_tril()
    q = torch.distributions.MultivariateNormal(gp.q_mu, scale_tril=r)
    p = torch.distributions.MultivariateNormal(torch.zeros(3, 4), scale_tril=torch.eye(4).expand(3, 4, 4))
    expected = torch.distributions.kl_divergence(q, p).sum()
    torch.testing.assert_close(gp.kl_divergence(), expected)
    assert gaussian_kl_whitened(torch.zeros(2, 4), torch.eye(4).expand(2, 4, 4)).item() == pytest.approx(0.0)


def test_initialisation_follows_appendix_b6():
    gp = SparseVariationalGP(make_kernel("rbf", 1), torch.randn(3, 1))
    torch.testing.assert_close(gp.q_mu, torch.zeros(1, 3))
    torch.testing.assert_close(gp.q_sqrt_tril() @ gp.q_sqrt_tril().mT, 1e-5 * torch.eye(3).expand(1, 3, 3))


def test_marginal_samples_agree_with_moments():
    g = torch.Generator().manual_seed(3)
    gp = SparseVariationalGP(make_kernel("rbf", 1), torch.linspace(-2, 2, 5)[:, None])
    _random_q(gp, g)
    x = torch.linspace(-3, 3, 4)[:, None]
    with torch.no_grad():
        draws = gp.sample(x, num_samples=200_000, generator=g)
        mean, var = gp.marginals(x)
    se = (var / 200_000).sqrt()
    assert torch.all((draws.mean(0) - mean).abs() < 5 * se)
    torch.testing.assert_close(draws.var(0), var, rtol=0.02, atol=1e-4)


def test_bad_inducing_points():
    with pytest.raises(ValueError, match="inducing_points"):
        SparseVariationalGP(make_kernel("rbf", 1), torch.randn(3))
    with pytest.raises(ValueError, match="NaN"):
        SparseVariationalGP(make_kernel("rbf", 1), torch.tensor([[0.0], [math.nan]]))


def test_marginal_terms_float32_uses_the_a_space_form_and_agrees_with_float64():
    # float32 keeps A = Lz⁻¹ K_ZX (its error grows with cond(Lz), not cond(K_ZZ)); both dtypes agree
    g = torch.Generator().manual_seed(0)
    z = torch.randn(30, 2, generator=g)
    x = torch.randn(200, 2, generator=g)
    kzz = torch.exp(-0.5 * torch.cdist(z, z).square()) + 1e-6 * torch.eye(30)
    kzx = torch.exp(-0.5 * torch.cdist(z, x).square()).unsqueeze(0)
    chol = torch.linalg.cholesky(kzz)
    q_mu = torch.randn(1, 30, generator=g)
    r = 0.1 * torch.randn(1, 30, 30, generator=g).tril()
    mean64, quad64 = whitened_marginal_terms(chol, kzx, q_mu, r)
    mean32, quad32 = whitened_marginal_terms(*(t.float() for t in (chol, kzx, q_mu, r)))
    r32 = r.float()
    a_mean, a_quad = _WhitenedMarginalTerms.apply(chol.float(), kzx.float(), q_mu.float(), 
                                                  r32 @ r32.mT - torch.eye(30, dtype=torch.float32))
    assert torch.equal(mean32, a_mean) and torch.equal(quad32, a_quad)
    var64 = 1.0 + quad64  # k(x, x) = 1: the cancellation the kernel-space form is exposed to
    assert var64.min() > 0
    torch.testing.assert_close(quad32.double(), quad64, rtol=0, atol=2e-3)
    torch.testing.assert_close(mean32.double(), mean64, rtol=0, atol=2e-3)
    # a minibatch smaller than 1.5 M takes the square-root form: as accurate in float32
    sqrt32 = whitened_marginal_terms(chol.float(), kzx[..., :40].float(), q_mu.float(), r32)
    torch.testing.assert_close(sqrt32[1].double(), quad64[..., :40], rtol=0, atol=2e-3)
    torch.testing.assert_close(sqrt32[0].double(), mean64[..., :40], rtol=0, atol=2e-3)


@pytest.mark.parametrize(
    "kzz_shape, kzx_shape, num_outputs",
    [((5, 5), (1, 5, 11), 1), ((3, 5, 5), (3, 5, 11), 3), ((5, 5), (2, 1, 5, 11), 3), ((5, 5), (2, 1, 5, 4), 3)],
)
@pytest.mark.parametrize("impl", ["A-space", "kernel-space", "square-root"])
def test_fused_marginal_terms_send_the_gradient_to_kzz(kzz_shape, kzx_shape, num_outputs, impl):
    # with K_ZZ given and its factor detached, the terms' gradient with respect to K_ZZ must be autograd's
    # through the Cholesky factor (Lz⁻ᵀ Ψ(Ā Aᵀ) Lz⁻¹ replaces the factor's own backward)
    terms = MARGINAL_TERMS[impl]
    g = torch.Generator().manual_seed(4)
    b = torch.randn(kzz_shape, generator=g)
    kzz = (b @ b.mT + 5 * torch.eye(5)).requires_grad_()
    kzx = torch.randn(kzx_shape, generator=g, requires_grad=True)
    q_mu = torch.randn(num_outputs, 5, generator=g, requires_grad=True)
    r = torch.randn(num_outputs, 5, 5, generator=g, requires_grad=True)

    def fused(k, kx, m, rr):
        k = 0.5 * (k + k.mT)  # a symmetric K_ZZ, as every kernel matrix is
        return terms(torch.linalg.cholesky(k.detach()), kx, m, rr, k)

    def plain(k, kx, m, rr):
        return _autograd_marginal_terms(torch.linalg.cholesky(0.5 * (k + k.mT)), kx, m, rr @ rr.mT - torch.eye(5))

    got, want = fused(kzz, kzx, q_mu, r), plain(kzz, kzx, q_mu, r)
    assert_same_gradients(got, want, (kzz, kzx, q_mu, r), g)
    assert torch.autograd.gradcheck(fused, (kzz, kzx, q_mu, r))
    with pytest.raises(ValueError, match="detached"):
        whitened_marginal_terms(torch.linalg.cholesky(kzz), kzx, q_mu, r, kzz)


def test_gram_minus_identity_matches_autograd_and_gradcheck():
    from flowgp.gp.variational import gram_minus_identity

    g = torch.Generator().manual_seed(6)
    r = torch.randn(2, 4, 4, generator=g).tril().requires_grad_()
    got = gram_minus_identity(r)
    want = r @ r.mT - torch.eye(4)
    torch.testing.assert_close(got, want)
    w = torch.randn(2, 4, 4, generator=g)  # not symmetric: the backward must symmetrise it
    torch.testing.assert_close(torch.autograd.grad((w * got).sum(), r)[0], torch.autograd.grad((w * want).sum(), r)[0])
    assert torch.autograd.gradcheck(gram_minus_identity, (r,))


@pytest.mark.parametrize("num_points", [5, 9, 13])  # square-root form, S-form, kernel-space form (float64)
@pytest.mark.parametrize("spec", ["rbf", "white+rbf", "matern32*linear", "periodic"])
def test_training_marginals_match_the_plain_formula_in_value_and_gradient(spec, num_points):
    # the training path (K_ZZ and K_ZX from one kernel call where the kernel allows it, gradient sent to K_ZZ
    # directly) against autograd of A = Lz⁻¹ K_ZX, mean = Aᵀm, var = k_xx + Σ (RᵀA)² - Σ A²
    g = torch.Generator().manual_seed(8)
    z = torch.randn(6, 2, generator=g)
    x = torch.randn(num_points, 2, generator=g)  # N < 2M: the fused path is taken because gradients are on
    gp = SparseVariationalGP(make_kernel(spec, 2), z, num_outputs=2)
    with torch.no_grad():
        gp.q_mu.copy_(torch.randn(gp.q_mu.shape, generator=g))
        gp.q_sqrt.copy_(0.3 * torch.randn(gp.q_sqrt.shape, generator=g))
    params = [p for p in gp.parameters() if p.requires_grad]
    mean, var = gp.marginals(x)
    chol = torch.linalg.cholesky(gp.kernel(gp.inducing_points) + 1e-8 * torch.eye(6))
    a = torch.linalg.solve_triangular(chol, gp.kernel(gp.inducing_points, x), upper=False)  # [M, N]
    r = gp.q_sqrt_tril()
    want_mean = (gp.q_mu @ a).mT
    want_var = (gp.kernel.diag(x).unsqueeze(0) + (r.mT @ a).square().sum(-2) - a.square().sum(-2)).mT
    torch.testing.assert_close(mean, want_mean, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(var, want_var, rtol=1e-9, atol=1e-10)
    w1, w2 = torch.randn(mean.shape, generator=g), torch.randn(var.shape, generator=g)
    got = torch.autograd.grad((w1 * mean + w2 * var).sum(), params, allow_unused=True)
    want = torch.autograd.grad((w1 * want_mean + w2 * want_var).sum(), params, allow_unused=True)
    for u, v in zip(got, want):
        torch.testing.assert_close(u, v, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("batch", [(), (3,)])
def test_transposed_projection_is_the_projections_transpose(batch):
    g = torch.Generator().manual_seed(4)
    gp = SparseVariationalGP(make_kernel("rbf", 2, batch_shape=batch), torch.randn(6, 2, dtype=torch.float64,
                                                                                  generator=g), 3)
    x = torch.randn(9, 2, dtype=torch.float64, generator=g)
    a, chol = gp.projection(x)
    at, chol_t = gp.projection(x, transposed=True)
    torch.testing.assert_close(at, a.mT)
    torch.testing.assert_close(chol_t, chol)
