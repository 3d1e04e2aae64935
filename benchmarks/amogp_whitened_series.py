"""Accuracy of the CP layer's tr(Φ_n W): today's contraction against a whitened moment series (a design study).

AMO-GP's bound needs t_n = tr(Φ_n W) per point, W = ααᵀ + C - K⁻¹ = L⁻ᵀ (m mᵀ + S - I) L⁻¹ (K_uu = L Lᵀ,
whitened q(v) = N(m, S)). The library contracts Φ_n (eq. 25) with W formed in float64, whose entries reach
1e7-1e8 (K_uu is nearly singular: 50 inducing inputs at the initial lengthscale) and cancel to O(1): the
rounding this leaves is what `amogp_gradient_rounding.py` sees in the gradients.

The alternative measured here never forms W. With Φ_n = E[k(a) k(a)ᵀ], a ~ N(μ_n, v_n), and k(a) expanded
around μ_n (k^(j) its j-th derivative in a; for k_i(a) = c exp(-(a - z_i)²/(2λ)),
k^(j)_i = c (-1/√λ)^j He_j(x_i) exp(-x_i²/2), x_i = (μ - z_i)/√λ, He the probabilists' Hermite polynomials),
    tr(Φ_n W) = Σ_p v^p (2p - 1)!! Σ_{j + l = 2p} f_jᵀ M f_l / (j! l!),   f_j = L⁻¹ k^(j),   M = m mᵀ + S - I,
a series in v/λ (it converges for v < λ) whose every term is a bilinear form of whitened vectors: O(1) numbers,
no cancellation. It is compared, at the estimator's own state (the four London sites of `amogp_step_time.py`),
with the library's float64 node and with an extended-precision reference (numpy's longdouble: W from the same
L, m, S, and eq. 25 materialised).

    OMP_NUM_THREADS=1 python benchmarks/amogp_whitened_series.py --start-epochs 1
    OMP_NUM_THREADS=1 python benchmarks/amogp_whitened_series.py --start-epochs 300

Printed: the largest error per point and the error of the sum over points, for the node, for the series
truncated after P = 1, 2, 3, 4, 6 moments, and for the same whitened expectation by Gauss-Hermite quadrature
with Q = 2-6 nodes (f = L⁻¹k at μ + √v ξ_q: no derivatives).
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch

import flowgp.models.amogp.psi_statistics as psi_statistics
from flowgp.numerics.linalg import lower_inverse
from flowgp.numerics.quadrature import gauss_hermite
from amogp_step_time import add_state_arguments, data, model_and_tensors


def capture_cp_layer(model, xt, yt, ot):
    """The CP layer's Ψ-node inputs (mean, var, z, W, c, λ) of one full-batch bound, and L, m, R of q(v)."""
    node = psi_statistics._DiagonalPsiContract
    seen = {}
    original = node.apply

    def spy(*args):
        seen["args"] = [a.detach().clone() for a in args]
        return original(*args)

    node.apply = spy
    try:
        with torch.no_grad():
            model.elbo(xt, yt, ot, num_data=xt.shape[0])
            post = model._posteriors()["f"]
    finally:
        node.apply = original
    if "args" not in seen or seen["args"][2].shape[0] != 1:
        raise SystemExit("this study covers one latent inducing set (--cp-inducing latent, one latent process)")
    return seen["args"], post.chol[0], model.latent.q_mu.detach()[0], model.latent.q_sqrt_tril().detach()[0]


