"""The validated configuration of one `flowgp.training.loop.train` run: every argument checked (ValueError or
TypeError naming it and the fix) before any work, and what follows from them (the sampler, the process group,
the budget in steps, the noise freeze)."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from .batches import ArrayBatches
from .distributed import World, current_world
from .early_stop import BestParameters, EarlyStop
from .natural_gradients import NaturalGradient
from ..reporting.progress import show_progress

#: the torch.compile modes `train(compile=...)` takes by name (True is "default")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

__all__ = ["RunConfig", "COMPILE_MODES", "total_steps"]


def total_steps(unit: str, budget: int, per_epoch: int) -> int:
    """The number of steps in a budget of `budget` units ("steps", or "epochs" of `per_epoch` steps each)."""
    return budget if unit == "steps" else budget * per_epoch


def is_sampler(x) -> bool:
    return not isinstance(x, torch.Tensor) and all(
        hasattr(x, a) for a in ("num_data", "steps_per_epoch", "state_dict", "load_state_dict", "__iter__"))


def _check_step_size(lr) -> None:
    """ValueError (TypeError for a non-number) unless `lr` is a positive finite step size."""
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real):
        raise TypeError(f"lr must be a positive finite step size such as 0.01, got {lr!r} ({type(lr).__name__})")
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive finite step size such as 0.01, got {lr!r}")


def _check_count(value, name: str, allow_none: bool = False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def _check_scalars(epochs, steps, lr, fix_noise_fraction, checkpoint_every, extend_budget, nonfinite) -> None:
    _check_count(epochs, "epochs")
    _check_count(steps, "steps", allow_none=True)
    _check_step_size(lr)
    if not 0.0 <= fix_noise_fraction <= 1.0:
        raise ValueError(f"fix_noise_fraction must lie in [0, 1], got {fix_noise_fraction}")
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be a positive integer, got {checkpoint_every!r}")
    if not isinstance(extend_budget, bool):
        raise TypeError(f"extend_budget must be True or False, got {type(extend_budget).__name__}")
    if nonfinite not in ("raise", "backoff"):
        raise ValueError(f"nonfinite must be 'raise' or 'backoff', got {nonfinite!r}")


def _check_parts(early_stop, natural_gradient, callback, loss, regulariser, compile, keep_best):
    """The objects the run is given, checked; returns the BestParameters to keep (None: keep_best=False)."""
    if early_stop is not None and not isinstance(early_stop, EarlyStop):
        raise TypeError(f"early_stop must be a flowgp.training.loop.EarlyStop, got {type(early_stop).__name__}")
    if natural_gradient is not None and not isinstance(natural_gradient, NaturalGradient):
        raise TypeError("natural_gradient must be a flowgp.training.natural_gradients.NaturalGradient, got "
                        f"{type(natural_gradient).__name__}")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable(step, loss, model), got {type(callback).__name__}")
    if loss is not None and not callable(loss):
        raise TypeError(f"loss must be callable(model, batch, num_data, generator), got {type(loss).__name__}")
    if regulariser is not None and not callable(regulariser):
        raise TypeError(f"regulariser must be callable() -> scalar tensor, got {type(regulariser).__name__}")
    if isinstance(compile, str):
        if compile not in COMPILE_MODES and compile != "auto":
            raise ValueError(f"compile={compile!r} is not a torch.compile mode; use True, False, 'auto' or one of "
                             f"{', '.join(map(repr, COMPILE_MODES))}")
    elif not isinstance(compile, bool):
        raise TypeError(f"compile must be True, False, 'auto' or a torch.compile mode name, got {compile!r}")
    best = BestParameters() if keep_best is True else (keep_best or None)
    if best is not None and not isinstance(best, BestParameters):
        raise TypeError(f"keep_best must be a bool or a BestParameters, got {type(keep_best).__name__}")
    return best


def _sampler_and_world(x, y, batch_size, seed, loss, world):
    """The sampler of the data (sharded over the process group when there is one) and the World."""
    if is_sampler(x):
        if y is not None or batch_size is not None:
            raise ValueError("x is a sampler: leave y and batch_size to it (pass y=None, batch_size=None)")
        sampler = x
    else:
        sampler = ArrayBatches(x, y, batch_size, seed=seed)
    if world is None:
        # the model's bound is split over the initialised process group; a loss= hook (flow initialisation,
        # auxiliary fits every rank repeats identically) runs locally unless a world is given
        world = current_world() if loss is None else World()
    if not isinstance(world, World):
        raise TypeError(f"world must be a flowgp.training.distributed.World or None, got {type(world).__name__}")
    if world.distributed and getattr(sampler, "world_size", 1) != world.size:
        if not hasattr(sampler, "shard"):
            raise TypeError(f"{type(sampler).__name__} has no shard(rank, world_size): it cannot be split over "
                            f"{world.size} processes")
        sampler.shard(world.rank, world.size)
    return sampler, world


@dataclass(frozen=True)
class RunConfig:
    """What `train` was asked to do, checked. `unit`/`budget`: "steps" and `steps`, or "epochs" and `epochs`;
    `total`: the budget in steps; `frozen_steps`: the steps with the likelihood noise frozen (TGP appendix
    B.5); `best`: the BestParameters that `keep_best` asks for (None: none)."""

    sampler: object
    world: World
    num_data: int
    steps_per_epoch: int
    unit: str
    budget: int
    total: int
    frozen_steps: int
    lr: float
    seed: int
    verbose: bool
    desc: str
    checkpoint_path: object
    checkpoint_every: int
    extend_budget: bool
    backoff: bool
    optimizer: object
    natural_gradient: Optional[NaturalGradient]
    schedule: Optional[Callable]
    early_stop: Optional[EarlyStop]
    callback: Optional[Callable]
    loss: Optional[Callable]
    regulariser: Optional[Callable]
    generator: Optional[torch.Generator]
    compile: object
    best: Optional[BestParameters]

    @property
    def path(self) -> Optional[Path]:
        return None if self.checkpoint_path is None else Path(self.checkpoint_path)

    @classmethod
    def from_arguments(cls, x, y, epochs, batch_size, lr, fix_noise_fraction, seed, verbose, checkpoint_path,
                       checkpoint_every, desc, *, steps, optimizer, natural_gradient, schedule, early_stop,
                       callback, loss, generator, keep_best, nonfinite, world, compile, regulariser,
                       extend_budget) -> "RunConfig":
        """`train`'s arguments checked (in the order of its signature), the sampler built or sharded."""
        _check_scalars(epochs, steps, lr, fix_noise_fraction, checkpoint_every, extend_budget, nonfinite)
        verbose = show_progress(verbose)  # "auto": only in an interactive terminal, never inside scikit-learn
        best = _check_parts(early_stop, natural_gradient, callback, loss, regulariser, compile, keep_best)
        sampler, world = _sampler_and_world(x, y, batch_size, seed, loss, world)
        per_epoch = int(sampler.steps_per_epoch)
        unit, budget = ("steps", steps) if steps is not None else ("epochs", epochs)
        total = total_steps(unit, budget, per_epoch)
        return cls(sampler=sampler, world=world, num_data=int(sampler.num_data), steps_per_epoch=per_epoch,
                   unit=unit, budget=budget, total=total, frozen_steps=int(round(fix_noise_fraction * total)),
                   lr=lr, seed=seed, verbose=verbose, desc=desc, checkpoint_path=checkpoint_path,
                   checkpoint_every=checkpoint_every, extend_budget=extend_budget, backoff=nonfinite == "backoff",
                   optimizer=optimizer, natural_gradient=natural_gradient, schedule=schedule,
                   early_stop=early_stop, callback=callback, loss=loss, regulariser=regulariser,
                   generator=generator, compile=compile, best=best)
