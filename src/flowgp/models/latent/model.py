"""Latent-variable deep GPs trained with importance-weighted VI (DGP-IWVI/DREG supplement, sections A, C, D, E).

A latent z_n ~ p(z) = N(0, I) is concatenated to x_n at the input of the first layer. With K samples
(z_{n,k}, f⁽¹⁾_k) per point, the partially collapsed bound of eq. A.9 is

    L_K = Σ_n E[ log (1/K) Σ_k w_{n,k} ] - Σ_ℓ KL[q(u_ℓ) || p(u_ℓ)],
    log w_{n,k} = E_{q(f⁽ᴸ⁾ | f⁽ᴸ⁻¹⁾_k)}[log p(y_n | f⁽ᴸ⁾)] + log p(z_{n,k}) - log q(z_{n,k})       (C.16)

with the last layer's expectation in closed form for a Gaussian likelihood. Gradients of the q(z)
parameters φ are either the reparameterised IW gradient "reg" (C.17: plain autograd of L_K) or "dreg"
(D.23): Σ_k w̃_k² ∂log w_k/∂z_k ∂z_k/∂φ, w̃ the normalised weights, log q evaluated with φ held fixed.
DREG is implemented by (i) stopping the gradient through φ inside log q and (ii) a hook multiplying the
gradient reaching z_k by w̃_k (detached): autograd of L_K already carries w̃_k ∂log w_k/∂z_k there, and z
is the only path from φ into log w. Model, kernel and layer parameters never pass through z, so they
keep the usual IW gradient Σ_k w̃_k ∇ log w_k, and the returned value is L_K itself in both cases.
With a hidden layer drawn jointly over the K samples (below), log w_k also depends on z_j (j ≠ k), and D.23 needs
a choice of what is held fixed when z_k moves: "dreg" holds the other slots' values fixed, which leaves D.23's form
with each slot's derivative through its Gaussian conditional (unbiased, `LatentDeepGP.iw_terms`); the ablations
"dreg-eps" hold the joint draw's ε fixed and keep the cross terms this creates (unbiased, but its SNR stops growing
with K) and "dreg-d23" apply D.23's surrogate literally (biased).

Joint draws over the K importance samples. Inside log (1/K) Σ_k w_{n,k} the K values f⁽¹⁾(x_n, z_{n,k}) are one
function evaluated at K inputs, so eq. A.9's expectation over f⁽¹⁾_{1:K} is over their *joint* law: for each point
and output a K × K Gaussian with covariance (whitened, A = Lz⁻¹ K_ZX over the K inputs, q(v) = N(m, R Rᵀ))

    Σ = K_XX - AᵀA + (RᵀA)ᵀ(RᵀA),     mean = Aᵀm (+ the layer's mean function),

drawn as mean + chol(Σ) ε (`joint_gp_sample`, batched over points and outputs, Cholesky with the project's growing
jitter, `flowgp.numerics.linalg.robust_cholesky`), which is what the authors' bound asks for (`full_cov=True` over the
sample axis). Every sampled (hidden) layer is drawn jointly over K; the last layer only enters through its
per-input marginals (closed-form expectation). Points are independent of each other: the bound is a sum over n
of expectations that each see one point's K inputs. Drawing the K slots independently from their marginals (the
former implementation here, and in effect the authors' published code, whose mixed-kernel hidden layer ignores
`full_cov`) makes log-mean-exp over k tend to log E[F p/q] instead of E[log (1/K) Σ F p/q]: not a lower bound
of log p(y). Measured: 0.9-1.5 nats above the joint bound on tests/models/latent/test_bound_validity.py's 3-point problem, and
0.4-0.6 nats per training point above it on power fits trained with K = 50 per-slot draws
(docs/results/ldgp/table1-uci, `benchmarks/studies/ldgp_objective_gap.py`).

The authors' objective, by name (`objective="per-slot"`). The per-slot draw of the previous paragraph is what the
DREG authors' published code trains (their Table 1), so `LatentDeepGP` keeps it as a named training objective,
`per_slot_objective`, documented as the published objective and never called a bound: with the log outside the
expectation over the shared q(U), nothing keeps it below log p(y). Its measured over-statement, both from
docs/results/ldgp/table1-uci ("Validity of the bound"; "What the per-slot objective trains towards"): 0.9-1.5
nats above the valid bound on the validity problem (K = 5 / 50 / 500: +1.52 / +0.88 / +1.16; brute-force
log p(y) = -4.941, which it stayed below there), and 0.43-0.60 nats per training point above it on power fits
trained on it with K = 50. `elbo` is always the bound; the training loop maximises `training_objective`, which is
the one the model's `objective` names ("bound" by default). With per-slot draws log w_k depends on z_k alone, so
every DREG variant is eq. D.23 exactly there (the authors' DREG).

Test log-likelihoods (supplement E.3) draw f at each (x*, z_s) from its marginal: each term N(y*; ...) is then an
unbiased estimate of p(y* | x*) and their mean is too, whatever the correlation between terms.

Layers: `flowgp.models.deep_gp.GPLayer` (D_out GPs with a fixed linear mean) or `ConcatProjectionLayer`
(supplement E.2 / the reference code's hidden layer: a fixed projection of a few GPs plus the observed inputs).
Both give `layer(h [S, N, D_in], generator=None) -> (sample, mean, var)`, `layer.marginals(h)`, `layer.gp`
(a `SparseVariationalGP`) and `layer.kl_divergence()`.
"""
from __future__ import annotations

import math
import warnings
from typing import Sequence

import torch
from torch import nn

from ...gp.defaults import DEFAULTS
from .encoders import ENCODER_SKIPS, AmortizedLatentEncoder, FreeLatent, normal_log_prob
from ...gp.likelihoods import GaussianLikelihood, Likelihood
from ...numerics.linalg import JitterMemory, gram, lower_inverse, robust_cholesky, shared_left_products
from ...gp.objective import minibatch_bound
from ...gp.prediction import check_probabilities, gaussian_mixture_quantiles, silverman_kde_log_density
from ...numerics.row_draws import draw_rows
from .._checks import as_inputs, as_targets

__all__ = ["LatentDeepGP", "ConcatProjectionLayer", "build_latent_deep_gp", "joint_gp_sample",
           "GRADIENT_ESTIMATORS", "HIDDEN_LAYERS", "OBJECTIVES", "check_num_importance", "check_gradient",
           "check_objective"]

#: "dreg" is D.23's form with each slot's own derivative taken through its conditional given the other slots'
#: values (unbiased with joint draws, `LatentDeepGP.iw_terms`); two ablations: "dreg-eps" holds the joint draw's ε
#: fixed instead (unbiased, with cross terms that keep its SNR from growing with K) and "dreg-d23" applies eq. D.23's
#: surrogate as written (biased once a hidden layer couples the K slots). Before 2026-11-28 "dreg" named "dreg-eps".
GRADIENT_ESTIMATORS = ("reg", "dreg", "dreg-eps", "dreg-d23")
#: training objectives: "bound" (the importance-weighted bound L_K of eq. A.9 with the hidden layers drawn jointly
#: over the K importance samples; the default and the only lower bound on log p(y)) and "per-slot" (the DREG authors'
#: published training objective, each slot's hidden values drawn from their own marginal: not a bound, see the
#: module docstring)
OBJECTIVES = ("bound", "per-slot")
#: hidden-layer structures of `build_latent_deep_gp`: "pca" (GPs with a fixed PCA linear mean, the DSVI layer)
#: and "concat" (supplement E.2: a fixed projection of 5 GPs concatenated with the layer's observed inputs)
HIDDEN_LAYERS = ("pca", "concat")
#: cap on (samples × points × inducing) elements per chunk in prediction and diagnostics
_CHUNK_ELEMENTS = 2_000_000


def check_num_importance(value, name: str = "num_importance") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int (the number K of importance samples), got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1 (K = 1 gives the plain ELBO), got {value}")
    return value


def check_gradient(value) -> str:
    if value not in GRADIENT_ESTIMATORS:
        raise ValueError(f"gradient must be one of {GRADIENT_ESTIMATORS}, got {value!r}")
    return value


def check_objective(value) -> str:
    if not isinstance(value, str) or value not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES} ('bound': the importance-weighted bound, the default; "
                         f"'per-slot': the DREG authors' published training objective, not a bound), got {value!r}")
    return value


