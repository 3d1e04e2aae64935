"""One optimisation step of `flowgp.training.loop.train`: the optimisers it steps, the objective it evaluates, and
the `Stepper` that takes a step (the closure, back-off on a non-finite loss, L-BFGS's re-evaluations, the
data-parallel evaluation). The one place of the library that calls `backward()`."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from .batches import Batch
from .distributed import all_reduce_gradients, flat_gradients, ordered_sum, set_gradients
from ..models.protocol import TrainableModel
from ..numerics.linalg import JitterMemory

__all__ = ["default_optimizer", "Optimisers", "build_optimisers", "build_objective", "Stepper"]

#: backoff mode gives up once a step size has been halved below this fraction of its initial value
MIN_LR_FRACTION = 1e-4


def default_optimizer(params, lr: float) -> torch.optim.Optimizer:
    """The optimiser `train` builds when none is given: Adam, fused where torch has a fused kernel for the
    parameters (CPU and CUDA floating point), else the multi-tensor (foreach) Adam.

    Same update rule as the single-tensor `torch.optim.Adam` (equal to rounding); one kernel for all
    parameters instead of about ten per parameter, which matters at small M, where the whole step costs a
    few hundred microseconds and the per-parameter update was a fifth of it.

    Args:
        params: the parameters (or parameter groups) to optimise.
        lr: Adam's step size.

    See Also:
        :func:`flowgp.training.train` (``optimizer=None`` uses it).
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


@dataclass
class Optimisers:
    """The trainable parameters (`tracked`), the main optimiser (None when the natural gradient holds every
    parameter), every optimiser stepped (main, then the natural gradient) and their schedulers."""

    tracked: list
    main: Optional[torch.optim.Optimizer]
    natural_gradient: object
    all: list
    schedulers: list

    def initial_lrs(self) -> list:
        return [[float(g["lr"]) for g in o.param_groups] for o in self.all]


def build_optimisers(model, config) -> Optimisers:
    """The optimisers of a run (`config`: a RunConfig): the natural gradient's parameters excluded from the
    main optimiser; ValueError for a model with nothing to train or L-BFGS next to a natural gradient."""
    natural_gradient = config.natural_gradient
    natgrad_ids = set()
    if natural_gradient is not None:
        natgrad_ids = {id(p) for g in natural_gradient.param_groups for p in g["params"]}
    tracked = [p for p in model.parameters() if p.requires_grad]
    params = [p for p in tracked if id(p) not in natgrad_ids]
    if not tracked:
        raise ValueError(f"{type(model).__name__} has no trainable parameters (all have requires_grad=False)")
    main = _make_optimizer(config.optimizer, params, config.lr) if params else None
    if isinstance(main, torch.optim.LBFGS) and natural_gradient is not None:
        raise ValueError("natural_gradient works next to single-evaluation optimisers (Adam, SGD, ...); L-BFGS "
                         "re-evaluates the loss and would leave it gradients of another point")
    optimizers = [o for o in (main, natural_gradient) if o is not None]
    for module in model.modules():  # one CholeskyJitterWarning per fit, however many steps grow the jitter
        if isinstance(getattr(module, "jitter_memory", None), JitterMemory):
            module.jitter_memory.start_fit()
    schedulers = [config.schedule(o) for o in optimizers] if config.schedule is not None else []
    return Optimisers(tracked, main, natural_gradient, optimizers, schedulers)


def _elbo_objective(model, num_data: int, generator: torch.Generator):
    """-model.training_objective(x_b, y_b, num_data=N, generator=..., batch_rows=..., indices=..., **extra) with
    the batch's rows and extra arrays and the loop's generator: the keywords of the one model interface
    (flowgp.models.protocol.TrainableModel), the same for every model; TypeError for a model without it."""
    if not isinstance(model, TrainableModel):
        raise TypeError(f"{type(model).__name__} does not implement flowgp.models.protocol.TrainableModel (elbo, "
                        "training_objective and predict; see that module); pass loss=callable(model, batch, "
                        "num_data, generator) for another objective")
    training_objective = model.training_objective

    def objective(batch: Batch):
        # where a model draws per-row noise, (offset, B) lets it draw for the whole global batch and keep its rows
        rows = (int(getattr(batch, "offset", 0)), int(getattr(batch, "step_size", len(batch))))
        return -training_objective(batch.x, batch.y, num_data=num_data, generator=generator, batch_rows=rows,
                                   indices=batch.index, **batch.extra)

    return objective


