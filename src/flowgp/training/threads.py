"""How many torch threads a fit uses: a choice that never oversubscribes the cores, set per fit and restored.

torch's default intra-op thread count is the machine's core count. A GP fit runs thousands of small steps, and
when more threads than free cores are asked for, each step waits for descheduled worker threads: with two other
CPU-bound processes on two cores, a default `flowgp fit` on 2 000 rows took 374 s with torch's default threads
and 33 s with one (107-258 ms against 8 ms per step). The same happens when scikit-learn runs several fits at
once (`n_jobs`) or torchrun starts several processes per machine.

`choose_threads("auto", work=...)` therefore takes

- one thread when a step is too small to gain from more (`work` below `SMALL_STEP_WORK`: the per-step cost of a
  sparse GP, batch x M² + M³ multiply-adds, under which a second thread is not expected to repay its
  synchronisation; see the constant for what was measured), and otherwise
- the cores this process may run on (its CPU affinity), divided by the processes sharing them (torchrun's
  `LOCAL_WORLD_SIZE`, which `flowgp fit --nproc` sets too), less the cores other processes keep busy right now
  (`busy_cores`: the kernel's count of runnable tasks), and never more than an `OMP_NUM_THREADS` set in the
  environment (joblib's loky workers, which scikit-learn's `n_jobs` starts, get their share of the cores
  there: 1 each for n_jobs=2 on two cores) nor than torch's own setting when the fit starts (a
  `torch.set_num_threads(1)` of the user's is kept).

`thread_limit(n)` sets torch's intra-op thread count for a block and restores the previous value after it,
so nothing is changed for good.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import torch

__all__ = ["SMALL_STEP_WORK", "available_cores", "busy_cores", "choose_threads", "check_threads", "thread_limit",
           "step_work"]

#: multiply-adds per step (batch x M² + M³) below which "auto" takes one thread even with idle cores: at batch 512,
#: M = 100 is 6e6, M = 300 is 7e7. Measured with `python -m benchmarks.perf.threads cutover` (SVGP step, float64,
#: 1 vs 2 threads interleaved) on the idle 2-core development machine (2026-12-07,
#: docs/results/perf/threads/cutover.csv): two threads are within ±5 % of one up to work 6e6 (M = 100 / 512:
#: 0.94x), mixed between 1e7 and 2e7 (0.86x at M = 200 / 128, 0.93x at M = 100 / 2048) and at least 10 % faster
#: in every row from 2.8e7 (M = 200 / 512: 0.86x, M = 500 / 2048: 0.60x). Under load (other processes' runnable
#: tasks 17-24, cutover-loaded.csv) two threads were 5-62x slower at every size: that is the case `busy_cores`
#: covers, whatever this value
SMALL_STEP_WORK = 2.0e7


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS reports one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


def busy_cores(reads: int = 3) -> int:
    """Cores other processes keep busy now: the runnable tasks of /proc/loadavg (an instantaneous count, unlike
    the load averages, which lag a minute) less the one reading it, the least of `reads` reads (a task that
    merely woke up is not a busy process); 0 where the kernel does not report it."""
    counts = []
    for _ in range(reads):
        try:
            with open("/proc/loadavg", encoding="ascii") as fh:
                counts.append(int(fh.read().split()[3].split("/")[0]) - 1)
        except (OSError, ValueError, IndexError):
            return 0
    return max(0, min(counts))


def _positive_env(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() and int(value) >= 1 else None


def step_work(batch_size: int, num_inducing: int, layers: int = 1) -> float:
    """Multiply-adds of one sparse-GP step, the size `choose_threads` compares with `SMALL_STEP_WORK`."""
    m = float(num_inducing)
    return float(layers) * (float(batch_size) * m * m + m ** 3)


def check_threads(threads) -> None:
    """ValueError/TypeError unless `threads` is "auto", None (leave torch's setting) or a positive integer."""
    if threads is None or threads == "auto":
        return
    if isinstance(threads, bool) or not isinstance(threads, int):
        raise TypeError(f"threads must be 'auto', None or a positive integer, got {threads!r}")
    if threads < 1:
        raise ValueError(f"threads must be a positive integer (or 'auto'), got {threads}")


def choose_threads(threads="auto", *, work: float | None = None, processes: int | None = None) -> int | None:
    """The torch thread count for a fit (module docstring): `threads` itself when it is an integer, None when it
    is None (torch's setting is left alone), else the "auto" choice for a step of `work` multiply-adds run by
    `processes` processes per machine (default: torchrun's LOCAL_WORLD_SIZE, else 1)."""
    check_threads(threads)
    if threads is None or isinstance(threads, int):
        return threads
    if work is not None and work < SMALL_STEP_WORK:
        return 1
    sharing = processes if processes is not None else (_positive_env("LOCAL_WORLD_SIZE") or 1)
    cores = available_cores()
    share = max(1, cores // max(1, int(sharing)))
    if share == 1:
        return 1
    # other processes' busy cores come off the share: a thread more than the free cores waits at every step
    share = max(1, min(share, cores - busy_cores()))
    cap = _positive_env("OMP_NUM_THREADS")
    return max(1, min(share, torch.get_num_threads(), cap if cap is not None else share))


@contextmanager
def thread_limit(threads: int | None):
    """torch's intra-op thread count set to `threads` inside the block (None: unchanged), restored after it."""
    previous = torch.get_num_threads()
    if threads is not None and threads != previous:
        torch.set_num_threads(int(threads))
    try:
        yield
    finally:
        if torch.get_num_threads() != previous:
            torch.set_num_threads(previous)
