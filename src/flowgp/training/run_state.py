"""The state of a `flowgp.training.loop.train` run and its checkpoints.

`RunState` is the loop's own state (history, step count, the running epoch mean, the early-stop state, the
initial step sizes, the wall seconds); `Checkpointer` writes it, with the model, optimiser, scheduler, sampler
and generator states, the best parameters and a stateful callback's state, to one atomic checksummed file
(`flowgp.training.checkpoint`), and resumes a run from such a file after checking that it is this run's
(configuration and fingerprint). The file format (`CHECKPOINT_FORMAT`, version 1) is that of every earlier
release: one flat dict.
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from typing import Optional

import torch

from .checkpoint import FingerprintedPath, atomic_save, check_fingerprint, safe_load
from .distributed import barrier
from .run_config import total_steps
from ..data.sources import data_digest

CHECKPOINT_FORMAT = "flowgp-training-checkpoint"
CHECKPOINT_VERSION = 1

__all__ = ["RunState", "Checkpointer", "CHECKPOINT_FORMAT", "CHECKPOINT_VERSION"]


@dataclass
class RunState:
    """The loop's state between steps. `early_stop`: the Plateau state {"best", "window_best"};
    `earlier_seconds`: the loop's wall seconds in the processes that wrote the checkpoint resumed."""

    history: list = field(default_factory=list)
    step: int = 0
    epoch_sum: float = 0.0
    epoch_count: int = 0
    early_stop: dict = field(default_factory=lambda: {"best": math.inf, "window_best": math.inf})
    initial_lrs: list = field(default_factory=list)
    finished: bool = False
    earlier_seconds: float = 0.0
    run_start: float = field(default_factory=time.perf_counter)

    def to_dict(self, finished: bool) -> dict:
        """The checkpoint entries of this state (`finished`: whether the run has ended)."""
        return {"history": list(self.history), "step": self.step, "epoch_sum": self.epoch_sum,
                "epoch_count": self.epoch_count, "early_stop": dict(self.early_stop),
                "initial_lrs": self.initial_lrs, "finished": finished,
                "training_seconds": self.earlier_seconds + time.perf_counter() - self.run_start}

    @classmethod
    def from_dict(cls, state: dict, extending: bool = False) -> "RunState":
        """The state a checkpoint holds (`extending`: carried on to a larger budget, so not finished)."""
        return cls(history=list(state["history"]), step=int(state["step"]), epoch_sum=float(state["epoch_sum"]),
                   epoch_count=int(state["epoch_count"]), early_stop=dict(state["early_stop"]),
                   initial_lrs=[list(v) for v in state["initial_lrs"]],
                   finished=bool(state["finished"]) and not extending,
                   earlier_seconds=float(state.get("training_seconds", 0.0)))  # files from before the key: 0


def run_fingerprint(checkpoint_path, x, y) -> Optional[dict]:
    """The fingerprint this run's checkpoint records (`flowgp.training.checkpoint`): the caller's, carried by a
    `FingerprintedPath` (the estimators': data digest from the pass that standardises, class, version,
    parameters), else for data given as tensors the digest of x and y (one read of them, only with a
    checkpoint); None for a sampler without the caller's fingerprint (nothing to compare)."""
    if isinstance(checkpoint_path, FingerprintedPath):
        return dict(checkpoint_path.fingerprint)
    if isinstance(x, torch.Tensor):
        return {"data": data_digest(x, y)}
    return None


def _check_run_fingerprint(path, state: dict, fingerprint: Optional[dict]) -> None:
    """FingerprintMismatch (a ValueError naming the differing fields) unless the checkpoint's recorded
    fingerprint is this run's; a file written before checkpoints recorded one resumes with a warning."""
    if fingerprint is None:
        return
    saved = state.get("fingerprint")
    if saved is None:
        warnings.warn(f"the checkpoint {path} records no fingerprint of its data and settings (it was written "
                      "before flowgp checked them), so nothing shows it belongs to this fit; resuming from it. "
                      "Delete it to train afresh", stacklevel=5)
        return
    check_fingerprint(path, saved, fingerprint)


def _load_model_state(model, saved: dict, path) -> None:
    """The model's parameters from a checkpoint; ValueError naming the file and the fix when it holds another
    model's (e.g. an SVGP's checkpoint given to a TGP: keys missing, shapes differing)."""
    try:
        model.load_state_dict(saved)
    except RuntimeError as err:
        detail = " ".join(str(err).split())[:400]
        raise ValueError(f"the checkpoint {path} holds the state of another model than this {type(model).__name__} "
                         f"({detail}); it was written by another estimator or model configuration: give this fit "
                         "its own checkpoint path, or delete the file to start afresh") from None


