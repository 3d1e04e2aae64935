"""Early stopping on a plateau of the history (`EarlyStop`, the rule; `Plateau`, the part of the loop that applies
it after every history entry) and the best parameters seen (`BestParameters`, `train(keep_best=...)`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from ..gp.defaults import DEFAULTS

__all__ = ["EarlyStop", "BestParameters", "Plateau", "default_plateau"]


@dataclass(frozen=True)
class EarlyStop:
    """Stop on a plateau of the history (one entry per epoch, or per step with a `steps` budget).

    After every `window` entries the run stops when the best (lowest) entry improved by at most
    max(rel_tol·(|best| + 1e-8), min_delta) over the window (window=None: no plateau test); it also stops as
    soon as an entry is <= `abs_tol` (when given). Skipped steps (nonfinite="backoff") add no entry.
    `min_delta` is an absolute tolerance in the history's units (nats per data point for the default
    objective): a relative one alone never stops a bound that settles near 0 per point.

    Args:
        window: entries per plateau test (None: no plateau test).
        rel_tol: the relative improvement over a window below which the run stops.
        abs_tol: stop as soon as an entry is at most this (None: never).
        min_delta: the absolute improvement over a window below which the run stops.

    Examples:
        >>> from flowgp.training import EarlyStop, train
        >>> stop = EarlyStop(window=50, rel_tol=1e-4)  # then train(model, x, y, early_stop=stop)
    """

    window: Optional[int] = 100
    rel_tol: float = 1e-3
    abs_tol: Optional[float] = None
    min_delta: float = 0.0

    def __post_init__(self):
        if self.window is not None and (isinstance(self.window, bool) or not isinstance(self.window, int)
                                        or self.window < 1):
            raise ValueError(f"EarlyStop window must be a positive integer or None, got {self.window!r}")
        if not self.rel_tol >= 0:
            raise ValueError(f"EarlyStop rel_tol must be non-negative, got {self.rel_tol!r}")
        if not self.min_delta >= 0:
            raise ValueError(f"EarlyStop min_delta must be non-negative, got {self.min_delta!r}")


def default_plateau() -> EarlyStop:
    """The estimators' plateau stop (`early_stop="auto"`): the run has stopped moving, and ends, once its best
    history entry (the epoch's mean negative bound per data point) improved by at most DEFAULTS.plateau_tol nats
    over the last DEFAULTS.plateau_window entries (the first window only sets the reference)."""
    return EarlyStop(window=DEFAULTS.plateau_window, rel_tol=0.0, min_delta=DEFAULTS.plateau_tol)


class BestParameters:
    """The lowest loss seen at an evaluated point and the trainable parameters there (`train(keep_best=...)`).

    Pass the same object to several `train` calls to keep the best point across them (e.g. L-BFGS then Adam).

    See Also:
        :func:`flowgp.training.train` (``keep_best=``).
    """

    def __init__(self):
        self.loss = math.inf
        self.values: Optional[list] = None

    def consider(self, value: float, params) -> bool:
        """Remember `params` if `value` is the lowest so far; returns whether it was."""
        if value < self.loss:
            self.loss = float(value)
            self.values = [p.detach().clone() for p in params]
            return True
        return False

    @torch.no_grad()
    def restore(self, params) -> bool:
        """Copy the best values back into `params` (nothing when no finite loss was seen); returns whether it did."""
        if self.values is None:
            return False
        for p, v in zip(params, self.values):
            p.copy_(v)
        return True

    def state_dict(self) -> dict:
        return {"loss": self.loss, "values": self.values}

    def load_state_dict(self, state) -> None:
        self.loss = float(state["loss"])
        self.values = None if state["values"] is None else list(state["values"])



class Plateau:
    """The early-stop part of the loop: called with each history entry (its position in the history, or the
    step with a `steps` budget), it says whether `rule` stops the run. Its state, {"best", "window_best"}, is the
    dict `state` (the run state's `early_stop`, saved with every checkpoint)."""

    def __init__(self, rule: Optional[EarlyStop], state: dict):
        self.rule = rule
        self.state = state

    def __call__(self, index: int, entry: float) -> bool:
        if self.rule is None:
            return False
        stop, rule = self.state, self.rule
        stop["best"] = min(stop["best"], entry)
        if rule.abs_tol is not None and entry <= rule.abs_tol:
            return True
        if rule.window is not None and (index + 1) % rule.window == 0:
            if stop["window_best"] - stop["best"] <= max(rule.rel_tol * (abs(stop["best"]) + 1e-8), rule.min_delta):
                return True
            stop["window_best"] = stop["best"]
        return False
