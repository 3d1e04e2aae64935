"""`train(compile=...)`: how a run compiles its objective.

True (or a torch.compile mode name) evaluates the objective through flowgp.training.compiled.CompiledObjective
(torch.compile of the whole bound and its backward; eager fallback with a warning when it cannot compile).
Compiling takes seconds to a minute on a CPU and only removes per-step overhead: worth it for long fits. True is
torch.compile's default mode; a mode name picks another: on a GPU "reduce-overhead" (CUDA graphs) replays the whole
bound as one graph, which measured fastest where the eager step is launch-bound (docs/results/perf/gpu: SVGP
M = 100, B = 1024 on an H200, 6.7 ms eager, 2.8 ms default mode, 1.8 ms reduce-overhead, against its longer
compilation, 13 s instead of 6 s).

"auto" (`AutoCompile`) runs the first `flowgp.training.compiled.AUTO_PROBE_STEPS` steps eagerly, times them, and
compiles (default mode) only when `flowgp.training.compiled.compile_pays_off` finds the rest of the budget long
enough to repay the compilation; otherwise the whole fit stays eager (the decision is printed when `verbose`).
After compiling it times as many compiled steps (the first two, which compile and warm up, not counted) and goes
back to the eager objective for the rest of the fit if their median is not below the eager one. A short fit (a
1 000-step SVGP at M = 20 on a CPU: 1.2 s eager, 3.5 s to compile) is not made slower by it. The choice depends
on measured time, and a compiled fit differs from the eager one by rounding (1e-6 relative): where a fit must
repeat bit for bit, pass True or False.
"""
from __future__ import annotations

import torch

from .compiled import AUTO_PROBE_STEPS
from .distributed import all_reduce_sum

__all__ = ["AutoCompile"]


class AutoCompile:
    """The auto-compile policy of one run. `timing`: whether the coming step is to be timed (then `record` its
    seconds); `after_step(step)` returns the objective to use from now on, or None to keep the current one.
    `report(message)` tells the user the decisions; `will_unfreeze(step)`: whether the noise freeze ends after
    `step` (the bound then compiles twice). `compiler` and `pays_off` are flowgp.training.compiled's
    CompiledObjective and compile_pays_off (the loop passes its own references, so that
    one name in flowgp.training.loop is the hook for both)."""

    def __init__(self, enabled: bool, step: int, eager_objective, tracked, generator, world, report, remaining_total,
                 will_unfreeze, compiler, pays_off):
        self.pending, self.verify = bool(enabled), False
        self.start, self.seconds, self.eager = step, [], None
        self.eager_objective, self.tracked, self.generator = eager_objective, tracked, generator
        self.world, self.report = world, report
        self.total, self.will_unfreeze = remaining_total, will_unfreeze
        self.compiler, self.pays_off = compiler, pays_off

    @property
    def timing(self) -> bool:
        return self.pending or self.verify

    def record(self, seconds: float) -> None:
        self.seconds.append(seconds)

    def after_step(self, step: int):
        if self.pending and step - self.start >= AUTO_PROBE_STEPS:
            compiled = self._decide(step)
            if compiled is not None:
                self.verify, self.start, self.seconds = True, step, []
            return compiled
        if self.verify and step - self.start >= AUTO_PROBE_STEPS:
            if not self._keep_compiled():  # it also ends the check
                return self.eager_objective
        return None

    def _median_step_seconds(self) -> float:
        timed = sorted(self.seconds[2:])  # the first steps allocate, warm caches (and compile)
        seconds = timed[len(timed) // 2]
        world = self.world
        if world.distributed:  # every rank decides on the same (mean) figure, so all ranks decide alike
            mean = all_reduce_sum(torch.tensor(seconds, dtype=torch.float64, device=self.tracked[0].device), world)
            seconds = float(mean) / world.size
        return seconds

    def _keep_compiled(self) -> bool:
        self.verify = False
        seconds = self._median_step_seconds()
        faster = seconds < self.eager
        self.report(f"compiled steps {1e3 * seconds:.2f} ms against {1e3 * self.eager:.2f} ms eager: "
                    f"{'kept' if faster else 'back to eager'}")
        return faster

    def _decide(self, step: int):
        self.pending = False
        seconds = self._median_step_seconds()
        self.eager = seconds
        worth, reason = self.pays_off(seconds, self.total - step, self.tracked[0].device,
                                         compilations=2 if self.will_unfreeze(step) else 1)
        self.report(reason)
        return self.compiler(self.eager_objective, self.tracked, generators=[self.generator]) if worth else None