def reference(mean, var, z, amp, lsq, chol, q_mu, q_sqrt, rows=200):
    """tr(Φ_n W) in np.longdouble: L⁻¹ by forward substitution, W = L⁻ᵀ (m mᵀ + S - I) L⁻¹, eq. 25 per point."""
    ld = np.longdouble
    L = chol.numpy().astype(ld)
    mg = L.shape[0]
    inv = np.zeros((mg, mg), dtype=ld)
    for j in range(mg):
        y = np.zeros(mg, dtype=ld)
        for i in range(mg):
            y[i] = ((1 if i == j else 0) - L[i, :i] @ y[:i]) / L[i, i]
        inv[:, j] = y
    m, r = q_mu.numpy().astype(ld), q_sqrt.numpy().astype(ld)
    w = inv.T @ (np.outer(m, m) + r @ r.T - np.eye(mg, dtype=ld)) @ inv
    mu, v, zz, c, lam = (t.numpy().astype(ld) for t in (mean, var, z, amp, lsq))
    c2 = lam + 2 * v
    la = -0.5 * (mu[:, None] - zz[None, :]) ** 2 / c2[:, None]
    kappa = 0.5 * v / (lam * c2)
    dz = (zz[:, None] - zz[None, :]) ** 2
    scale = c ** 2 * np.sqrt(lam / c2)
    out = np.empty(mu.shape[0], dtype=ld)
    for s in range(0, mu.shape[0], rows):
        sl = slice(s, s + rows)
        e = np.exp(la[sl, :, None] + la[sl, None, :] - kappa[sl, None, None] * dz[None])
        out[sl] = scale[sl] * np.einsum("nij,ij->n", e, w)
    return out


