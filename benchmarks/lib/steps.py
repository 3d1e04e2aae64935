"""One training step of a flowgp model as a closure, and the interleaved timing of several such closures: the
shared core of the step-time scripts (`perf/step_time.py`, `perf/dgp_step_time.py` and the studies that time
steps), so every one of them times the same step the same way."""
from __future__ import annotations

import statistics
import time

import torch

from flowgp.training.compiled import CompiledObjective
from flowgp.training.loop import default_optimizer


def sync(device):
    """Wait for the device's queued work (a no-op off CUDA), so a wall-clock reading covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def clock(kind):
    """time.perf_counter (wall) or time.process_time (CPU time of this process: with one thread, the step's
    own cost, which time-slicing on a loaded machine does not inflate; on CUDA only wall time is meaningful)."""
    return time.process_time if kind == "cpu" else time.perf_counter


def time_interleaved(steps, repeats, warmup, device, block=10, clock_kind="wall"):
    """Median seconds per step of each closure in `steps`, timed in alternating blocks of `block` steps.

    Alternating blocks expose every model to the same drift in machine load and clock speed, so the
    ratios stay meaningful on a shared machine; within a block the model steps back to back as in
    training (warm caches), and the first step of each block is run untimed so the switch is not counted.
    """
    now = clock(clock_kind)
    for step in steps.values():
        for _ in range(warmup):
            step()
    times = {name: [] for name in steps}
    while min(len(t) for t in times.values()) < repeats:
        for name, step in steps.items():
            step()
            for _ in range(min(block, repeats - len(times[name]))):
                sync(device)
                start = now()
                step()
                sync(device)
                times[name].append(now() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def median_step_time(fn, steps, device):
    """Median wall seconds of `steps` calls of `fn`, each synchronised with the device."""
    times = []
    for _ in range(steps):
        sync(device)
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def interleaved(fns: dict, rounds, steps, warmup, device):
    """Median over rounds of the per-round median time of each fn, the fns interleaved within every round."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    per = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            per[k].append(median_step_time(fn, steps, device))
    return {k: statistics.median(v) for k, v in per.items()}, per


def batches(x, y, batch, generator):
    """Random minibatches of `batch` rows forever (the whole data every time when batch >= N)."""
    n = x.shape[0]
    while True:
        if batch >= n:
            yield x, y
            continue
        idx = torch.randint(0, n, (batch,), generator=generator).to(x.device)
        yield x[idx], y[idx]


def flowgp_step(model, x, y, batch, lr=0.01, seed=0, compiled=False, compile_mode=None):
    """One training step (minibatch ELBO, backward, Adam update) of a flowgp model, as a closure.

    compiled: evaluate the bound through flowgp.training.compiled.CompiledObjective; the closure's `compiler`
    attribute then holds it (its compile_seconds), and the compilation happens here, before any timing.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    opt = default_optimizer(params, lr)
    minibatches = batches(x, y, batch, torch.Generator().manual_seed(seed))
    n = x.shape[0]

    def bound(xb, yb):
        return -model.elbo(xb, yb, num_data=n)

    objective = CompiledObjective(bound, params, mode=compile_mode) if compiled else bound
    if compiled:
        objective(*next(batches(x, y, batch, torch.Generator().manual_seed(seed + 1))))

    def step():
        xb, yb = next(minibatches)
        opt.zero_grad(set_to_none=True)
        loss = objective(xb, yb)
        loss.backward()
        opt.step()

    step.compiler = objective if compiled else None
    return step


def synthetic_data(num_data: int, dim: int):
    """The step-time scripts' inputs and targets (float64; perf/step_time.py's) and the generator after them."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(num_data, dim, generator=g, dtype=torch.float64)
    y = torch.sin(x[:, :1]) + 0.1 * torch.randn(num_data, 1, generator=g, dtype=torch.float64)
    return x, y, g


def step_medians(steps: dict, rounds: int, per_round: int) -> dict:
    """Median over interleaved rounds of each step's per-round median, in seconds (20 warm-up calls each)."""
    return interleaved(steps, rounds, per_round, 20, torch.device("cpu"))[0]
