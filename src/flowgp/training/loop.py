"""The one optimisation loop of flowgp: every fit, flow initialisation and latent-DGP run goes through `train`.

`train(model, x, y)` maximises model.training_objective(x_b, y_b, num_data=N, ...) (`flowgp.models.protocol`)
over minibatches (or minimises a `loss=` hook) with Adam or any torch.optim optimiser, optionally with
natural-gradient steps on Gaussian q(v) (`flowgp.training.natural_gradients.NaturalGradient`, Salimbeni et al. 2018) next to it,
learning-rate schedules, the fixed-noise schedule, early stopping on a plateau, a per-step callback, a progress bar
and resumable checkpoints.

- Data come from a sampler (`flowgp.training.batches.ArrayBatches` for tensors): the loop never sees the whole data set,
  so a data-parallel version only wraps the sampler and the gradient reduction.
- The fixed-noise schedule (TGP appendix B.5) freezes the likelihood noise for the first `fix_noise_fraction`
  of the steps, which keeps models from explaining the data as noise early on.
- Randomness: the sampler's generator (seeded with `seed`) orders the rows; a second torch.Generator (seeded
  with seed + 1, on the data's device) is passed as `generator=` to the model's objective, so a fit never
  touches the global RNG.
- Checkpoints (`checkpoint_path`) are atomic and checksummed (`flowgp.training.checkpoint`) and load with
  weights_only=True. They hold the model, every optimiser's and scheduler's state, the sampler's state (the
  permutation of the current epoch and the position in it), both generators' states, the history, the step
  count and the early-stop state, so a resumed run takes exactly the steps the uninterrupted run would have
  taken; and the loop's wall seconds summed over every process that ran it (`checkpoint_training_seconds`).
  They also record the run's fingerprint (`flowgp.training.checkpoint.FingerprintedPath`: what it was trained on), and a
  file whose fingerprint is another run's is refused rather than resumed: a fit never hands back another's model.
  They are written every `checkpoint_every` budget units (epochs or steps), when the run ends, and on
  KeyboardInterrupt, always at a completed-step boundary: while a checkpointed run is in the main thread, a
  first Ctrl-C is held until the current step is done (a second one interrupts at once, without saving). The
  interruption leaves `train` as a `TrainingInterrupted` (a KeyboardInterrupt) naming the step and the file saved.
  `extend_budget=True` carries a checkpointed run, finished or not, on to a larger budget on the same trajectory.
- Data parallelism (`flowgp.training.distributed`): inside an initialised torch.distributed process group (torchrun,
  `flowgp fit --nproc N`) every rank takes its part of the same global batch (the sampler is sharded), weights
  its bound by its share of the rows so that the summed gradients are the single-process gradient of the
  global batch, all-reduces the gradients and the loss, and takes the same step. Rank 0 alone writes the
  checkpoints and shows the progress bar; a checkpoint holds no trace of the world size, so a run resumes with
  any number of processes on the same trajectory.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Callable, Optional

import torch
from tqdm.auto import tqdm

from ..gp.defaults import DEFAULTS
from .checkpoint import safe_load
from .compiled import CompiledObjective, compile_pays_off
from .compile_policy import AutoCompile
from .distributed import World, broadcast_module
from .early_stop import BestParameters, EarlyStop, Plateau
from .interrupt import InterruptGuard, TrainingInterrupted
from .natural_gradients import NaturalGradient
from .run_config import COMPILE_MODES, RunConfig
from .run_state import CHECKPOINT_FORMAT, Checkpointer, RunState, run_fingerprint
from .stepper import Stepper, build_objective, build_optimisers, default_optimizer

__all__ = ["train", "default_optimizer", "EarlyStop", "BestParameters", "step_lr", "CHECKPOINT_FORMAT",
           "checkpoint_training_seconds", "TrainingInterrupted", "COMPILE_MODES"]


def step_lr(step_size: int, gamma: float):
    """Schedule factory for `train(schedule=...)`: multiply every step size by `gamma` every `step_size` steps
    (torch.optim.lr_scheduler.StepLR; the DGP-IWVI supplement E.2 uses 0.98 every 1000 iterations).

    Args:
        step_size: steps between two reductions.
        gamma: the factor of each reduction.

    Examples:
        >>> from flowgp.training import step_lr
        >>> schedule = step_lr(1000, 0.98)  # then train(model, x, y, schedule=schedule)
    """
    if isinstance(step_size, bool) or int(step_size) != step_size or step_size < 1:
        raise ValueError(f"step_size must be a positive integer, got {step_size!r}")
    if not gamma > 0:
        raise ValueError(f"gamma must be positive, got {gamma!r}")
    return functools.partial(torch.optim.lr_scheduler.StepLR, step_size=int(step_size), gamma=float(gamma))


def checkpoint_training_seconds(path) -> float:
    """Wall seconds that the training loops which wrote the checkpoint `path` ran, summed over every process
    that continued it (0.0 for files written before checkpoints kept the count): a resumed fit's total."""
    state = safe_load(Path(path))
    return float(state.get("training_seconds", 0.0)) if isinstance(state, dict) else 0.0


