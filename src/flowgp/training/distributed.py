"""Data parallelism on torch.distributed: the world a training run sees, gradient reduction, the launcher.

Every flowgp bound is a sum over data points rescaled by N / B minus global terms (`flowgp.gp.objective`):

    L(batch) = (N / B) Σ_{i ∈ batch} ℓ_i - KL.

With W processes ("ranks") each rank r holds a slice of B_r rows of the same global batch of B rows
(Σ_r B_r = B). Rank r evaluates the model's own bound on its rows, L_r = (N / B_r) Σ_{i ∈ r} ℓ_i - KL, and
weights it by B_r / B:

    Σ_r (B_r / B) L_r = (N / B) Σ_{i ∈ batch} ℓ_i - KL = L(batch),

so the gradients summed over ranks (one all-reduce, `all_reduce_gradients`) are exactly the single-process
gradient of the global batch, and every rank then takes the same optimiser step. This is what
DistributedDataParallel does with its averaged gradients; an explicit all-reduce after `backward` is used
instead so that closure optimisers (L-BFGS), natural-gradient steps and skipped steps work unchanged.

Processes are started by torch's launcher (`torchrun --nproc-per-node N -m flowgp fit ...`, or
`flowgp fit --nproc N`, which calls `launch`); `init_from_env` joins the process group the launcher
describes in the environment (gloo on CPU, NCCL on CUDA).

Exact across world sizes (`World.parts`, environment FLOWGP_REDUCE_PARTS, `flowgp fit --reduce-parts P`): the
sum above is rounded differently for each W (one rank sums B rows, two ranks sum B/2 rows each and add), a
difference of ~1e-16 that chaotic stages amplify: the robust TGP fit's L-BFGS refinement walks a near-flat
valley of the SAL flow for its whole evaluation budget, and 1e-13 between the start points became 0.4 in a flow
parameter and 6e-4 (relative) in the predictions between W = 1 and 2. With P parts every global batch is cut
into the same P parts (positions ⌊kB/P⌋, k = 0..P-1) whatever W is; each part's loss and gradients are computed
on their own, gathered from the ranks (`ordered_sum`) and added in part order on every rank, so every W that
divides P computes bitwise the same step (the same floating-point operations in the same order).
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import uuid
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

__all__ = ["World", "current_world", "init_from_env", "shutdown", "local_slice", "all_reduce_gradients",
           "all_reduce_sum", "all_gather_objects", "broadcast_module", "barrier", "launch", "PARTS_VARIABLE", "reduce_parts",
           "flat_gradients", "ordered_sum", "set_gradients"]

#: the environment variable that fixes the number of parts of every global batch (see the module doc)
PARTS_VARIABLE = "FLOWGP_REDUCE_PARTS"


@dataclass(frozen=True)
class World:
    """The ranks a training run is split over: this process's `rank` in [0, size).

    `parts`: None (each rank's share is one part, reduced by one all-reduce) or P, a multiple of `size`: every
    global batch is cut into P fixed parts summed in a fixed order, so that all world sizes dividing P give
    bitwise the same run.

    Args:
        rank: this process's rank.
        size: the number of processes.
        parts: None or the number P of fixed parts of every global batch.

    Examples:
        >>> from flowgp.training.distributed import World, local_slice
        >>> local_slice(10, World(rank=1, size=3))  # rows 3, 4, 5 of a batch of 10
        slice(3, 6, None)
    """

    rank: int = 0
    size: int = 1
    parts: Optional[int] = None

    def __post_init__(self):
        if self.parts is not None:
            if isinstance(self.parts, bool) or not isinstance(self.parts, int) or self.parts < 1:
                raise ValueError(f"parts must be None or a positive integer, got {self.parts!r}")
            if self.parts % self.size:
                raise ValueError(f"parts={self.parts} (--reduce-parts) must be a multiple of the world size "
                                 f"{self.size}: choose a multiple of the number of processes")

    @property
    def local_parts(self) -> int:
        """The parts of each global batch this rank evaluates (1 when `parts` is None)."""
        return 1 if self.parts is None else self.parts // self.size

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes checkpoints and models and shows progress."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def reduce_parts() -> Optional[int]:
    """The parts of every global batch the environment asks for (FLOWGP_REDUCE_PARTS; None when unset).

    See Also:
        :class:`flowgp.training.distributed.World` (``parts``).
    """
    value = os.environ.get(PARTS_VARIABLE, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{PARTS_VARIABLE} must be a positive integer, got {value!r}") from None


def current_world() -> World:
    """The default process group's rank and size, or World(0, 1) when torch.distributed is not initialised;
    `parts` from FLOWGP_REDUCE_PARTS.

    See Also:
        :func:`flowgp.training.train` (``world=``), :func:`flowgp.training.distributed.launch`.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return World(torch.distributed.get_rank(), torch.distributed.get_world_size(), reduce_parts())
    return World(parts=reduce_parts())


def init_from_env(device="cpu") -> World:
    """Join the process group described by the launcher's environment (WORLD_SIZE, RANK, MASTER_ADDR, ...).

    Does nothing (returns World(0, 1)) when WORLD_SIZE is unset or 1; returns the current world when a group
    is already initialised. The backend is NCCL for a CUDA `device` (each rank on cuda:LOCAL_RANK), else gloo.

    Args:
        device: the training device ("cpu", "cuda", a torch.device): it picks the backend.

    See Also:
        :func:`flowgp.training.train` (``world=``), :func:`flowgp.training.distributed.launch`.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return current_world()
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    if not torch.distributed.is_available():
        raise RuntimeError("WORLD_SIZE > 1 but this torch build has no torch.distributed")
    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.distributed.init_process_group(backend=backend)
    return current_world()


def shutdown() -> None:
    """Leave the process group (when one is initialised).

    See Also:
        :func:`flowgp.training.train` (``world=``), :func:`flowgp.training.distributed.launch`.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def local_slice(global_rows: int, world: World) -> slice:
    """The positions [lo, hi) of a global batch of `global_rows` rows that `world.rank` evaluates: contiguous
    near-equal parts, lo = ⌊rB/W⌋, so that the parts are the same whatever order the ranks run in.

    Args:
        global_rows: B, the rows of the global batch.
        world: the World.

    See Also:
        :class:`flowgp.training.distributed.World` (an example).
    """
    lo = global_rows * world.rank // world.size
    hi = global_rows * (world.rank + 1) // world.size
    return slice(lo, hi)


def all_reduce_sum(value: torch.Tensor, world: World) -> torch.Tensor:
    """Σ over ranks of a tensor (a copy; the input is unchanged). Identity for a single process.

    Args:
        value: a tensor.
        world: the World.

    See Also:
        :func:`flowgp.training.train` (``world=``), :func:`flowgp.training.distributed.launch`.
    """
    if not world.distributed:
        return value
    out = value.detach().clone()
    torch.distributed.all_reduce(out, op=torch.distributed.ReduceOp.SUM)
    return out


def all_reduce_gradients(params: Sequence[torch.Tensor], world: World,
                         loss: Optional[torch.Tensor] = None, extra: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    """Sum every parameter's .grad over ranks, and `loss` (a scalar) with them, in ONE all-reduce.

    One collective per training step: on CPU (gloo) each costs 0.1-0.4 ms idle and, worse, a wait for the
    slowest rank, so the step's three (loss, which gradients exist, gradients) cost more than a 2-process run
    saved. The buffer is float64 - [loss, one presence flag per parameter, gradients] - so the loss sum is the
    float64 sum `all_reduce_sum` gives and float32 gradients are summed without extra rounding. A parameter whose
    gradient is None on every rank keeps None (optimisers skip it, as in one process); one with a gradient on
    some ranks only (a rank with no rows in the batch) gets the sum, zeros standing in for the missing ones.
    Returns the summed loss (float64), or None when no `loss` was given; one process: the loss unchanged.

    Args:
        params: the parameters whose gradients are summed (in place).
        world: the World.
        loss: a scalar loss summed with them, or None.
        extra: a float64 vector summed along in the same collective (in place), e.g. the ranks' stop requests.

    See Also:
        :func:`flowgp.training.train` (``world=``), :func:`flowgp.training.distributed.launch`.
    """
    if not world.distributed or not params:
        return None if loss is None else loss.detach().to(torch.float64)
    reference = params[0]
    head = [] if loss is None else [loss.detach().reshape(1).to(torch.float64)]
    flags = torch.tensor([0.0 if p.grad is None else 1.0 for p in params], dtype=torch.float64,
                         device=reference.device)
    grads = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(torch.float64) for p in params]
    tail = [] if extra is None else [extra.to(device=reference.device, dtype=torch.float64)]
    flat = torch.cat(head + [flags] + grads + tail)
    torch.distributed.all_reduce(flat, op=torch.distributed.ReduceOp.SUM)
    if extra is not None:
        extra.copy_(flat[flat.numel() - extra.numel():].to(extra.device))
    offset = len(head) + len(params)
    for p, present in zip(params, flat[len(head):offset].tolist()):
        n = p.numel()
        if present > 0:
            p.grad = flat[offset:offset + n].view_as(p).to(p.dtype).clone()
        offset += n
    return None if loss is None else flat[0]


def flat_gradients(params: Sequence[torch.Tensor], loss: torch.Tensor) -> torch.Tensor:
    """[loss, one presence flag per parameter, every .grad flattened] as one float64 vector (zeros for a
    missing gradient): what `ordered_sum` adds and `set_gradients` unpacks.

    Args:
        params: the parameters, in a fixed order.
        loss: the scalar loss of this part.

    See Also:
        :func:`flowgp.training.distributed.ordered_sum`, :func:`flowgp.training.distributed.set_gradients`.
    """
    reference = params[0]
    flags = torch.tensor([0.0 if p.grad is None else 1.0 for p in params], dtype=torch.float64,
                         device=reference.device)
    grads = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(torch.float64) for p in params]
    return torch.cat([loss.detach().reshape(1).to(torch.float64), flags] + grads)