def whitened_series(mean, var, z, amp, lsq, inv_t, q_mu, q_sqrt, moments: int):
    """Σ_{p <= P} v^p (2p - 1)!! Σ_{j + l = 2p} f_jᵀ M f_l / (j! l!) in float64 (see the module docstring);
    inv_t = L⁻ᵀ. The bilinear forms of all pairs (j, l) come from one Gram matrix per point, [N, J, J] with
    J = 2P + 1, weighted by the moments E[ε^(j+l)] (zero for odd j + l): differentiable by autograd (the form
    `--time` measures)."""
    terms = 2 * moments + 1
    root = lsq.sqrt()
    x = (mean[:, None] - z[None, :]) / root[:, None]
    base = amp[:, None] * torch.exp(-0.5 * x.square())
    herm = [torch.ones_like(x), x]
    for j in range(1, terms - 1):
        herm.append(x * herm[j] - j * herm[j - 1])
    step = (-1.0 / root)[:, None]
    k = torch.stack([herm[j] * (step ** j / math.factorial(j)) for j in range(terms)], 1) * base[:, None]  # [N, J, Mg]
    f = k @ inv_t  # L⁻¹ k^(j)/j!, [N, J, Mg]
    fm, fr = f @ q_mu, f @ q_sqrt
    gram = fm.unsqueeze(-1) * fm.unsqueeze(-2) + fr @ fr.mT - f @ f.mT  # f_jᵀ (m mᵀ + S - I) f_l
    order = torch.arange(terms)
    total = order[:, None] + order[None, :]
    even = (total % 2 == 0) & (total <= 2 * moments)
    half = torch.where(even, total // 2, 0)
    double_factorial = torch.tensor([float(math.prod(range(1, 2 * p, 2))) for p in range(terms)], dtype=mean.dtype)
    coef = torch.where(even, double_factorial[half], torch.zeros((), dtype=mean.dtype))  # [J, J]
    return (gram * coef * var[:, None, None] ** half.to(mean.dtype)).sum((-1, -2))


def whitened_quadrature(mean, var, z, amp, lsq, inv_t, q_mu, q_sqrt, nodes: int):
    """E[f(a)ᵀ M f(a)], f = L⁻¹ k(a), a ~ N(μ_n, v_n), by Gauss-Hermite quadrature with `nodes` nodes: the same
    whitened, cancellation-free form without derivatives (exact for the series' terms of degree < 2·nodes);
    inv_t = L⁻ᵀ, so that every f is a GEMM. Differentiable by autograd (the plain form `--time` measures)."""
    xi, weights = gauss_hermite(nodes, mean.dtype)  # E[h(ξ)] ≈ Σ_q w_q h(ξ_q), ξ ~ N(0, 1)
    a = mean + var.sqrt() * xi[:, None]  # [Q, N]
    f = (amp[:, None] * torch.exp(-0.5 * (a[..., None] - z).square() / lsq[:, None])) @ inv_t  # [Q, N, Mg]
    quad = (f @ q_mu).square() + (f @ q_sqrt).square().sum(-1) - f.square().sum(-1)  # f M f, M = m mᵀ + S - I
    return weights @ quad


class ChunkedQuadrature(torch.autograd.Function):
    """tr(Φ_n W) = Σ_q w_q f_qᵀ M f_q, f_q = L⁻¹ k(μ_n + √v_n ξ_q), in chunks of points that stay in the cache,
    with the backward written by hand (a prototype of what the library would need):
        ḡ_f = 2 ḡ_n w_q (f·m m + Rᵀ-part: (f R) Rᵀ - f),   m̄ = Σ 2 ḡ w (f·m) f,   R̄ = Σ 2 ḡ w fᵀ (f R),
        (L⁻ᵀ)̄ = Σ kᵀ ḡ_f,   k̄ = ḡ_f L⁻¹,   e = k̄ ∘ k,   u = e ∘ (a - z)/λ:
        μ̄ = -Σ u,   v̄ = -Σ_q ξ_q/(2√v) Σ_i u,   z̄ = Σ u,   λ̄ = Σ e (a - z)²/(2λ²),   c̄ = Σ e / c."""

    CHUNK = 256

    @staticmethod
    def _pieces(mean, var, z, amp, lsq, inv_t, xi, sl):
        a = mean[sl] + var[sl].sqrt() * xi[:, None]  # [Q, nc]
        d = a.unsqueeze(-1) - z  # [Q, nc, M]
        k = amp[sl, None] * torch.exp(-0.5 * d.square() / lsq[sl, None])
        return d, k, k @ inv_t

    @staticmethod
    def forward(ctx, mean, var, z, amp, lsq, inv_t, q_mu, q_sqrt, xi, weights):
        n = mean.shape[0]
        out = mean.new_empty(n)
        for s in range(0, n, ChunkedQuadrature.CHUNK):
            sl = slice(s, s + ChunkedQuadrature.CHUNK)
            _, _, f = ChunkedQuadrature._pieces(mean, var, z, amp, lsq, inv_t, xi, sl)
            quad = (f @ q_mu).square() + (f @ q_sqrt).square().sum(-1) - f.square().sum(-1)
            out[sl] = weights @ quad
        ctx.save_for_backward(mean, var, z, amp, lsq, inv_t, q_mu, q_sqrt, xi, weights)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        mean, var, z, amp, lsq, inv_t, q_mu, q_sqrt, xi, weights = ctx.saved_tensors
        n, mg = mean.shape[0], z.shape[0]
        g_mean, g_var, g_amp, g_lsq = (torch.empty_like(mean) for _ in range(4))
        g_z, g_inv, g_m, g_r = torch.zeros_like(z), torch.zeros_like(inv_t), torch.zeros_like(q_mu), \
            torch.zeros_like(q_sqrt)
        root = var.sqrt()
        for s in range(0, n, ChunkedQuadrature.CHUNK):
            sl = slice(s, s + ChunkedQuadrature.CHUNK)
            d, k, f = ChunkedQuadrature._pieces(mean, var, z, amp, lsq, inv_t, xi, sl)
            fm, fr = f @ q_mu, f @ q_sqrt
            gq = 2.0 * weights[:, None] * grad[sl]  # [Q, nc]
            gf = (torch.addcmul(fr @ q_sqrt.mT, fm.unsqueeze(-1), q_mu) - f).mul_(gq.unsqueeze(-1))
            flat_f, flat_k, flat_gf = f.reshape(-1, mg), k.reshape(-1, mg), gf.reshape(-1, mg)
            g_m += (gq * fm).reshape(-1) @ flat_f
            g_r += flat_f.mT @ (fr * gq.unsqueeze(-1)).reshape(-1, mg)
            g_inv += flat_k.mT @ flat_gf
            e = (gf @ inv_t.mT).mul_(k)  # k̄ ∘ k
            lam = lsq[sl, None]
            u = e * d / lam
            su = u.sum(-1)  # [Q, nc]
            g_mean[sl] = -su.sum(0)
            g_var[sl] = -(xi[:, None] * su).sum(0) / (2.0 * root[sl])
            g_z += u.sum((0, 1))
            g_lsq[sl] = (e * d.square()).sum((0, 2)) / (2.0 * lsq[sl].square())
            g_amp[sl] = e.sum((0, 2)) / amp[sl]
        return g_mean, g_var, g_z, g_amp, g_lsq, g_inv, g_m, g_r, None, None


def timing(mean, var, z, weight, amp, lsq, chol, q_mu, q_sqrt, repeats: int = 20):
    """Median ms of forward and backward: today's node (Ψ₁ and the contraction), the whitened series (P = 2-4
    moments) and the whitened quadrature (through autograd, L⁻¹ formed once and multiplied as GEMMs, every input
    requiring gradients)."""
    import statistics
    import time

    node_in = [t.detach().clone().requires_grad_() for t in (mean, var, z, weight, amp, lsq)]
    quad_in = [t.detach().clone().requires_grad_() for t in (mean[:, 0], var[:, 0], z[0, :, 0], amp[:, 0],
                                                               lsq[:, 0, 0], chol, q_mu, q_sqrt)]

    def node():
        psi, phi = psi_statistics._DiagonalPsiContract.apply(*node_in)
        (psi.sum() + phi.sum()).backward()

    def quadrature(nodes):
        mu, v, zz, c, lam, L, m, r = quad_in
        whitened_quadrature(mu, v, zz, c, lam, lower_inverse(L).mT, m, r, nodes).sum().backward()

    def median(fn):
        for _ in range(3):
            fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
        return round(statistics.median(times), 2)

    def chunked(nodes):
        mu, v, zz, c, lam, L, m, r = quad_in
        xi, weights = gauss_hermite(nodes, L.dtype)
        ChunkedQuadrature.apply(mu, v, zz, c, lam, lower_inverse(L).mT, m, r, xi, weights).sum().backward()

    def series(moments):
        mu, v, zz, c, lam, L, m, r = quad_in
        whitened_series(mu, v, zz, c, lam, lower_inverse(L).mT, m, r, moments).sum().backward()

    return {"node": median(node), "series_P2": median(lambda: series(2)), "series_P3": median(lambda: series(3)),
            "series_P4": median(lambda: series(4)), "quadrature_Q4": median(lambda: quadrature(4)),
            "quadrature_Q7": median(lambda: quadrature(7)), "chunked_hand_written_Q4": median(lambda: chunked(4)),
            "chunked_hand_written_Q7": median(lambda: chunked(7))}


def gradient_study(model, node_args, q_mu, q_sqrt):
    """∂/∂z of Σ_n tr(Φ_n W) (the CP inducing inputs; every other input held) four ways: today's node with W from
    the posterior node, with the series and with the exponentials (two orderings of one formula), and the whitened
    expectation through a differentiable Cholesky, as the series (P = 3) and by quadrature (Q = 5). Returns the
    largest |gradient| of each and the largest difference within and across the formulations, relative to it."""
    from flowgp.numerics.linalg import DEFAULT_JITTER
    from flowgp.models.amogp.model import _WhitenedPosterior

    mean, var, _, _, amp, lsq = node_args
    z0 = model.latent.z.detach()
    ls = model.inducing_lengthscale.detach()
    jitter = model.latent.jitter if model.latent.jitter is not None else DEFAULT_JITTER[z0.dtype]
    eye = torch.eye(z0.shape[1], dtype=z0.dtype)

    def kuu(z):
        return model.kernel.inducing_covariance(z, ls)

    def node(exponentials):
        z = z0.clone().requires_grad_()
        weight = _WhitenedPosterior.apply(kuu(z), q_mu[None], q_sqrt[None], jitter, None)[3]
        contract = psi_statistics._BlockedExpContract
        saved = contract._TAYLOR_MAX_TERMS
        contract._TAYLOR_MAX_TERMS = 0 if exponentials else saved
        try:
            value = psi_statistics._DiagonalPsiContract.apply(mean, var, z, weight, amp, lsq)[1].sum()
        finally:
            contract._TAYLOR_MAX_TERMS = saved
        return torch.autograd.grad(value, z)[0]

    def whitened(series):
        z = z0.clone().requires_grad_()
        chol = torch.linalg.cholesky(kuu(z)[0] + jitter * eye)
        inv_t = torch.linalg.solve_triangular(chol, eye, upper=False).mT
        args = (mean[:, 0], var[:, 0], z[0, :, 0], amp[:, 0], lsq[:, 0, 0], inv_t, q_mu, q_sqrt)
        value = whitened_series(*args, 3) if series else whitened_quadrature(*args, 5)
        return torch.autograd.grad(value.sum(), z)[0]

    g = {"node_series": node(False), "node_exponentials": node(True), "whitened_series_P3": whitened(True),
         "whitened_quadrature_Q5": whitened(False)}
    scale = max(float(v.abs().max()) for v in g.values())

    def rel(a, b):
        return float((g[a] - g[b]).abs().max()) / scale

    return {"largest_abs": {k: float(v.abs().max()) for k, v in g.items()},
            "node_series_vs_exponentials": rel("node_series", "node_exponentials"),
            "whitened_series_vs_quadrature": rel("whitened_series_P3", "whitened_quadrature_Q5"),
            "node_series_vs_whitened_series": rel("node_series", "whitened_series_P3"),
            "node_exponentials_vs_whitened_series": rel("node_exponentials", "whitened_series_P3")}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_state_arguments(p, cp_choices=("latent",), cp_grid="off")  # trained inducing inputs, as committed
    p.add_argument("--time", action="store_true",
                   help="also time forward and backward (autograd) of today's node, the series (P = 2-4) and "
                        "the quadrature (Q = 4, 7)")
    p.add_argument("--gradients", action="store_true",
                   help="also compare ∂/∂z (the CP inducing inputs) of today's node (series, exponentials) and of "
                        "the whitened forms (series, quadrature) through a differentiable Cholesky")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    model, xt, yt, ot = model_and_tensors("gp", *data(args), args)
    (mean, var, z, weight, amp, lsq), chol, q_mu, q_sqrt = capture_cp_layer(model, xt, yt, ot)
    mu, v, zz, c, lam = mean[:, 0], var[:, 0], z[0, :, 0], amp[:, 0], lsq[:, 0, 0]
    ref = reference(mu, v, zz, c, lam, chol, q_mu, q_sqrt)
    exact = ref.astype(np.float64)
    inv_t = lower_inverse(chol).mT
    print(f"N = {mu.shape[0]}, Mg = {zz.shape[0]}, largest v/λ = {(v / lam).max().item():.3g}, "
          f"largest |W| = {weight.abs().max().item():.3g}, Σ_n tr(Φ_n W) = {float(ref.sum()):.12g}")
    rows = {}

    def record(key, label, values):
        """Errors of one evaluation [N] against the reference, kept under `key` and printed."""
        values = values.numpy()
        rows[key] = r = {"max_abs_err": float(np.abs(values - exact).max()),
                         "sum_abs_err": abs(float(values.sum() - ref.sum()))}
        print(f"{label:28s} largest error per point {r['max_abs_err']:.3g}, error of the sum {r['sum_abs_err']:.3g}")

    with torch.no_grad():
        record("node", "float64 node (today)", psi_statistics._DiagonalPsiContract.apply(
            mean, var, z, weight, amp, lsq)[1])
    for moments in (1, 2, 3, 4, 6):
        record(f"series_P{moments}", f"whitened series, P = {moments}",
               whitened_series(mu, v, zz, c, lam, inv_t, q_mu, q_sqrt, moments))
    for nodes in (2, 3, 4, 5, 6):
        record(f"quadrature_Q{nodes}", f"whitened Gauss-Hermite, Q = {nodes}",
               whitened_quadrature(mu, v, zz, c, lam, inv_t, q_mu, q_sqrt, nodes))
    if args.gradients:
        rows["gradients_z"] = gradient_study(model, (mean, var, z, weight, amp, lsq), q_mu, q_sqrt)
        print("∂/∂z (CP inducing inputs), differences relative to the largest entry:", rows["gradients_z"])
    if args.time:
        rows["timing_ms"] = timing(mean, var, z, weight, amp, lsq, chol, q_mu, q_sqrt)
        print("forward + backward, ms (median of 20):", rows["timing_ms"])
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"setting": vars(args), "largest_v_over_lambda": float((v / lam).max()),
                                               "largest_abs_w": float(weight.abs().max()),
                                               "sum_reference": float(ref.sum()), "errors": rows}, indent=1))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
