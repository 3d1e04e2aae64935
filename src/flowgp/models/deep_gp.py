"""Deep GPs with doubly-stochastic variational inference (Salimbeni & Deisenroth 2017, DSVI).

F_ℓ = f_ℓ(F_{ℓ-1}) with f_ℓ a multi-output sparse GP layer and F_0 = X (CNF-DGP paper §II, joint above eq. 3).
The ELBO (CNF-DGP eq. 3) E_{q(F_L)}[log p(y | F_L)] - KL[q(U) || p(U)] is estimated with S samples pushed
through the layers with the marginal trick: only the per-point marginals q(f_ℓ(x_n) | F_{ℓ-1}) are sampled
(reparameterised), and the last layer's expectation is taken in closed form (Gaussian likelihood) or by
Gauss-Hermite quadrature. q(U) is either Gaussian per layer (whitened, as in SVGP) or a normalizing-flow
posterior over all layers' whitened inducing outputs (`flowgp.models.cnf_posterior`, CNF-DGP eqs. 5-9).

Flow posteriors are sampled, and by default *per data point*: every point n (and each of its S samples)
gets its own draw U⁽ⁿ⁾ of all layers' inducing outputs,
    ELBO ≈ (N/B) Σ_n (1/S) Σ_s E[log p(y_n | f_L) | U⁽ⁿˢ⁾] - KL,
which is as unbiased as one draw shared by the batch (each term's expectation is the same) but whose
U-noise averages over the batch. It is cheap because the projection A = Lz⁻¹ K_ZX of a layer does not depend
on U: point n's conditional mean is the dot product a_nᵀ v⁽ⁿ⁾ (`GPLayer.conditional_per_point`). The paper's
estimator, one draw shared by the batch (CNF-DGP eq. 6), is `draws="shared"` (`posterior="cnf-paper"`).

For the Gaussian-base flow q(U) = T_#N(m, RRᵀ) (`posterior="cnf"`), `draws="coupled"` *locally
reparameterises* every point's base draw V on DSVI's chain. DSVI samples each hidden f_ℓ(x_n) from its
marginal, f = μ + σ ε with σ² = k̃ + |Rᵀa|², i.e. it integrates U out and needs one normal per point and
output; a pathwise draw V = m + R ξ instead spreads the noise over M directions, and the gradient with
respect to R becomes ~50x noisier (`benchmarks/studies/cnf_dgp_gradient_noise.py`), which is why plain per-point
draws trailed DSVI at the same budget. The coupled draw rotates DSVI's ε into the part of ξ along Rᵀa and
draws the rest freshly (`DeepGP._coupled_terms`), so ξ ~ N(0, I) exactly and the flow chain pushed through
T(V) *is* DSVI's chain at T = id, value and gradient. The bound is DSVI's estimate plus the flow's change
on the same draws (zero at the identity). In training (base_gradient="dsvi") DSVI's part is DSVI's own code on
every row, and the change Δ, a low-noise difference, is estimated on `flow_rows` random rows of the batch:
(N/b) Σ_b Δ_n, unbiased, so the flow step costs a fraction of a DSVI step instead of several.
"""
from __future__ import annotations

import contextlib
import copy
import math
from typing import Sequence

import numpy as np
import torch
from torch import nn

from ..gp.defaults import DEFAULTS
from ..gp.inducing import initial_inducing_inputs
from ..gp.kernels import Kernel, Sum, White, make_kernel
from ..gp.likelihoods import GaussianLikelihood, Likelihood
from ..numerics.linalg import lower_inverse
from ..gp.objective import minibatch_bound
from ..numerics.row_draws import derived_generator, draw_rows, generator_copy
from ..gp.prediction import gaussian_mixture_quantiles
from ..gp.variational import SparseVariationalGP
from ._checks import as_inputs, as_targets
from .cnf_posterior import FLOW_BASES, standard_normal
from .image_skip import ConvSkip, check_image_shape
from .protocol import TrainsItsBound

__all__ = ["LinearMean", "GPLayer", "DeepGP", "build_deep_gp", "hidden_layer_width", "POSTERIORS", "DRAWS",
           "BASE_GRADIENTS", "select_flow_strength",
           "warm_start_from_gaussian"]

#: the variational families over the inducing outputs understood by `build_deep_gp`: DSVI's Gaussian, the
#: Gaussian-base convolutional flow (default flow), the paper's CNF (diagonal φ(Z) base, shared draws), the
#: layer-wise flow of CNF-DGP Fig. 1
POSTERIORS = ("gaussian", "cnf", "cnf-paper", "flow-layerwise")
#: skip-layer connections of hidden layers: DSVI's fixed linear projection, CNF-DGP §IV-B's 3×3 convolution
SKIPS = ("linear", "dense", "conv")
#: skips whose hidden layers keep the input's width (image layout), with one kernel shared by a layer's GPs:
#: "dense" is the fully connected trainable skip that CNF-DGP §IV-B replaces by the convolution ("conv")
FULL_WIDTH_SKIPS = ("dense", "conv")
#: how a flow posterior's U is drawn in the bound: per data point locally reparameterised on DSVI's chain
#: (Gaussian-base flows only), per data point, or one draw for the batch (the paper's eq. 6)
DRAWS = ("coupled", "per-point", "shared")
#: which bound the parameters shared with DSVI follow under draws="coupled" (`DeepGP`)
BASE_GRADIENTS = ("joint", "dsvi")
#: rows of each training batch on which the coupled bound's flow change Δ is estimated with base_gradient="dsvi"
#: (see DeepGP); None: every row
FLOW_ROWS = 32
#: below this many elements per Monte Carlo chunk the no-grad bound evaluates all samples at once
_EVAL_CHUNK_ELEMENTS = 2 ** 24
_LOG_2PI = math.log(2.0 * math.pi)