def build_objective(model, config, generator, tracked, compiler):
    """(the objective a step evaluates, the eager objective behind it, the history's scale): -elbo (history in
    nats per data point) or the `loss` hook (history as is), plus the regulariser, compiled by `compiler`
    (flowgp.training.compiled.CompiledObjective) when `config.compile` names a mode (True: the default one)."""
    n, loss, regulariser = config.num_data, config.loss, config.regulariser
    if loss is None:
        objective = _elbo_objective(model, n, generator)
        scale = float(n)
    else:
        def objective(batch):
            return loss(model, batch, n, generator)
        scale = 1.0
    if regulariser is not None:
        unregularised = objective

        def objective(batch):
            # each process's share of the loss is weighted by its share of the batch, so the term is counted
            # once in the all-reduced sum
            return unregularised(batch) + regulariser()

    eager_objective = objective
    compile = config.compile
    if compile and compile != "auto":
        mode = None if compile is True or compile == "default" else compile
        objective = compiler(objective, tracked, generators=[generator], mode=mode)
    return objective, eager_objective, scale


class _NonFinite(Exception):
    pass


class _SkipStep(Exception):
    pass


def _cut(batch, world):
    """This rank's share of a global batch cut into its parts: part k holds the global positions
    [⌊kB/P⌋, ⌊(k+1)B/P⌋) (B the global batch's rows, P = world.parts), whatever the world size; rank r holds
    parts r·P/W .. (r+1)·P/W - 1, whose union is its share [⌊rB/W⌋, ⌊(r+1)B/W⌋)."""
    if world.parts == 1:
        return [batch]
    size, offset, count = int(batch.step_size), int(getattr(batch, "offset", 0)), world.local_parts
    first = world.rank * count
    out = []
    for k in range(first, first + count):
        lo, hi = size * k // world.parts - offset, size * (k + 1) // world.parts - offset
        out.append(Batch(batch.x[lo:hi], None if batch.y is None else batch.y[lo:hi], batch.index[lo:hi],
                         {name: value[lo:hi] for name, value in batch.extra.items()}, global_size=size,
                         offset=offset + lo))
    return out


def _grads_finite(params) -> bool:
    return all(p.grad is None or bool(torch.all(torch.isfinite(p.grad))) for p in params)