def ordered_sum(local: torch.Tensor, world: World) -> torch.Tensor:
    """Σ_k v_k over the parts' vectors of all ranks, added one after another in part order on every rank.

    `local` [world.local_parts, L]: this rank's parts (rank r holds parts r·P/W .. (r+1)·P/W - 1). The parts
    are gathered (all_gather: rank order is part order) and summed left to right, ((v_0 + v_1) + v_2) + ..., so
    the result has the same bits for every world size that divides P (an all-reduce would add in an order of
    its own, which depends on W).

    Args:
        local: [local parts, L] this rank's `flat_gradients` vectors.
        world: the World (`parts` set).

    See Also:
        :func:`flowgp.training.distributed.flat_gradients`.
    """
    if world.distributed:
        gathered = [torch.empty_like(local) for _ in range(world.size)]
        torch.distributed.all_gather(gathered, local.contiguous())
        local = torch.cat(gathered)
    total = local[0].clone()
    for v in local[1:]:
        total += v
    return total


def set_gradients(params: Sequence[torch.Tensor], total: torch.Tensor) -> torch.Tensor:
    """Unpack a `flat_gradients` vector (summed): each parameter's .grad (None where no part had one);
    returns the loss (float64 scalar).

    Args:
        params: the parameters, in the order `flat_gradients` used.
        total: the summed vector (`ordered_sum`).

    See Also:
        :func:`flowgp.training.distributed.flat_gradients`.
    """
    offset = 1 + len(params)
    for p, present in zip(params, total[1:offset].tolist()):
        n = p.numel()
        p.grad = total[offset:offset + n].view_as(p).to(p.dtype).clone() if present > 0 else None
        offset += n
    return total[0]


