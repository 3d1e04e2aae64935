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

