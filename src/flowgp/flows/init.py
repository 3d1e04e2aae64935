"""Flow initialisation (appendix B.2-B.3, plus random perturbation).

Optimisation runs on the raw parameters. Adam (as in the paper) is guarded: a step whose loss or
gradient is not finite is undone and the learning rate halved, the best parameters seen are kept,
and the loop stops once the loss stalls. The data fit (eq. 30) additionally uses L-BFGS, which
crosses the curved valleys of these likelihoods (e.g. SAL's shape/scale trade-off) in a few dozen
evaluations where Adam needs thousands; every L-BFGS result is kept only if it lowers the loss.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch import Tensor

from .base import Flow

__all__ = ["init_identity", "init_from_data", "init_random"]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_NUM_QUANTILES = 256


def _check_flow(flow) -> None:
    if not isinstance(flow, Flow):
        raise TypeError(f"flow must be a flowgp Flow, got {type(flow).__name__}")


def _dtype_device(flow: Flow):
    return flow.dtype, flow.device


class _NonFinite(Exception):
    pass


class _Trainer:
    """Guarded optimisation of one loss over a flow's parameters, remembering the best point."""

    def __init__(self, flow: Flow, loss_fn: Callable[[], Tensor]):
        self.params = [p for p in flow.parameters() if p.requires_grad]
        self.loss_fn = loss_fn
        self.best_loss = math.inf
        self.best = self.snapshot()

    def snapshot(self):
        return [p.detach().clone() for p in self.params]

    def restore(self, values) -> None:
        with torch.no_grad():
            for p, v in zip(self.params, values):
                p.copy_(v)

    def evaluate(self) -> float:
        with torch.no_grad():
            try:
                value = float(self.loss_fn())
            except RuntimeError:  # e.g. a numerical inverse that cannot bracket the data
                return math.inf
        return value if math.isfinite(value) else math.inf

    def consider(self) -> float:
        """Evaluate the current point and remember it if it is the best so far."""
        value = self.evaluate()
        if value < self.best_loss:
            self.best_loss, self.best = value, self.snapshot()
        return value

    def _loss_and_grad(self):
        loss = self.loss_fn()
        if not bool(torch.isfinite(loss)):
            raise _NonFinite
        loss.backward()
        if not all(p.grad is None or bool(torch.all(torch.isfinite(p.grad))) for p in self.params):
            raise _NonFinite
        return loss

    def adam(self, steps: int, lr: float, window: int = 100, rel_tol: float = 1e-3, abs_tol: float = 0.0):
        opt = torch.optim.Adam(self.params, lr=lr)
        window_best, min_lr = math.inf, lr * 1e-4
        for step in range(steps):
            opt.zero_grad(set_to_none=True)
            current = self.snapshot()
            try:
                value = self._loss_and_grad().item()
            except (_NonFinite, RuntimeError):
                # The last step left the region where the loss is defined: go back, smaller steps.
                self.restore(self.best if self.best_loss < math.inf else current)
                for group in opt.param_groups:
                    group["lr"] *= 0.5
                if opt.param_groups[0]["lr"] < min_lr:
                    break
                continue
            if value < self.best_loss:
                self.best_loss, self.best = value, current
            if value <= abs_tol:
                break
            if (step + 1) % window == 0:
                if window_best - self.best_loss <= rel_tol * (abs(self.best_loss) + 1e-8):
                    break
                window_best = self.best_loss
            opt.step()
        self.restore(self.best)
        self.clear()

    def lbfgs(self, max_iter: int = 100) -> bool:
        """L-BFGS from the current point; returns whether it improved on the best loss."""
        start = self.snapshot()
        before = self.best_loss
        opt = torch.optim.LBFGS(self.params, lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe",
                                tolerance_grad=1e-10, tolerance_change=1e-14, history_size=20)

        calls = [0]
        penalty = 1e6 * (1.0 + abs(before)) if math.isfinite(before) else 1e10

        def closure():
            opt.zero_grad(set_to_none=True)
            calls[0] += 1
            point = self.snapshot()
            try:
                loss = self._loss_and_grad()
            except (_NonFinite, RuntimeError):
                if calls[0] == 1:
                    raise
                # A line-search trial outside the region where the loss is defined (e.g. data
                # beyond a tanh bound): a large value with zero slope makes the search back off.
                for p in self.params:
                    p.grad = torch.zeros_like(p)
                return torch.tensor(penalty, dtype=point[0].dtype, device=point[0].device)
            if loss.item() < self.best_loss:  # line-search trial points can be the best ones
                self.best_loss, self.best = loss.item(), point
            return loss

        try:
            opt.step(closure)
        except (_NonFinite, RuntimeError):
            self.restore(start)
        self.consider()
        self.restore(self.best)
        self.clear()
        return self.best_loss < before

    def clear(self) -> None:
        for p in self.params:
            p.grad = None