def all_gather_objects(obj, world: World) -> list:
    """Every rank's `obj` (picklable), in rank order, on every rank; [obj] for a single process.

    Args:
        obj: any picklable object.
        world: the World.

    See Also:
        :func:`flowgp.training.distributed.all_reduce_sum`.
    """
    if not world.distributed:
        return [obj]
    out = [None] * world.size
    torch.distributed.all_gather_object(out, obj)
    return out


@torch.no_grad()
def broadcast_module(module: torch.nn.Module, world: World, src: int = 0) -> None:
    """Copy rank `src`'s parameters and buffers to every rank (the start of a data-parallel run).

    Args:
        module: the module to synchronise (in place).
        world: the World.
        src: the rank whose values are copied.

    See Also:
        :func:`flowgp.training.train` (``world=``), :func:`flowgp.training.distributed.launch`.
    """
    if not world.distributed:
        return
    for t in list(module.parameters()) + list(module.buffers()):
        torch.distributed.broadcast(t.data, src=src)


def barrier(world: World) -> None:
    """Wait for every rank (no-op for a single process).

    Args:
        world: the World.

    See Also:
        :func:`flowgp.training.train` (``world=``), :func:`flowgp.training.distributed.launch`.
    """
    if world.distributed:
        torch.distributed.barrier()


