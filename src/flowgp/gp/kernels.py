"""Covariance functions (Rasmussen & Williams, *Gaussian Processes for Machine Learning*, ch. 4).

Every kernel is a ``torch.nn.Module`` with a ``batch_shape`` (e.g. ``(L,)`` for L independent output GPs)
whose positive parameters are stored unconstrained (``raw_lengthscale``, ``raw_variance``, ``raw_period``)
and exposed through properties that apply a :class:`~flowgp.numerics.constraints.Positive` transform.

Parameter shapes are ``batch_shape + (1, D)`` (ARD lengthscales / periods) or ``batch_shape + (1, 1)``
(shared lengthscales, variances), so they broadcast directly against inputs of shape ``[..., N, D]``.

Broadcasting rule: ``kernel(x1, x2)`` takes ``x1`` of shape ``[..., N, D]`` and ``x2`` of shape
``[..., M, D]``; the leading dims of x1, x2 and the kernel's ``batch_shape`` broadcast together, with
``batch_shape`` aligned immediately before ``(N, D)``, and the result has shape
``broadcast(x1.shape[:-2], x2.shape[:-2], batch_shape) + (N, M)``. For example with ``batch_shape=(L,)``,
``x1`` of shape ``[S, 1, N, D]`` and ``Z`` of shape ``[L, M, D]`` give ``[S, L, N, M]``.
``kernel.diag(x)`` returns ``k(x_n, x_n)`` with shape ``broadcast(x.shape[:-2], batch_shape) + (N,)``
in O(N) without forming the N x N matrix.
"""
from __future__ import annotations

import inspect
import math
import re
from typing import Iterable, Sequence

import torch
from torch import nn

from flowgp.numerics.constraints import Positive
from flowgp.registry import KERNELS

__all__ = [
    "Kernel",
    "RBF",
    "Matern12",
    "Matern32",
    "Matern52",
    "Periodic",
    "Linear",
    "White",
    "Scale",
    "Sum",
    "Product",
    "make_kernel",
    "KERNEL_NAMES",
]

#: lengthscales and periods divide the inputs, so keep them strictly away from zero
LENGTHSCALE_CONSTRAINT = Positive(lower=1e-6)
#: public names of the positive parameters (exposed as properties over raw_<name>)
_PARAMETER_NAMES = frozenset({"lengthscale", "variance", "period"})
#: a zero variance is harmless numerically (the Cholesky jitter covers it), so no lower bound
VARIANCE_CONSTRAINT = Positive(lower=0.0)


# ----------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------
def _as_batch_shape(batch_shape) -> torch.Size:
    if isinstance(batch_shape, int):
        batch_shape = (batch_shape,)
    try:
        shape = torch.Size(batch_shape)
    except TypeError as err:
        raise TypeError(f"batch_shape must be a tuple of ints, got {batch_shape!r}") from err
    if any(s < 1 for s in shape):
        raise ValueError(f"batch_shape entries must be >= 1, got {tuple(shape)}")
    return shape


def _check_input_dim(input_dim) -> int | None:
    if input_dim is None:
        return None
    if isinstance(input_dim, bool) or not isinstance(input_dim, int):
        raise TypeError(f"input_dim must be an int, got {type(input_dim).__name__}")
    if input_dim < 1:
        raise ValueError(f"input_dim must be >= 1, got {input_dim}")
    return input_dim


def _positive_property(name: str, doc: str) -> property:
    """A property reading ``constraint(raw_<name>)`` and writing ``raw_<name> <- constraint.inverse(value)``."""

    def getter(self):
        return self._constraints[name](getattr(self, "raw_" + name))

    def setter(self, value):
        self._set_positive(name, value)

    return property(getter, setter, doc=doc)


def _safe_sqrt(r2: torch.Tensor) -> torch.Tensor:
    """sqrt(r²) with r = 0 (and a zero gradient) where r² is below eps².

    d sqrt(u)/du = 1/(2 sqrt(u)) is infinite at u = 0, which would make the diagonal of K(x, x) produce
    NaN gradients for the Matérn kernels. Below eps² the distance r < eps is indistinguishable from 0 in
    every Matérn profile, so returning exactly 0 keeps k(x, x) exact and its gradient finite.
    """
    tiny = torch.finfo(r2.dtype).eps ** 2
    return torch.where(r2 > tiny, torch.sqrt(r2.clamp_min(tiny)), 0.0)


def _symmetrize_zero_diag(d: torch.Tensor) -> torch.Tensor:
    """Make a distance-like matrix of x against itself exactly symmetric with an exactly zero diagonal.

    The matmul expansion is not bitwise symmetric and leaves O(eps·|x|²) on the diagonal; both are zero
    mathematically (and so is the diagonal's gradient), so we set them exactly.
    """
    d = 0.5 * (d + d.mT)
    d = d.clone()
    d.diagonal(dim1=-2, dim2=-1).zero_()
    return d