def _check_positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def joint_gp_sample(gp, h: torch.Tensor, generator: torch.Generator | None = None,
                    memory: JitterMemory | None = None, batch_rows: tuple[int, int] | None = None,
                    parts: dict | None = None) -> torch.Tensor:
    """One joint draw of a sparse GP's outputs over the second-to-last axis of h: [..., K, D] -> [..., K, L].

    For every leading index (a point, an outer sample) the K values f(h_1..h_K) of each output l are drawn from
    q(f) = N(Aᵀm_l (+ mean function), K_HH - AᵀA + (R_lᵀA)ᵀ(R_lᵀA)) with A = Lz⁻¹ K_ZH (TGP appendix eq. 12 with
    the full K × K covariance; the DGP-IWVI bound A.9 needs it over the importance samples). `gp` is a
    `flowgp.gp.variational.SparseVariationalGP`; only its public API is used (projection, kernel, q_mu,
    q_sqrt_tril, mean_function). The K × K factorisations go through `robust_cholesky` (growing jitter,
    remembered in `memory`). Differentiable in h and in every parameter (reparameterised draw).
    `batch_rows` = (offset, B): h's last leading axis holds rows offset.. of a global batch of B split over
    processes; the noise is drawn for all B rows and sliced, so a row's draw does not depend on the split.
    `parts`: a dict that receives the draw's pieces (inputs, Aᵀ, (RᵀA)ᵀ, R, Lz, the K × K factors and ε) for
    `own_slot_derivative`.
    """
    if h.dim() < 2:
        raise ValueError(f"h must have shape [..., K, D], got {tuple(h.shape)}")
    lead, k, d = h.shape[:-2], h.shape[-2], h.shape[-1]
    groups = h.reshape(-1, k, d)  # [G, K, D]
    g = groups.shape[0]
    num_out = gp.num_outputs
    # Aᵀ = K_HZ Lz⁻ᵀ [Lb, G·K, M] (Lb = 1 for a kernel shared by the outputs), built transposed so that M is the
    # contiguous axis: every product below is then a plain (batched) GEMM on row-major blocks, with no permuted
    # copies of the [L, M, G·K] tensors in either pass (they cost more than the products at K = 5, M = 128)
    at, chol_z = gp.projection(groups.reshape(g * k, d), transposed=True)
    if at.dim() == 2:
        at = at.unsqueeze(0)
    m = at.shape[-1]
    r = gp.q_sqrt_tril()  # [L, M, M]
    if at.shape[0] == 1:  # one A for all outputs: no copy of it per output
        mean = at[0] @ gp.q_mu.mT  # Aᵀm, [G·K, L]
        rat = shared_left_products(at[0], r)  # (RᵀA)ᵀ [L, G·K, M]
    else:
        mean = (at @ gp.q_mu.unsqueeze(-1)).squeeze(-1).mT
        rat = at @ r
    # K × K blocks per point: (RᵀA)ᵀ(RᵀA) - AᵀA, [L, G, K, K]
    correction = gram(rat.reshape(num_out, g, k, m)) - gram(at.reshape(at.shape[0], g, k, m))
    kxx = gp.kernel(groups.unsqueeze(-3))  # [G, Lb, K, K]
    cov = kxx.movedim(-3, 0) + correction
    cov = 0.5 * (cov + cov.mT)
    chol = robust_cholesky(cov, memory=memory)
    # [L, *lead, K, 1], the rows on lead's last axis: the same numbers as [L, G, K, 1] without batch_rows
    eps = draw_rows(lambda s: torch.randn(s, dtype=chol.dtype, device=chol.device, generator=generator),
                    (num_out,) + tuple(lead) + (k, 1), batch_rows, dim=len(lead)).reshape(chol.shape[:-1] + (1,))
    out = (mean.reshape(g, k, num_out) + (chol @ eps).squeeze(-1).permute(1, 2, 0)).reshape(lead + (k, num_out))
    if gp.mean_function is not None:
        out = out + gp.mean_function(h)
    if parts is not None:
        parts.update(groups=groups, at=at, rat=rat, r=r, chol_z=chol_z, chol=chol, eps=eps)
    return out


def _input_tangents(gp, parts: dict, columns: Sequence[int]):
    """For each column c of slot k's own input h_k: (∂mean_k/∂h_{k,c} [G, K, L], ȧ rows ∂Aᵀ/∂h_{k,c}
    [Lb, G·K, M], ∂₁k(h_k, h_b) [Lb, G, K, K]) of a joint draw's pieces (`joint_gp_sample`). Every row of
    Aᵀ = K_HZ Lz⁻ᵀ depends on its own input only, so these come from one forward-mode product of the kernel per
    column and a GEMM. The mean's derivative includes the layer's mean function. No gradient."""
    groups = parts["groups"]
    g, k, d = groups.shape
    num_out = parts["chol"].shape[0]
    rows = groups.reshape(g * k, d)
    linv_t = lower_inverse(parts["chol_z"]).mT
    with torch.no_grad(), warnings.catch_warnings():
        # torch's forward mode loads its decompositions through torch.jit.script on first use, which warns of
        # its own deprecation: torch's internals, nothing a user of this function can act on (a
        # DeprecationWarning up to torch 2.13, a FutureWarning from 2.14)
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated")
        for c in columns:
            tangent = torch.zeros_like(rows)
            tangent[:, c] = 1.0
            _, dk_hz = torch.func.jvp(lambda a: gp.kernel(a.unsqueeze(-3), gp.inducing_points), (rows,), (tangent,))
            dat = dk_hz @ linv_t  # ∂Aᵀ rows, [Lb, G·K, M]
            if dat.shape[0] == 1:
                dmean = dat[0] @ gp.q_mu.mT  # [G·K, L]
            else:
                dmean = (dat @ gp.q_mu.unsqueeze(-1)).squeeze(-1).mT
            _, dkxx = torch.func.jvp(lambda a: gp.kernel(a.unsqueeze(-3), groups.unsqueeze(-3)), (groups,),
                                     (tangent.reshape(g, k, d),))  # ∂₁k(h_k, h_b), [G, Lb, K, K]
            dmean = dmean.reshape(g, k, num_out)
            if gp.mean_function is not None:
                _, dmf = torch.func.jvp(gp.mean_function, (rows,), (tangent,))
                dmean = dmean + dmf.reshape(g, k, num_out)
            yield dmean, dat, dkxx.movedim(-3, 0)


def _own_input_derivatives(gp, parts: dict, columns: Sequence[int]):
    """For each column c: (∂mean_k/∂h_{k,c} [G, K, L], D [L, G, K, K]) of a joint draw's pieces (`joint_gp_sample`),
    with D_kb = ∂₁k(h_k, h_b) + q̇_k·q_b - ȧ_k·a_b the derivative of row k of Σ with respect to slot k's own input
    (dΣ = e_k D_kᵀ + D_k e_kᵀ), q_b the rows of (RᵀA)ᵀ (`_input_tangents` for the rest). No gradient."""
    at, rat, r = parts["at"], parts["rat"], parts["r"]  # R of q(u), as the draw used it
    num_out, g, k = parts["chol"].shape[:3]
    m = at.shape[-1]
    with torch.no_grad():
        for dmean, dat, dkxx in _input_tangents(gp, parts, columns):
            drat = dat[0] @ r if dat.shape[0] == 1 else dat @ r  # [L, G·K, M]
            drow = (dkxx + drat.reshape(num_out, g, k, m) @ rat.reshape(num_out, g, k, m).mT
                    - dat.reshape(dat.shape[0], g, k, m) @ at.reshape(at.shape[0], g, k, m).mT)  # D, [L, G, K, K]
            yield dmean, drow