def _noise_parameters(model):
    likelihood = getattr(model, "likelihood", None)
    if not isinstance(likelihood, torch.nn.Module):
        return []
    return [p for n, p in likelihood.named_parameters() if "noise" in n]


def train(
    model,
    x,
    y: Optional[torch.Tensor] = None,
    epochs: int = DEFAULTS.epochs,
    batch_size: Optional[int] = None,
    lr: float = DEFAULTS.lr,
    fix_noise_fraction: float = 0.0,
    seed: int = 0,
    verbose: bool | str = True,
    checkpoint_path=None,
    checkpoint_every: int = 100,
    desc: str = "training",
    *,
    steps: Optional[int] = None,
    optimizer=None,
    natural_gradient: Optional[NaturalGradient] = None,
    schedule: Optional[Callable] = None,
    early_stop: Optional[EarlyStop] = None,
    callback: Optional[Callable] = None,
    loss: Optional[Callable] = None,
    generator: Optional[torch.Generator] = None,
    keep_best=False,
    nonfinite: str = "raise",
    world: Optional[World] = None,
    compile: bool | str = False,
    regulariser: Optional[Callable] = None,
    extend_budget: bool = False,
) -> list:
    """Minimise -model.elbo (or `loss`) over minibatches; returns the history (see the module doc).

    Args:
        model: a flowgp.models.protocol.TrainableModel (its training_objective is called with num_data,
            generator, batch_rows, indices and the sampler's extra arrays by keyword), or any module with `loss=`.
        x, y, batch_size: data tensors (wrapped in ArrayBatches(x, y, batch_size, seed=seed); batch_size None: the
            full batch), or x a sampler from flowgp.training.batches (then y and batch_size must be None).
        epochs, steps: the budget in passes over the data, or in optimiser steps when `steps` is given.
        lr: step size of the default optimiser (Adam) or of an optimiser class.
        fix_noise_fraction: the likelihood noise is frozen for this fraction of the steps (TGP appendix B.5).
        seed: seeds the sampler's generator (seed) and the model's Monte Carlo generator (seed + 1).
        checkpoint_path, checkpoint_every: resume from this file when it exists, write it every `checkpoint_every` epochs (or
            steps) and at the end. A checkpoint written with another data size, batch size, budget or
            optimiser set is refused (ValueError naming the difference), except as `extend_budget` allows;
            so is one written by another run (`flowgp.training.checkpoint.FingerprintMismatch`, a ValueError naming
            the fields): the checkpoint records the run's fingerprint, the one a
            `flowgp.training.checkpoint.FingerprintedPath` carries, else for tensors x, y a digest of them (for a
            sampler without one, nothing). A finished checkpoint of the same run is loaded back without
            training. Files written before fingerprints existed resume with a warning.
        verbose: show a progress bar: True, False or "auto" (only in an interactive terminal and never when
            scikit-learn or joblib runs the fit: `flowgp.reporting.progress.show_progress` decides).
        desc: label of the progress bar (shown when `verbose`).
        optimizer: None (Adam), a torch.optim.Optimizer class (built with lr=lr), or a factory
            callable(params) -> optimiser. Closure-based optimisers (L-BFGS) are stepped with a closure.
        natural_gradient: a flowgp.training.natural_gradients.NaturalGradient over some q(v); its parameters are excluded from
            `optimizer`, and it steps after it from the same gradients.
        schedule: callable(optimiser) -> LR scheduler, applied to every optimiser (the natural gradient's
            step size included) and stepped after every step, e.g. step_lr(1000, 0.98).
        early_stop: an EarlyStop on the history.
        callback: callback(step, loss, model) after every step (step: 0-based index, loss: the step's loss
            value, non-finite for a step skipped in backoff mode); a truthy return value stops the run. A callback
            with state_dict()/load_state_dict() has its state saved in the checkpoints and restored on resume.
        loss: loss(model, batch, num_data, generator) -> scalar tensor to minimise instead of -elbo.
        regulariser: regulariser() -> scalar tensor added to the loss at every evaluation: a global term (of
            the parameters alone, not the data), counted once whatever the number of processes.
        generator: the model's Monte Carlo generator (default: new, seeded with seed + 1, on the data's device).
        keep_best: True or a BestParameters: remember the trainable parameters at the lowest loss evaluated
            (L-BFGS line-search points included) and restore them at the end.
        nonfinite: "raise" (FloatingPointError on a non-finite loss) or "backoff": a step whose loss or
            gradient is not finite (or whose evaluation raises RuntimeError) is undone (back to the best point
            with keep_best), every step size is halved, and the run stops once one falls below 1e-4 of its
            initial value; inside an L-BFGS step such a trial point returns a large value with zero slope so
            the line search backs off.
        world: the flowgp.training.distributed.World to split every batch over (default: the initialised
            torch.distributed group for the model's bound, one process with a `loss=` hook). A sampler passed
            as x is sharded with its `shard(rank, world_size)`. A `loss=` hook given a world must be a minibatch
            estimate of the same form as the bound (rows' terms rescaled by N / B, with B = batch.step_size,
            minus global terms).
        compile: False; True or a torch.compile mode name (flowgp.training.run_config.COMPILE_MODES): evaluate the
            objective through flowgp.training.compiled.CompiledObjective (bound and backward compiled; eager fallback
            with a warning); "auto": compile only where the rest of the budget repays it, timed
            (flowgp.training.compile_policy, which gives the measurements). A compiled fit differs from the eager
            one by rounding: where a fit must repeat bit for bit, pass True or False.
        extend_budget: let `checkpoint_path` hold a run written with a smaller budget (same unit, everything
            else the same), finished or not, and carry it on to this budget on the trajectory of a run given this
            budget from the start (schedules of the step alone, same end of the noise freeze). Refused
            (ValueError) for a smaller budget, a run that stopped early, or one that restored keep_best.

    Returns:
        The history: with the default objective the mean negative ELBO per data point (mean over the epoch's
        steps divided by N), with `loss` the loss itself; one entry per epoch, or per step with `steps`.

    See Also:
        :class:`flowgp.SVGP` (an example), :class:`flowgp.training.EarlyStop`, :func:`flowgp.training.step_lr`.
    """
    config = RunConfig.from_arguments(
        x, y, epochs, batch_size, lr, fix_noise_fraction, seed, verbose, checkpoint_path, checkpoint_every, desc,
        steps=steps, optimizer=optimizer, natural_gradient=natural_gradient, schedule=schedule,
        early_stop=early_stop, callback=callback, loss=loss, generator=generator, keep_best=keep_best,
        nonfinite=nonfinite, world=world, compile=compile, regulariser=regulariser, extend_budget=extend_budget)
    return _fit(model, config, x, y)