def _check_extension(path, state, budget) -> None:
    """Refuse to extend a checkpoint that a longer run would not have passed through (see `extend_budget`)."""
    saved = int(state["config"]["budget"])
    if budget < saved:
        raise ValueError(f"extend_budget only grows a budget: the checkpoint {path} was written with budget={saved} "
                         f"but this run has budget={budget}")
    if not state["finished"]:
        return
    cfg = state["config"]
    total = total_steps(cfg["unit"], saved, int(cfg["steps_per_epoch"]))
    if int(state["step"]) < total:
        raise ValueError(f"the run in {path} stopped at step {int(state['step'])} of {total} (early stop, back-off "
                         "or a callback), so a longer budget would not continue it; delete the file to start afresh")
    if state["best"] is not None:
        raise ValueError(f"the run in {path} ended by restoring its best parameters (keep_best), not at its last "
                         "step, so a longer budget would not continue it; delete the file to start afresh")


def _check_config(path, saved: dict, config: dict, extending: bool) -> None:
    """ValueError naming the first setting in which the checkpoint's run differs from this one."""
    for key, value in config.items():
        before = saved.get(key)
        if before != value and not (extending and key == "budget"):
            hint = (" (a longer budget moves the end of the noise freeze, fix_noise_fraction x the budget, "
                    "so it cannot extend this run)" if extending and key == "frozen_steps" else "")
            raise ValueError(f"the checkpoint {path} was written with {key}={before!r} but this run has "
                             f"{key}={value!r}{hint}; resume with the same data, batch size, budget and "
                             "optimisers (extend_budget=True allows a larger budget), or delete the file to "
                             "start afresh")


class Checkpointer:
    """Writes and resumes the checkpoints of one run (`config`: its RunConfig; nothing when it has no
    checkpoint_path). Rank 0 alone writes; the other ranks wait for its file."""

    def __init__(self, config, model, optimisers, generator, fingerprint: Optional[dict]):
        self.config, self.model, self.optimisers, self.generator = config, model, optimisers, generator
        self.path = config.path
        self.fingerprint = fingerprint
        self.settings = {"num_data": config.num_data, "batch_size": int(getattr(config.sampler, "batch_size", -1)),
                         "steps_per_epoch": config.steps_per_epoch, "unit": config.unit, "budget": config.budget,
                         "frozen_steps": config.frozen_steps,
                         "optimizers": [type(o).__name__ for o in optimisers.all],
                         "schedulers": len(optimisers.schedulers)}

    def resume(self, state: RunState) -> RunState:
        """The state to start from: the checkpoint's when the file exists (every other state loaded from it
        too), else `state`."""
        path, config = self.path, self.config
        if path is None or not path.exists():
            return state
        saved = safe_load(path, map_location=getattr(config.sampler, "device", "cpu"))
        if not isinstance(saved, dict) or saved.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path} is not a flowgp training checkpoint; choose another checkpoint_path")
        extending = config.extend_budget and saved["config"].get("budget") != config.budget
        _check_config(path, saved["config"], self.settings, extending)
        _check_run_fingerprint(path, saved, self.fingerprint)
        if extending:
            _check_extension(path, saved, config.budget)
        _load_model_state(self.model, saved["model"], path)
        for o, s in zip(self.optimisers.all, saved["optimizers"]):
            o.load_state_dict(s)
        for s, entry in zip(self.optimisers.schedulers, saved["schedulers"]):
            s.load_state_dict(entry)
        config.sampler.load_state_dict(saved["sampler"])
        self.generator.set_state(saved["generator"].cpu())
        resumed = RunState.from_dict(saved, extending)
        resumed.run_start = state.run_start
        if config.best is not None and saved["best"] is not None:
            config.best.load_state_dict(saved["best"])
        if hasattr(config.callback, "load_state_dict") and saved.get("callback") is not None:
            config.callback.load_state_dict(saved["callback"])
        return resumed

    def save(self, state: RunState, done: bool) -> None:
        """Write the run's state (`done`: the run has ended) atomically, at a completed-step boundary."""
        if self.path is None:
            return
        world = self.config.world
        if not world.is_main:
            barrier(world)  # the others wait until rank 0's file is in place
            return
        best, callback = self.config.best, self.config.callback
        loop = state.to_dict(done)
        atomic_save({
            "format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "config": self.settings,
            "fingerprint": self.fingerprint, "model": self.model.state_dict(),
            "optimizers": [o.state_dict() for o in self.optimisers.all],
            "schedulers": [s.state_dict() for s in self.optimisers.schedulers],
            "sampler": self.config.sampler.state_dict(), "generator": self.generator.get_state(),
            **{k: loop[k] for k in ("history", "step", "epoch_sum", "epoch_count", "early_stop", "initial_lrs",
                                    "finished")},
            "best": None if best is None else best.state_dict(),
            # a callback with state (e.g. the robust fit's best state seen) resumes with the run
            "callback": callback.state_dict() if hasattr(callback, "state_dict") else None,
            "training_seconds": loop["training_seconds"],
        }, self.path)
        barrier(world)