def init_identity(flow: Flow, low: float = -3.0, high: float = 3.0, num_points: int = 500,
                  steps: int = 2000, lr: float = 0.01) -> float:
    """Fit G ≈ identity on a grid (appendix eq. 31): minimise (1/N) Σ (x_n - G(x_n))² with Adam.

    Stops early once the MSE stalls. For a flow on the positive half-line the grid starts at
    high/num_points instead of low ≤ 0. With param_shape (L,) every output is fitted. Returns the
    final MSE.
    """
    _check_flow(flow)
    if not high > low:
        raise ValueError(f"need low < high, got low={low}, high={high}")
    if num_points < 2:
        raise ValueError(f"num_points must be at least 2, got {num_points}")
    if flow.domain == "positive" and low <= 0:
        if high <= 0:
            raise ValueError(f"a flow on the positive half-line needs high > 0, got high={high}")
        low = high / num_points
    dtype, device = _dtype_device(flow)
    x = torch.linspace(low, high, num_points, dtype=dtype, device=device)
    x = x.reshape((num_points,) + (1,) * len(flow.param_shape))

    def loss_fn():
        return torch.mean((flow(x, validate=False) - x) ** 2)

    trainer = _Trainer(flow, loss_fn)
    if trainer.params and steps > 0:
        trainer.adam(steps, lr, window=100, rel_tol=1e-3, abs_tol=1e-12)
    return trainer.evaluate()


def _normal_log_pdf(z: Tensor) -> Tensor:
    return -0.5 * z * z - _HALF_LOG_2PI


def _validated_data(flow: Flow, y) -> tuple[Tensor, bool]:
    dtype, device = _dtype_device(flow)
    if not isinstance(y, Tensor):
        y = torch.as_tensor(y)
    y = y.detach().to(dtype=dtype, device=device)
    if y.ndim not in (1, 2):
        raise ValueError(f"y must be 1-D [N] or 2-D [N, L], got shape {tuple(y.shape)}")
    if y.shape[0] < 2:
        raise ValueError(f"y needs at least 2 samples, got {y.shape[0]}")
    finite = torch.isfinite(y)
    if not bool(torch.all(finite)):
        raise ValueError(f"y must be finite; got {int((~finite).sum())} NaN/inf values")
    ps = tuple(flow.param_shape)
    if len(ps) > 1:
        raise ValueError(f"init_from_data supports param_shape () or (L,), got {ps}")
    if y.ndim == 2 and len(ps) == 1 and ps[0] not in (1, y.shape[1]):
        raise ValueError(f"y has {y.shape[1]} columns but the flow's param_shape is {ps}")
    per_column = y.ndim == 2 and len(ps) == 1 and ps[0] == y.shape[1] and ps[0] > 1
    if y.ndim == 1 and ps:
        y = y.reshape(-1, *([1] * len(ps)))
    return y, per_column