def own_slot_derivative(gp, parts: dict, columns: Sequence[int]) -> torch.Tensor:
    """∂f_k/∂h_{k,c}: the derivative of each slot's joint draw (`joint_gp_sample`, same ε) with respect to its own
    input's column c, for c in `columns`: [G, K, L, len(columns)], no gradient.

    The draw is f = Aᵀm + C ε, C = chol(Σ), Σ_kb = k(h_k, h_b) + q_k·q_b - a_k·a_b per point and output; h_k moves
    row and column k of Σ by D_k (`_own_input_derivatives`), and the factor by dC = C Φ(C⁻¹ dΣ C⁻ᵀ), Φ = lower
    triangle with the diagonal halved (the Cholesky's derivative). So ∂f_k/∂h_k = ȧ_kᵀm + (dC ε)_k (+ the mean
    function's derivative) costs K × K arithmetic per point. The latent DGP's unbiased DREG with the ε held fixed
    ("dreg-eps") needs exactly these diagonal terms of ∂log w_k/∂z_j (`LatentDeepGP.iw_terms`).
    """
    chol, eps = parts["chol"], parts["eps"]
    k = chol.shape[-1]
    eye = torch.eye(k, dtype=chol.dtype, device=chol.device)
    half_tril = torch.ones_like(eye).tril(-1) + 0.5 * eye
    out = []
    with torch.no_grad():
        inv_chol = torch.linalg.solve_triangular(chol, eye.expand_as(chol), upper=False)  # C⁻¹, [L, G, K, K]
        for dmean, drow in _own_input_derivatives(gp, parts, columns):
            # C⁻¹ dΣ⁽ᵏ⁾ C⁻ᵀ = v_k w_kᵀ + w_k v_kᵀ with v_k, w_k the k-th columns of V = C⁻¹ and W = C⁻¹ Dᵀ: rank
            # two, so the K factor derivatives need two K × K products per point, not 2K triangular solves
            v = inv_chol.mT  # v[.., k, a] = V[a, k], [L, G, K, K]
            w = (inv_chol @ drow.mT).mT
            y = v.unsqueeze(-1) * w.unsqueeze(-2)
            y = y + y.mT  # [L, G, K (k), K (a), K (b)]
            # (dC ε)_k = Σ_a C_ka Σ_b Φ(y)_ab ε_b, Φ = lower triangle with the diagonal halved
            # (element-wise: a batched product of 5 x 5 by 5 x 1 blocks is far slower on CPU)
            dnoise = (chol * (y * (half_tril * eps.mT.unsqueeze(-3))).sum(-1)).sum(-1)  # [L, G, K]
            out.append(dmean + dnoise.permute(1, 2, 0))
    return torch.stack(out, -1)


def conditional_slot_derivative(gp, parts: dict, columns: Sequence[int]) -> torch.Tensor:
    """∂f_k/∂h_{k,c} with the other slots' *values* held fixed: [G, K, L, len(columns)], no gradient.

    Given f_(-k), slot k of the joint draw is f_k = m_k + s_k ε̃_k with the Gaussian conditional
    m_k = μ_k + Σ_(k,-k) Σ_(-k,-k)⁻¹ (f_(-k) - μ_(-k)), s_k² = Σ_kk - Σ_(k,-k) Σ_(-k,-k)⁻¹ Σ_(-k,k). Moving h_k
    moves μ_k, row k of Σ (by D_k, `_own_input_derivatives`) and Σ_kk (by 2 D_kk), and nothing in Σ_(-k,-k) or
    f_(-k). Written with the precision P = Σ⁻¹ (s_k² = 1/P_kk, ε̃_k = ρ_k/√P_kk, ρ = P (f - μ) = C⁻ᵀ ε) the terms
    of ∂m_k and ε̃_k ∂s_k that involve Σ_(-k,-k)⁻¹ cancel, leaving

        ∂f_k/∂h_k = ∂μ_k + Σ_b D_kb ρ_b.

    This is the derivative the latent DGP's conditional DREG ("dreg", `LatentDeepGP.iw_terms`) needs: with the
    other slots' values fixed, log w_k depends on z_k alone. D is never formed: with v = Σ_b a_b ρ_b (per point and
    output, [M]), Σ_b (q̇_k·q_b - ȧ_k·a_b) ρ_b = ȧ_kᵀ (S - I) v, S = RRᵀ, so a column costs a K × K product per
    point for the kernel's part and matrix-vector products for the rest, not the [L, G·K, M] product ∂(RᵀA)ᵀ.
    """
    chol, eps, at, r = parts["chol"], parts["eps"], parts["at"], parts["r"]
    num_out, g, k = chol.shape[:3]
    m = at.shape[-1]
    out = []
    # products batched over points as [G, ...] x [G, ...] with G outermost in memory; a kernel shared by the outputs
    # (Lb = 1) enters without its output axis, since broadcasting it would copy [G, K, M] tensors per output
    shared = at.shape[0] == 1
    with torch.no_grad():
        rho = torch.linalg.solve_triangular(chol.mT, eps, upper=True)[..., 0]  # C⁻ᵀ ε = Σ⁻¹(f - μ), [L, G, K]
        if shared:
            rho_g = rho.permute(1, 0, 2).contiguous()  # [G, L, K]
            v = (rho_g @ at[0].reshape(g, k, m)).permute(1, 2, 0)  # Σ_b a_b ρ_b, [L, M, G]
        else:
            v = (rho.unsqueeze(-2) @ at.reshape(num_out, g, k, m)).squeeze(-2).mT
        sv = r @ (r.mT @ v) - v  # (S - I) v, [L, M, G]
        sv_g = sv.permute(2, 1, 0).contiguous()  # [G, M, L]
        for dmean, dat, dkxx in _input_tangents(gp, parts, columns):
            if shared:
                step = dkxx[0] @ rho_g.mT + dat[0].reshape(g, k, m) @ sv_g  # [G, K, L]
            else:
                step = ((dkxx @ rho.unsqueeze(-1)).squeeze(-1)
                        + (dat.reshape(num_out, g, k, m) @ sv.mT.unsqueeze(-1)).squeeze(-1)).permute(1, 2, 0)
            out.append(dmean + step)  # ∂μ_k + Σ_b D_kb ρ_b, [G, K, L]
    return torch.stack(out, -1)


class ConcatProjectionLayer(nn.Module):
    """Hidden layer of supplement E.2 (and the reference code's `G5` layer): f(h) = h P + g(h) W.

    g = (g_1..g_J) are J independent GPs sharing one RBF-ARD kernel (`gp`, a SparseVariationalGP with J
    outputs), W [J, D_out] is a fixed projection (the first principal directions of the data) and P [D_in, D_out]
    the fixed identity on the observed input columns (the latent columns are dropped): "a linear projection of
    five independent GPs concatenated with their inputs", [g, h] [W; P]. Neither P nor W is trained.

    Protocol of the latent deep GP's layers: forward(h, generator) -> (sample, mean, var) with independent
    draws per input (marginal trick), marginals(h) -> (mean, var) of each output, joint_sample(h [..., K, D_in])
    drawing g jointly over the K axis (`joint_gp_sample`), kl_divergence().
    """

    def __init__(self, gp, mixing: torch.Tensor, passthrough: torch.Tensor):
        super().__init__()
        if mixing.dim() != 2 or mixing.shape[0] != gp.num_outputs:
            raise ValueError(f"mixing must have shape [J, D_out] with J = {gp.num_outputs} GPs, "
                             f"got {tuple(mixing.shape)}")
        d_in = gp.inducing_points.shape[-1]
        if tuple(passthrough.shape) != (d_in, mixing.shape[1]):
            raise ValueError(f"passthrough must have shape [D_in, D_out] = [{d_in}, {mixing.shape[1]}], "
                             f"got {tuple(passthrough.shape)}")
        self.gp = gp
        self.register_buffer("mixing", mixing.detach().clone())
        self.register_buffer("passthrough", passthrough.detach().clone())
        # the K × K factorisations of the joint draws: a level that once needed more jitter is kept
        self.joint_jitter = JitterMemory()

    @property
    def input_dim(self) -> int:
        return self.passthrough.shape[0]

    @property
    def output_dim(self) -> int:
        return self.passthrough.shape[1]

    @property
    def num_inducing(self) -> int:
        return self.gp.num_inducing

    def kl_divergence(self) -> torch.Tensor:
        return self.gp.kl_divergence()

    def marginals(self, h: torch.Tensor):
        """Mean and variance of each output, [..., N, D_out]: h P + m_g W and Σ_j v_j W_j² (g independent)."""
        lead, n = h.shape[:-2], h.shape[-2]
        g_mean, g_var = self.gp.marginals(h.reshape(-1, h.shape[-1]))
        mean = h @ self.passthrough + (g_mean @ self.mixing).reshape(lead + (n, -1))
        var = (g_var @ self.mixing.square()).reshape(lead + (n, -1))
        return mean, var

    def forward(self, h: torch.Tensor, generator: torch.Generator | None = None, common_noise: bool = False,
                batch_rows: tuple[int, int] | None = None):
        """(sample, mean, var), each [..., N, D_out]: g drawn independently per input, then projected.

        common_noise: the same ε for every one of the N inputs (per leading index and output), so that a point's
        draw does not depend on the other points (common random numbers, as GPLayer.forward). `batch_rows` =
        (offset, B): the N inputs are rows offset.. of a global batch of B split over processes (as GPLayer.forward)."""
        lead, n = h.shape[:-2], h.shape[-2]
        g_mean, g_var = self.gp.marginals(h.reshape(-1, h.shape[-1]))
        if common_noise:
            eps = torch.randn(lead + (1, g_mean.shape[-1]), dtype=g_mean.dtype, device=g_mean.device,
                              generator=generator).expand(lead + (n, g_mean.shape[-1])).reshape(g_mean.shape)
        else:  # drawn as [..., N, J] (the same numbers as [.., J] when unsplit), so that rows can be sliced
            eps = draw_rows(lambda shape: torch.randn(shape, dtype=g_mean.dtype, device=g_mean.device,
                                                      generator=generator),
                            lead + (n, g_mean.shape[-1]), batch_rows).reshape(g_mean.shape)
        base = h @ self.passthrough
        sample = base + ((g_mean + g_var.sqrt() * eps) @ self.mixing).reshape(lead + (n, -1))
        mean = base + (g_mean @ self.mixing).reshape(lead + (n, -1))
        var = (g_var @ self.mixing.square()).reshape(lead + (n, -1))
        return sample, mean, var

    def joint_sample(self, h: torch.Tensor, generator: torch.Generator | None = None,
                     batch_rows: tuple[int, int] | None = None, parts: dict | None = None) -> torch.Tensor:
        """A draw of f over the K axis of h [..., K, D_in] jointly (each g_j by `joint_gp_sample`): [..., K, D_out].
        `parts` as in `joint_gp_sample`, plus this layer's fixed projections."""
        draw = joint_gp_sample(self.gp, h, generator, self.joint_jitter, batch_rows, parts)
        if parts is not None:
            parts.update(mixing=self.mixing, passthrough=self.passthrough)
        return h @ self.passthrough + draw @ self.mixing