def _fit(model, config: RunConfig, x, y) -> list:
    """Set up the run's parts (optimisers, objective, checkpoints, state resumed), then run the loop."""
    optimisers = build_optimisers(model, config)
    generator = config.generator
    if generator is None:
        generator = torch.Generator(device=getattr(config.sampler, "device", "cpu")).manual_seed(int(config.seed) + 1)
    objective, eager_objective, scale = build_objective(model, config, generator, optimisers.tracked,
                                                            CompiledObjective)
    state = RunState(initial_lrs=optimisers.initial_lrs())
    fingerprint = None if config.path is None else run_fingerprint(config.checkpoint_path, x, y)
    checkpoints = Checkpointer(config, model, optimisers, generator, fingerprint)
    state = checkpoints.resume(state)
    # every rank starts from rank 0's parameters (as DistributedDataParallel does)
    broadcast_module(model, config.world)
    best = config.best
    if state.finished:
        model.eval()
        if best is not None:
            best.restore(optimisers.tracked)
        return state.history
    stepper = Stepper(objective, optimisers, best, config.backoff, config.world, state.initial_lrs,
                      config.steps_per_epoch, generator)
    _loop(model, config, state, stepper, checkpoints, eager_objective, generator, scale)
    if best is not None:
        best.restore(optimisers.tracked)
    checkpoints.save(state, True)
    model.eval()
    return state.history