def _squared_distance(a: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """||a_n - b_m||² via ||a||² + ||b||² - 2 a·b (one matmul, no [N, M, D] tensor).

    ``b=None`` means b = a (exact symmetry, zero diagonal, clamped at 0). The cross case is not clamped:
    it is the hot path of sparse GPs and every profile tolerates the O(eps) negatives the expansion can
    leave (exp(-r²) stays within rounding of 1, and `_safe_sqrt` maps them to r = 0). Inputs are assumed
    already divided by the lengthscale and centred (see `_centre`).
    """
    a2 = a.pow(2).sum(-1, keepdim=True)  # [..., N, 1]
    if b is None:
        d = a2 + a2.mT - 2.0 * (a @ a.mT)
        return _symmetrize_zero_diag(d).clamp_min(0.0)
    b2 = b.pow(2).sum(-1, keepdim=True)  # [..., M, 1]
    # -2 is folded into the small [M, D] operand and the adds happen in place on the matmul's output,
    # which autograd does not need: two fewer passes over the [N, M] result, forward and backward.
    return (a @ (-2.0 * b).mT).add_(a2).add_(b2.mT)


def _centre(x1: torch.Tensor, x2: torch.Tensor | None):
    """Shift both inputs by the mean of x1 (one D-vector) before expanding squared distances.

    The expansion ||a||² + ||b||² - 2a·b loses precision as ||a||, ||b|| grow relative to ||a - b||;
    distances are shift invariant, so centring recovers that precision. The shift is detached because
    the distances do not depend on it (its gradient contribution is exactly zero).
    """
    shift = x1.detach().reshape(-1, x1.shape[-1]).mean(0)
    return x1 - shift, (None if x2 is None else x2 - shift)


# ----------------------------------------------------------------------------------------------------
# base class
# ----------------------------------------------------------------------------------------------------
class Kernel(nn.Module):
    """Base class: ``kernel(x1, x2=None) -> K`` of shape ``[..., N, M]`` and ``kernel.diag(x) -> [..., N]``.

    Subclasses implement ``_forward(x1, x2)`` (x2 None means x2 = x1) and ``_diag(x)``; the base class
    validates the inputs first. ``spec`` is a short string naming the covariance shape (Scale amplitudes
    are implicit), understood by :func:`make_kernel`.

    Args:
        input_dim: D, the number of input features the kernel accepts (None: any).
        batch_shape: leading shape of independent kernels; default ().
        dtype: dtype of the parameters; default float64.
    """

    spec: str = "kernel"
    #: whether the cross-covariance K(x1, x2) at x2 = x1 equals K(x1) up to rounding (no term that only the
    #: self-covariance carries, such as White noise): sparse GPs then get K_ZZ and K_ZX from one evaluation
    #: K(Z, [Z; X]). False unless a kernel states it.
    cross_matches_self: bool = False
    #: whether every cross-covariance K(x1, x2) between distinct input sets is exactly zero (White noise):
    #: a Sum then leaves the term out of its cross-covariance instead of adding a tensor of zeros
    cross_is_zero: bool = False

    def __init__(self, input_dim: int | None = None, batch_shape: Sequence[int] = (), dtype=torch.float64):
        super().__init__()
        self.input_dim = _check_input_dim(input_dim)
        self.batch_shape = _as_batch_shape(batch_shape)
        self._dtype = dtype
        self._constraints: dict[str, Positive] = {}

    # -- parameters ----------------------------------------------------------------------------------
    def _register_positive(self, name: str, value, shape: Sequence[int], constraint: Positive) -> None:
        shape = torch.Size(shape)
        value = self._broadcast_value(name, value, shape, self._dtype, None)
        raw = constraint.inverse(value)
        self._constraints[name] = constraint
        self.register_parameter("raw_" + name, nn.Parameter(raw))

    @staticmethod
    def _broadcast_value(name, value, shape, dtype, device) -> torch.Tensor:
        value = torch.as_tensor(value, dtype=dtype, device=device).detach()
        try:
            return torch.broadcast_to(value, shape).clone()
        except RuntimeError as err:
            raise ValueError(
                f"{name} of shape {tuple(value.shape)} does not broadcast to the parameter shape {tuple(shape)} "
                "(batch_shape + (1, D) or batch_shape + (1, 1))"
            ) from err

    def _set_positive(self, name: str, value) -> None:
        raw = getattr(self, "raw_" + name)
        value = self._broadcast_value(name, value, raw.shape, raw.dtype, raw.device)
        # copy in place so optimisers holding the Parameter keep tracking it
        with torch.no_grad():
            raw.copy_(self._constraints[name].inverse(value))

    def __setattr__(self, name, value):
        # `scale_kernel.lengthscale = 0.5` on a kernel without that parameter would otherwise silently
        # create an unused attribute; point at the component that owns it instead
        if name in _PARAMETER_NAMES and not isinstance(getattr(type(self), name, None), property):
            raise AttributeError(
                f"{type(self).__name__} has no parameter {name!r}; set it on the component kernel that owns it "
                f"(named parameters: {[n for n, _ in self.named_parameters()]})"
            )
        super().__setattr__(name, value)

    def _param(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """Constrained parameter cast (differentiably) to the inputs' dtype and device."""
        return getattr(self, name).to(dtype=like.dtype, device=like.device)

    # -- validation ----------------------------------------------------------------------------------
    def _check_x(self, x: torch.Tensor, label: str) -> None:
        if not torch.is_tensor(x):
            raise TypeError(f"{label} must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"{label} must be a floating-point tensor, got dtype {x.dtype}")
        if x.dim() < 2:
            raise ValueError(f"{label} must have shape [..., N, D], got {tuple(x.shape)}")
        if self.input_dim is not None and x.shape[-1] != self.input_dim:
            raise ValueError(
                f"{label} has {x.shape[-1]} features but the kernel was built for input_dim={self.input_dim}"
            )

    def _check_inputs(self, x1: torch.Tensor, x2: torch.Tensor | None) -> None:
        self._check_x(x1, "x1")
        batches = [x1.shape[:-2]]
        if x2 is not None:
            self._check_x(x2, "x2")
            if x2.shape[-1] != x1.shape[-1]:
                raise ValueError(f"x1 has {x1.shape[-1]} features but x2 has {x2.shape[-1]}")
            if x2.dtype != x1.dtype or x2.device != x1.device:
                raise TypeError(
                    f"x1 and x2 must share dtype and device, got {x1.dtype}/{x1.device} and {x2.dtype}/{x2.device}"
                )
            batches.append(x2.shape[:-2])
        try:
            torch.broadcast_shapes(*batches, self.batch_shape)
        except RuntimeError as err:
            shapes = ", ".join(str(tuple(b)) for b in batches)
            raise ValueError(
                f"input batch dims {shapes} do not broadcast with the kernel batch_shape {tuple(self.batch_shape)}; "
                "the batch_shape sits immediately before (N, D), so insert singleton dims as needed"
            ) from err

    # -- public API ----------------------------------------------------------------------------------
    def forward(self, x1: torch.Tensor, x2: torch.Tensor | None = None) -> torch.Tensor:
        """K(x1, x2) of shape broadcast(x1.shape[:-2], x2.shape[:-2], batch_shape) + (N, M)."""
        self._check_inputs(x1, x2)
        return self._forward(x1, x2)

    def diag(self, x: torch.Tensor) -> torch.Tensor:
        """k(x_n, x_n) of shape broadcast(x.shape[:-2], batch_shape) + (N,), in O(N)."""
        self._check_inputs(x, None)
        return self._diag(x)

    def _forward(self, x1, x2):  # pragma: no cover - abstract
        raise NotImplementedError

    def _diag(self, x):  # pragma: no cover - abstract
        raise NotImplementedError

    def _out_batch(self, *xs: torch.Tensor | None) -> torch.Size:
        return torch.broadcast_shapes(*(x.shape[:-2] for x in xs if x is not None), self.batch_shape)

    def __add__(self, other: "Kernel") -> "Sum":
        if not isinstance(other, Kernel):
            return NotImplemented
        return Sum(self, other)

    def __radd__(self, other):
        # lets builtin sum([k1, k2, ...]) work (it starts from 0)
        if isinstance(other, (int, float)) and other == 0:
            return self
        return NotImplemented

    def __mul__(self, other: "Kernel") -> "Product":
        if not isinstance(other, Kernel):
            return NotImplemented
        return Product(self, other)

    def extra_repr(self) -> str:
        parts = [f"spec={self.spec!r}"]
        if self.input_dim is not None:
            parts.append(f"input_dim={self.input_dim}")
        if len(self.batch_shape):
            parts.append(f"batch_shape={tuple(self.batch_shape)}")
        return ", ".join(parts)


# ----------------------------------------------------------------------------------------------------
# stationary kernels
# ----------------------------------------------------------------------------------------------------
#: below exp(-60) ≈ 9e-27 a single-precision kernel value is set to 0 (`exp_without_subnormals`)
_LOW_PRECISION_LOG_FLOOR = -60.0


def exp_without_subnormals(log_k: torch.Tensor) -> torch.Tensor:
    """exp(log_k) for kernel values; in float32 (and below) values under exp(-60) are exactly 0.

    A point far from the inducing inputs has kernel values that underflow into the subnormal range
    (< 1.2e-38 in float32), and every product that touches a subnormal number, or makes one, runs through a
    microcode assist on x86 CPUs: 20-100x slower. A deep GP on images (784-dimensional layers with a trainable
    skip) spent 8 of its 9 seconds per step so. Values under 9e-27 are far below float32's rounding of the
    kernel's variance scale, so setting them to 0 changes nothing representable; their gradient is 0 too.
    float64 keeps every value (its subnormals start at exp(-708)).
    """
    if log_k.dtype == torch.float64:
        return torch.exp(log_k)
    return torch.exp(log_k.masked_fill(log_k < _LOW_PRECISION_LOG_FLOOR, -math.inf))


class _Stationary(Kernel):
    """Unit-variance stationary kernel k(r) of the scaled distance r² = Σ_d (x_d - x'_d)² / ℓ_d²."""

    cross_matches_self = True

    lengthscale = _positive_property("lengthscale", "Lengthscale ℓ, shape batch_shape + (1, D) or (1, 1).")

    def __init__(
        self,
        input_dim: int | None = None,
        *,
        ard: bool = True,
        lengthscale=1.0,
        batch_shape: Sequence[int] = (),
        dtype=torch.float64,
    ):
        super().__init__(input_dim, batch_shape, dtype)
        if ard and self.input_dim is None:
            raise ValueError(f"{type(self).__name__}: input_dim is required when ard=True")
        self.ard = bool(ard)
        d = self.input_dim if self.ard else 1
        self._register_positive("lengthscale", lengthscale, self.batch_shape + (1, d), LENGTHSCALE_CONSTRAINT)

    def _scaled_sqdist(self, x1, x2):
        ell = self._param("lengthscale", x1)
        a, b = _centre(x1, x2)
        return _squared_distance(a / ell, None if b is None else b / ell)

    def _forward(self, x1, x2):
        return self._profile(self._scaled_sqdist(x1, x2))

    def _diag(self, x):
        # k(0) = 1 for every stationary profile here
        return x.new_ones(self._out_batch(x) + x.shape[-2:-1])

    def _profile(self, r2: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def extra_repr(self) -> str:
        return super().extra_repr() + f", ard={self.ard}"


class RBF(_Stationary):
    """Squared exponential: k(x,x') = exp(-½ Σ_d (x_d-x'_d)²/ℓ_d²), R&W eq. 4.9 (wrap in Scale for σ²).

    Args:
        input_dim: D, the number of input features (required with ``ard=True``).
        ard: one lengthscale per input feature (default) or one shared lengthscale.
        lengthscale: initial ℓ (a float or a tensor broadcastable to batch_shape + (1, D)), in the units of the
            inputs; default 1.
        batch_shape: leading shape of independent kernels (e.g. (L,) for one kernel per output); default ().
        dtype: dtype of the parameters; default float64.

    Examples:
        >>> import torch
        >>> from flowgp.gp.kernels import RBF
        >>> k = RBF(input_dim=1, lengthscale=2.0)
        >>> x = torch.tensor([[0.0], [2.0]], dtype=torch.float64)
        >>> k(x).detach()  # exp(-1/2) off the diagonal
        tensor([[1.0000, 0.6065],
                [0.6065, 1.0000]], dtype=torch.float64)
    """

    spec = "rbf"

    def _forward(self, x1, x2):
        return exp_without_subnormals(self._log_forward(x1, x2))

    def _log_forward(self, x1, x2, log_scale=None):
        """log σ² - ½ r² with σ² = exp(log_scale) (1 when None); `Scale` uses it to fold in its variance.

        Inputs divided by √2·ℓ give ½r² straight from the matmul, and the constant terms are folded into the
        small [N, 1] and [M, 1] norms, so the [N, M] result sees one matmul, two in-place subtractions and
        the exp: the sparse-GP hot path, where these passes dominate the step time.
        """
        ell = self._param("lengthscale", x1) * math.sqrt(2.0)
        a, b = _centre(x1, x2)
        a = a / ell
        if b is None:
            half_r2 = _squared_distance(a, None)
            return -half_r2 if log_scale is None else log_scale - half_r2
        # the norms are negated on the small [N, 1]/[M, 1] side: adding them in place has an identity
        # backward on [N, M], where a subtraction would cost a negation pass of the big gradient
        neg_a2 = a.pow(2).sum(-1, keepdim=True).neg()  # [..., N, 1]
        if log_scale is not None:
            neg_a2 = neg_a2 + log_scale
        b_scaled = b / ell
        neg_b2 = b_scaled.pow(2).sum(-1, keepdim=True).neg()  # [..., M, 1]
        if a.dim() > 2 and b.dim() <= a.dim() and all(n == 1 for n in b.shape[:-2]):
            # x2 shared by x1's batch (a deep GP layer's K_ZX: one Z and lengthscale per output, the same X):
            # both 1/ℓ go on x1's side, so that x2 stays one [M, D] matrix and the product is one GEMM over
            # x1's stacked rows, not a batch of [N, D] x [D, M] products with D = 8 inner columns (3-5x slower)
            cross = (a / ell) @ (2.0 * b.reshape(b.shape[-2:])).mT
        else:
            cross = a @ (2.0 * b_scaled).mT
        return cross.add_(neg_a2).add_(neg_b2.mT)

    def _profile(self, r2):
        return torch.exp(-0.5 * r2)


class Matern12(_Stationary):
    """Matérn ν=1/2 (exponential): k(r) = exp(-r), r² = Σ_d (x_d-x'_d)²/ℓ_d², R&W eq. 4.18.

    Args:
        input_dim: D, the number of input features (required with ``ard=True``).
        ard: one lengthscale per input feature (default) or one shared lengthscale.
        lengthscale: initial ℓ (a float or a tensor broadcastable to batch_shape + (1, D)), in the units of the
            inputs; default 1.
        batch_shape: leading shape of independent kernels (e.g. (L,) for one kernel per output); default ().
        dtype: dtype of the parameters; default float64.

    See Also:
        :func:`flowgp.make_kernel` (by name: "matern12"), :class:`flowgp.gp.kernels.Scale` (an amplitude).
    """

    spec = "matern12"

    def _profile(self, r2):
        return torch.exp(-_safe_sqrt(r2))


class Matern32(_Stationary):
    """Matérn ν=3/2: k(r) = (1 + √3 r) exp(-√3 r), r² = Σ_d (x_d-x'_d)²/ℓ_d², R&W eq. 4.17.

    Args:
        input_dim: D, the number of input features (required with ``ard=True``).
        ard: one lengthscale per input feature (default) or one shared lengthscale.
        lengthscale: initial ℓ (a float or a tensor broadcastable to batch_shape + (1, D)), in the units of the
            inputs; default 1.
        batch_shape: leading shape of independent kernels (e.g. (L,) for one kernel per output); default ().
        dtype: dtype of the parameters; default float64.

    See Also:
        :func:`flowgp.make_kernel` (by name: "matern32"), :class:`flowgp.gp.kernels.Scale` (an amplitude).
    """

    spec = "matern32"

    def _profile(self, r2):
        s = math.sqrt(3.0) * _safe_sqrt(r2)
        return (1.0 + s) * torch.exp(-s)


class Matern52(_Stationary):
    """Matérn ν=5/2: k(r) = (1 + √5 r + 5r²/3) exp(-√5 r), r² = Σ_d (x_d-x'_d)²/ℓ_d², R&W eq. 4.17.

    Args:
        input_dim: D, the number of input features (required with ``ard=True``).
        ard: one lengthscale per input feature (default) or one shared lengthscale.
        lengthscale: initial ℓ (a float or a tensor broadcastable to batch_shape + (1, D)), in the units of the
            inputs; default 1.
        batch_shape: leading shape of independent kernels (e.g. (L,) for one kernel per output); default ().
        dtype: dtype of the parameters; default float64.

    See Also:
        :func:`flowgp.make_kernel` (by name: "matern52"), :class:`flowgp.gp.kernels.Scale` (an amplitude).
    """

    spec = "matern52"

    def _profile(self, r2):
        s = math.sqrt(5.0) * _safe_sqrt(r2)
        return (1.0 + s + (5.0 / 3.0) * r2) * torch.exp(-s)


class Periodic(_Stationary):
    """Periodic: k(x,x') = exp(-2 Σ_d sin²(π|x_d-x'_d|/p_d)/ℓ_d²) (R&W eq. 4.31, per-dimension p and ℓ).

    Evaluated without an [N, M, D] tensor via 2 sin²(Δ/2) = 1 - cos u cos v - sin u sin v (u = 2πx/p),
    so the exponent is Σ_d w_d - [w cos u, w sin u]·[cos v, sin v] with w = 1/ℓ²: one matmul.

    Args:
        input_dim: D, the number of input features (required with ``ard=True``).
        ard: one lengthscale and period per input feature (default) or one of each shared.
        lengthscale: initial ℓ (float or tensor broadcastable to batch_shape + (1, D)); default 1.
        period: initial period p, in the units of the inputs; default 1.
        batch_shape: leading shape of independent kernels; default ().
        dtype: dtype of the parameters; default float64.

    See Also:
        :func:`flowgp.make_kernel` (by name: "periodic", e.g. "periodic*rbf").
    """

    spec = "periodic"
    period = _positive_property("period", "Period p, shape batch_shape + (1, D) (ard) or (1, 1).")

    def __init__(
        self,
        input_dim: int | None = None,
        *,
        ard: bool = True,
        lengthscale=1.0,
        period=1.0,
        batch_shape: Sequence[int] = (),
        dtype=torch.float64,
    ):
        super().__init__(input_dim, ard=ard, lengthscale=lengthscale, batch_shape=batch_shape, dtype=dtype)
        d = self.input_dim if self.ard else 1
        self._register_positive("period", period, self.batch_shape + (1, d), LENGTHSCALE_CONSTRAINT)

    def _forward(self, x1, x2):
        ell = self._param("lengthscale", x1)
        p = self._param("period", x1)
        w = ell.pow(-2)
        d = x1.shape[-1]
        # w may have a single column (shared ℓ); expand so the feature concatenation lines up
        w = w.expand(*w.shape[:-1], d)
        u = (2.0 * math.pi) * x1 / p
        cu, su = torch.cos(u), torch.sin(u)
        left = torch.cat([w * cu, w * su], dim=-1)
        if x2 is None:
            right = torch.cat([cu, su], dim=-1)
        else:
            v = (2.0 * math.pi) * x2 / p
            right = torch.cat([torch.cos(v), torch.sin(v)], dim=-1)
        s = w.sum(-1, keepdim=True) - left @ right.mT  # = 2 Σ_d w_d sin²(π Δ_d / p_d) >= 0
        if x2 is None:
            s = _symmetrize_zero_diag(s)
        return torch.exp(-s.clamp_min(0.0))


# ----------------------------------------------------------------------------------------------------
# non-stationary / noise kernels
# ----------------------------------------------------------------------------------------------------
class _VarianceKernel(Kernel):
    """A kernel whose only parameter is its own variance σ² (Linear, White)."""

    variance = _positive_property("variance", "Variance σ², shape batch_shape + (1, 1).")

    def __init__(
        self,
        input_dim: int | None = None,
        *,
        variance=1.0,
        batch_shape: Sequence[int] = (),
        dtype=torch.float64,
    ):
        super().__init__(input_dim, batch_shape, dtype)
        self._register_positive("variance", variance, self.batch_shape + (1, 1), VARIANCE_CONSTRAINT)


class Linear(_VarianceKernel):
    """Linear (dot product): k(x,x') = σ² x·x', R&W eq. 4.28 with Σ_p = σ² I.

    Args:
        input_dim: D, the number of input features (None: any).
        variance: initial σ²; default 1.
        batch_shape: leading shape of independent kernels; default ().
        dtype: dtype of the parameters; default float64.

    See Also:
        :func:`flowgp.make_kernel` (by name: "linear", e.g. "rbf+linear").
    """

    spec = "linear"
    cross_matches_self = True

    def _forward(self, x1, x2):
        var = self._param("variance", x1)
        if x2 is None:
            k = x1 @ x1.mT
            k = 0.5 * (k + k.mT)  # matmul is not bitwise symmetric
        else:
            k = x1 @ x2.mT
        return var * k

    def _diag(self, x):
        var = self._param("variance", x)
        return var[..., 0] * x.pow(2).sum(-1)


class White(_VarianceKernel):
    """White noise: k(x,x') = σ² δ(x, x'), nonzero only on the diagonal of K(x, x) (x2=None) and in diag().

    Args:
        input_dim: D, the number of input features (None: any).
        variance: initial σ²; default 1.
        batch_shape: leading shape of independent kernels; default ().
        dtype: dtype of the parameters; default float64.

    See Also:
        :func:`flowgp.make_kernel` (by name: "white").
    """

    spec = "white"
    cross_is_zero = True

    def _forward(self, x1, x2):
        n = x1.shape[-2]
        if x2 is not None:
            # distinct input sets: noise is independent across them, even at coinciding locations
            return x1.new_zeros(self._out_batch(x1, x2) + (n, x2.shape[-2]))
        var = self._param("variance", x1)
        eye = torch.eye(n, dtype=x1.dtype, device=x1.device)
        return (var * eye).expand(self._out_batch(x1) + (n, n)).contiguous()

    def _diag(self, x):
        var = self._param("variance", x)
        return var[..., 0].expand(self._out_batch(x) + x.shape[-2:-1]).contiguous()


# ----------------------------------------------------------------------------------------------------
# combinators
# ----------------------------------------------------------------------------------------------------
def _common_input_dim(kernels: Iterable[Kernel]) -> int | None:
    dims = {k.input_dim for k in kernels if k.input_dim is not None}
    if len(dims) > 1:
        raise ValueError(f"cannot combine kernels built for different input_dims {sorted(dims)}")
    return dims.pop() if dims else None


class Scale(Kernel):
    """Outputscale: k(x,x') = σ² k_base(x,x'); σ² has shape batch_shape + (1, 1).

    Args:
        base: the Kernel to scale.
        variance: initial σ² (float or tensor broadcastable to batch_shape + (1, 1)); default 1.
        batch_shape: shape of σ²'s batch (None: the base kernel's).
        dtype: dtype of σ² (None: that of the base kernel's parameters, else float64).

    Examples:
        >>> import torch
        >>> from flowgp.gp.kernels import RBF, Scale
        >>> k = Scale(RBF(input_dim=2), variance=3.0)
        >>> k.diag(torch.zeros(4, 2, dtype=torch.float64)).detach()
        tensor([3., 3., 3., 3.], dtype=torch.float64)
    """

    variance = _positive_property("variance", "Outputscale σ², shape batch_shape + (1, 1).")

    def __init__(self, base: Kernel, variance=1.0, *, batch_shape: Sequence[int] | None = None, dtype=None):
        if not isinstance(base, Kernel):
            raise TypeError(f"Scale expects a Kernel, got {type(base).__name__}")
        own = base.batch_shape if batch_shape is None else _as_batch_shape(batch_shape)
        if dtype is None:
            dtype = next((p.dtype for p in base.parameters()), torch.float64)
        super().__init__(base.input_dim, own, dtype)
        self.base = base
        self._register_positive("variance", variance, own + (1, 1), VARIANCE_CONSTRAINT)
        self.batch_shape = torch.broadcast_shapes(own, base.batch_shape)

    @property
    def spec(self) -> str:  # the amplitude does not change the covariance's shape
        return self.base.spec

    @property
    def cross_matches_self(self) -> bool:
        return self.base.cross_matches_self

    def _forward(self, x1, x2):
        if isinstance(self.base, RBF):  # σ² folded into the exponent: one pass fewer over [N, M]
            return exp_without_subnormals(self.base._log_forward(x1, x2, self._param("variance", x1).log()))
        return self._param("variance", x1) * self.base._forward(x1, x2)

    def _diag(self, x):
        return self._param("variance", x)[..., 0] * self.base._diag(x)


class _Combination(Kernel):
    """Shared machinery of Sum and Product: components are flattened, batch shapes broadcast, and the
    inputs are validated once against the common input_dim / broadcast batch shape."""

    def __init__(self, *kernels: Kernel):
        if len(kernels) == 1 and isinstance(kernels[0], (list, tuple)):
            kernels = tuple(kernels[0])
        if len(kernels) < 2:
            raise ValueError(f"{type(self).__name__} needs at least two kernels, got {len(kernels)}")
        for k in kernels:
            if not isinstance(k, Kernel):
                raise TypeError(f"{type(self).__name__} expects Kernels, got {type(k).__name__}")
        flat: list[Kernel] = []
        for k in kernels:  # (k1 + k2) + k3 -> Sum(k1, k2, k3)
            flat.extend(k.kernels if type(k) is type(self) else [k])
        try:
            batch = torch.broadcast_shapes(*(k.batch_shape for k in flat))
        except RuntimeError as err:
            raise ValueError(
                f"kernel batch shapes {[tuple(k.batch_shape) for k in flat]} do not broadcast"
            ) from err
        super().__init__(_common_input_dim(flat), batch)
        self.kernels = nn.ModuleList(flat)

    @property
    def cross_matches_self(self) -> bool:
        return all(k.cross_matches_self for k in self.kernels)

    def _forward(self, x1, x2):
        out = self.kernels[0]._forward(x1, x2)
        for k in self.kernels[1:]:
            out = self._combine(out, k._forward(x1, x2))
        return out

    def _diag(self, x):
        out = self.kernels[0]._diag(x)
        for k in self.kernels[1:]:
            out = self._combine(out, k._diag(x))
        return out


class Sum(_Combination):
    """Sum: k(x,x') = Σ_i k_i(x,x') (R&W §4.2.4); also ``k1 + k2``.

    Args:
        *kernels: two or more Kernels (or one list of them); nested sums are flattened.

    See Also:
        :class:`flowgp.gp.kernels.Product`; :func:`flowgp.make_kernel` ("rbf+linear").
    """

    @property
    def cross_is_zero(self) -> bool:
        return all(k.cross_is_zero for k in self.kernels)

    def _forward(self, x1, x2):
        kernels = self.kernels
        if x2 is not None and not self.cross_is_zero:
            # a White term adds exactly zero between distinct input sets: building and adding an [N, M]
            # tensor of zeros cost a deep GP's hidden layers two passes over their largest tensors
            kernels = [k for k in kernels if not k.cross_is_zero]
            if len(kernels) < len(self.kernels):
                out = kernels[0]._forward(x1, x2)
                for k in kernels[1:]:
                    out = out + k._forward(x1, x2)
                # the broadcast shape the full sum would have had (a dropped term may carry batch dims)
                return out.expand(self._out_batch(x1, x2) + out.shape[-2:])
        return super()._forward(x1, x2)

    @staticmethod
    def _combine(a, b):
        return a + b

    @property
    def spec(self) -> str:
        return "+".join(k.spec for k in self.kernels)


class Product(_Combination):
    """Product: k(x,x') = Π_i k_i(x,x') (R&W §4.2.4); also ``k1 * k2``.

    Args:
        *kernels: two or more Kernels (or one list of them); nested products are flattened.

    See Also:
        :class:`flowgp.gp.kernels.Sum`; :func:`flowgp.make_kernel` ("periodic*rbf").
    """

    @staticmethod
    def _combine(a, b):
        return a * b

    @property
    def spec(self) -> str:
        parts = []
        for k in self.kernels:
            s = k.spec
            parts.append(f"({s})" if "+" in s else s)
        return "*".join(parts)


# ----------------------------------------------------------------------------------------------------
# factory
# ----------------------------------------------------------------------------------------------------
#: the built-in kernel names `make_kernel` understands (terms combine with "+" and "*", e.g. "rbf+linear")
KERNEL_NAMES: tuple[str, ...] = ("rbf", "matern12", "matern32", "matern52", "periodic", "linear", "white")
_TOKEN = re.compile(r"\s*(?:([A-Za-z_][A-Za-z0-9_]*)|([+*()]))")

# the built-in names in the one name-to-class table; a user's Kernel subclass registered there
# (`KERNELS.register("mine", MyKernel)`) works in every spec, e.g. make_kernel("rbf+mine", D)
KERNELS.register("rbf", RBF, aliases=("se", "squared_exponential"))
KERNELS.register("matern12", Matern12)
KERNELS.register("matern32", Matern32)
KERNELS.register("matern52", Matern52)
KERNELS.register("periodic", Periodic)
KERNELS.register("linear", Linear)
KERNELS.register("white", White)


def _valid_names_message() -> str:
    aliases = ", ".join(f"{a!r} -> {c!r}" for a, c in KERNELS.aliases().items())
    return (
        f"valid names: {', '.join(KERNELS.names())} (aliases {aliases}), combined with '+' and '*' "
        "('*' binds tighter; parentheses allowed), e.g. 'rbf+linear' or 'periodic*rbf'"
    )


def _build_leaf(name: str, input_dim: int, hyperparameters: dict, common: dict) -> "Kernel":
    """The kernel registered under `name`, given the hyperparameters its constructor accepts.

    Every kernel is called as cls(input_dim, batch_shape=..., dtype=..., **h) where h holds those of
    lengthscale / variance / period that the constructor names (so RBF gets a lengthscale, Linear a
    variance, a user's kernel whatever it declares).
    """
    factory = KERNELS.get(name)
    try:
        accepted = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or C callable: pass only the required arguments
        accepted = {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    kwargs = dict(common)
    kwargs.update({k: v for k, v in hyperparameters.items() if takes_any or k in accepted})
    kernel = factory(input_dim, **kwargs)
    if not isinstance(kernel, Kernel):
        raise TypeError(f"kernel {name!r} is registered to {factory!r}, which returned "
                        f"{type(kernel).__name__}, not a flowgp Kernel")
    return kernel


def _has_amplitude(k: Kernel) -> bool:
    if isinstance(k, (Scale, Linear, White)):
        return True
    if isinstance(k, Sum):
        return all(_has_amplitude(c) for c in k.kernels)
    if isinstance(k, Product):
        return any(_has_amplitude(c) for c in k.kernels)
    return False


def make_kernel(
    name: str,
    input_dim: int,
    batch_shape: Sequence[int] = (),
    lengthscale=1.0,
    variance=1.0,
    period=1.0,
    *,
    dtype=torch.float64,
) -> Kernel:
    """Build a kernel from a name such as ``"rbf"``, ``"matern32"``, ``"rbf+linear"`` or ``"periodic*rbf"``.

    Names are case-insensitive ('se' and 'squared_exponential' alias 'rbf') and resolved through
    `flowgp.registry.KERNELS`, so a registered user kernel works too (it receives those of lengthscale,
    variance and period that its constructor names, plus batch_shape and dtype). Stationary kernels use ARD
    lengthscales over ``input_dim`` features. Every additive term gets exactly one amplitude σ² =
    ``variance``: a term made only of stationary factors is wrapped in :class:`Scale`, while a term with
    a Linear or White factor uses that factor's own variance (avoiding unidentifiable duplicate scales).

    Args:
        name: the kernel's name; "+" adds and "*" multiplies terms (``*`` binds tighter).
        input_dim: D, the number of input features (a positive int).
        batch_shape: leading shape of independent kernels, e.g. (L,) for one kernel per output; default ().
        lengthscale: initial lengthscale of every stationary factor; default 1.
        variance: initial amplitude σ² of every additive term; default 1.
        period: initial period of every periodic factor; default 1.
        dtype: dtype of the parameters; default float64.
    """
    if not isinstance(name, str):
        raise TypeError(f"kernel name must be a string, got {type(name).__name__}")
    if isinstance(input_dim, bool) or not isinstance(input_dim, int):
        raise TypeError(f"input_dim must be an int, got {type(input_dim).__name__}")
    if input_dim < 1:
        raise ValueError(f"input_dim must be >= 1, got {input_dim}")
    batch_shape = _as_batch_shape(batch_shape)

    tokens: list[str] = []
    pos, text = 0, name.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"cannot parse kernel name {name!r} at {text[pos:]!r}; {_valid_names_message()}")
        tokens.append((m.group(1) or m.group(2)).lower())
        pos = m.end()
    if not tokens:
        raise ValueError(f"empty kernel name; {_valid_names_message()}")

    common = dict(batch_shape=batch_shape, dtype=dtype)
    i = 0

    def peek():
        return tokens[i] if i < len(tokens) else None

    def take():
        nonlocal i
        tok = peek()
        if tok is None:
            raise ValueError(f"kernel name {name!r} ends unexpectedly; {_valid_names_message()}")
        i += 1
        return tok

    def leaf(tok: str) -> Kernel:
        if tok not in KERNELS:
            raise ValueError(f"unknown kernel {tok!r} in {name!r}; {_valid_names_message()}")
        hyper = {"lengthscale": lengthscale, "variance": variance, "period": period}
        return _build_leaf(KERNELS.canonical(tok), input_dim, hyper, common)

    def factor() -> Kernel:
        tok = take()
        if tok == "(":
            k = expr()
            if take() != ")":
                raise ValueError(f"unbalanced parentheses in kernel name {name!r}")
            return k
        if tok in {"+", "*", ")"}:
            raise ValueError(f"unexpected {tok!r} in kernel name {name!r}; {_valid_names_message()}")
        return leaf(tok)

    def term() -> Kernel:
        factors = [factor()]
        while peek() == "*":
            take()
            factors.append(factor())
        k = factors[0] if len(factors) == 1 else Product(*factors)
        if not any(_has_amplitude(f) for f in factors):
            k = Scale(k, variance, batch_shape=batch_shape, dtype=dtype)
        return k

    def expr() -> Kernel:
        terms = [term()]
        while peek() == "+":
            take()
            terms.append(term())
        return terms[0] if len(terms) == 1 else Sum(*terms)

    kernel = expr()
    if i != len(tokens):
        raise ValueError(f"unexpected {tokens[i]!r} in kernel name {name!r}; {_valid_names_message()}")
    return kernel
