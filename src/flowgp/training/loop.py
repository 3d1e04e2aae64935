"""The one optimisation loop of flowgp: every fit, flow initialisation and latent-DGP run goes through `train`.

`train(model, x, y)` maximises model.elbo(x_b, y_b, num_data=N) (a model's `training_objective` where it has one)
over minibatches (or minimises a `loss=` hook) with Adam or any torch.optim optimiser, optionally with
natural-gradient steps on Gaussian q(v) (`flowgp.training.natural_gradients.NaturalGradient`, Salimbeni et al. 2018) next to it,
learning-rate schedules, the fixed-noise schedule, early stopping on a plateau, a per-step callback, a progress bar
and resumable checkpoints.

- Data come from a sampler (`flowgp.training.batches.ArrayBatches` for tensors): the loop never sees the whole data set,
  so a data-parallel version only wraps the sampler and the gradient reduction.
- The fixed-noise schedule (TGP appendix B.5) freezes the likelihood noise for the first `fix_noise_fraction`
  of the steps, which keeps models from explaining the data as noise early on.
- Randomness: the sampler's generator (seeded with `seed`) orders the rows; a second torch.Generator (seeded
  with seed + 1, on the data's device) is passed as `generator=` to model.elbo when its signature takes one, so
  a fit never touches the global RNG.
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
import inspect
import math
import numbers
import signal
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
from tqdm.auto import tqdm

from ..gp.defaults import DEFAULTS
from .batches import ArrayBatches, Batch
from .checkpoint import FingerprintedPath, atomic_save, check_fingerprint, safe_load
from .compiled import AUTO_PROBE_STEPS, CompiledObjective, compile_pays_off
from ..data.sources import data_digest
from .distributed import World, all_reduce_gradients, all_reduce_sum, barrier, broadcast_module, current_world
from ..numerics.linalg import JitterMemory
from .natural_gradients import NaturalGradient

#: the torch.compile modes `train(compile=...)` takes by name (True is "default")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")

__all__ = ["train", "default_optimizer", "EarlyStop", "BestParameters", "step_lr", "CHECKPOINT_FORMAT",
           "checkpoint_training_seconds", "TrainingInterrupted"]

CHECKPOINT_FORMAT = "flowgp-training-checkpoint"
_CHECKPOINT_VERSION = 1
#: backoff mode gives up once a step size has been halved below this fraction of its initial value
_MIN_LR_FRACTION = 1e-4


@dataclass(frozen=True)
class EarlyStop:
    """Stop on a plateau of the history (one entry per epoch, or per step with a `steps` budget).

    After every `window` entries the run stops when the best (lowest) entry improved by at most
    rel_tol·(|best| + 1e-8) over the window (window=None: no plateau test); it also stops as soon as an entry
    is <= `abs_tol` (when given). Skipped steps (nonfinite="backoff") add no entry.
    """

    window: Optional[int] = 100
    rel_tol: float = 1e-3
    abs_tol: Optional[float] = None

    def __post_init__(self):
        if self.window is not None and (isinstance(self.window, bool) or not isinstance(self.window, int)
                                        or self.window < 1):
            raise ValueError(f"EarlyStop window must be a positive integer or None, got {self.window!r}")
        if not self.rel_tol >= 0:
            raise ValueError(f"EarlyStop rel_tol must be non-negative, got {self.rel_tol!r}")


class BestParameters:
    """The lowest loss seen at an evaluated point and the trainable parameters there (`train(keep_best=...)`).

    Pass the same object to several `train` calls to keep the best point across them (e.g. L-BFGS then Adam).
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


def step_lr(step_size: int, gamma: float):
    """Schedule factory for `train(schedule=...)`: multiply every step size by `gamma` every `step_size` steps
    (torch.optim.lr_scheduler.StepLR; the DGP-IWVI supplement E.2 uses 0.98 every 1000 iterations)."""
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