class Stepper:
    """Takes one step on a batch: `step(batch, index)` -> (loss at the step's starting point, whether the step
    was taken). With `backoff` a step whose loss or gradient is not finite (or whose evaluation raises) is undone
    (to the best point when `best` holds one) and every step size halved; inside an L-BFGS step such a trial
    point returns `penalty` with zero slope so the line search backs off. `objective` may be swapped between
    steps (compile="auto")."""

    def __init__(self, objective, optimisers: Optimisers, best, backoff: bool, world, initial_lrs, per_epoch: int,
                 generator: Optional[torch.Generator] = None):
        self.objective = objective
        self.generator = generator  # the objective's draws: rewound before each part of a batch (`world.parts`)
        # data-parallel Ctrl-C: whether this rank asks to stop (set by the loop), and whether some rank has asked
        # in a reduction so far (the same on every rank: the flags travel in the gradients' collective)
        self.stop_requested = lambda: False
        self.stop_agreed = False
        self.optimisers = optimisers
        self.tracked = optimisers.tracked
        self.best = best
        self.backoff = backoff
        self.world = world
        self.per_epoch = per_epoch
        self.min_lrs = [[MIN_LR_FRACTION * v for v in group] for group in initial_lrs]
        self.penalty = 1e6 * (1.0 + abs(best.loss)) if best is not None and math.isfinite(best.loss) else 1e10

    def lr_exhausted(self) -> bool:
        """Whether back-off has halved some step size below MIN_LR_FRACTION of its initial value."""
        return any(g["lr"] < low for o, lows in zip(self.optimisers.all, self.min_lrs)
                   for g, low in zip(o.param_groups, lows))

    def step(self, batch, index: int):
        """(loss value at the step's starting point, whether the step was taken); `index`: the step's number."""
        self._evaluations, self._first = 0, None
        self._batch, self._index = batch, index
        tracked, opts = self.tracked, self.optimisers
        start = [p.detach().clone() for p in tracked] if self.backoff else None
        try:
            if opts.main is not None:
                opts.main.step(self._closure)
            else:
                self._closure()
            if opts.natural_gradient is not None:
                opts.natural_gradient.step()
        except (_SkipStep, RuntimeError):
            if not self.backoff:
                raise
            with torch.no_grad():
                if self.best is None or not self.best.restore(tracked):
                    for p, v in zip(tracked, start):
                        p.copy_(v)
            for o in opts.all:
                for g in o.param_groups:
                    g["lr"] *= 0.5
            return math.inf, False
        for s in opts.schedulers:
            s.step()
        return self._first, True

    def _closure(self):
        for o in self.optimisers.all:
            o.zero_grad(set_to_none=True)
        self._evaluations += 1
        try:
            value, v = self._evaluate(self._batch)
        except _NonFinite as err:
            if not self.backoff:
                raise FloatingPointError(
                    f"the loss became {err.args[0]} at step {self._index} (epoch {self._index // self.per_epoch}); "
                    "lower lr, use float64, or pass nonfinite='backoff' to undo such steps and halve the step size"
                ) from None
            return self._fail()
        except RuntimeError as err:
            if not self.backoff:
                if self._index > 0 and isinstance(err, torch.linalg.LinAlgError):
                    # the parameters the last steps reached make a matrix singular: what a non-finite loss
                    # would say of a step size too large
                    raise FloatingPointError(
                        f"the loss could not be evaluated at step {self._index} (epoch "
                        f"{self._index // self.per_epoch}): {str(err).splitlines()[0]}; the steps so far moved the "
                        "parameters too far: lower lr, use float64, or pass nonfinite='backoff' to undo such steps "
                        "and halve the step size") from err
                raise
            return self._fail()
        if self.best is not None:
            self.best.consider(v, self.tracked)
        if self._first is None:
            self._first = v
        return value

    def _evaluate(self, batch):
        """(loss tensor, its value), the gradients accumulated; _NonFinite for a non-finite loss (or gradient in
        back-off mode)."""
        if self.world.parts is not None:
            value = self._parts_evaluation(batch)
            v = value.item()
        elif self.world.distributed:
            value = self._distributed_evaluation(batch)
            v = value.item()
        else:
            value = self.objective(batch)
            # one host read per step serves the finiteness check and the history (each read waits for
            # the device to finish: a second one would stall a GPU's queue again)
            v = value.item()
            if not math.isfinite(v):
                raise _NonFinite(v)
            value.backward()
        if self.backoff and not _grads_finite(self.tracked):
            raise _NonFinite(v)
        return value, v

    def _distributed_evaluation(self, batch):
        """This rank's share of the global batch's loss, backpropagated; gradients and loss summed over
        ranks in one all-reduce. Every rank reaches the same decision: a rank whose share is not finite
        (or raised) backpropagates nothing and sends it as the loss, so the sum is not finite everywhere."""
        tracked = self.tracked
        error = None
        local = None
        if len(batch):
            try:
                local = self.objective(batch) * (len(batch) / batch.step_size)
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
        request = self._stop_flag()
        total = all_reduce_gradients(tracked, self.world, loss=mine, extra=request)
        self._heed(request)
        if not bool(torch.isfinite(total)):
            if error is not None and not self.backoff:
                raise error
            raise _NonFinite(total.item())
        return total.to(reference.dtype)

    def _parts_evaluation(self, batch):
        """The global batch's loss and gradients as the sum of its `world.parts` fixed parts added in part
        order (`flowgp.training.distributed.ordered_sum`): this rank evaluates its parts one by one, each from
        the same generator state (a part draws the global batch's noise and keeps its rows, as a rank does), so
        the step is bitwise the same for every world size dividing the number of parts. A part whose loss is
        not finite (or raised) sends NaN, as `_distributed_evaluation` does."""
        tracked, world = self.tracked, self.world
        reference = tracked[0]
        state = None if self.generator is None else self.generator.get_state()
        vectors, error = [], None
        for part in _cut(batch, world):
            if state is not None:
                self.generator.set_state(state)
            for p in tracked:
                p.grad = None
            local = None
            if len(part):
                try:
                    local = self.objective(part) * (len(part) / part.step_size)
                    if bool(torch.isfinite(local)):
                        local.backward()
                except RuntimeError as err:
                    error, local = err, None
                    for p in tracked:
                        p.grad = None
            mine = (local.detach() if local is not None else
                    torch.tensor(math.nan if error is not None else 0.0, dtype=reference.dtype,
                                 device=reference.device))
            vectors.append(torch.cat([flat_gradients(tracked, mine), self._stop_flag().to(reference.device)]))
        summed = ordered_sum(torch.stack(vectors), world)
        total = set_gradients(tracked, summed)
        if world.distributed:
            self._heed(summed[-1:])
        if not bool(torch.isfinite(total)):
            if error is not None and not self.backoff:
                raise error
            raise _NonFinite(total.item())
        return total.to(reference.dtype)

    def _stop_flag(self) -> torch.Tensor:
        return torch.tensor([1.0 if self.stop_requested() else 0.0], dtype=torch.float64)

    def _heed(self, request: torch.Tensor) -> None:
        """After a reduction: some rank asked to stop (`request` summed over ranks > 0): every rank stops after
        this step; inside a step of many evaluations (L-BFGS) at once, all at this same evaluation."""
        if float(request[0]) > 0:
            self.stop_agreed = True
            if self._evaluations > 1:
                raise KeyboardInterrupt

    def _fail(self):
        if self._evaluations == 1:
            raise _SkipStep
        # a line-search trial outside the region where the loss is defined: a large value with zero
        # slope makes the search back off
        for p in self.tracked:
            p.grad = torch.zeros_like(p)
        return torch.tensor(self.penalty, dtype=self.tracked[0].dtype, device=self.tracked[0].device)
