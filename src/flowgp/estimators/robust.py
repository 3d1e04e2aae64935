"""The robust fit of flow-warped GPs: options, the best-state callback and the final check.

A TGP (or v-WGP, TGP classifier) with the identity flow is the SVGP, so its best bound is never below the
SVGP's; `RobustFit` says how a flow estimator makes its fitted bound end there too (warm start from a fitted
SVGP, flow refinement, natural gradients on q(u), plateau stop, restarts, best state kept), `BestState` keeps
the state with the best full-data bound during `flowgp.training.loop.train`, and `warn_below_svgp` emits
`BoundBelowSVGPWarning` when a fit still ends below the SVGP's bound. Measurements: docs/results/tgp/robust-fit.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

from ..gp.defaults import DEFAULTS
from ..training.loop import EarlyStop

__all__ = ["RobustFit", "DEFAULT_ROBUST_FIT", "BestState", "BoundBelowSVGPWarning", "warn_below_svgp", "snapshot",
           "resolve_robust", "FitRows"]


class BoundBelowSVGPWarning(UserWarning):
    """A flow-warped GP's fitted training bound ended below the bound of the SVGP it contains.

    See Also:
        :class:`flowgp.estimators.RobustFit` (the fit that avoids it; ``tolerance`` sets the check's slack).
    """


@dataclass(frozen=True)
class RobustFit:
    """How a flow estimator fits so that its training bound does not end below the SVGP's (`robust=`).

    Args:
        warm_start: fit an SVGP with the same settings first and start the flow model exactly at it
            (`flowgp.training.initialisation.warm_start_from_svgp`: inducing inputs, kernel, q(u), noise; flow at the
            map that makes it that SVGP). False: the flow model starts from `flow_init` as without `robust`.
        refine_flow: at the warm start, maximise the bound over the flow and the noise alone (GP held) by L-BFGS
            on the full data before the joint training (this is what moves a positive flow, which can only
            approximate the shifted identity, above the SVGP's bound), anchored at its start by a negligible
            quadratic term so that a flat direction of the flow family has one answer (`regression.REFINE_ANCHOR`).
            WarpedGPRegressor refines only after an inexact warm start: its bound's Jacobian term is unbounded on
            tied targets (see its `_refine_after`).
        natural_gradient: γ of natural-gradient steps on q(u) (Salimbeni et al. 2018) in the flow model's
            training, Adam on the rest; None: Adam on everything. Adam on q(u) lags behind a changing warp and
            makes the bound oscillate by ~0.1 per point between epochs; γ = 0.1 keeps q(u) with it (ablation in
            docs/results/tgp/robust-fit).
        svgp_natural_gradient: γ for q(u) in the SVGP stage of a full-batch fit; the Gaussian likelihood is
            conjugate, so γ = 1 puts q(u) at its optimum for the current hyperparameters at every step (None: Adam).
        svgp_natural_gradient_minibatch: γ of that stage when the fit runs in minibatches. γ = 1 on a minibatch
            estimate jumps q(u) to each batch's optimum: on the UCI quick preset (1 500 steps of 512 rows) the
            stage then ended below an Adam SVGP and the TGP below the SVGP on power (10/10 splits) and energy (3/10);
            with γ = 0.1 the TGP ends above it on every power and energy split measured
            (benchmarks/studies/tgp_minibatch_variants.py; docs/results/tgp/robust-fit/README.md §8).
        flow_lr: the flow model's Adam step as a multiple of `lr` (from the warm start a smaller step keeps the
            bound from oscillating: at lr = 0.01 it jumps by up to 0.5 per point between epochs on air quality).
        svgp_epochs: the share of the robust fit's epochs spent on the SVGP stage. Regressors: a share of `epochs`,
            the flow model trains for the rest (at least one epoch), so a robust fit takes the same number of steps
            as a plain one (natural gradients make the SVGP stage converge in its share). TGPClassifier: its
            likelihoods are not conjugate, so an SVGP stage shorter than the SVGP classifier's own fit ends below it
            and leaves the flow model's GP under-trained (breast_cancer, 100 epochs: 131/143 test points against
            the SVGPClassifier's 135/143); its SVGP stage is therefore that fit itself, all `epochs`, and the flow
            model trains for `classifier_flow_epochs(epochs)` more (`epochs` again at the default 0.5).
        plateau: the plateau stop of the flow model's training (its epochs stay the maximum): "auto" (default), the
            estimator's own `early_stop` rule (by default `flowgp.training.early_stop.default_plateau()`: best bound
            per point improved by at most 0.001 over 50 epochs); (window, rel_tol) of
            `flowgp.training.loop.EarlyStop` (stop once the bound improved by less than rel_tol·|bound| over `window`
            epochs); None: all of them. The SVGP stage stops by the estimator's `early_stop`, as the SVGP's own fit
            does, and the epochs it leaves go to the flow model; `early_stop=None` on the estimator runs all epochs
            of both stages. (Until this release: (100, 1e-4), and the SVGP stage ran all of its epochs.)
        restarts: flow initialisations ("identity", "data", "random") trained from scratch besides the warm
            start (without it: besides `flow_init`), the state with the best training bound kept (never chosen
            on test data).
        keep_best: keep the state with the best full-data bound seen (full batch: every step; minibatches: every
            `keep_best_every` epochs), not the last one.
        keep_best_every: in minibatches, epochs between full-data bound evaluations of `keep_best`. One evaluation
            costs about a third of an epoch (a forward pass over every row); once per epoch it made each epoch of the
            robust fit ~1.3x an epoch of the plain fit (N = 2 000, batches of 512), every 5 epochs ~1.07x.
        tolerance: per-point slack of the final check against the SVGP's bound (the warning).
        refine_budget: the refinement's L-BFGS evaluates the full-data bound (value and gradient, about the cost of
            one epoch) at most refine_budget·epochs times and at most `refine_max_evaluations` times; below 2 it is
            skipped. A fixed 200-iteration refinement cost 1.9-2.9x the SVGP's whole fit at 50-200 epochs
            (N = 10 000, batches of 512); scaled to the budget it never costs more than that share of the fit.
            benchmarks/perf/robust_tgp_cost.py measures the stages.
        refine_max_evaluations: the cap of those evaluations for long fits.

    See Also:
        :class:`flowgp.TGPRegressor` (``robust=``), :class:`flowgp.estimators.BoundBelowSVGPWarning`.

    Examples:
        >>> from flowgp import TGPRegressor
        >>> from flowgp.estimators import RobustFit
        >>> est = TGPRegressor(robust=RobustFit(restarts=("data",), plateau=None))
    """

    warm_start: bool = True
    refine_flow: bool = True
    natural_gradient: Optional[float] = 0.1
    svgp_natural_gradient: Optional[float] = DEFAULTS.natural_gradient_full_batch
    svgp_natural_gradient_minibatch: Optional[float] = DEFAULTS.natural_gradient_minibatch
    flow_lr: float = 0.5
    svgp_epochs: float = 0.5
    plateau: Optional[tuple | str] = "auto"
    restarts: tuple = ()
    keep_best: bool = True
    keep_best_every: int = 5
    tolerance: float = 0.005
    refine_budget: float = DEFAULTS.refine_budget
    refine_max_evaluations: int = 200

    def __post_init__(self):
        for name in ("natural_gradient", "svgp_natural_gradient", "svgp_natural_gradient_minibatch"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"RobustFit.{name} must be None or a positive step size, got {value!r}")
        if not self.flow_lr > 0:
            raise ValueError(f"RobustFit.flow_lr must be positive, got {self.flow_lr!r}")
        if not 0 < self.svgp_epochs <= 1:
            raise ValueError(f"RobustFit.svgp_epochs is a share of epochs in (0, 1], got {self.svgp_epochs!r}")
        if self.plateau is not None and not (isinstance(self.plateau, str) and self.plateau == "auto"):
            if isinstance(self.plateau, str) or not isinstance(self.plateau, (tuple, list)):
                raise ValueError(f"RobustFit.plateau must be 'auto', None or (window, rel_tol), got {self.plateau!r}")
            EarlyStop(*self.plateau)  # validates window and rel_tol
        for init in self.restarts:
            if init not in ("identity", "data", "random"):
                raise ValueError(f"RobustFit.restarts holds flow initialisations 'identity', 'data' or 'random', "
                                 f"got {init!r}")
        if isinstance(self.keep_best_every, bool) or not isinstance(self.keep_best_every, int) \
                or self.keep_best_every < 1:
            raise ValueError(f"RobustFit.keep_best_every must be a positive integer, got {self.keep_best_every!r}")
        if not self.tolerance >= 0:
            raise ValueError(f"RobustFit.tolerance must be non-negative, got {self.tolerance!r}")
        if not 0 <= self.refine_budget <= 1:
            raise ValueError(f"RobustFit.refine_budget is a share of epochs in [0, 1], got {self.refine_budget!r}")
        if isinstance(self.refine_max_evaluations, bool) or not isinstance(self.refine_max_evaluations, int) \
                or self.refine_max_evaluations < 0:
            raise ValueError(f"RobustFit.refine_max_evaluations must be a non-negative integer, "
                             f"got {self.refine_max_evaluations!r}")

    def refine_evaluations(self, epochs: int) -> int:
        """The full-data evaluations the flow refinement may spend in a fit of `epochs` epochs (0: no refinement):
        floor(refine_budget·epochs), at most refine_max_evaluations, 0 below 2."""
        evaluations = min(int(self.refine_budget * epochs), self.refine_max_evaluations)
        return evaluations if evaluations >= 2 else 0

    def early_stop(self) -> Optional[EarlyStop]:
        """The EarlyStop of an explicit (window, rel_tol) plateau; None for None (and for "auto", which the
        estimator resolves to its own rule)."""
        if self.plateau is None or isinstance(self.plateau, str):
            return None
        return EarlyStop(*self.plateau)

    def classifier_flow_epochs(self, epochs: int) -> int:
        """Epochs of the flow stage after an SVGP stage of all `epochs` (TGPClassifier): the two stages keep the
        shares svgp_epochs : 1 - svgp_epochs of the fit, epochs·(1 - s)/s, at least one (none when epochs is 0)."""
        if not epochs:
            return 0
        return max(1, int(round(epochs * (1.0 - self.svgp_epochs) / self.svgp_epochs)))


@dataclass(frozen=True)
class FitRows:
    """The data of a robust fit, in memory or streamed.

    x, y: the rows its bounds are evaluated on (warm start, refinement, best state, final check), in the
        estimator's units: all training rows, or for a streamed table a uniform sample of them, whose bounds
        (expected log-likelihood scaled by num_rows / len(x), minus the KL) estimate the full table's.
    num_rows: the size of the training set.
    svgp_shift: the mean of the raw targets (the SVGP stage standardises by it).
    y_range: (min, max) of the raw targets over the training set.
    stream: None when training reads x, y themselves; for a streamed table, `stream(shift, scale)` returns a
        flowgp.training.batches sampler over the whole table with targets (y - shift) / scale.
    """

    x: object
    y: object
    num_rows: int
    svgp_shift: float
    y_range: tuple
    stream: Optional[Callable] = None


#: the default robust procedure (`robust=True`)
DEFAULT_ROBUST_FIT = RobustFit()


def resolve_robust(robust, flow_is_identity: bool) -> Optional[RobustFit]:
    """The RobustFit an estimator's `robust=` parameter asks for: None for a plain fit (False/None, or an identity
    flow, whose model is the SVGP itself), DEFAULT_ROBUST_FIT for True; TypeError for anything else."""
    if robust is False or robust is None:
        return None
    if robust is not True and not isinstance(robust, RobustFit):
        raise TypeError(f"robust must be True (the default robust fit), False (a plain fit) or a "
                        f"flowgp.estimators.RobustFit, got {type(robust).__name__}")
    if flow_is_identity:
        return None
    return DEFAULT_ROBUST_FIT if robust is True else robust


def snapshot(model) -> dict:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


class BestState:
    """A `train` callback keeping the model state with the best full-data bound (`RobustFit.keep_best`).

    Full batch (`every` None): a step's loss is -bound at the state the step started from, so that state is
    remembered one step late at no extra cost. Minibatches: `bound(model)` is evaluated every `every` steps.
    `finish` also weighs the final state (which the loop never evaluates) and loads the best one.
    """

    def __init__(self, model, bound, every=None):
        self.bound, self.every = bound, every
        self.value, self.state = -math.inf, None
        self.previous = snapshot(model) if every is None else None
        if every is not None:
            self.consider(model)

    def consider(self, model) -> None:
        value = self.bound(model)
        if value > self.value:
            self.value, self.state = value, snapshot(model)

    def __call__(self, step, loss, model):
        if self.every is None:
            if math.isfinite(loss) and -loss > self.value:
                self.value, self.state = -loss, self.previous
            self.previous = snapshot(model)
        elif (step + 1) % self.every == 0:
            self.consider(model)
        return False

    # saved in `train`'s checkpoints, so a resumed (or reloaded) fit keeps the best state of the whole run
    def state_dict(self) -> dict:
        return {"value": self.value, "state": self.state, "previous": self.previous}

    def load_state_dict(self, saved: dict) -> None:
        self.value, self.state, self.previous = float(saved["value"]), saved["state"], saved["previous"]

    def finish(self, model) -> None:
        self.consider(model)
        if self.state is not None:
            model.load_state_dict(self.state)


def warn_below_svgp(name: str, bound: float, svgp_bound: float, tolerance: float, stacklevel: int = 5,
                    start: float | None = None) -> bool:
    """Warn (BoundBelowSVGPWarning) when the per-point `bound` is below `svgp_bound` - `tolerance`; returns
    whether it warned. `start`: the flow model's bound at its warm start (after refinement); a start below the
    SVGP's means the flow family cannot reproduce the SVGP (e.g. a bare 'log' or 'softplus', with no affine
    stage), so a lower final bound may be the model's, and the message says so instead of blaming the optimiser."""
    if bound >= svgp_bound - tolerance:
        return False
    if start is not None and start < svgp_bound - tolerance:
        cause = (f"this flow cannot reproduce that SVGP (its closest start, {start:.4f}, is below it), so the lower "
                 "bound may be the model's rather than the optimiser's; a flow ending in an affine stage (e.g. "
                 "'sal', 'log+sal', 'sal+softplus') contains the SVGP. Otherwise try")
    else:
        cause = "the flow model contains that SVGP, so this is an optimisation failure. Try"
    warnings.warn(
        f"{name}: the fitted training bound per point, {bound:.4f}, is below the SVGP's on the same data, "
        f"{svgp_bound:.4f} (tolerance {tolerance}); {cause} more epochs, a smaller lr, "
        "robust=RobustFit(restarts=('data',)), another flow, or robust=RobustFit(natural_gradient=0.03); "
        "fit_report_ has the bound after every stage.",
        BoundBelowSVGPWarning, stacklevel=stacklevel)
    return True