class TrainingInterrupted(KeyboardInterrupt):
    """A KeyboardInterrupt (Ctrl-C) that stopped `train`: `step` is the number of steps completed, `checkpoint`
    the file that holds the state a rerun resumes from (None: nothing was saved)."""

    def __init__(self, step: int, checkpoint=None):
        super().__init__(f"interrupted at step {step}" + (f"; state saved to {checkpoint}" if checkpoint else ""))
        self.step = int(step)
        self.checkpoint = None if checkpoint is None else str(checkpoint)

    def __reduce__(self):  # rebuilt from (step, checkpoint), e.g. when a bench worker hands it to its parent
        return type(self), (self.step, self.checkpoint)


class _NonFinite(Exception):
    pass


class _SkipStep(Exception):
    pass


def _noise_parameters(model):
    likelihood = getattr(model, "likelihood", None)
    if not isinstance(likelihood, torch.nn.Module):
        return []
    return [p for n, p in likelihood.named_parameters() if "noise" in n]


def _is_sampler(x) -> bool:
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


def _elbo_objective(model, sampler, num_data: int, generator: torch.Generator):
    """-model.elbo(x_b, y_b, num_data=N, ...) with the keyword arguments its signature declares; a model whose
    training objective may differ from its bound (the latent deep GP's per-slot objective) names it
    `training_objective`, with elbo's signature, and that is used instead."""
    elbo = getattr(model, "training_objective", None) or getattr(model, "elbo", None)
    if not callable(elbo):
        raise TypeError(f"{type(model).__name__} has no elbo(x, y, num_data) method; pass loss=callable(model, "
                        "batch, num_data, generator) for another objective")
    params = inspect.signature(elbo).parameters
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    pass_generator = "generator" in params
    # where a model draws per-row noise, (offset, B) lets it draw for the whole global batch and keep its rows
    pass_rows = "batch_rows" in params
    index_name = "indices" if "indices" in params else ("index" if "index" in params else None)
    extra_names = list(getattr(sampler, "extra", {}) or {})
    missing = [k for k in extra_names if k not in params and not var_kw]
    if missing:
        raise TypeError(f"the sampler provides {missing} but {type(model).__name__}.elbo takes no such keyword")

    def objective(batch: Batch):
        kwargs = dict(batch.extra)
        if pass_generator:
            kwargs["generator"] = generator
        if index_name is not None:
            kwargs[index_name] = batch.index
        if pass_rows:
            kwargs["batch_rows"] = (int(getattr(batch, "offset", 0)), int(getattr(batch, "step_size", len(batch))))
        return -elbo(batch.x, batch.y, num_data=num_data, **kwargs)

    return objective


def default_optimizer(params, lr: float) -> torch.optim.Optimizer:
    """The optimiser `train` builds when none is given: Adam, fused where torch has a fused kernel for the
    parameters (CPU and CUDA floating point), else the multi-tensor (foreach) Adam.

    Same update rule as the single-tensor `torch.optim.Adam` (equal to rounding); one kernel for all
    parameters instead of about ten per parameter, which matters at small M, where the whole step costs a
    few hundred microseconds and the per-parameter update was a fifth of it.
    """
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):  # a device or dtype without the fused kernel
        return torch.optim.Adam(params, lr=lr, foreach=True)


def _make_optimizer(optimizer, params, lr):
    if optimizer is None:
        return default_optimizer(params, lr)
    if isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer):
        return optimizer(params, lr=lr)
    if callable(optimizer):
        opt = optimizer(params)
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"optimizer factory must return a torch.optim.Optimizer, got {type(opt).__name__}")
        return opt
    raise TypeError("optimizer must be None (Adam), a torch.optim.Optimizer class or a factory "
                    f"callable(params) -> Optimizer, got {type(optimizer).__name__}")


def _grads_finite(params) -> bool:
    return all(p.grad is None or bool(torch.all(torch.isfinite(p.grad))) for p in params)