class LinearMean(nn.Module):
    """m(x) = x W with W [D_in, D_out]; fixed by default (Salimbeni & Deisenroth keep the PCA projection fixed)."""

    def __init__(self, weight: torch.Tensor, learn: bool = False):
        super().__init__()
        weight = _as_float_tensor(weight)
        if weight.dim() != 2:
            raise ValueError(f"weight must have shape [D_in, D_out], got {tuple(weight.shape)}")
        self.weight = nn.Parameter(weight.clone(), requires_grad=learn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight


def hidden_layer_width(input_dim: int, output_dim: int = 1, cap: int = 16) -> int:
    """Hidden width of the TGP paper §5.2: at least min(D, 16) GPs per layer, and never fewer than the outputs.

    That is max(min(D, cap), output_dim): energy (D = 8) gets 8 GPs per layer, as the paper states.
    """
    return max(min(int(input_dim), cap), int(output_dim))


def linear_mean_weight(x: torch.Tensor, output_dim: int) -> torch.Tensor:
    """Projection of Salimbeni & Deisenroth: identity when widths match, the top principal directions
    (right singular vectors of x) when shrinking, identity padded with zero columns when growing."""
    d_in = x.shape[-1]
    if output_dim == d_in:
        return torch.eye(d_in, dtype=x.dtype, device=x.device)
    if output_dim < d_in:
        _, _, vh = torch.linalg.svd(x, full_matrices=False)
        return vh[:output_dim].mT.contiguous()
    eye = torch.eye(d_in, dtype=x.dtype, device=x.device)
    return torch.cat([eye, eye.new_zeros(d_in, output_dim - d_in)], dim=1)


class GPLayer(nn.Module):
    """One DGP layer: D_out independent sparse GPs of a shared input F_{ℓ-1} [..., N, D_in].

    q(f_ℓ(x)) marginals follow the whitened SVGP (TGP appendix eq. 12); given whitened inducing outputs v
    (a flow-posterior sample) they are the conditional p(f | v): mean Aᵀv, var diag K_XX - Σ A², A = Lz⁻¹K_ZX.

    Args:
        inducing_points: Z, [M, D_in] shared by the outputs or [D_out, M, D_in].
        output_dim: D_out (number of GPs in this layer).
        kernel: kernel name for `make_kernel` (built with batch_shape (D_out,), one hyperparameter set per GP)
            or a Kernel instance.
        mean_weight: [D_in, D_out] weight of a linear mean function, or None for a zero mean (last layer).
        white_variance: initial variance of a White kernel added on hidden layers (appendix B.6: 1e-6), or None.
        lengthscale, variance, period: initial kernel hyperparameters when `kernel` is a name.
        q_var_init, learn_inducing, jitter: passed to SparseVariationalGP.
        learn_mean: train the linear mean's weight (default False, as in Salimbeni & Deisenroth).
        mean_function: a module [..., N, D_in] -> [..., N, D_out] used as the mean instead of `mean_weight`
            (e.g. the convolutional skip `ConvSkip` of image layers).
        shared_kernel: one set of kernel hyperparameters for all D_out GPs (kernel batch shape ()), so K_ZX is
            computed once per layer instead of D_out times: what makes image-wide layers (D_out = C·H·W) cheap.

    See Also:
        :class:`flowgp.models.DeepGP`, :func:`flowgp.models.build_deep_gp`.
    """

    def __init__(
        self,
        inducing_points: torch.Tensor,
        output_dim: int,
        kernel: str | Kernel = "rbf",
        mean_weight: torch.Tensor | None = None,
        white_variance: float | None = None,
        lengthscale=1.0,
        variance=1.0,
        q_var_init: float = 1e-5,
        learn_inducing: bool = True,
        learn_mean: bool = False,
        period=1.0,
        jitter: float | None = None,
        mean_function: nn.Module | None = None,
        shared_kernel: bool = False,
    ):
        super().__init__()
        z = _as_float_tensor(inducing_points)
        if isinstance(output_dim, bool) or not isinstance(output_dim, (int, np.integer)) or output_dim < 1:
            raise ValueError(f"output_dim must be a positive integer, got {output_dim!r}")
        if z.dim() not in (2, 3):
            raise ValueError(f"inducing_points must have shape [M, D_in] or [D_out, M, D_in], got {tuple(z.shape)}")
        d_in = z.shape[-1]
        batch = () if shared_kernel else (int(output_dim),)
        if isinstance(kernel, str):
            kern = make_kernel(kernel, d_in, batch_shape=batch, lengthscale=lengthscale,
                               variance=variance, period=period, dtype=z.dtype)
        elif isinstance(kernel, Kernel):
            kern = kernel
        else:
            raise TypeError(f"kernel must be a kernel name such as 'rbf' or a Kernel, got {type(kernel).__name__}")
        if white_variance is not None:
            kern = Sum(kern, White(d_in, variance=white_variance, batch_shape=batch, dtype=z.dtype))
        if mean_function is not None and mean_weight is not None:
            raise ValueError("give mean_weight (a linear mean) or mean_function, not both")
        mean = mean_function
        if mean_weight is not None:
            mean_weight = torch.as_tensor(mean_weight, dtype=z.dtype)
            if tuple(mean_weight.shape) != (d_in, int(output_dim)):
                raise ValueError(
                    f"mean_weight must have shape [D_in, D_out] = [{d_in}, {output_dim}], got {tuple(mean_weight.shape)}"
                )
            mean = LinearMean(mean_weight, learn=learn_mean)
        self.gp = SparseVariationalGP(kern, z, int(output_dim), mean, q_var_init, learn_inducing, jitter)

    @property
    def input_dim(self) -> int:
        return self.gp.inducing_points.shape[-1]

    @property
    def output_dim(self) -> int:
        return self.gp.num_outputs

    @property
    def num_inducing(self) -> int:
        return self.gp.num_inducing

    def kl_divergence(self) -> torch.Tensor:
        """KL[q(v_ℓ) || N(0, I)] of the layer's own Gaussian posterior (appendix eq. 9)."""
        return self.gp.kl_divergence()

    def conditional(self, x: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Marginals of p(f(x) | v) for whitened inducing outputs v [..., D_out, M]: mean, var [..., N, D_out].

        The variational core's `SparseVariationalGP.conditional` (TGP appendix eq. 12 with S = 0), which also
        checks v's shape.
        """
        mean, var = self.gp.conditional(x, v)
        return mean, var

    def chol_inverse(self) -> torch.Tensor:
        """Lz⁻¹ [Lb, M, M] of the layer's K_ZZ (for several projections in one step: one Cholesky for all)."""
        return lower_inverse(self.gp.kzz_cholesky())

    def _projection(self, flat: torch.Tensor, chol_inverse: torch.Tensor | None = None):
        """A = Lz⁻¹ K_ZX [Lb, M, Q] and the conditional variance k̃ = diag K_XX - Σ A² [Lb, Q] of points [Q, D_in]
        (`chol_inverse`: Lz⁻¹ when the caller has it)."""
        if chol_inverse is None:
            a, _ = self.gp.projection(flat)
        else:
            a = chol_inverse @ self.gp.kernel(self.gp.inducing_points, flat.unsqueeze(-3))
        return a, (self.gp.kernel.diag(flat.unsqueeze(-3)) - a.square().sum(-2)).clamp_min(1e-12)

    def conditional_per_point(self, x: torch.Tensor, v: torch.Tensor,
                              chol_inverse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Marginals of p(f(x_p) | v⁽ᵖ⁾) with one whitened draw per point: mean, var [S, N, D_out].

        x: [N, D_in] (shared by the S samples) or [S, N, D_in]; v: [D_out, M, P] channels-first with P = S·N
        columns in sample-major order (column s·N + n is sample s of point n). Since A = Lz⁻¹ K_ZX does not
        depend on v, mean_p = a_pᵀ v⁽ᵖ⁾ is a batched dot product and var_p = k_pp - a_pᵀ a_p is shared by all
        draws of a point (TGP appendix eq. 12 with S = 0, one v per column). `chol_inverse`: Lz⁻¹ when the
        caller has it (see `chol_inverse`).
        """
        if x.dim() not in (2, 3) or x.shape[-1] != self.input_dim:
            raise ValueError(f"x must have shape [N, {self.input_dim}] or [S, N, {self.input_dim}], got {tuple(x.shape)}")
        d_out, m = self.output_dim, self.num_inducing
        if v.dim() != 3 or tuple(v.shape[:2]) != (d_out, m):
            raise ValueError(f"v must have shape [{d_out}, {m}, P] (D_out, M, draws), got {tuple(v.shape)}")
        n = x.shape[-2]
        flat = x.reshape(-1, x.shape[-1])  # [Q, D_in], Q = N or S·N
        q = flat.shape[0]
        if v.shape[-1] % q or (x.dim() == 3 and v.shape[-1] != q):
            raise ValueError(f"v has {v.shape[-1]} draws, not a multiple of the {q} points of x (S·N draws needed)")
        reps = v.shape[-1] // q
        a, var = self._projection(flat, chol_inverse)
        mean = (a.unsqueeze(-2) * v.reshape(d_out, m, reps, q)).sum(-3)  # [D_out, reps, Q]
        var = var.unsqueeze(-2).expand(d_out, reps, q)
        s = v.shape[-1] // n
        mean = mean.reshape(d_out, s, n).permute(1, 2, 0)
        var = var.reshape(d_out, s, n).permute(1, 2, 0)
        if self.gp.mean_function is not None:
            mean = mean + self.gp.mean_function(x)
        return mean, var

    def marginal_parts(self, x: torch.Tensor,
                       chol_inverse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q(f(x)) marginals split into their parts: mean [..., N, D_out], the conditional variance
        k̃ = k_xx - aᵀa [..., N, D_out] and Rᵀa [D_out, M, Q] (Q = the points of x, leading axes folded in
        row-major order), so that var = k̃ + |Rᵀa|² (TGP appendix eq. 12, a = Lz⁻¹ k_Zx, S = R Rᵀ).

        What the locally reparameterised per-point draws of U need (`DeepGP`, draws="coupled").
        `chol_inverse`: Lz⁻¹ when the caller has it.
        """
        lead, n = x.shape[:-2], x.shape[-2]
        flat = x.reshape(-1, x.shape[-1])
        d_out = self.output_dim
        a, kt = self._projection(flat, chol_inverse)
        a = a.expand(d_out, -1, -1)
        mean = (self.gp.q_mu.unsqueeze(-1) * a).sum(-2)  # [D_out, Q]
        rta = self.gp.q_sqrt_tril().mT @ a  # [D_out, M, Q]
        mean = mean.mT.reshape(lead + (n, d_out))
        kt = kt.expand(d_out, -1).mT.reshape(lead + (n, d_out))
        if self.gp.mean_function is not None:
            mean = mean + self.gp.mean_function(x)
        return mean, kt, rta

    def marginals(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q(f(x)) marginals under the layer's Gaussian q(v), mean and var [..., N, D_out].

        The marginals are per point, so the sample axes are folded into N: one kernel batch over the outputs
        (no K_ZZ factor broadcast over samples) and large matrix products instead of many small ones.
        """
        lead, n = x.shape[:-2], x.shape[-2]
        mean, var = self.gp.marginals(x.reshape(-1, x.shape[-1]))
        return mean.reshape(lead + (n, -1)), var.reshape(lead + (n, -1))

    def forward(
        self, x: torch.Tensor, v: torch.Tensor | None = None, generator: torch.Generator | None = None,
        num_samples: int | None = None, common_noise: bool = False, batch_rows: tuple[int, int] | None = None,
        eps: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(sample, mean, var) of f(x), each [S, N, D_out], for x [S, N, D_in] (or [N, D_in] with num_samples).

        The sample is mean + sqrt(var)·ε with independent ε per point and output (the marginal trick,
        Salimbeni & Deisenroth eq. 7). With v (whitened inducing outputs, [S, D_out, M]) the marginals are
        those of p(f | v), as needed by a non-Gaussian q(U). With common_noise every point uses the same ε
        (per sample and output): each point's draws keep their distribution, and a point's prediction no longer
        depends on which other points are predicted with it (common random numbers).
        `batch_rows` = (offset, B): these N rows are rows offset..offset+N of a global batch of B split over
        processes; ε is drawn for all B rows and sliced, so a row's draw does not depend on the split.
        `eps`: ε drawn beforehand (`layer_noise`, shape [S, N, D_out], or [S, 1, D_out] with common_noise),
        used instead of drawing here; `generator` and `batch_rows` are then not used.
        """
        if x.dim() < 2 or x.shape[-1] != self.input_dim:
            raise ValueError(f"x must have shape [S, N, {self.input_dim}] or [N, {self.input_dim}], got {tuple(x.shape)}")
        mean, var = self.marginals(x) if v is None else self.conditional(x, v)
        shape = mean.shape
        if num_samples is not None and mean.dim() == 2:
            shape = (int(num_samples),) + tuple(shape)
        noise_shape = tuple(shape[:-2]) + (1, shape[-1]) if common_noise else shape
        if eps is None:
            eps = draw_rows(lambda s: torch.randn(s, dtype=mean.dtype, device=mean.device, generator=generator),
                            noise_shape, None if common_noise else batch_rows)
        elif tuple(eps.shape) != tuple(noise_shape):
            raise ValueError(f"eps must have shape {tuple(noise_shape)} (the layer's noise), got {tuple(eps.shape)}")
        sample = mean + var.sqrt() * eps
        return sample, mean.expand(shape), var.expand(shape)


# not traced by torch.compile, like `draw_rows` (a draw from a torch.Generator is a graph break): calling it once
# for all layers keeps a deep GP's compiled step in one graph after it
@torch.compiler.disable
def layer_noise(layers, num_samples: int, rows: int, generator, dtype, device, batch_rows=None,
                common_noise: bool = False) -> list[torch.Tensor]:
    """The ε of DSVI's marginal samples for every layer, [S, N, d_ℓ] each ([S, 1, d_ℓ] with `common_noise`),
    drawn in layer order exactly as `GPLayer.forward` draws them one layer at a time (same shapes, dtype and
    generator calls, so the same numbers); `batch_rows` as there."""
    width = 1 if common_noise else int(rows)
    return [draw_rows(lambda shape: torch.randn(shape, dtype=dtype, device=device, generator=generator),
                      (int(num_samples), width, layer.output_dim), None if common_noise else batch_rows)
            for layer in layers]


class DeepGP(TrainsItsBound, nn.Module):
    """A deep GP F_L = f_L ∘ … ∘ f_1(X) with likelihood p(y | F_L) (CNF-DGP paper §II, eq. 3).

    Args:
        layers: GPLayer sequence; layer ℓ's input width must equal layer ℓ-1's output width.
        likelihood: defaults to GaussianLikelihood(num_outputs = last layer's width).
        posterior: None for independent Gaussian q(U_ℓ) per layer (DSVI), or a flow posterior with
            `sample(num_samples, inducing_inputs, generator) -> ([v_ℓ [S, D_ℓ, M]], log q [S])` (cnf_posterior module),
            or one with `gaussian_base = True` and `draw(layers, P, generator)` (the Gaussian-base flow, whose
            base is the layers' own q(v), which then stay trainable).
        num_samples: S used by `elbo` when none is given (training): samples per data point.
        draws: "per-point" (the default: an independent draw of U for every point and sample), "coupled"
            (Gaussian-base flows: DSVI's chain with locally reparameterised draws of U, exactly DSVI's estimator
            at the identity flow; see the module docstring) or "shared" (one draw per sample shared by the batch,
            the paper's eq. 6); flow posteriors only.
        base_gradient: with draws="coupled", "dsvi" (the default: the base q(v), kernels, inducing inputs, mean
            functions and likelihood follow DSVI's bound, computed by DSVI's own code on the same draws, and only
            the flow steps follow the flow's change of the bound: trained with the same seed, the shared
            parameters are a DSVI fit's bit for bit, the model is DSVI plus a learned correction, and the flow's
            gradient noise never reaches the base) or "joint" (every parameter follows the flow posterior's
            bound). The value returned is the flow posterior's bound either way. None: "dsvi" with coupled
            draws, "joint" otherwise.
        flow_rows: with base_gradient="dsvi", the number of rows of each training batch on which the flow's
            change Δ of the bound is estimated: a uniformly random subset (a minibatch of the minibatch, so
            (N/b) Σ_b Δ_n stays unbiased), drawn by the coupling's generator, so DSVI's part and every shared
            parameter's gradient are unchanged. Δ is a difference of two estimates on the same draws (0 at the
            identity), far less noisy per row than the bound itself, and pushing every row's U through the flow
            costs several DSVI steps: a few dozen rows carry the flow's gradient for a fraction of that cost.
            None: every row. Evaluation without gradients always uses every row.
        quadrature_points: Gauss-Hermite points for non-Gaussian likelihood expectations.
        predict_quadrature_points: points for predictive densities under non-Gaussian likelihoods.

    See Also:
        :func:`flowgp.models.build_deep_gp` (built and initialised), :class:`flowgp.DeepGPRegressor`.

    Examples:
        >>> import torch
        >>> from flowgp.models import build_deep_gp
        >>> x = torch.randn(40, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        >>> model = build_deep_gp(x, y_dim=1, num_layers=2, num_inducing=8)
        >>> len(model.layers)
        2
    """

    def __init__(
        self,
        layers: Sequence[GPLayer],
        likelihood: Likelihood | None = None,
        posterior: nn.Module | None = None,
        num_samples: int = 1,
        quadrature_points: int = DEFAULTS.quadrature_points,
        predict_quadrature_points: int = DEFAULTS.predict_quadrature_points,
        draws: str | None = None,
        base_gradient: str | None = None,
        flow_rows: int | None = FLOW_ROWS,
    ):
        super().__init__()
        gaussian_base = getattr(posterior, "gaussian_base", False)
        if draws is None:
            draws = "per-point"
        if draws not in DRAWS:
            raise ValueError(f"draws must be one of {DRAWS}, got {draws!r}")
        if draws == "coupled" and not gaussian_base:
            raise ValueError("draws='coupled' needs a Gaussian-base flow posterior (posterior='cnf'), whose base is "
                             "DSVI's q(U); use draws='per-point' or 'shared' for other posteriors")
        if base_gradient is None:
            base_gradient = "dsvi" if draws == "coupled" else "joint"
        if base_gradient not in BASE_GRADIENTS:
            raise ValueError(f"base_gradient must be one of {BASE_GRADIENTS}, got {base_gradient!r}")
        if base_gradient == "dsvi" and draws != "coupled":
            raise ValueError("base_gradient='dsvi' needs draws='coupled' (the bound split into DSVI's estimate and "
                             f"the flow's change on the same draws), got draws={draws!r}")
        self.draws = draws
        self.base_gradient = base_gradient
        if flow_rows is not None:
            flow_rows = _positive_int(flow_rows, "flow_rows")
        self.flow_rows = flow_rows
        layers = list(layers)
        if not layers:
            raise ValueError("a DeepGP needs at least one layer")
        for i, layer in enumerate(layers):
            if not isinstance(layer, GPLayer):
                raise TypeError(f"layers[{i}] must be a GPLayer, got {type(layer).__name__}")
            if i and layer.input_dim != layers[i - 1].output_dim:
                raise ValueError(
                    f"layers[{i}] takes {layer.input_dim} inputs but layers[{i - 1}] outputs {layers[i - 1].output_dim}"
                )
        self.layers = nn.ModuleList(layers)
        if likelihood is None:  # in the layers' dtype, whatever torch's default dtype is
            likelihood = GaussianLikelihood(num_outputs=layers[-1].output_dim).to(layers[-1].gp.q_mu.dtype)
        self.likelihood = likelihood
        self.posterior = posterior
        if posterior is not None and not getattr(posterior, "gaussian_base", False):
            # q(U) comes from the flow: the layers' own Gaussian q(v) is unused, so keep it out of the optimiser
            for layer in layers:
                layer.gp.q_mu.requires_grad_(False)
                layer.gp.q_sqrt.requires_grad_(False)
        self.num_samples = _positive_int(num_samples, "num_samples")
        self.quadrature_points = int(quadrature_points)
        self.predict_quadrature_points = int(predict_quadrature_points)

    # ----- shapes and checks -------------------------------------------------------------------------
    @property
    def input_dim(self) -> int:
        return self.layers[0].input_dim

    @property
    def num_outputs(self) -> int:
        return self.layers[-1].output_dim

    def validate(self, x, y=None):
        """x checked as [N, D] inputs (and y as [N, L] targets or [N] class labels): x, or (x, y).

        Raises TypeError/ValueError naming the argument on a non-tensor, a wrong shape or non-finite values.
        """
        x = as_inputs(x, self.input_dim)
        if y is None:
            return x
        if y.dim() == 1 and not y.is_floating_point():  # class labels for a multiclass likelihood
            if y.shape[0] != x.shape[0]:
                raise ValueError(f"y has {y.shape[0]} labels but x has {x.shape[0]} rows")
            return x, y
        return x, as_targets(y, x.shape[0], self.num_outputs)

    # ----- sampling through the layers ---------------------------------------------------------------
    def sample_inducing(self, num_samples: int, generator=None):
        """(list of whitened v_ℓ [S, D_ℓ, M] or None, KL estimate) for one ELBO evaluation.

        Gaussian q: v is integrated analytically per layer and the KL is closed form. Flow q: v ~ q(V) and
        KL ≈ (1/S) Σ_s [log q(v_s) - log N(v_s; 0, I)] (CNF-DGP eq. 6; whitening leaves the KL unchanged).
        """
        if self.posterior is None:
            return None, sum(layer.kl_divergence() for layer in self.layers)
        if getattr(self.posterior, "gaussian_base", False):
            if self.posterior.is_identity():
                # q(U) is exactly the Gaussian base (e.g. a flow kept at strength 0): integrate U per layer as
                # DSVI does, the same distribution with the lower-variance estimator (draws nothing for U)
                return None, self.posterior.gaussian_kl(self.layers)
            return self.posterior.sample(num_samples, self.layers, generator=generator)
        z = [layer.gp.inducing_points for layer in self.layers]
        vs, log_q = self.posterior.sample(num_samples, z, generator=generator)
        log_p = sum(-0.5 * (v.square() + _LOG_2PI).sum((-2, -1)) for v in vs)
        return vs, (log_q - log_p).mean()

    def draw_inducing(self, num_draws: int, generator=None):
        """P independent draws of all layers' whitened U from a flow posterior, for the per-point bound.

        Returns ([v_ℓ [D_ℓ, M, P]] channels-first, KL part known in closed form (a scalar: the Gaussian base's
        KL, or 0), per-draw Monte Carlo KL terms [P]); KL[q(U) || p(U)] = closed part + E[per-draw terms].
        For the paper's and the layer-wise flows the per-draw term is log q(v) - log N(v; 0, I) (eq. 6).
        """
        if self.posterior is None:
            raise ValueError("draw_inducing needs a flow posterior; the Gaussian q(U) is integrated in closed form")
        num_draws = _positive_int(num_draws, "num_draws")
        if getattr(self.posterior, "gaussian_base", False):
            return self.posterior.draw(self.layers, num_draws, generator=generator)
        z = [layer.gp.inducing_points for layer in self.layers]
        vs, log_q = self.posterior.sample(num_draws, z, generator=generator)
        log_p = sum(-0.5 * (v.square() + _LOG_2PI).sum((-2, -1)) for v in vs)
        return [v.permute(1, 2, 0) for v in vs], log_q.new_zeros(()), log_q - log_p

    def propagate_per_point(self, x: torch.Tensor, inducing, generator=None):
        """[(sample, mean, var) per layer], each [S, N, D_ℓ], with one draw of U per point and sample.

        `inducing`: [v_ℓ [D_ℓ, M, S·N]] from `draw_inducing(S·N)` (column s·N + n belongs to point n, sample s).
        """
        outs = []
        h = x
        for layer, v in zip(self.layers, inducing):
            mean, var = layer.conditional_per_point(h, v)
            eps = torch.randn(mean.shape, dtype=mean.dtype, device=mean.device, generator=generator)
            sample = mean + var.sqrt() * eps
            outs.append((sample, mean, var))
            h = sample
        return outs

    def propagate(self, x: torch.Tensor, num_samples: int = 1, generator=None, inducing=None,
                  common_noise: bool = False, batch_rows=None):
        """[(sample, mean, var) per layer], each [S, N, D_ℓ]: S samples pushed through the layers.

        `inducing` is a list of whitened v_ℓ [S, D_ℓ, M] (flow posterior samples); None uses each layer's
        Gaussian marginals. The first layer sees the same X for every sample and is evaluated once.
        `common_noise`: the same ε for every point (see GPLayer.forward), for row-wise predictions.
        """
        num_samples = _positive_int(num_samples, "num_samples")
        noise = [None] * len(self.layers)
        if inducing is None and x.dim() == 2 and x.dtype == self.layers[0].gp.q_mu.dtype:
            # every layer's ε in one call before the chain: the same draws in the same order as drawing them
            # layer by layer, and under torch.compile one graph break (a draw from a torch.Generator is one)
            # instead of one per layer, which split the compiled step into a graph per layer
            noise = layer_noise(self.layers, num_samples, x.shape[0], generator, x.dtype, x.device, batch_rows,
                                common_noise)
        outs = []
        h = x
        for i, layer in enumerate(self.layers):
            v = None if inducing is None else inducing[i]
            sample, mean, var = layer(h, v=v, generator=generator, num_samples=num_samples, common_noise=common_noise,
                                      batch_rows=batch_rows, eps=noise[i])
            outs.append((sample, mean, var))
            h = sample
        return outs

    # ----- objective ---------------------------------------------------------------------------------
    def pointwise_expected_log_likelihood(self, y: torch.Tensor, mean: torch.Tensor, var: torch.Tensor):
        """E_{q(f_L(x_n) | F_{L-1})}[log p(y_n | f)] per sample and point, [S, N] or [S, N, L] (closed form
        for a Gaussian likelihood, Gauss-Hermite otherwise)."""
        return self.likelihood.expected_log_prob(_match_labels(y, mean), mean, var, self.quadrature_points)

    def expected_log_likelihood(self, y: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
        """Σ_n E_{q(f_L(x_n) | F_{L-1})}[log p(y_n | f)] per sample, [S] (closed form for a Gaussian)."""
        ell = self.pointwise_expected_log_likelihood(y, mean, var)
        return ell.reshape(ell.shape[0], -1).sum(-1)

    def elbo(self, x: torch.Tensor, y: torch.Tensor, num_data: int | None = None,
             num_samples: int | None = None, generator: torch.Generator | None = None,
             batch_rows: tuple[int, int] | None = None, indices=None) -> torch.Tensor:
        """Minibatch ELBO (CNF-DGP eq. 3 / eq. 6): (N/B)·Σ_batch (1/S) Σ_s E[log p(y_n | f_L)] - KL.

        Assembled by `flowgp.gp.objective.minibatch_bound`; every Monte Carlo draw (hidden layers, flow q(U))
        comes from `generator` (torch's global RNG when None). `batch_rows` (offset, B): x is part of a global
        batch of B rows split over processes (see GPLayer.forward; passed by flowgp.training.loop). `indices` (the
        rows' positions, flowgp.models.protocol.TrainableModel) is unused.
        """
        x, y = self.validate(x, y)
        num_samples = self.num_samples if num_samples is None else _positive_int(num_samples, "num_samples")
        if self.draws == "coupled" and self.base_gradient == "dsvi" and torch.is_grad_enabled():
            return self._dsvi_plus_flow_elbo(x, y, num_data, num_samples, generator, batch_rows)
        if self.posterior is not None and self.draws in ("per-point", "coupled"):
            return self._per_point_elbo(x, y, num_data, num_samples, generator)
        vs, kl = self.sample_inducing(num_samples, generator)
        return self._propagated_bound(x, y, num_data, num_samples, generator, vs, kl, batch_rows)[0]

    def _propagated_bound(self, x, y, num_data, num_samples, generator, inducing, kl, batch_rows=None):
        """(minibatch bound, [(sample, mean, var) per layer]) with S samples pushed through the layers (`inducing`
        None: each layer's Gaussian marginals, DSVI's estimator) and the KL `kl`."""
        chain = self.propagate(x, num_samples, generator, inducing, batch_rows=batch_rows)
        ell = self.pointwise_expected_log_likelihood(y, chain[-1][1], chain[-1][2]).mean(0)  # [N] or [N, L]
        return minibatch_bound(ell, [kl], num_data, x.shape[0]), chain

    def _per_point_elbo(self, x, y, num_data, num_samples, generator):
        """(N/B) Σ_n (1/S) Σ_s E[log p(y_n | f_L) | U⁽ⁿˢ⁾] - KL with an independent U per point and sample.

        Without gradients (evaluation), the S samples are taken in chunks so that a many-sample estimate on
        the whole training set stays within memory; the estimate is the same average.
        """
        # entries per point and sample; coupled draws also keep Rᵀa, w and ξ of that size next to V and T(V)
        width = sum(layer.output_dim for layer in self.layers) * self.layers[0].num_inducing
        width *= 2 if self.draws == "coupled" else 1
        chunk = num_samples
        if not torch.is_grad_enabled():
            chunk = max(1, min(num_samples, _EVAL_CHUNK_ELEMENTS // max(1, width * x.shape[0])))
        # ell_sum: Σ_s E[log p(y_n | f_L)] per point (coupled draws: DSVI's part; change_sum the flow's change)
        ell_sum, change_sum, corr_sum, kl_closed, done = 0.0, 0.0, 0.0, None, 0
        if self.draws == "coupled":
            # all S samples' chain noise first (small: S·N·d per layer), in DSVI's order, then the coupling's
            # draws: the DSVI part then uses a DSVI model's random numbers however the samples are chunked
            chain_noise, flow_generator = self._chain_noise(x, num_samples, generator)
        while done < num_samples:
            s = min(chunk, num_samples - done)
            if self.draws == "coupled":
                ell, change, kl_closed, corr = self._coupled_terms(x, y, [e[done:done + s] for e in chain_noise],
                                                                   flow_generator)
                change_sum = change_sum + change
            else:
                vs, kl_closed, corr = self.draw_inducing(s * x.shape[0], generator)
                _, mean, var = self.propagate_per_point(x, vs, generator)[-1]
                ell = self.pointwise_expected_log_likelihood(y, mean, var).sum(0)
            ell_sum = ell_sum + ell
            corr_sum = corr_sum + corr.sum()
            done += s
        kl = kl_closed + corr_sum / (num_samples * x.shape[0])
        return minibatch_bound((ell_sum + change_sum) / num_samples, [kl], num_data, x.shape[0])

    def _dsvi_plus_flow_elbo(self, x, y, num_data, num_samples, generator, batch_rows=None):
        """The coupled bound for training with base_gradient="dsvi": its value, DSVI's gradient for every parameter
        but the flow's.

        The DSVI part is computed by DSVI's own code (`_propagated_bound` with the layers' Gaussian marginals and
        the closed-form KL, as a DSVI model's `elbo`), so it is that model's estimate bit for bit; the flow's change Δ
        (0 at the identity) is computed on the same chain (its ε replayed from a copy of the generator) and only
        its derivative with respect to the flow's parameters is kept: the flow steps get ∂Δ/∂φ, the only part of
        the bound that depends on them, and the base q(v), kernels, inducing inputs, mean functions and likelihood
        get DSVI's gradient, whose noise does not grow as T leaves the identity.
        """
        replay = generator_copy(generator, x.device)
        dsvi, chain = self._propagated_bound(x, y, num_data, num_samples, generator, None,
                                             self.posterior.gaussian_kl(self.layers), batch_rows)
        noise, flow_generator = self._chain_noise(x, num_samples, replay, batch_rows)
        # the global batch: these n rows are rows offset..offset+n of it (data-parallel training) or all of it
        n = x.shape[0]
        offset, total = (0, n) if batch_rows is None else (int(batch_rows[0]), int(batch_rows[1]))
        rows = total if self.flow_rows is None else min(total, self.flow_rows)
        selected = None
        if rows < total or batch_rows is not None:
            # Δ on a uniformly random subset of the global batch (itself a uniform minibatch, so (N/b) Σ_b Δ_n
            # stays unbiased), drawn by the coupling's generator: the DSVI part's draws are unchanged. Every
            # rank draws the same subset and the coupling's draws for all of its rows, and keeps its own: a
            # row's draws do not depend on the number of processes
            order = (torch.randperm(total, generator=flow_generator, device=x.device)[:rows] if rows < total
                     else torch.arange(total, device=x.device))
            positions = ((order >= offset) & (order < offset + n)).nonzero().squeeze(-1)
            keep = order[positions] - offset
            x, y = x[keep], y[keep]
            noise = [e[:, keep] for e in noise]
            chain = [tuple(t[..., keep, :] for t in layer) for layer in chain]
            selected = (positions, rows)
        if x.shape[0] == 0:  # none of this rank's rows is in the subset: its share of Δ is 0
            return dsvi
        _, change, _, corr = self._coupled_terms(x, y, noise, flow_generator, chain=chain, rows=selected)
        # (B/n) [(N/b) Σ Δ_n - Σ c / (S b)] over this rank's selected rows: the training loop weighs a rank's
        # bound by n/B, so the ranks' shares sum to the one-process estimate (the factor is 1 there)
        delta = minibatch_bound(change / num_samples, [corr.sum() / (num_samples * rows)], num_data, rows)
        if total != n:
            delta = delta * (total / n)
        flow = [p for p in self.posterior.parameters() if p.requires_grad]
        if not flow or not delta.requires_grad:
            return dsvi + delta.detach()
        grads = torch.autograd.grad(delta, flow, allow_unused=True)
        # a term whose value is 0 and whose gradient is ∂Δ/∂φ for the flow's parameters and nothing else
        link = sum(((g * p).sum() for g, p in zip(grads, flow) if g is not None), delta.new_zeros(()))
        return dsvi + delta.detach() + (link - link.detach())

    def _chain_noise(self, x, num_samples, generator, batch_rows=None, common_noise: bool = False):
        """(DSVI's ε per layer [S, N, d_ℓ], the coupling's generator) for the coupled bound.

        The ε are drawn as DSVI's own `propagate` draws them (same shapes, order and dtype), so that at the
        identity flow the estimate equals the DSVI model's for the same generator state. The coupling's own
        draws (η, the free part of ξ) come from a generator derived from `generator`'s state, which they leave
        untouched: the DSVI part then consumes exactly a DSVI model's random numbers, step after step, so that
        with base_gradient="dsvi" the shared parameters follow a DSVI fit's trajectory. `batch_rows`: as in
        `GPLayer.forward` (rows of a global batch split over processes; the DSVI part's draws then do not depend
        on the split, the coupling's own draws do). `common_noise`: one ε per sample and output for all points
        ([S, 1, d_ℓ]), as `propagate(common_noise=True)` draws them.
        """
        noise = layer_noise(self.layers, num_samples, x.shape[0], generator, self.layers[0].gp.q_mu.dtype, x.device,
                            batch_rows, common_noise)
        return noise, derived_generator(generator, x.device)

    def _coupled_terms(self, x, y, chain_noise, flow_generator, chain=None, rows=None):
        """Σ_s of DSVI's estimate of E[log p(y_n | f_L)] per point, Σ_s of the flow's change of it per point, the
        Gaussian KL and c(V) per draw (draws="coupled"); the coupled estimate is the sum of the first two.
        The draws are `_coupled_parts`'s; DSVI's part is None when `chain` is given (see there).
        """
        dsvi_last, base_last, flow_last, kl_closed, corr = self._coupled_parts(x, chain_noise, flow_generator, chain,
                                                                               rows=rows)
        ell = None if dsvi_last is None else self.pointwise_expected_log_likelihood(y, *dsvi_last).sum(0)
        change = (self.pointwise_expected_log_likelihood(y, *flow_last)
                  - self.pointwise_expected_log_likelihood(y, *base_last)).sum(0)
        return ell, change, kl_closed, corr

    def _coupled_parts(self, x, chain_noise, flow_generator, chain=None, common_noise: bool = False, rows=None):
        """The last layer's marginals on the coupled draws: DSVI's (mean, var) (None when `chain` is given), the
        base draw's and the flow's, each [S, N, d_L], with the Gaussian KL and c(V) per draw.

        DSVI's chain runs on every point: at layer ℓ, f = μ + σ ε with σ² = k̃ + s², s = |Rᵀa| (U integrated
        out), the last layer's expectation in closed form: ℓ_DSVI(n). Each point's base draw of layer ℓ is then
        built from the same ε (locally reparameterised):
            ζ = (s ε + √k̃ η) / σ,  ε' = (√k̃ ε - s η) / σ   (a rotation of (ε, η): independent N(0, 1)),
            ξ = w ζ + (I - w wᵀ) ξ',  w = Rᵀa / s,  V = m + R ξ,
        so that ξ ~ N(0, I) (V ~ N(m, RRᵀ), independent across layers given the chain) and aᵀV = aᵀm + s ζ. The
        flow chain pushes T(V) through the layers with noise ε'; at T = id it reproduces DSVI's chain exactly,
        as a function of the parameters. The estimate is
            Σ_n ℓ_DSVI(n) + Σ_n [ℓ(n | T(V)) - ℓ(n | V)],
        where ℓ(n | V) takes the last layer at f ~ N(μ + s ζ_L, k̃) (the draw whose average is DSVI's closed
        form), so the change is 0 at the identity draw by draw and grows smoothly with T.

        `chain_noise`, `flow_generator`: from `_chain_noise` (S = the ε's first axis). `chain`: DSVI's
        [(sample, mean, var)] per layer computed with those ε: its samples are the layers' inputs, and DSVI's
        part is not computed again. `common_noise`: the coupling's own draws (η, the free part of ξ) are shared
        by the points too (with ε of shape [S, 1, d]), so a point's draws do not depend on the other points.
        `rows` = (positions [n], R): the points are rows `positions` of R (a global batch split over processes):
        the coupling's own draws are made for all R rows and these rows' are kept (`flowgp.numerics.row_draws.draw_rows`).
        """
        n, last = x.shape[0], len(self.layers) - 1
        rows = None if common_noise else rows
        num_samples = chain_noise[0].shape[0]
        draws, flow_noise, h = [], [], x
        # with DSVI's chain given (base_gradient="dsvi") only the flow's parameters need a gradient, and the base
        # draws V do not depend on them: the draws are built without autograd
        with torch.no_grad() if chain is not None else contextlib.nullcontext():
            # one Lz⁻¹ per layer for both passes (no gradient through K_ZZ is needed from Δ with DSVI's chain)
            inverses = [layer.chol_inverse() for layer in self.layers]
            for i, layer in enumerate(self.layers):
                mean, kt, rta = layer.marginal_parts(h, inverses[i])  # [(S,) N, d], [(S,) N, d], [d, M, (S·)N]
                d_out, m = layer.output_dim, layer.num_inducing
                if mean.dim() == 2:  # the first layer: x is shared by the samples
                    mean, kt = mean.expand(num_samples, -1, -1), kt.expand(num_samples, -1, -1)
                    rta = rta.unsqueeze(-2).expand(d_out, m, num_samples, n)
                rta = rta.reshape(d_out, m, num_samples, n)
                s2 = rta.square().sum(1).permute(1, 2, 0)  # [S, N, d]
                if i == last:
                    dsvi_last = None if chain is not None else (mean, kt + s2)
                else:
                    eps, sd = chain_noise[i], (kt + s2).sqrt()
                    sample = mean + sd * eps if chain is None else chain[i][0]
                s_ = s2.clamp_min(torch.finfo(s2.dtype).tiny).sqrt()
                eta = draw_rows(lambda shape: standard_normal(shape, mean, flow_generator),
                                mean.shape[:-2] + (1 if common_noise else n, d_out), rows)
                if i == last:
                    zeta = eta  # the last layer is integrated in closed form: its draw needs no coupling noise
                    base_mean, base_var = mean + s_ * zeta, kt
                else:
                    skt = kt.sqrt()
                    zeta = (s_ * eps + skt * eta) / sd
                    flow_noise.append((skt * eps - s_ * eta) / sd)
                w = rta / s_.permute(2, 0, 1).unsqueeze(1)  # [d, M, S, N] unit vectors (0 where Rᵀa = 0)
                free = draw_rows(lambda shape: standard_normal(shape, mean, flow_generator),
                                 (d_out, m, num_samples, 1 if common_noise else n), rows, dim=-1)
                xi = free + w * (zeta.permute(2, 0, 1).unsqueeze(1) - (w * free).sum(1, keepdim=True))
                draws.append(torch.baddbmm(layer.gp.q_mu.unsqueeze(-1), layer.gp.q_sqrt_tril(),
                                           xi.reshape(d_out, m, num_samples * n)))
                if i != last:
                    h = sample
        inducing, kl_closed, corr = self.posterior.push(self.layers, torch.cat(draws, 0))
        h = x
        for i, (layer, v) in enumerate(zip(self.layers, inducing)):
            mean_f, kt_f = layer.conditional_per_point(h, v, inverses[i])
            if i != last:
                h = mean_f + kt_f.sqrt() * flow_noise[i]
        return dsvi_last, (base_mean, base_var), (mean_f, kt_f), kl_closed, corr

    # ----- prediction --------------------------------------------------------------------------------
    def predict_f_samples(self, x: torch.Tensor, num_samples: int = 100, generator=None, common_noise: bool = False):
        """Last-layer marginals (mean, var) [S, N, L] for S samples of the hidden layers (and of q(U));
        `common_noise`: the same hidden-layer ε for every point, so that each row's result depends on the
        generator's state alone, not on the other rows (see GPLayer.forward)."""
        x = self.validate(x)
        vs, _ = self.sample_inducing(num_samples, generator)
        _, mean, var = self.propagate(x, num_samples, generator, vs, common_noise)[-1]
        return mean, var

    def predict_components(self, x: torch.Tensor, num_samples: int = 100, generator=None,
                           common_noise: bool = False):
        """q(f_L(x*)) as a weighted Gaussian mixture: (mean, var [C, N, L], weights [C] summing to 1).

        Usually the S samples of `predict_f_samples` with weights 1/S. For a Gaussian-base flow away from the
        identity the weights are signed (a control variate): the S components of DSVI's estimate under the
        base (U integrated per layer), plus the flow's last-layer conditionals on S coupled draws of U per point
        (`_coupled_parts`), minus the base's conditionals on the same draws, each 1/S. The DSVI term and the base
        term have the same expectation (the base's predictive) and the flow term's is the flow's, so the
        estimate is unbiased for the flow's predictive; its noise is DSVI's plus what the flow changes. The
        flow's samples alone (U shared by the points, each component a conditional given U) give a mixture of
        narrow conditionals whose log-density estimate is biased low. At the identity the last two terms cancel
        draw by draw.
        """
        x = self.validate(x)
        posterior = self.posterior
        if not getattr(posterior, "gaussian_base", False) or posterior.is_identity():
            mean, var = self.predict_f_samples(x, num_samples, generator, common_noise)
            return mean, var, mean.new_full((mean.shape[0],), 1.0 / mean.shape[0])
        num_samples = _positive_int(num_samples, "num_samples")
        replay = generator_copy(generator, x.device)
        chain = self.propagate(x, num_samples, generator, common_noise=common_noise)
        noise, flow_generator = self._chain_noise(x, num_samples, replay, common_noise=common_noise)
        _, base, flow, _, _ = self._coupled_parts(x, noise, flow_generator, chain=chain, common_noise=common_noise)
        mean = torch.cat([chain[-1][1], flow[0], base[0]])
        var = torch.cat([chain[-1][2], flow[1], base[1]])
        weights = mean.new_full((3 * num_samples,), 1.0 / num_samples)
        weights[2 * num_samples:] = -1.0 / num_samples
        return mean, var, weights

    def predict_f(self, x: torch.Tensor, num_samples: int = 100, generator=None):
        """Mean and variance of q(f_L(x*)) (the mixture of `predict_components`), each [N, L]."""
        return _mixture_moments(*self.predict_components(x, num_samples, generator))

    def predict(self, x: torch.Tensor, num_samples: int = 100, generator=None, common_noise: bool = False):
        """Predictive mean and variance of y* (noise included) under the mixture of `predict_components`, [N, L]."""
        mean, var, weights = self.predict_components(x, num_samples, generator, common_noise)
        if not hasattr(self.likelihood, "predictive_moments"):
            raise TypeError(f"{type(self.likelihood).__name__} has no predictive_moments; use predict_f")
        return _mixture_moments(*self.likelihood.predictive_moments(mean, var), weights)

    def log_predictive_density(self, x: torch.Tensor, y: torch.Tensor, num_samples: int = 100, generator=None,
                               common_noise: bool = False):
        """log p(y* | x*) ≈ log Σ_c w_c p(y* | component c), [N, L] (or [N]): the S samples' log-mean-exp, or
        the signed control variate of `predict_components` (where its estimate is not positive, a point falls
        back to the flow's own components)."""
        x, y = self.validate(x, y)
        mean, var, weights = self.predict_components(x, num_samples, generator, common_noise)
        lpd = self.likelihood.predictive_log_density(_match_labels(y, mean), mean, var, self.predict_quadrature_points)
        if bool((weights > 0).all()):
            return torch.logsumexp(lpd + weights.log().reshape((-1,) + (1,) * (lpd.dim() - 1)), dim=0)
        top = lpd.amax(0)
        scaled = (lpd - top).exp() * weights.reshape((-1,) + (1,) * (lpd.dim() - 1))
        total = scaled.sum(0)
        s = weights.shape[0] // 3
        flow_only = torch.logsumexp(lpd[s:2 * s], dim=0) - math.log(s)
        return torch.where(total > 0, top + total.clamp_min(torch.finfo(total.dtype).tiny).log(), flow_only)

    def predict_quantiles(self, x: torch.Tensor, probs, num_samples: int = 100, generator=None,
                          iterations: int = 80, common_noise: bool = False) -> torch.Tensor:
        """Quantiles [P, N, L] of the Gaussian mixture p(y*) = (1/S) Σ_s N(m_s, v_s + σ²) (flowgp.gp.prediction.mixture_quantiles)."""
        mean, var = self.predict_f_samples(x, num_samples, generator, common_noise)
        if not hasattr(self.likelihood, "predictive_moments"):
            raise TypeError(f"{type(self.likelihood).__name__} has no predictive_moments; quantiles need one")
        mean, var = self.likelihood.predictive_moments(mean, var)
        return gaussian_mixture_quantiles(mean, var, probs, iterations)

    def sample_f(self, x: torch.Tensor, num_samples: int = 1, generator=None) -> torch.Tensor:
        """Samples of f_L(x*) [S, N, L], independent across x* (the marginal trick, not joint draws)."""
        x = self.validate(x)
        vs, _ = self.sample_inducing(num_samples, generator)
        return self.propagate(x, num_samples, generator, vs)[-1][0]

    def sample_y(self, x: torch.Tensor, num_samples: int = 1, generator=None) -> torch.Tensor:
        """Draws of y* [S, N, L] (independent across x*): f_L from `sample_f` plus the likelihood's noise, the
        mixture whose moments `predict` estimates."""
        if not hasattr(self.likelihood, "sample"):
            raise TypeError(f"{type(self.likelihood).__name__} cannot draw y; sample_y needs a likelihood with "
                            "sample() (a regression likelihood)")
        return self.likelihood.sample(self.sample_f(x, num_samples, generator), generator=generator)


def _as_float_tensor(value) -> torch.Tensor:
    """A floating tensor keeps its dtype; anything else (arrays, lists, integer tensors) becomes float64."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value
    return torch.as_tensor(value, dtype=torch.float64)


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _match_labels(y: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """Class labels [N] expanded to the samples' leading shape [S, N] (multiclass likelihoods index f [S, N, C])."""
    if not y.is_floating_point() and y.dim() < mean.dim() - 1:
        return y.expand(mean.shape[:-1])
    return y


def _mixture_moments(mean: torch.Tensor, var: torch.Tensor, weights: torch.Tensor | None = None):
    """Mean and variance of a mixture over dim 0 (equal weights, or `weights` [C] summing to 1, possibly signed):
    E[m], E[v + m²] - E[m]²."""
    if weights is None:
        first = mean.mean(0)
        return first, ((var + mean.square()).mean(0) - first.square()).clamp_min(0)
    w = weights.reshape((-1,) + (1,) * (mean.dim() - 1))
    first = (w * mean).sum(0)
    return first, ((w * (var + mean.square())).sum(0) - first.square()).clamp_min(0)


def build_deep_gp(
    x: torch.Tensor,
    y_dim: int,
    num_layers: int,
    num_inducing: int = DEFAULTS.num_inducing,
    kernel: str = "rbf",
    hidden_width: int | None = None,
    likelihood: Likelihood | None = None,
    posterior: str = "gaussian",
    lengthscale=1.0,
    variance=1.0,
    period=1.0,
    white_variance: float = 1e-6,
    q_var_init: float = 1e-5,
    num_samples: int = 1,
    kmeans_restarts: int = DEFAULTS.kmeans_restarts,
    seed: int = 0,
    inducing_points: torch.Tensor | None = None,
    learn_inducing: bool = True,
    flow_steps: int = 2,
    flow_nonlinear: bool = True,
    flow_base: str = "network",
    quadrature_points: int = DEFAULTS.quadrature_points,
    predict_quadrature_points: int = DEFAULTS.predict_quadrature_points,
    generator: torch.Generator | None = None,
    dtype: torch.dtype | None = None,
    device=None,
    draws: str | None = None,
    flow_elementwise: str = "entry",
    skip: str = "linear",
    image_shape: tuple | None = None,
    base_gradient: str | None = None,
    flow_rows: int | None = FLOW_ROWS,
) -> DeepGP:
    """A DeepGP initialised as in Salimbeni & Deisenroth / TGP appendix B.6.

    Hidden layers have `hidden_width` GPs (default `hidden_layer_width(D, y_dim)`, the TGP paper's rule),
    a fixed linear mean (PCA of the propagated inputs / identity) and a White(1e-6) kernel term; the last
    layer has y_dim GPs and zero mean. Every layer has the same M inducing inputs: k-means centres of X
    (best of `kmeans_restarts`, seeded by `seed`) pushed through the preceding mean projections, so that the
    inducing outputs of all layers stack into the M × 1 × Σd_ℓ tensor of the convolutional flow posterior.
    `posterior` is "gaussian" (DSVI), "cnf" (the convolutional flow steps of CNF-DGP §III over DSVI's
    full-covariance Gaussian base, identity at initialisation: `GaussianConvolutionalFlowPosterior`, with
    `flow_elementwise` "entry" or "channel"), "cnf-paper" (the paper's exact design: diagonal base from φ(Z),
    one draw of U shared by the batch) or "flow-layerwise" (the naive flow of Fig. 1); `flow_base` is the
    paper CNF's base: "network" (eq. 9) or "free" (ablation), unused by the other posteriors. `draws`
    ("per-point", "coupled" or "shared", see `DeepGP`) overrides how the bound draws U; by default "coupled"
    for "cnf" (DSVI's chain with locally reparameterised draws of U; "cnf" only), "shared" for "cnf-paper"
    (the paper's eq. 6) and "per-point" for "flow-layerwise"; `base_gradient` ("dsvi", the default with coupled
    draws, or "joint") is which bound the parameters shared with DSVI follow (see `DeepGP`).

    `skip` is the hidden layers' skip-layer connection: "linear" (the fixed projection above), "conv", the
    convolutional skip-layer connection of CNF-DGP §IV-B for images (`image_shape` = (C, H, W), x holding the
    images flattened in that order), or "dense", the fully connected trainable skip that "conv" replaces (its
    ablation). With "conv" and "dense" hidden layers keep the input's width (the image layout: C·H·W GPs), take
    a trainable mean starting at the identity (`ConvSkip`, a 3×3 convolution; or a D×D linear map) and one
    kernel shared by the layer's GPs on the flattened image, with initial lengthscale `lengthscale`·sqrt(D)
    (distances between standardised images grow as the square root of the number of pixels).

    Randomness (the flow posterior's networks) comes from `generator` (a CPU generator), by default
    `torch.Generator().manual_seed(seed)`; torch's and NumPy's global RNGs are never touched. The model is
    built in x's dtype and moved to `dtype` / `device` at the end (default: x's).

    Args:
        x, y_dim, num_layers, num_inducing: training inputs [N, D], outputs of the last layer, layers L, M.
        kernel, lengthscale, variance, period: every layer's kernel name and initial hyperparameters.
        hidden_width, white_variance, skip, image_shape: the hidden layers, as above (White's variance).
        likelihood: the last layer's likelihood (None: GaussianLikelihood(num_outputs=y_dim)).
        posterior, flow_base, draws, base_gradient, flow_elementwise, generator, dtype, device: as above.
        q_var_init, num_samples: initial whitened S = value·I; samples per point in each training bound.
        kmeans_restarts, seed, inducing_points, learn_inducing: Z from k-means (or given), trained or not.
        flow_steps, flow_nonlinear: flow posteriors' steps, each with a sinh-arcsinh step when nonlinear.
        quadrature_points, predict_quadrature_points, flow_rows: as in :class:`flowgp.models.DeepGP`.

    See Also:
        :class:`flowgp.models.DeepGP` (an example), :class:`flowgp.DeepGPRegressor` (which calls it).
    """
    x = as_inputs(x)
    num_layers = _positive_int(num_layers, "num_layers")
    y_dim = _positive_int(y_dim, "y_dim")
    draws = _check_deep_options(posterior, flow_base, draws, skip, image_shape)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if generator is None:
        generator = torch.Generator().manual_seed(int(seed))
    width = _hidden_width(x.shape[1], y_dim, hidden_width, skip, image_shape)
    z = initial_inducing_inputs(x, num_inducing, kmeans_restarts, seed, inducing_points, x.dtype, x.device)
    layers = _deep_layers(x, z, num_layers, y_dim, width, skip, image_shape, kernel=kernel,
                          white_variance=white_variance, lengthscale=lengthscale, variance=variance,
                          q_var_init=q_var_init, learn_inducing=learn_inducing, period=period)
    flow = _flow_posterior(posterior, layers, flow_steps, flow_nonlinear, flow_elementwise, flow_base, q_var_init,
                           generator)
    model = DeepGP(layers, likelihood, flow, num_samples=num_samples, quadrature_points=quadrature_points,
                   predict_quadrature_points=predict_quadrature_points, draws=draws, base_gradient=base_gradient, flow_rows=flow_rows)
    return model.to(device=x.device if device is None else device, dtype=x.dtype if dtype is None else dtype)


def _check_deep_options(posterior, flow_base, draws, skip, image_shape) -> str:
    """Checks `build_deep_gp`'s named options; returns `draws` (the posterior's default when None)."""
    if posterior not in POSTERIORS:
        raise ValueError(f"posterior must be one of {POSTERIORS}, got {posterior!r}")
    if flow_base not in FLOW_BASES:
        raise ValueError(f"flow_base must be 'network' (CNF-DGP eq. 9) or 'free', got {flow_base!r}")
    if draws is None:
        draws = {"cnf-paper": "shared", "cnf": "coupled"}.get(posterior, "per-point")
    if draws not in DRAWS:
        raise ValueError(f"draws must be one of {DRAWS} (or None for the posterior's default), got {draws!r}")
    if skip not in SKIPS:
        raise ValueError(f"skip must be one of {SKIPS}, got {skip!r}")
    if skip == "conv" and image_shape is None:
        raise ValueError("skip='conv' needs image_shape=(channels, height, width) of the flattened images in x")
    return draws


def _hidden_width(d: int, y_dim: int, hidden_width, skip: str, image_shape) -> int:
    """GPs per hidden layer: the input's width for full-width skips, else `hidden_width` or the TGP paper's rule."""
    if image_shape is not None:
        check_image_shape(image_shape, d)
    if skip in FULL_WIDTH_SKIPS:
        if hidden_width is not None and int(hidden_width) != d:
            raise ValueError(f"with skip={skip!r} the hidden layers keep the input's width (C·H·W = {d}); "
                             f"leave hidden_width=None, got {hidden_width!r}")
        return d
    return hidden_layer_width(d, y_dim) if hidden_width is None else _positive_int(hidden_width, "hidden_width")


def _deep_layers(x, z, num_layers: int, y_dim: int, width: int, skip: str, image_shape, *, kernel, white_variance,
                 lengthscale, variance, q_var_init, learn_inducing, period) -> list:
    """The GPLayers of `build_deep_gp`: every layer's Z is z pushed through the preceding mean projections."""
    d = x.shape[1]
    if image_shape is not None:
        channels, height, img_width = check_image_shape(image_shape, d)
    layers = []
    x_run, z_run = x, z
    for ell in range(num_layers):
        last = ell == num_layers - 1
        d_out = y_dim if last else width
        # full-width skips: the layer's GPs read the flattened image (its first layer the input, later ones the
        # previous layer's image-shaped outputs); the skip starts at the identity, so Z passes through unchanged
        full_width = skip in FULL_WIDTH_SKIPS
        weight, mean = None, None
        if not last and skip == "conv":
            mean = ConvSkip(channels, channels, height, img_width, dtype=x.dtype, device=x.device)
        elif not last and skip == "dense":
            mean = LinearMean(torch.eye(d, dtype=x.dtype, device=x.device), learn=True)
        elif not last:
            weight = linear_mean_weight(x_run, d_out)
        layer = GPLayer(z_run, d_out, kernel=kernel, mean_weight=weight, mean_function=mean,
                        white_variance=None if last else white_variance,
                        lengthscale=lengthscale * math.sqrt(d) if full_width else lengthscale, variance=variance,
                        q_var_init=q_var_init, learn_inducing=learn_inducing, period=period,
                        shared_kernel=full_width and not last)
        layers.append(layer.to(device=x.device, dtype=x.dtype))
        if weight is not None:
            x_run, z_run = x_run @ weight, z_run @ weight
    return layers


def _flow_posterior(posterior: str, layers, flow_steps, flow_nonlinear, flow_elementwise, flow_base, q_var_init,
                    generator):
    """The flow posterior over the layers' inducing outputs `posterior` names (None for "gaussian")."""
    from .cnf_posterior import ConvolutionalFlowPosterior, GaussianConvolutionalFlowPosterior, LayerwiseFlowPosterior

    # the flow's parameters are drawn on the CPU in x's dtype (a CPU generator) and moved with the model
    if posterior == "cnf":
        return GaussianConvolutionalFlowPosterior(layers, num_steps=flow_steps, nonlinear=flow_nonlinear,
                                                  elementwise=flow_elementwise)
    if posterior == "cnf-paper":
        return ConvolutionalFlowPosterior(layers, num_steps=flow_steps, nonlinear=flow_nonlinear,
                                          scale_init=math.sqrt(q_var_init), base=flow_base, generator=generator)
    if posterior == "flow-layerwise":
        return LayerwiseFlowPosterior(layers, num_steps=flow_steps, nonlinear=flow_nonlinear,
                                      scale_init=math.sqrt(q_var_init), generator=generator)
    return None


def warm_start_from_gaussian(model: DeepGP, gaussian_model: DeepGP) -> DeepGP:
    """Start `model` (a Gaussian-base flow posterior, `posterior="cnf"`) from a fitted DSVI `gaussian_model`.

    Copies every layer's state (kernel, inducing inputs Z, mean function, q(v) = the flow's Gaussian base) and
    the likelihood's; the flow steps are left as they are (identity when fresh, so the warm-started model's
    q(U) is then exactly the DSVI posterior). Both models must have the same layer shapes. Returns `model`.
    """
    if not isinstance(model, DeepGP) or not isinstance(gaussian_model, DeepGP):
        raise TypeError("model and gaussian_model must both be DeepGP instances")
    if gaussian_model.posterior is not None:
        raise ValueError("gaussian_model must have the Gaussian (DSVI) posterior, posterior=None")
    if not getattr(model.posterior, "gaussian_base", False):
        raise ValueError("model must have a Gaussian-base flow posterior (posterior='cnf'); other flows do not "
                         "contain the DSVI posterior")
    if len(model.layers) != len(gaussian_model.layers):
        raise ValueError(f"model has {len(model.layers)} layers, gaussian_model {len(gaussian_model.layers)}")
    with torch.no_grad():
        for i, (dst, src) in enumerate(zip(model.layers, gaussian_model.layers)):
            dst_state, src_state = dst.state_dict(), src.state_dict()
            if dst_state.keys() != src_state.keys() or any(
                    dst_state[k].shape != src_state[k].shape for k in dst_state):
                raise ValueError(f"layers[{i}] of the two models differ in structure or shapes")
            dst.load_state_dict(src_state)
            dst.gp.jitter_memory = copy.deepcopy(src.gp.jitter_memory)
        model.likelihood.load_state_dict(gaussian_model.likelihood.state_dict())
    return model


def select_flow_strength(model: DeepGP, x: torch.Tensor, y: torch.Tensor,
                         fractions: Sequence[float] = (0.0, 0.125, 0.25, 0.5, 1.0), num_samples: int = 8,
                         seed: int = 0, max_rows: int = 4096, alternatives: dict | None = None,
                         confirm: bool = True) -> dict:
    """Scale a trained Gaussian-base flow toward the identity where that raises the bound: θ ← λ*·θ.

    Every parameter of `GaussianConvolutionalFlowPosterior` is 0 at the identity (LU factors, log-scales,
    sinh-arcsinh a and log b), so λ·θ runs from the DSVI posterior (λ = 0: exactly the base q(v)) to the trained
    flow (λ = 1). The bound is estimated at every λ in `fractions` with the same random numbers (one generator
    seed, `num_samples` draws per point, on at most `max_rows` rows drawn with that seed), so the differences
    between the λ are estimated far more precisely than the bound itself, and λ* is the best. λ = 0 is always a
    candidate: the selected model's bound is never below that of its own base, the DSVI posterior (the richer
    family contains the simpler one, and the selection keeps the containment when the flow's training has not
    paid off, e.g. where the flow's gradient noise outweighs what a non-Gaussian q(U) can gain).

    `alternatives` ({name: parameter values in the order of `model.posterior.parameters()`}, e.g. averaged
    iterates) are scaled and scored the same way and compete with the trained values.

    `confirm`: the best of several noisy estimates is biased upward (it is chosen because its noise was
    favourable), so a winner with λ* > 0 is scored again against λ = 0 with fresh random numbers (seed + 1; on
    another subset of rows when there are more than `max_rows`) and kept only if it still beats λ = 0 there. A
    flow whose gain was the selection's own noise then falls back to the DSVI posterior (measured: L = 4 power
    split 6 kept λ = 1/8 for a change of -3e-5 nats per point on the bench's independent estimate).

    Returns {λ: bound estimate per row of the trained flow, name: {λ: estimate} per alternative, "selected": λ*,
    "source": "trained" or the alternative's name, "confirmation": {0.0: estimate, λ*: estimate} or None}. The
    model is left at λ*·θ of the selected source.
    """
    if not getattr(model.posterior, "gaussian_base", False):
        raise ValueError("select_flow_strength needs a Gaussian-base flow posterior (posterior='cnf')")
    fractions = sorted({float(f) for f in fractions} | {0.0})
    if any(not 0.0 <= f <= 1.0 for f in fractions):
        raise ValueError(f"fractions must lie in [0, 1], got {fractions}")
    params = list(model.posterior.parameters())
    sources = {"trained": [p.detach().clone() for p in params]}
    for name, values in (alternatives or {}).items():
        values = [torch.as_tensor(v) for v in values]
        if name in ("trained", "selected", "source") or [tuple(v.shape) for v in values] != \
                [tuple(p.shape) for p in params]:
            raise ValueError(f"alternatives[{name!r}] must be a new name with one value per flow parameter, "
                             f"shaped like model.posterior.parameters()")
        sources[name] = values
    x_all, y_all = model.validate(x, y)

    def rows_of(row_seed):
        if x_all.shape[0] <= max_rows:
            return x_all, y_all
        rows = torch.randperm(x_all.shape[0], generator=torch.Generator().manual_seed(int(row_seed)))[:max_rows]
        return x_all[rows.to(x_all.device)], y_all[rows.to(y_all.device)]

    scores = {name: {} for name in sources}
    with torch.no_grad():
        def score(values, f, draw_seed, xs, ys):
            for p, t in zip(params, values):
                p.copy_(f * t)
            gen = torch.Generator(device=xs.device).manual_seed(int(draw_seed))
            return float(model.elbo(xs, ys, num_data=xs.shape[0], num_samples=num_samples, generator=gen)) / xs.shape[0]

        xs, ys = rows_of(seed)
        base = score(sources["trained"], 0.0, seed, xs, ys)  # λ = 0 is the same model for every source
        for name, values in sources.items():
            scores[name] = {f: base if f == 0.0 else score(values, f, seed, xs, ys) for f in fractions}
        # the best (source, λ); ties go to the smaller flow and to the trained values
        order = list(sources)
        best_name, best = max(((n, f) for n in order for f in fractions),
                              key=lambda c: (scores[c[0]][c[1]], -c[1], -order.index(c[0])))
        confirmation = None
        if confirm and best > 0:
            xc, yc = rows_of(seed + 1)
            confirmation = {0.0: score(sources[best_name], 0.0, seed + 1, xc, yc),
                            best: score(sources[best_name], best, seed + 1, xc, yc)}
            if not confirmation[best] > confirmation[0.0]:
                best_name, best = "trained", 0.0
        for p, t in zip(params, sources[best_name]):
            p.copy_(best * t)
    out = dict(scores.pop("trained"))
    out.update(scores)
    return {**out, "selected": best, "source": best_name if best > 0 else "trained", "confirmation": confirmation}