class LatentDeepGP(nn.Module):
    """Deep GP with a latent input z ~ N(0, I) concatenated to x, trained on the IW bound L_K (eq. A.9).

    Args:
        layers: deep-GP layers (first layer's input dimension D + latent_dim, last layer's output L).
        qz: q(z) module, `qz(x, y, indices) -> (mean [B, Q], std [B, Q])` (AmortizedLatentEncoder/FreeLatent).
        likelihood: Gaussian by default (the last layer's expectation is then in closed form).
        num_importance: default K in `elbo`.
        gradient: default estimator for q(z), "reg" or "dreg" (or the ablations "dreg-eps", "dreg-d23").
        objective: what `training_objective` (and so `flowgp.training.loop.train`) maximises: "bound" (the default,
            `elbo`: L_K with joint draws) or "per-slot" (`per_slot_objective`: the DREG authors' published training
            objective, not a bound; see the module docstring). `elbo` is the bound whatever this says.

    See Also:
        :func:`flowgp.models.latent.build_latent_deep_gp` (built as in supplement E.2),
        :class:`flowgp.LatentDeepGPRegressor` (its estimator).
    """

    def __init__(self, layers: Sequence[nn.Module], qz: nn.Module, likelihood: Likelihood | None = None,
                 num_importance: int = 1, gradient: str = "dreg", objective: str = "bound"):
        super().__init__()
        if len(layers) < 1:
            raise ValueError("layers must hold at least one deep-GP layer")
        if not isinstance(qz, (AmortizedLatentEncoder, FreeLatent)):
            raise TypeError(f"qz must be an AmortizedLatentEncoder or FreeLatent, got {type(qz).__name__}")
        self.layers = nn.ModuleList(layers)
        self.qz = qz
        if likelihood is None:  # in the layers' dtype, whatever torch's default dtype is
            dtype = next((p.dtype for p in self.layers.parameters()), torch.float64)
            likelihood = GaussianLikelihood(noise=0.01).to(dtype)
        self.likelihood = likelihood
        self.num_importance = check_num_importance(num_importance)
        self.gradient = check_gradient(gradient)
        self.objective = check_objective(objective)
        # the K × K factorisations of the joint first-layer draws (GPLayer hidden layers)
        self.joint_jitter = JitterMemory()

    # ----- sizes -------------------------------------------------------------------------------------
    @property
    def latent_dim(self) -> int:
        return self.qz.latent_dim

    @property
    def amortized(self) -> bool:
        return isinstance(self.qz, AmortizedLatentEncoder)

    def validate(self, x, y=None):
        """x checked as [N, D] observed inputs (and y as [N, L] targets): x, or (x, y).

        Raises TypeError/ValueError naming the argument on a non-tensor, a wrong shape or non-finite values.
        """
        x = as_inputs(x, self.layers[0].input_dim - self.latent_dim)
        if y is None:
            return x
        num_outputs = y.shape[-1] if isinstance(y, torch.Tensor) and y.dim() == 2 else 1
        return x, as_targets(y, x.shape[0], num_outputs)

    # ----- forward pieces ----------------------------------------------------------------------------
    def kl_divergence(self) -> torch.Tensor:
        """Σ_ℓ KL[q(u_ℓ) || p(u_ℓ)] over the layers."""
        return sum(layer.kl_divergence() for layer in self.layers)

    def last_layer_marginals(self, h: torch.Tensor, generator=None, common_noise: bool = False):
        """Propagate inputs h [T, B, D + Q] by sampling through all but the last layer (marginal trick);
        return the last layer's Gaussian marginals q(f⁽ᴸ⁾ | f⁽ᴸ⁻¹⁾) as (mean, var), each [T, B, L].
        common_noise: every one of the B points uses the same hidden-layer ε (per T and output)."""
        for layer in self.layers[:-1]:
            h, _, _ = layer(h, generator=generator, common_noise=common_noise)
        _, mean, var = self.layers[-1](h, generator=generator)
        return mean, var

    def q_params(self, x, y, indices=None):
        """(μ, σ) of q(z_n) for the batch, each [B, Q]."""
        return self.qz(x, y, indices)

    def joint_hidden_sample(self, layer, h: torch.Tensor, generator=None, batch_rows=None,
                            parts: dict | None = None) -> torch.Tensor:
        """Draw of a hidden layer at h [..., K, D_in], jointly over the K axis (see the module docstring).
        `parts` as in `joint_gp_sample`."""
        if hasattr(layer, "joint_sample"):
            return layer.joint_sample(h, generator, batch_rows, parts)
        return joint_gp_sample(layer.gp, h, generator, self.joint_jitter, batch_rows, parts)

    @staticmethod
    def per_slot_hidden_sample(layer, h: torch.Tensor, generator=None, batch_rows=None) -> torch.Tensor:
        """Draw of a hidden layer at h [S, B, K, D_in] with every slot's values from their own marginal, independent
        over the K slots (the DREG authors' code; the per-slot objective): [S, B, K, D_out]. The noise is drawn as
        [S, K, B, ·] (the rows on the axis `batch_rows` = (offset, B) slices, as in `joint_gp_sample`)."""
        rows_inner = h.transpose(-3, -2)  # [S, K, B, D_in]
        return layer(rows_inner, generator=generator, batch_rows=batch_rows)[0].transpose(-3, -2)

    def joint_last_layer_marginals(self, h: torch.Tensor, generator=None, batch_rows=None,
                                   parts: dict | None = None, per_slot: bool = False):
        """Inputs h [S, B, K, D + Q]: every hidden layer drawn jointly over the K axis (per outer sample, point and
        output), then the last layer's per-input marginals (mean, var), each [S, B, K, L]. `batch_rows` as in
        `joint_gp_sample` (B is h's row axis). `parts`: a dict that receives the first hidden layer's pieces
        (`joint_gp_sample`), every hidden layer's pieces as a list "layers" (each with its draw as "output"), and
        the last hidden draw (the last layer's input) as "hidden". `per_slot`: the hidden layers drawn per slot
        instead (`per_slot_hidden_sample`; the per-slot objective, no `parts`)."""
        if per_slot:
            if parts is not None:
                raise ValueError("per_slot draws have no joint-draw pieces: pass parts=None")
            for layer in self.layers[:-1]:
                h = self.per_slot_hidden_sample(layer, h, generator, batch_rows)
            return self.layers[-1].marginals(h)
        per_layer = []
        for i, layer in enumerate(self.layers[:-1]):
            own = {} if parts is not None else None
            h = self.joint_hidden_sample(layer, h, generator, batch_rows, own)
            if own is not None:
                own["output"] = h
                per_layer.append(own)
        if parts is not None and per_layer:
            parts.update(per_layer[0], layers=per_layer, hidden=h)
        return self.layers[-1].marginals(h)

    def log_weights(self, x, y, num_importance: int, num_samples: int = 1, indices=None, q_params=None,
                    detach_q: bool = False, generator: torch.Generator | None = None,
                    batch_rows: tuple[int, int] | None = None, parts: dict | None = None, per_slot: bool = False):
        """log w_{s,k,n} of eq. C.16 for S outer × K importance samples: returns (log_w [S, K, B], z [S, K, B, Q]).

        The hidden layers' values at the K inputs (x_n, z_{s,k,n}) are drawn jointly over k (eq. A.9's
        expectation over f⁽¹⁾_{1:K}); outer samples and points are independent.
        `q_params` overrides (μ, σ) with tensors broadcasting to [S, B, Q] (used to take per-sample gradients);
        `detach_q` evaluates log q(z) with μ, σ held fixed (the DREG form, eq. D.23). `batch_rows` = (offset, B):
        these rows are rows offset.. of a global batch of B split over processes; every draw (z and the hidden
        layers) is made for all B rows and sliced, so a row's draws do not depend on the split. `parts`: as in
        `joint_last_layer_marginals`, plus q(z)'s (μ, σ) [S, 1, B, Q]. `per_slot`: the hidden layers drawn per
        slot (the per-slot objective's weights, not the bound's; `joint_last_layer_marginals`).
        """
        k = check_num_importance(num_importance)
        s = _check_positive_int(num_samples, "num_samples")
        mean, std = self.q_params(x, y, indices) if q_params is None else q_params
        b, q = x.shape[0], self.latent_dim
        mean = mean.expand(s, b, q).unsqueeze(1)  # [S, 1, B, Q]
        std = std.expand(s, b, q).unsqueeze(1)
        eps = draw_rows(lambda shape: torch.randn(shape, dtype=x.dtype, device=x.device, generator=generator),
                        (s, k, b, q), batch_rows)
        z = mean + std * eps  # reparameterised (eq. C.13)
        h = torch.cat([x.expand(s, k, b, x.shape[-1]), z], dim=-1).transpose(1, 2)  # [S, B, K, D + Q]
        f_mean, f_var = self.joint_last_layer_marginals(h, generator, batch_rows, parts, per_slot)
        if parts is not None:
            parts.update(q_mean=mean, q_std=std)
        ell = self.likelihood.expected_log_prob(y.unsqueeze(-2), f_mean, f_var).sum(-1).transpose(1, 2)  # [S, K, B]
        log_q = normal_log_prob(z, mean.detach(), std.detach()) if detach_q else normal_log_prob(z, mean, std)
        return ell + normal_log_prob(z) - log_q, z

    def iw_terms(self, x, y, num_importance: int, gradient: str = "reg", num_samples: int = 1, indices=None,
                 q_params=None, generator=None, batch_rows=None, per_slot: bool = False) -> torch.Tensor:
        """Per-sample, per-point log (1/K) Σ_k w_k, [S, B], whose gradient is the chosen estimator for q(z).

        "dreg" with joint draws (the hidden layers' K values of a point are one function at K inputs, drawn
        jointly): unbiased and in D.23's form, c_j = w̃_j² G̃_jj, where G̃_jj = ∂log w_j/∂z_j with
        the other slots' hidden *values* held fixed (slot j drawn from its conditional given them), not their ε.
        Why it is unbiased: ∇_φ L_K = Σ_j ∂L_K/∂φ_j, φ_j the parameters of slot j's proposal (L_K is a valid bound
        for any φ_1..φ_K and equals the bound at φ_j = φ). For ∂/∂φ_j, represent the joint draw as (z_(-j), f_(-j))
        first, which does not depend on φ_j, then z_j = μ + σ η_j and slot j's values from their Gaussian
        conditional given f_(-j) (layer by layer). Only log w_j then depends on φ_j, the slots are as independent
        as in D.23's derivation, and Tucker et al.'s identity gives E[w̃_j² G̃_jj ∂z_j/∂φ]. Each term's integrand
        is a function of the joint draw's values, so one draw serves every j. G̃_jj comes in closed form
        (`conditional_slot_derivative`, chained through the hidden layers) after one product of Σ_k log w_k with
        respect to the last hidden draw; z's gradient hook replaces what autograd brings by α w̃_j² G̃_jj.

        "dreg-eps" (an ablation; "dreg" before 2026-11-28): with the joint draw's ε held fixed, log w_k depends on
        every z_j of its point (G_kj = ∂log w_k/∂z_j ≠ 0 for k ≠ j, through the K × K
        Cholesky). Tucker et al.'s identity E[w̃_k ∇_φ log q(z_k)] = E[(dw̃_k/dz_k) ∂z_k/∂φ] then gives the
        unbiased doubly reparameterised gradient at z_j

            c_j = Σ_k w̃_k G_kj - w̃_j G_jj + w̃_j Σ_k w̃_k G_kj,

        which is D.23's w̃_j² G_jj when G is diagonal. The first term is what autograd of L_K brings to z_j (log q
        with φ held fixed); the rest is added by a zero-valued surrogate Σ_j sg(coef_j)·(z_j - sg(z_j)), so the
        returned value is L_K and the model's parameters keep the plain IW gradient. With more than two layers G
        is formed by K vector-Jacobian products of log w w.r.t. z (only when z carries a gradient). With two
        layers nothing is formed: G_jj comes in closed form (`dreg_own_terms`), and z's gradient hook rewrites the
        α Σ_k w̃_k G_kj that autograd brings (α: the objective's weight on the point's term, read by a hook on the
        returned terms) into α c_j. A one-layer model has a diagonal G and uses D.23 through a hook on z.

        "dreg-d23": D.23's surrogate taken literally, Σ_k sg(w̃_k²) log w_k differentiated through every z, which
        gives z_j the coefficient Σ_k w̃_k² G_kj. It equals "dreg" for one layer and is biased once a hidden layer
        couples the slots; kept to measure what the cross terms do to the gradient's signal-to-noise ratio.

        `per_slot`: the hidden layers drawn per slot, the per-slot objective's terms (not the bound's; see the module
        docstring). Each log w_k then depends on z_k alone (G is diagonal), so every DREG variant is eq. D.23
        exactly, as in the DREG authors' code.
        """
        gradient = check_gradient(gradient)
        dreg = gradient in ("dreg", "dreg-eps", "dreg-d23")
        conditional = gradient == "dreg"
        # G's diagonal in closed form from the hidden draws' pieces: "dreg-eps" with two layers (`own_slot_derivative`),
        # "dreg" at any depth (`conditional_slot_derivative`)
        parts = {} if ((gradient == "dreg-eps" and len(self.layers) == 2 or conditional and len(self.layers) > 1)
                       and num_importance > 1 and torch.is_grad_enabled() and not per_slot) else None
        log_w, z = self.log_weights(x, y, num_importance, num_samples, indices, q_params, dreg, generator,
                                    batch_rows, parts, per_slot)
        terms = torch.logsumexp(log_w, dim=1) - math.log(log_w.shape[1])
        if dreg and z.requires_grad and torch.is_grad_enabled():
            k = log_w.shape[1]
            weights = torch.softmax(log_w.detach(), dim=1).unsqueeze(-1)  # w̃_k, [S, K, B, 1]
            if gradient == "dreg-d23" and len(self.layers) > 1 and k > 1 and not per_slot:
                # D.23 as written, Σ_k sg(w̃_k²) ∇_φ log w_k through every z: at z_j Σ_k w̃_k² G_kj (the cross terms
                # G_kj, k ≠ j, weighted as if they were own terms). Autograd of L_K brings Σ_k w̃_k G_kj; one
                # vector-Jacobian product adds the difference
                extra = torch.autograd.grad(((weights.squeeze(-1) ** 2 - weights.squeeze(-1)) * log_w).sum(), z,
                                            retain_graph=True)[0]
                return terms + (extra.detach() * (z - z.detach())).sum((1, -1))
            if len(self.layers) == 1 or k == 1 or per_slot:
                # no sampled layer, one slot or per-slot draws: G is diagonal and c_j = w̃_j² G_jj, i.e. one more
                # factor w̃_j on what autograd brings to z_j (eq. D.23 exactly), no Jacobian needed
                z.register_hook(lambda g: g * weights)
                return terms
            if conditional:
                # α w̃_j² G̃_jj replaces what autograd brings to z_j (α as below, read where the backward reaches
                # `terms`, before it reaches z)
                own = self.dreg_own_terms(log_w, z, parts, conditional=True)
                seen = {}
                terms.register_hook(lambda g: seen.__setitem__("alpha", g.detach()))
                z.register_hook(lambda g: seen["alpha"][:, None, :, None] * weights.square() * own)
                return terms
            if parts is not None:
                # autograd of L_K brings α Σ_k w̃_k G_kj to z_j, α = ∂(objective)/∂(the point's term); the estimator
                # wants α((1 + w̃_j) Σ_k w̃_k G_kj - w̃_j G_jj). α is read where the gradient reaches `terms` (which
                # the backward reaches before z) and z's gradient is rewritten: no product for the column sums
                own = self.dreg_own_terms(log_w, z, parts)
                seen = {}
                terms.register_hook(lambda g: seen.__setitem__("alpha", g.detach()))
                z.register_hook(lambda g: g * (1.0 + weights) - seen["alpha"][:, None, :, None] * weights * own)
                return terms
            rows = [torch.autograd.grad(log_w[:, i].sum(), z, retain_graph=True)[0] for i in range(k)]
            jac = torch.stack(rows, 1)  # G_{k j}: [S, K (k), K (j), B, Q]
            pathwise = (weights.unsqueeze(2) * jac).sum(1)  # Σ_k w̃_k G_kj, [S, K, B, Q]
            own = torch.diagonal(jac, dim1=1, dim2=2).movedim(-1, 1)  # G_jj, [S, K, B, Q]
            coef = (weights * (pathwise - own)).detach()
            terms = terms + (coef * (z - z.detach())).sum((1, -1))
        return terms

    def dreg_own_terms(self, log_w, z, parts: dict, conditional: bool = False) -> torch.Tensor:
        """G_jj = ∂log w_j/∂z_j, [S, K, B, Q] (no gradient), without forming G.

        The last layer is evaluated per slot, so one product of Σ_k log w_k with respect to the last hidden draw h
        gives every U_k = ∂log w_k/∂h_k; then G_jj = U_j·∂h_j/∂z_j + ∂(log p(z_j) - log q(z_j))/∂z_j with q's
        parameters held fixed (DREG's log w). ∂h_j/∂z_j: with the ε of the joint draws held fixed
        (`own_slot_derivative`, two layers only: "dreg-eps"), or, `conditional`, with the other slots' values held fixed
        (`conditional_slot_derivative`, chained through every hidden layer: "dreg"). This replaces K products
        through the hidden layers by K × K arithmetic per point. `parts` is what `log_weights` collected.
        """
        hidden = parts["hidden"]  # [S, B, K, D_h]
        u = torch.autograd.grad(log_w.sum(), hidden, retain_graph=True)[0]
        s, b, k, d_h = hidden.shape
        q = z.shape[-1]
        per_layer = parts["layers"]
        if not conditional and len(per_layer) != 1:
            raise ValueError("the closed-form own terms with the ε held fixed need exactly one hidden layer")
        derivative = conditional_slot_derivative if conditional else own_slot_derivative
        jac = None  # ∂(layer output)_j/∂z_j, [S·B, K, D_out, Q]
        for layer, pieces in zip(self.layers[:-1], per_layer):
            d_in = pieces["groups"].shape[-1]
            columns = list(range(d_in - q, d_in)) if jac is None else list(range(d_in))  # z's columns of [x, z]
            d_gp = derivative(layer.gp, pieces, columns)  # [S·B, K, J, C]
            if "mixing" in pieces:  # h = h_in P + g W
                step = (d_gp.mT @ pieces["mixing"] + pieces["passthrough"][columns]).mT  # [S·B, K, D_out, C]
            else:
                step = d_gp
            jac = step if jac is None else step @ jac
        own = (u.reshape(s * b, k, d_h, 1) * jac).sum(-2).reshape(s, b, k, q).transpose(1, 2)  # [S, K, B, Q]
        zd = z.detach()
        return own - zd + (zd - parts["q_mean"].detach()) / parts["q_std"].detach().square()

    # ----- objectives ---------------------------------------------------------------------------------
    def elbo(self, x, y, num_data: int | None = None, indices=None, num_importance: int | None = None,
             gradient: str | None = None, num_samples: int = 1,
             generator: torch.Generator | None = None, batch_rows: tuple[int, int] | None = None) -> torch.Tensor:
        """Minibatch estimate of L_K (eq. A.9) scaled to the data set: (N/B) Σ_n mean_s log (1/K) Σ_k w - Σ KL.

        The per-point term is the log-mean-weight of `iw_terms`, assembled by `flowgp.gp.objective.minibatch_bound`.
        Its value is L_K for both estimators; its gradient w.r.t. q(z)'s parameters is REG (C.17) or DREG (D.23).
        Every draw (z and the hidden layers) comes from `generator` (torch's global RNG when None). `batch_rows`
        (offset, B): x is part of a global batch of B split over processes (see `log_weights`). Always the bound
        (hidden layers drawn jointly over K), whatever the model's `objective`.
        """
        return self._importance_objective(x, y, num_data, indices, num_importance, gradient, num_samples, generator,
                                          batch_rows, per_slot=False)

    def per_slot_objective(self, x, y, num_data: int | None = None, indices=None, num_importance: int | None = None,
                           gradient: str | None = None, num_samples: int = 1, generator: torch.Generator | None = None,
                           batch_rows: tuple[int, int] | None = None) -> torch.Tensor:
        """The DREG authors' published training objective (their Table 1), NOT a lower bound on log p(y):

            (N/B) Σ_n mean_s log (1/K) Σ_k w_{n,k} - Σ KL,  f⁽ℓ⁾_k ~ q(f⁽ℓ⁾(h_{n,k})) independently over k,

        `elbo`'s form (eq. A.9 / C.16) with every hidden layer drawn per slot from its marginal instead of jointly
        over the K slots (`per_slot_hidden_sample`). Measured above the valid bound by 0.9-1.5 nats on a 3-point
        problem and 0.43-0.60 nats per training point on power fits (module docstring). REG (C.17) or, for every
        DREG name, eq. D.23 exactly; arguments and draws as in `elbo`.
        """
        return self._importance_objective(x, y, num_data, indices, num_importance, gradient, num_samples, generator,
                                          batch_rows, per_slot=True)

    def training_objective(self, x, y, num_data: int | None = None, indices=None, num_importance: int | None = None,
                           gradient: str | None = None, num_samples: int = 1, generator: torch.Generator | None = None,
                           batch_rows: tuple[int, int] | None = None) -> torch.Tensor:
        """What training maximises (`flowgp.training.loop.train` calls this before `elbo`): `elbo` when the model's
        `objective` is "bound", `per_slot_objective` when it is "per-slot". Arguments as in `elbo`."""
        chosen = self.per_slot_objective if self.objective == "per-slot" else self.elbo
        return chosen(x, y, num_data, indices, num_importance, gradient, num_samples, generator, batch_rows)

    def _importance_objective(self, x, y, num_data, indices, num_importance, gradient, num_samples, generator,
                              batch_rows, per_slot: bool) -> torch.Tensor:
        """`elbo` (per_slot=False) or `per_slot_objective` (per_slot=True)."""
        x, y = self.validate(x, y)
        k = self.num_importance if num_importance is None else num_importance
        gradient = self.gradient if gradient is None else gradient
        # DREG's bookkeeping (vector-Jacobian products and gradient hooks inside the forward) runs eagerly even in
        # a compiled step: traced, a fit ended 1.6e-4 nats off the eager one (REG's compiled fit is equal to it)
        iw_terms = self.iw_terms_eagerly if gradient in ("dreg", "dreg-eps", "dreg-d23") else self.iw_terms
        terms = iw_terms(x, y, k, gradient, num_samples, indices, generator=generator, batch_rows=batch_rows,
                         per_slot=per_slot)
        return minibatch_bound(terms.mean(0), [self.kl_divergence()], num_data, x.shape[0])

    @torch.compiler.disable
    def iw_terms_eagerly(self, *args, **kwargs) -> torch.Tensor:
        """`iw_terms`, never traced by torch.compile (a graph break around it)."""
        return self.iw_terms(*args, **kwargs)

    def plain_elbo(self, x, y, num_data: int | None = None, indices=None, num_samples: int = 1,
                   analytic_kl: bool = False, generator=None) -> torch.Tensor:
        """Standard ELBO (eq. A.3 with the last layer collapsed): E_q[log F + log p(z) - log q(z)] - Σ KL.

        Monte Carlo over S samples (so with the same samples it equals L_1); `analytic_kl` uses the closed-form
        KL[q(z_n) || N(0, I)] instead of its one-sample estimate. Draws come from `generator`.
        """
        x, y = self.validate(x, y)
        log_w, z = self.log_weights(x, y, 1, num_samples, indices, generator=generator)
        if analytic_kl:
            mean, std = self.q_params(x, y, indices)
            kl_z = 0.5 * (mean.square() + std.square() - 1.0 - 2.0 * std.log()).sum(-1)  # [B]
            log_w = log_w - normal_log_prob(z) + normal_log_prob(z, mean, std) - kl_z
        return minibatch_bound(log_w.mean((0, 1)), [self.kl_divergence()], num_data, x.shape[0])

    # ----- prediction (z from the prior, supplement E.3) ----------------------------------------------
    def _chunk(self, num_points: int) -> int:
        m = max(getattr(layer, "num_inducing", 128) for layer in self.layers)
        return max(1, _CHUNK_ELEMENTS // max(1, num_points * m))

    def prior_marginals(self, x, num_samples: int, generator=None, common_noise: bool = False):
        """Last-layer marginals with z ~ p(z) = N(0, I): yields (mean, var) chunks of shape [s, N, L].

        common_noise: sample s uses the same z_s and hidden-layer ε for every row (common random numbers): each
        row's estimate keeps its distribution, and a row's prediction no longer depends on the other rows."""
        x = self.validate(x)
        total = _check_positive_int(num_samples, "num_samples")
        chunk = self._chunk(x.shape[0])
        done = 0
        while done < total:
            s = min(chunk, total - done)
            rows = 1 if common_noise else x.shape[0]
            z = torch.randn((s, rows, self.latent_dim), dtype=x.dtype, device=x.device, generator=generator)
            z = z.expand(s, x.shape[0], self.latent_dim)
            yield self.last_layer_marginals(torch.cat([x.expand(s, *x.shape), z], dim=-1), generator, common_noise)
            done += s

    def log_predictive_density(self, x, y, num_samples: int = 1000, generator=None, common_noise: bool = False) -> torch.Tensor:
        """log p(y*_n | x*_n) ≈ log (1/S) Σ_s p(y*_n | z_s, f⁽ᴸ⁻¹⁾_s), z_s ~ p(z) (supplement E.3), [N].

        The last layer is integrated exactly (N(y; μ_s, v_s + σ²)), a lower-variance form of E.3's estimator.
        """
        x, y = self.validate(x, y)
        parts = []
        for mean, var in self.prior_marginals(x, num_samples, generator, common_noise):
            parts.append(self.likelihood.predictive_log_density(y, mean, var).sum(-1))  # [s, N]
        log_p = torch.cat(parts, 0)
        return torch.logsumexp(log_p, 0) - math.log(log_p.shape[0])

    def predict(self, x, num_samples: int = 1000, generator=None, common_noise: bool = False):
        """Mean and variance of the (mixture) predictive p(y* | x*), each [N, L]."""
        first = second = 0.0
        count = 0
        for mean, var in self.prior_marginals(x, num_samples, generator, common_noise):
            y_mean, y_var = self.likelihood.predictive_moments(mean, var)
            first = first + y_mean.sum(0)
            second = second + (y_var + y_mean.square()).sum(0)
            count += mean.shape[0]
        first, second = first / count, second / count
        return first, (second - first.square()).clamp_min(0)

    def sample_y(self, x, num_samples: int = 1, generator=None) -> torch.Tensor:
        """Draws y* ~ p(y* | x*) (multimodal through z): [num_samples, N, L]."""
        out = []
        for mean, var in self.prior_marginals(x, num_samples, generator):
            f = mean + var.sqrt() * torch.randn(mean.shape, dtype=mean.dtype, device=mean.device, generator=generator)
            out.append(self.likelihood.sample(f, generator=generator))
        return torch.cat(out, 0)

    def predictive_summary(self, x, y, probs, num_samples: int = 1000, generator=None, iterations: int = 80,
                           common_noise: bool = False) -> dict:
        """What the test scores need, from one set of draws z_s ~ p(z) (each of log_predictive_density, predict
        and predict_quantiles draws the whole set itself), as a dict of tensors:
        "log_density" [N] (supplement E.3, the last layer integrated exactly, as log_predictive_density),
        "mean" [N, L] (as predict), "quantiles" [P, N, L] at `probs` (as predict_quantiles) and
        "log_density_kde" [N]: the authors' public script's estimate, a Silverman-bandwidth KDE of one draw of
        y per z_s (`flowgp.gp.prediction.silverman_kde_log_density`). Holds all S components of the N rows'
        mixtures at once, as predict_quantiles does."""
        x, y = self.validate(x, y)
        probs = check_probabilities(probs, x)
        with torch.no_grad():
            mean, var = (torch.cat(parts, 0) for parts in
                         zip(*self.prior_marginals(x, num_samples, generator, common_noise)))  # [S, N, L]
            log_p = self.likelihood.predictive_log_density(y, mean, var).sum(-1)
            total_var = var + self.likelihood.noise
            rows = 1 if common_noise else mean.shape[1]
            eps = torch.randn((mean.shape[0], rows, mean.shape[2]), dtype=mean.dtype, device=mean.device,
                              generator=generator)
            draws = mean + total_var.sqrt() * eps.expand(mean.shape)
            return {"log_density": torch.logsumexp(log_p, 0) - math.log(log_p.shape[0]),
                    "mean": self.likelihood.predictive_moments(mean, var)[0].mean(0),
                    "quantiles": gaussian_mixture_quantiles(mean, total_var, probs, iterations),
                    "log_density_kde": silverman_kde_log_density(draws, y).sum(-1)}

    def predict_quantiles(self, x, probs, num_samples: int = 1000, generator=None, iterations: int = 80, common_noise: bool = False):
        """Quantiles of the Gaussian-mixture predictive at `probs` (safeguarded Newton on its CDF, flowgp.gp.prediction.mixture_quantiles): [P, N, L]."""
        probs = check_probabilities(probs, x)
        with torch.no_grad():
            means, sds = [], []
            for mean, var in self.prior_marginals(x, num_samples, generator, common_noise):
                means.append(mean)
                sds.append((var + self.likelihood.noise).sqrt())
            mean, sd = torch.cat(means, 0), torch.cat(sds, 0)  # [S, N, L]
            return gaussian_mixture_quantiles(mean, sd.square(), probs, iterations)


# ----- construction (supplement E.2) ------------------------------------------------------------------
def build_latent_deep_gp(
    x: torch.Tensor,
    y: torch.Tensor,
    num_layers: int,
    latent_dim: int = 1,
    num_inducing: int = 128,
    amortized: bool = True,
    hidden_width: int = 5,
    kernel: str = "rbf",
    noise: float = 0.01,
    num_importance: int = 1,
    gradient: str = "dreg",
    white_variance: float = 1e-6,
    q_var_init: float = 1e-5,
    kmeans_restarts: int = DEFAULTS.kmeans_restarts,
    learn_inducing: bool = True,
    hidden_layer: str = "pca",
    hidden_q_var_init: float | None = None,
    learn_hidden_variance: bool = True,
    encoder_skips: str = "dense",
    seed: int = 0,
    generator: torch.Generator | None = None,
    dtype: torch.dtype | None = None,
    device=None,
    objective: str = "bound",
) -> LatentDeepGP:
    """A LatentDeepGP initialised as in supplement E.2.

    RBF-ARD kernels with lengthscales √D_in; M inducing inputs per layer from k-means of x (all of x when
    M ≥ N), the latent columns drawn from N(0, 1); a zero-mean last layer; Gaussian likelihood with variance
    `noise` (0.01); q(z) amortized by the E.2 network or free. Hidden layers (`hidden_layer`):

    - "pca": `hidden_width` GPs with a fixed linear mean (first principal directions of the layer input,
      identity/zero-padded when widening) and a White(`white_variance`) term;
    - "concat" (E.2 and the reference code's `G5` layer): `ConcatProjectionLayer`, `hidden_width` GPs sharing
      one RBF-ARD kernel (+ White(`white_variance`), which plays GPflow's 1e-6 jitter) mixed by the first
      principal directions of x [hidden_width, D] and added to the observed inputs (identity on x, the latent
      columns dropped), output width D; the next layer's inducing inputs are the k-means centres again.

    `q_var_init` is the last layer's initial S = q_var_init·I (whitened), `hidden_q_var_init` the hidden
    layers' (default q_var_init; the reference run script scales the hidden q_sqrt by 1e-5, i.e. 1e-10).
    `learn_hidden_variance=False` holds the hidden kernels' variances (RBF 1, White) fixed, as the reference
    run script does. `encoder_skips` is the q(z) network's skip structure (`AmortizedLatentEncoder`'s `skips`).
    `objective`: what training maximises, "bound" (L_K, the default) or "per-slot" (the DREG authors' published
    objective, not a bound; `LatentDeepGP.per_slot_objective`).

    Every draw (the latent columns and the encoder's Glorot initialisation) comes from `generator` (a CPU
    generator), by default `torch.Generator().manual_seed(seed)` (`seed` also seeds k-means); torch's and
    NumPy's global RNGs are never touched. The model is built in x's dtype and moved to `dtype` / `device` at the end (default: x's).

    Args:
        x, y: the training inputs [N, D] and targets [N] or [N, L].
        num_layers: the number of GP layers.
        latent_dim: dimension of z.
        num_inducing: M inducing inputs per layer.
        amortized: q(z) from the E.2 encoder network (True) or free per-point parameters.
        hidden_width, white_variance, hidden_layer: the hidden layers, as above.
        kernel: the kernel name ("rbf").
        noise: initial likelihood variance.
        num_importance: default K of the bound.
        gradient: default estimator of q(z)'s gradient (`LatentDeepGP`).
        q_var_init, hidden_q_var_init, learn_hidden_variance: as above.
        kmeans_restarts: k-means runs for the inducing inputs; the best is kept.
        learn_inducing: train the inducing inputs.
        encoder_skips, objective: as above.
        seed, generator, dtype, device: as above.

    See Also:
        :class:`flowgp.models.latent.LatentDeepGP`, :class:`flowgp.LatentDeepGPRegressor`.
    """
    from ...gp.inducing import initial_inducing_inputs

    x = as_inputs(x)
    if y.dim() == 1:
        y = y.unsqueeze(-1)
    y = as_targets(y, x.shape[0], y.shape[-1])
    num_layers = _check_positive_int(num_layers, "num_layers")
    _check_latent_options(latent_dim, hidden_layer, encoder_skips, num_importance, gradient, objective)
    hidden_width = _check_positive_int(hidden_width, "hidden_width")
    hidden_q_var_init = q_var_init if hidden_q_var_init is None else float(hidden_q_var_init)
    if not hidden_q_var_init > 0 or not q_var_init > 0:
        raise ValueError(f"q_var_init and hidden_q_var_init must be > 0, got {q_var_init}, {hidden_q_var_init}")
    n, d = x.shape
    y_dim = y.shape[1]
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if generator is None:
        generator = torch.Generator().manual_seed(int(seed))
    z_x = initial_inducing_inputs(x, min(num_inducing, n), kmeans_restarts, seed, dtype=x.dtype)
    layers = _latent_layers(x, z_x, num_layers, latent_dim, y_dim, hidden_layer, hidden_width, kernel=kernel,
                            white_variance=white_variance, q_var_init=q_var_init,
                            hidden_q_var_init=hidden_q_var_init, learn_inducing=learn_inducing,
                            learn_hidden_variance=learn_hidden_variance, generator=generator)
    qz = AmortizedLatentEncoder(d, y_dim, latent_dim, generator=generator, dtype=x.dtype, skips=encoder_skips) \
        if amortized \
        else FreeLatent(n, latent_dim, dtype=x.dtype)
    likelihood = GaussianLikelihood(noise=noise, num_outputs=y_dim)
    model = LatentDeepGP(layers, qz, likelihood, num_importance=num_importance, gradient=gradient, objective=objective)
    return model.to(device=x.device if device is None else device, dtype=x.dtype if dtype is None else dtype)


def _check_latent_options(latent_dim, hidden_layer, encoder_skips, num_importance, gradient, objective) -> None:
    """Checks `build_latent_deep_gp`'s named options."""
    if isinstance(latent_dim, bool) or not isinstance(latent_dim, int):
        raise TypeError(f"latent_dim must be an int, got {type(latent_dim).__name__}")
    if latent_dim < 1:
        raise ValueError(f"latent_dim must be >= 1 (the latent input's dimension), got {latent_dim}")
    if hidden_layer not in HIDDEN_LAYERS:
        raise ValueError(f"hidden_layer must be one of {HIDDEN_LAYERS}, got {hidden_layer!r}")
    if encoder_skips not in ENCODER_SKIPS:
        raise ValueError(f"encoder_skips must be one of {ENCODER_SKIPS}, got {encoder_skips!r}")
    check_num_importance(num_importance)
    check_gradient(gradient)
    check_objective(objective)


def _freeze_variances(module) -> None:
    """Holds the kernels' variances (RBF, White) of `module` fixed, as the reference run script does."""
    for name, param in module.named_parameters():
        if name.endswith("raw_variance"):
            param.requires_grad_(False)


def _latent_layers(x, z_x, num_layers, latent_dim, y_dim, hidden_layer, hidden_width, *, kernel, white_variance,
                   q_var_init, hidden_q_var_init, learn_inducing, learn_hidden_variance, generator) -> list:
    """The layers of `build_latent_deep_gp` (supplement E.2): inducing inputs [Z_x, Z_latent ~ N(0, 1)]."""
    from ...gp.kernels import Sum, White, make_kernel
    from ...gp.variational import SparseVariationalGP
    from ..deep_gp import GPLayer, linear_mean_weight

    n, d = x.shape
    z_lat = torch.randn((z_x.shape[0], latent_dim), dtype=x.dtype, generator=generator)
    z_run = torch.cat([z_x, z_lat], dim=1).to(x.device)
    # the layer inputs' principal directions use a prior draw of the latent column
    x_run = torch.cat([x, torch.randn((n, latent_dim), dtype=x.dtype, generator=generator).to(x.device)], dim=1)
    layers = []
    for ell in range(num_layers):
        last = ell == num_layers - 1
        d_in = x_run.shape[1]
        if not last and hidden_layer == "concat":
            kern = make_kernel(kernel, d_in, lengthscale=math.sqrt(d_in), dtype=x.dtype)
            kern = Sum(kern, White(d_in, variance=white_variance, dtype=x.dtype))
            if not learn_hidden_variance:
                _freeze_variances(kern)
            gp = SparseVariationalGP(kern, z_run, hidden_width, None, hidden_q_var_init, learn_inducing)
            xc = x - x.mean(0)
            mixing = linear_mean_weight(xc, min(hidden_width, d)).mT  # [J', D] principal directions
            if mixing.shape[0] < hidden_width:  # fewer data dimensions than GPs: the extra GPs get zero weight
                mixing = torch.cat([mixing, mixing.new_zeros(hidden_width - mixing.shape[0], d)], 0)
            passthrough = torch.eye(d_in, d, dtype=x.dtype, device=x.device)  # x kept, latent columns dropped
            layers.append(ConcatProjectionLayer(gp, mixing, passthrough).to(device=x.device, dtype=x.dtype))
            x_run, z_run = x, z_x.to(x.device)
            continue
        d_out = y_dim if last else hidden_width
        weight = None if last else linear_mean_weight(x_run - x_run.mean(0), d_out)
        layer = GPLayer(z_run, d_out, kernel=kernel, mean_weight=weight,
                        white_variance=None if last else white_variance, lengthscale=math.sqrt(d_in),
                        q_var_init=q_var_init if last else hidden_q_var_init, learn_inducing=learn_inducing)
        if not last and not learn_hidden_variance:
            _freeze_variances(layer)
        layers.append(layer.to(device=x.device, dtype=x.dtype))
        if not last:
            x_run, z_run = x_run @ weight, z_run @ weight
    return layers