def _total_steps(unit: str, budget: int, per_epoch: int) -> int:
    """The number of steps in a budget of `budget` units ("steps", or "epochs" of `per_epoch` steps each)."""
    return budget if unit == "steps" else budget * per_epoch


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
    total = _total_steps(cfg["unit"], saved, int(cfg["steps_per_epoch"]))
    if int(state["step"]) < total:
        raise ValueError(f"the run in {path} stopped at step {int(state['step'])} of {total} (early stop, back-off "
                         "or a callback), so a longer budget would not continue it; delete the file to start afresh")
    if state["best"] is not None:
        raise ValueError(f"the run in {path} ended by restoring its best parameters (keep_best), not at its last "
                         "step, so a longer budget would not continue it; delete the file to start afresh")


def _run_fingerprint(checkpoint_path, x, y) -> Optional[dict]:
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
                      "Delete it to train afresh", stacklevel=3)
        return
    check_fingerprint(path, saved, fingerprint)


def train(
    model,
    x,
    y: Optional[torch.Tensor] = None,
    epochs: int = DEFAULTS.epochs,
    batch_size: Optional[int] = None,
    lr: float = DEFAULTS.lr,
    fix_noise_fraction: float = 0.0,
    seed: int = 0,
    verbose: bool = True,
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
        model: an nn.Module with elbo(x, y, num_data=N, ...) (keywords `generator`, `indices`/`index` and the
            sampler's extra names are passed when its signature declares them), or any module with `loss=`.
        x, y: data tensors (wrapped in ArrayBatches(x, y, batch_size, seed=seed)), or x a sampler from
            flowgp.training.batches (then y and batch_size must be None).
        epochs: the budget in passes over the data, unless `steps` is given: then the budget is `steps` steps.
        lr: step size of the default optimiser (Adam) or of an optimiser class.
        fix_noise_fraction: the likelihood noise is frozen for this fraction of the steps (TGP appendix B.5).
        seed: seeds the sampler's generator (seed) and the model's Monte Carlo generator (seed + 1).
        checkpoint_path: resume from this file when it exists, write it every `checkpoint_every` epochs (or
            steps) and at the end. A checkpoint written with another data size, batch size, budget or
            optimiser set is refused (ValueError naming the difference), except as `extend_budget` allows;
            so is one written by another run (`flowgp.training.checkpoint.FingerprintMismatch`, a ValueError naming
            the fields): the checkpoint records the run's fingerprint, the one a
            `flowgp.training.checkpoint.FingerprintedPath` carries, else for tensors x, y a digest of them (for a
            sampler without one, nothing). A finished checkpoint of the same run is loaded back without
            training. Files written before fingerprints existed resume with a warning.
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
        compile: evaluate the objective through flowgp.training.compiled.CompiledObjective (torch.compile of the
            whole bound and its backward; eager fallback with a warning when it cannot compile). Compiling
            takes seconds to a minute on a CPU and only removes per-step overhead: worth it for long fits.
            True is torch.compile's default mode; a mode name picks another: on a GPU "reduce-overhead" (CUDA
            graphs) replays the whole bound as one graph, which measured fastest where the eager step is
            launch-bound (docs/results/perf/gpu: SVGP M = 100, B = 1024 on an H200, 6.7 ms eager, 2.8 ms default
            mode, 1.8 ms reduce-overhead, against its longer compilation, 13 s instead of 6 s).
            "auto" runs the first `flowgp.training.compiled.AUTO_PROBE_STEPS` steps eagerly, times them, and compiles
            (default mode) only when `flowgp.training.compiled.compile_pays_off` finds the rest of the budget long
            enough to repay the compilation; otherwise the whole fit stays eager (the decision is printed when
            `verbose`). After compiling it times as many compiled steps (the first two, which compile and warm
            up, not counted) and goes back to the eager objective for the rest of the fit if their median is not
            below the eager one. A short fit (a 1 000-step SVGP at M = 20 on a CPU: 1.2 s eager, 3.5 s to
            compile) is not made slower by it. The choice depends on measured time, and a compiled fit differs from the
            eager one by rounding (1e-6 relative): where a fit must repeat bit for bit, pass True or False.
        extend_budget: let `checkpoint_path` hold a run written with a smaller budget (same unit, everything
            else the same), finished or not, and carry it on to this budget with its optimiser, scheduler,
            sampler and generator states: the steps taken are those of a run given this budget from the start,
            as long as the schedules depend on the step alone (step_lr does; one built from the total does
            not) and the noise freeze (`fix_noise_fraction`) ends at the same step. Refused (ValueError) for a
            smaller budget, for a run that stopped before its budget (early stop, back-off or a callback) and
            for a finished run that restored its best parameters (`keep_best`), none of which a longer run
            would continue from.

    Returns:
        The history: with the default objective the mean negative ELBO per data point (mean over the epoch's
        steps divided by N), with `loss` the loss itself; one entry per epoch, or per step with `steps`.
    """
    # ----- arguments -------------------------------------------------------------------------------------
    epochs = _check_count(epochs, "epochs")
    steps = _check_count(steps, "steps", allow_none=True)
    _check_step_size(lr)
    if not 0.0 <= fix_noise_fraction <= 1.0:
        raise ValueError(f"fix_noise_fraction must lie in [0, 1], got {fix_noise_fraction}")
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be a positive integer, got {checkpoint_every!r}")
    if not isinstance(extend_budget, bool):
        raise TypeError(f"extend_budget must be True or False, got {type(extend_budget).__name__}")
    if nonfinite not in ("raise", "backoff"):
        raise ValueError(f"nonfinite must be 'raise' or 'backoff', got {nonfinite!r}")
    if early_stop is not None and not isinstance(early_stop, EarlyStop):
        raise TypeError(f"early_stop must be a flowgp.training.loop.EarlyStop, got {type(early_stop).__name__}")
    if natural_gradient is not None and not isinstance(natural_gradient, NaturalGradient):
        raise TypeError("natural_gradient must be a flowgp.training.natural_gradients.NaturalGradient, got "
                        f"{type(natural_gradient).__name__}")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable(step, loss, model), got {type(callback).__name__}")
    if loss is not None and not callable(loss):
        raise TypeError(f"loss must be callable(model, batch, num_data, generator), got {type(loss).__name__}")
    if _is_sampler(x):
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
    backoff = nonfinite == "backoff"
    n = int(sampler.num_data)
    per_epoch = int(sampler.steps_per_epoch)
    unit, budget = ("steps", steps) if steps is not None else ("epochs", epochs)
    total = _total_steps(unit, budget, per_epoch)
    frozen_steps = int(round(fix_noise_fraction * total))

    # ----- optimisers ------------------------------------------------------------------------------------
    natgrad_ids = set()
    if natural_gradient is not None:
        natgrad_ids = {id(p) for g in natural_gradient.param_groups for p in g["params"]}
    tracked = [p for p in model.parameters() if p.requires_grad]
    params = [p for p in tracked if id(p) not in natgrad_ids]
    if not tracked:
        raise ValueError(f"{type(model).__name__} has no trainable parameters (all have requires_grad=False)")
    main = _make_optimizer(optimizer, params, lr) if params else None
    needs_closure = isinstance(main, torch.optim.LBFGS)
    if needs_closure and natural_gradient is not None:
        raise ValueError("natural_gradient works next to single-evaluation optimisers (Adam, SGD, ...); L-BFGS "
                         "re-evaluates the loss and would leave it gradients of another point")
    optimizers = [o for o in (main, natural_gradient) if o is not None]
    for module in model.modules():  # one CholeskyJitterWarning per fit, however many steps grow the jitter
        if isinstance(getattr(module, "jitter_memory", None), JitterMemory):
            module.jitter_memory.start_fit()
    schedulers = [schedule(o) for o in optimizers] if schedule is not None else []
    initial_lrs = [[float(g["lr"]) for g in o.param_groups] for o in optimizers]

    if generator is None:
        generator = torch.Generator(device=getattr(sampler, "device", "cpu")).manual_seed(int(seed) + 1)
    if loss is None:
        objective = _elbo_objective(model, sampler, n, generator)
        scale = float(n)
    else:
        def objective(batch):
            return loss(model, batch, n, generator)
        scale = 1.0
    if regulariser is not None:
        if not callable(regulariser):
            raise TypeError(f"regulariser must be callable() -> scalar tensor, got {type(regulariser).__name__}")
        unregularised = objective

        def objective(batch):
            # each process's share of the loss is weighted by its share of the batch, so the term is counted
            # once in the all-reduced sum
            return unregularised(batch) + regulariser()

    if isinstance(compile, str):
        if compile not in COMPILE_MODES and compile != "auto":
            raise ValueError(f"compile={compile!r} is not a torch.compile mode; use True, False, 'auto' or one of "
                             f"{', '.join(map(repr, COMPILE_MODES))}")
    elif not isinstance(compile, bool):
        raise TypeError(f"compile must be True, False, 'auto' or a torch.compile mode name, got {compile!r}")
    eager_objective = objective
    if compile and compile != "auto":
        mode = None if compile is True or compile == "default" else compile
        objective = CompiledObjective(objective, tracked, generators=[generator], mode=mode)
    best = BestParameters() if keep_best is True else (keep_best or None)
    if best is not None and not isinstance(best, BestParameters):
        raise TypeError(f"keep_best must be a bool or a BestParameters, got {type(keep_best).__name__}")

    config = {"num_data": n, "batch_size": int(getattr(sampler, "batch_size", -1)), "steps_per_epoch": per_epoch,
              "unit": unit, "budget": budget, "frozen_steps": frozen_steps,
              "optimizers": [type(o).__name__ for o in optimizers], "schedulers": len(schedulers)}

    # ----- state (restored from a checkpoint when there is one) ------------------------------------------
    history: list = []
    step = 0
    epoch_sum, epoch_count = 0.0, 0
    stop = {"best": math.inf, "window_best": math.inf}
    finished = False
    earlier_seconds = 0.0  # wall seconds of the loop in the processes that wrote the checkpoint
    run_start = time.perf_counter()
    path = None if checkpoint_path is None else Path(checkpoint_path)
    fingerprint = None if path is None else _run_fingerprint(checkpoint_path, x, y)
    if path is not None and path.exists():
        state = safe_load(path, map_location=getattr(sampler, "device", "cpu"))
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path} is not a flowgp training checkpoint; choose another checkpoint_path")
        extending = extend_budget and state["config"].get("budget") != budget
        for key, value in config.items():
            saved = state["config"].get(key)
            if saved != value and not (extending and key == "budget"):
                hint = (" (a longer budget moves the end of the noise freeze, fix_noise_fraction x the budget, "
                        "so it cannot extend this run)" if extending and key == "frozen_steps" else "")
                raise ValueError(f"the checkpoint {path} was written with {key}={saved!r} but this run has "
                                 f"{key}={value!r}{hint}; resume with the same data, batch size, budget and "
                                 "optimisers (extend_budget=True allows a larger budget), or delete the file to "
                                 "start afresh")
        _check_run_fingerprint(path, state, fingerprint)
        if extending:
            _check_extension(path, state, budget)
        _load_model_state(model, state["model"], path)
        for o, s in zip(optimizers, state["optimizers"]):
            o.load_state_dict(s)
        for s, saved in zip(schedulers, state["schedulers"]):
            s.load_state_dict(saved)
        sampler.load_state_dict(state["sampler"])
        generator.set_state(state["generator"].cpu())
        history = list(state["history"])
        step = int(state["step"])
        epoch_sum, epoch_count = float(state["epoch_sum"]), int(state["epoch_count"])
        stop = dict(state["early_stop"])
        initial_lrs = [list(v) for v in state["initial_lrs"]]
        finished = bool(state["finished"]) and not extending
        earlier_seconds = float(state.get("training_seconds", 0.0))  # files from before the key: 0
        if best is not None and state["best"] is not None:
            best.load_state_dict(state["best"])
        if hasattr(callback, "load_state_dict") and state.get("callback") is not None:
            callback.load_state_dict(state["callback"])
    # every rank starts from rank 0's parameters (as DistributedDataParallel does)
    broadcast_module(model, world)
    min_lrs = [[_MIN_LR_FRACTION * v for v in group] for group in initial_lrs]
    penalty = 1e6 * (1.0 + abs(best.loss)) if best is not None and math.isfinite(best.loss) else 1e10

    def save(done: bool):
        if path is None:
            return
        if not world.is_main:
            barrier(world)  # the others wait until rank 0's file is in place
            return
        atomic_save({
            "format": CHECKPOINT_FORMAT, "version": _CHECKPOINT_VERSION, "config": config, "fingerprint": fingerprint,
            "model": model.state_dict(), "optimizers": [o.state_dict() for o in optimizers],
            "schedulers": [s.state_dict() for s in schedulers], "sampler": sampler.state_dict(),
            "generator": generator.get_state(), "history": list(history), "step": step,
            "epoch_sum": epoch_sum, "epoch_count": epoch_count, "early_stop": dict(stop),
            "initial_lrs": initial_lrs, "finished": done, "best": None if best is None else best.state_dict(),
            # a callback with state (e.g. the robust fit's best state seen) resumes with the run
            "callback": callback.state_dict() if hasattr(callback, "state_dict") else None,
            "training_seconds": earlier_seconds + time.perf_counter() - run_start,
        }, path)
        barrier(world)

    if finished:
        model.eval()
        if best is not None:
            best.restore(tracked)
        return history

    # ----- one step --------------------------------------------------------------------------------------
    def run_step(batch):
        """(loss value at the step's starting point, whether the step was taken)."""
        evaluations = [0]
        first = [None]

        def closure():
            for o in optimizers:
                o.zero_grad(set_to_none=True)
            evaluations[0] += 1
            try:
                if world.distributed:
                    value = distributed_evaluation(batch)
                    v = value.item()
                else:
                    value = objective(batch)
                    # one host read per step serves the finiteness check and the history (each read waits for
                    # the device to finish: a second one would stall a GPU's queue again)
                    v = value.item()
                    if not math.isfinite(v):
                        raise _NonFinite(v)
                    value.backward()
                if backoff and not _grads_finite(tracked):
                    raise _NonFinite(v)
            except _NonFinite as err:
                if not backoff:
                    raise FloatingPointError(
                        f"the loss became {err.args[0]} at step {step} (epoch {step // per_epoch}); lower lr, "
                        "use float64, or pass nonfinite='backoff' to undo such steps and halve the step size"
                    ) from None
                return fail()
            except RuntimeError as err:
                if not backoff:
                    if step > 0 and isinstance(err, torch.linalg.LinAlgError):
                        # the parameters the last steps reached make a matrix singular: what a non-finite loss
                        # would say of a step size too large
                        raise FloatingPointError(
                            f"the loss could not be evaluated at step {step} (epoch {step // per_epoch}): "
                            f"{str(err).splitlines()[0]}; the steps so far moved the parameters too far: lower lr, "
                            "use float64, or pass nonfinite='backoff' to undo such steps and halve the step size"
                        ) from err
                    raise
                return fail()
            if best is not None:
                best.consider(v, tracked)
            if first[0] is None:
                first[0] = v
            return value

        def distributed_evaluation(batch):
            """This rank's share of the global batch's loss, backpropagated; gradients and loss summed over
            ranks in one all-reduce. Every rank reaches the same decision: a rank whose share is not finite
            (or raised) backpropagates nothing and sends it as the loss, so the sum is not finite everywhere."""
            error = None
            local = None
            if len(batch):
                try:
                    local = objective(batch) * (len(batch) / batch.step_size)
                    if bool(torch.isfinite(local)):
                        local.backward()
                except RuntimeError as err:
                    error, local = err, None
                    for p in tracked:  # a backward that failed half-way leaves partial gradients
                        p.grad = None
            reference = tracked[0]
            mine = (local.detach() if local is not None else
                    torch.tensor(math.nan if error is not None else 0.0, dtype=reference.dtype,
                                 device=reference.device)).reshape(())
            total = all_reduce_gradients(tracked, world, loss=mine)
            if not bool(torch.isfinite(total)):
                if error is not None and not backoff:
                    raise error
                raise _NonFinite(total.item())
            return total.to(reference.dtype)

        def fail():
            if evaluations[0] == 1:
                raise _SkipStep
            # a line-search trial outside the region where the loss is defined: a large value with zero
            # slope makes the search back off
            for p in tracked:
                p.grad = torch.zeros_like(p)
            return torch.tensor(penalty, dtype=tracked[0].dtype, device=tracked[0].device)

        start = [p.detach().clone() for p in tracked] if backoff else None
        try:
            if main is not None:
                main.step(closure)
            else:
                closure()
            if natural_gradient is not None:
                natural_gradient.step()
        except (_SkipStep, RuntimeError):
            if not backoff:
                raise
            with torch.no_grad():
                if best is None or not best.restore(tracked):
                    for p, v in zip(tracked, start):
                        p.copy_(v)
            for o in optimizers:
                for g in o.param_groups:
                    g["lr"] *= 0.5
            return math.inf, False
        for s in schedulers:
            s.step()
        return first[0], True

    def lr_exhausted() -> bool:
        return any(g["lr"] < low for o, lows in zip(optimizers, min_lrs) for g, low in zip(o.param_groups, lows))

    def plateau(index: int, entry: float) -> bool:
        stop["best"] = min(stop["best"], entry)
        if early_stop.abs_tol is not None and entry <= early_stop.abs_tol:
            return True
        if early_stop.window is not None and (index + 1) % early_stop.window == 0:
            if stop["window_best"] - stop["best"] <= early_stop.rel_tol * (abs(stop["best"]) + 1e-8):
                return True
            stop["window_best"] = stop["best"]
        return False

    # ----- the loop --------------------------------------------------------------------------------------
    noise_params = _noise_parameters(model)
    pending = {"interrupt": False, "boundary": True}
    previous_handler = None
    if path is not None and threading.current_thread() is threading.main_thread():
        def hold_interrupt(signum, frame):
            if pending["interrupt"] or pending["boundary"]:
                raise KeyboardInterrupt
            pending["interrupt"] = True  # finish the step, save, then stop
        previous_handler = signal.signal(signal.SIGINT, hold_interrupt)
    model.train()
    done_units = step if unit == "steps" else step // per_epoch
    bar = tqdm(total=budget, initial=done_units, desc=desc, disable=not (verbose and world.is_main), leave=False)
    halt = False
    # compile="auto": the first steps run eagerly and are timed; then compile only if the rest can repay it
    # and once compiled, as many compiled steps are timed: no faster than eager, the fit goes back to eager
    probe = {"pending": compile == "auto", "start": step, "seconds": [], "verify": False, "eager": None}

    def median_step_seconds():
        timed = sorted(probe["seconds"][2:])  # the first steps allocate, warm caches (and compile)
        seconds = timed[len(timed) // 2]
        if world.distributed:  # every rank decides on the same (mean) figure, so all ranks decide alike
            mean = all_reduce_sum(torch.tensor(seconds, dtype=torch.float64, device=tracked[0].device), world)
            seconds = float(mean) / world.size
        return seconds

    def keep_compiled() -> bool:
        probe["verify"] = False
        seconds = median_step_seconds()
        faster = seconds < probe["eager"]
        if verbose and world.is_main:
            bar.write(f"{desc}: compile='auto': compiled steps {1e3 * seconds:.2f} ms against "
                      f"{1e3 * probe['eager']:.2f} ms eager: {'kept' if faster else 'back to eager'}")
        return faster

    def decide_compilation():
        probe["pending"] = False
        seconds = median_step_seconds()
        probe["eager"] = seconds
        remaining = total - step
        frozen_later = step < frozen_steps < total and bool(noise_params)  # unfreezing compiles again
        worth, reason = compile_pays_off(seconds, remaining, tracked[0].device,
                                         compilations=2 if frozen_later else 1)
        if verbose and world.is_main:
            bar.write(f"{desc}: compile='auto': {reason}")
        return CompiledObjective(eager_objective, tracked, generators=[generator]) if worth else None

    try:
        while step < total and not halt:
            batches = iter(sampler)
            while True:
                pending["boundary"] = False  # from here until the step's bookkeeping is done, state is torn
                batch = next(batches, None)
                if batch is None:
                    break
                frozen = step < frozen_steps
                for p in noise_params:
                    p.requires_grad_(not frozen)
                if probe["pending"] or probe["verify"]:
                    started = time.perf_counter()
                    value, taken = run_step(batch)  # its host read of the loss waits for the device
                    probe["seconds"].append(time.perf_counter() - started)
                else:
                    value, taken = run_step(batch)
                index = step
                step += 1
                if probe["pending"] and step - probe["start"] >= AUTO_PROBE_STEPS:
                    compiled = decide_compilation()
                    if compiled is not None:
                        objective = compiled
                        probe.update(verify=True, start=step, seconds=[])
                elif probe["verify"] and step - probe["start"] >= AUTO_PROBE_STEPS:
                    if not keep_compiled():  # it also ends the check
                        objective = eager_objective
                entry = None
                if taken:
                    epoch_sum += value
                    epoch_count += 1
                    if unit == "steps":
                        entry = value / scale
                        history.append(entry)
                epoch_end = step % per_epoch == 0
                if unit == "epochs" and epoch_end:
                    if epoch_count:
                        entry = epoch_sum / epoch_count / scale
                        history.append(entry)
                    epoch_sum, epoch_count = 0.0, 0
                if unit == "steps" or epoch_end:
                    bar.update(1)
                if entry is not None:
                    position = len(history) - 1 if unit == "epochs" else index
                    if early_stop is not None and plateau(position, entry):
                        halt = True
                    if verbose and (unit == "epochs" or index % 20 == 0):
                        bar.set_postfix(loss=f"{entry:.4f}")
                if backoff and not taken and lr_exhausted():
                    halt = True
                pending["boundary"] = True
                if callback is not None and callback(index, value, model):
                    halt = True
                units = step if unit == "steps" else (step // per_epoch if epoch_end else 0)
                if units and units % checkpoint_every == 0 and step < total and not halt:
                    save(False)
                if pending["interrupt"]:
                    raise KeyboardInterrupt
                if halt or step >= total:
                    break
            pending["boundary"] = True
    except KeyboardInterrupt as err:
        saved = pending["boundary"] and path is not None
        if pending["boundary"]:
            save(False)
        if isinstance(err, TrainingInterrupted):  # from a nested loop (e.g. a callback's): already reported
            raise
        raise TrainingInterrupted(step, path if saved else None).with_traceback(err.__traceback__) from None
    finally:
        for p in noise_params:
            p.requires_grad_(True)
        bar.close()
        if previous_handler is not None:
            signal.signal(signal.SIGINT, previous_handler)
    if best is not None:
        best.restore(tracked)
    save(True)
    model.eval()
    return history