def init_from_data(flow: Flow, y, steps: int = 2000, lr: float = 0.01, direction: str = "generative") -> float:
    """Fit the flow to samples y by maximum likelihood (appendix eqs. 27-30).

    direction="generative" (TGP prior): G(N(0,1)) should match y; minimises
        -mean[log φ(G⁻¹(y)) - log G'(G⁻¹(y))]            (eq. 30)
    direction="normalizing" (warped likelihood, v-WGP): T(y) should be N(0,1); minimises
        -mean[log φ(T(y)) + log T'(y)].

    y is 1-D [N] or 2-D [N, L] (with param_shape (L,) each column gets its own parameters). A
    bounded-range flow (tanh) whose range misses the data is first moved and widened to cover it.
    The likelihood fit starts from a cheap warm start that matches 256 quantiles of y to normal
    quantiles (no inverse needed) and is kept only if it helps; then L-BFGS, with guarded Adam
    (`steps`, `lr`) as fallback when L-BFGS stalls or leaves the region where the loss is defined.
    Returns the final mean negative log-likelihood.
    """
    _check_flow(flow)
    if direction not in ("generative", "normalizing"):
        raise ValueError(f"direction must be 'generative' or 'normalizing', got {direction!r}")
    y, per_column = _validated_data(flow, y)
    low, high = (y.min(0).values, y.max(0).values) if per_column else (y.min(), y.max())
    if bool(torch.any(high <= low)):
        raise ValueError("y is constant (in some column); a distribution cannot be fitted to it")

    if direction == "generative":
        flow.fit_codomain_to(low, high)
        with torch.no_grad():
            bounds = flow.codomain_bounds()
        if bounds is not None and bool(torch.any((y <= bounds[0]) | (y >= bounds[1]))):
            raise ValueError(
                f"y lies outside the range of the '{flow.spec}' flow (e.g. positive-only flows need y > 0): "
                f"got y in [{y.min().item():.4g}, {y.max().item():.4g}]; the generative initialisation needs "
                "data the flow can produce"
            )

        def nll():
            z = flow.inverse(y, validate=False)
            return -torch.mean(_normal_log_pdf(z) - flow.log_abs_det_jacobian(z, validate=False))
    else:
        try:
            with torch.no_grad():
                flow(y)
        except ValueError as err:
            raise ValueError(f"y is outside the domain of the '{flow.spec}' flow: {err}") from err

        def nll():
            z, log_det = flow.forward_and_log_det(y, validate=False)
            return -torch.mean(_normal_log_pdf(z) + log_det)

    trainer = _Trainer(flow, nll)
    start_loss = trainer.consider()
    if not trainer.params or steps <= 0:
        return start_loss
    _quantile_warm_start(flow, y, direction, steps, lr, trainer)
    if not trainer.lbfgs():
        trainer.adam(steps, lr, window=100, rel_tol=1e-4)
        trainer.lbfgs()
    return trainer.evaluate()


def _quantile_warm_start(flow: Flow, y: Tensor, direction: str, steps: int, lr: float, trainer: _Trainer):
    """Least squares between G(normal quantiles) and the data quantiles, forward maps only.

    Well conditioned and cheap even for flows with a numerical inverse; it moves the parameters to
    the right scale before the likelihood fit. Kept only if the likelihood improves.
    """
    n = y.shape[0]
    k = min(n, _NUM_QUANTILES)
    probs = (torch.arange(k, dtype=y.dtype, device=y.device) + 0.5) / k
    q_y = torch.quantile(y, probs, dim=0)  # [k, ...]
    q_z = torch.special.ndtri(probs).reshape(-1, *([1] * (y.ndim - 1)))
    scale = y.std(0).clamp_min(torch.finfo(y.dtype).tiny)

    if direction == "generative":
        def loss_fn():
            return torch.mean(((flow(q_z, validate=False) - q_y) / scale) ** 2)
    else:
        def loss_fn():
            return torch.mean((flow(q_y, validate=False) - q_z) ** 2)

    warm = _Trainer(flow, loss_fn)
    warm.consider()
    if not warm.lbfgs():
        warm.adam(min(steps, 1000), lr, window=100, rel_tol=1e-3)
        warm.lbfgs()
    trainer.consider()  # the warm point becomes the best only if its likelihood is better
    trainer.restore(trainer.best)


def init_random(flow: Flow, std: float = 0.5, generator: Optional[torch.Generator] = None) -> Flow:
    """Perturb every raw parameter by N(0, std²) noise (the paper's random initialisation); returns flow."""
    _check_flow(flow)
    if not std >= 0:
        raise ValueError(f"std must be non-negative, got {std}")
    with torch.no_grad():
        for p in flow.parameters():
            if generator is not None:
                noise = torch.randn(p.shape, generator=generator, dtype=p.dtype, device=generator.device)
                noise = noise.to(p.device)
            else:
                noise = torch.randn(p.shape, dtype=p.dtype, device=p.device)
            p.add_(std * noise)
    return flow