#: the modules of torch's elastic launcher that log each signal it receives and passes on to its workers
_ELASTIC_SIGNAL_LOGGERS = ("agent.server.api", "multiprocessing.api")


def _drop_signal_records(record) -> bool:
    return "signal" not in record.getMessage()


def launch(args: Sequence[str], nproc: int, module: str = "flowgp") -> int:
    """Run `python -m <module> <args>` in `nproc` worker processes on this machine with torch's elastic
    launcher (what `torchrun --standalone --nproc-per-node nproc -m <module> <args>` does); returns 0 when every
    worker succeeded, 1 otherwise (the workers' own errors are on stderr); a Ctrl-C, which the launcher passes on
    to the workers, is a KeyboardInterrupt once they have stopped.

    Args:
        args: the command line after the module name, e.g. ["fit", "data.csv", ...].
        nproc: the number of worker processes.
        module: the module run with ``python -m`` (default "flowgp", the command line).

    See Also:
        :func:`flowgp.training.distributed.init_from_env` (what each worker calls).
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"--nproc must be a positive integer, got {nproc!r}")
    # one thread per worker unless asked otherwise: W workers with all cores each would oversubscribe
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
                          monitor_interval=0.1)
    # the launcher installs its own handlers for these signals and leaves them behind: restore the caller's
    names = [n for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, n)]
    saved = {n: signal.getsignal(getattr(signal, n)) for n in names}
    # its log lines about passing a signal on (three for a Ctrl-C) are left out while it runs: the interruption
    # is reported in one line by the caller
    chatter = [logging.getLogger(f"torch.distributed.elastic.{name}") for name in _ELASTIC_SIGNAL_LOGGERS]
    for logger in chatter:
        logger.addFilter(_drop_signal_records)
    try:
        elastic_launch(config, entrypoint=sys.executable)("-u", "-m", module, *args)
    except ChildFailedError:
        return 1
    except SignalException as err:  # the launcher passed the signal on to the workers and waited for them
        if err.sigval == signal.SIGINT:
            raise KeyboardInterrupt from None  # a Ctrl-C, reported as in one process
        raise
    finally:
        for logger in chatter:
            logger.removeFilter(_drop_signal_records)
        if threading.current_thread() is threading.main_thread():
            for n, handler in saved.items():
                if handler is not None:
                    signal.signal(getattr(signal, n), handler)
    return 0