def _record(state: RunState, config: RunConfig, value: float, taken: bool, scale: float):
    """The step's bookkeeping: (history entry or None, whether an epoch ended)."""
    entry = None
    if taken:
        state.epoch_sum += value
        state.epoch_count += 1
        if config.unit == "steps":
            entry = value / scale
            state.history.append(entry)
    epoch_end = state.step % config.steps_per_epoch == 0
    if config.unit == "epochs" and epoch_end:
        if state.epoch_count:
            entry = state.epoch_sum / state.epoch_count / scale
            state.history.append(entry)
        state.epoch_sum, state.epoch_count = 0.0, 0
    return entry, epoch_end


def _loop(model, config: RunConfig, state: RunState, stepper: Stepper, checkpoints: Checkpointer, eager_objective,
          generator, scale: float) -> None:
    """The loop: steps over the sampler's batches until the budget is spent or a part stops the run."""
    world, unit, per_epoch, total = config.world, config.unit, config.steps_per_epoch, config.total
    noise_params = _noise_parameters(model)
    plateau = Plateau(config.early_stop, state.early_stop)
    model.train()
    done_units = state.step if unit == "steps" else state.step // per_epoch
    bar = tqdm(total=config.budget, initial=done_units, desc=config.desc, disable=not (config.verbose and world.is_main),
               leave=False)

    def report(message):
        if config.verbose and world.is_main:
            bar.write(f"{config.desc}: compile='auto': {message}")

    policy = AutoCompile(config.compile == "auto", state.step, eager_objective, stepper.tracked, generator, world,
                         report, total, lambda step: step < config.frozen_steps < total and bool(noise_params),
                         CompiledObjective, compile_pays_off)
    halt = False
    with InterruptGuard(config.path is not None, shared=world.distributed) as guard:
        stepper.stop_requested = lambda: guard.requested
        try:
            while state.step < total and not halt:
                batches = iter(config.sampler)
                while True:
                    guard.boundary = False  # from here until the step's bookkeeping is done, state is torn
                    batch = next(batches, None)
                    if batch is None:
                        break
                    frozen = state.step < config.frozen_steps
                    for p in noise_params:
                        p.requires_grad_(not frozen)
                    index = state.step
                    started = time.perf_counter() if policy.timing else None
                    value, taken = stepper.step(batch, index)  # its host read of the loss waits for the device
                    if started is not None:
                        policy.record(time.perf_counter() - started)
                    state.step += 1
                    switched = policy.after_step(state.step)
                    if switched is not None:
                        stepper.objective = switched
                    entry, epoch_end = _record(state, config, value, taken, scale)
                    if unit == "steps" or epoch_end:
                        bar.update(1)
                    if entry is not None:
                        position = len(state.history) - 1 if unit == "epochs" else index
                        halt = plateau(position, entry) or halt
                        if config.verbose and (unit == "epochs" or index % 20 == 0):
                            bar.set_postfix(loss=f"{entry:.4f}")
                    if config.backoff and not taken and stepper.lr_exhausted():
                        halt = True
                    guard.boundary = True
                    if config.callback is not None and config.callback(index, value, model):
                        halt = True
                    units = state.step if unit == "steps" else (state.step // per_epoch if epoch_end else 0)
                    if units and units % config.checkpoint_every == 0 and state.step < total and not halt:
                        checkpoints.save(state, False)
                    # (ranks stop together, after the step in which one of them asked: see InterruptGuard)
                    if stepper.stop_agreed if world.distributed else guard.requested:
                        raise KeyboardInterrupt
                    if halt or state.step >= total:
                        break
                guard.boundary = True
        except KeyboardInterrupt as err:
            guard.stop(err, state.step, lambda: checkpoints.save(state, False), config.path)
        finally:
            for p in noise_params:
                p.requires_grad_(True)
            bar.close()
