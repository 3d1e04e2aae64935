"""A compiled training objective: `torch.compile` of a whole minibatch bound, its backward included.

`CompiledObjective(objective, parameters)` wraps the training loop's objective (a callable of one minibatch
returning the scalar loss -bound). Its first call for a batch signature (shapes, dtypes, device) compiles the
forward and, through a throw-away `torch.autograd.grad`, the backward graph, so that every compilation happens
in one place where a failure can be caught: then it warns once (`CompileFallbackWarning`) and stays eager.

The compiled graph is the eager computation's first attempt, nothing else:

- the K_ZZ Cholesky factor is taken once at the jitter level the eager path would start from
  (`flowgp.numerics.linalg.robust_cholesky` under compilation), and a failed factorisation poisons the loss with NaN
  instead of branching on the data inside the graph;
- the input checks that read the data (NaN/inf) are skipped inside the graph for the same reason;

so whenever the compiled loss is not finite the objective is evaluated again eagerly, which retries the
Cholesky with growing jitter (and warns and remembers the level, the project's jitter policy), or raises the
clear error about the data. Batches of another signature (an epoch's last, smaller batch) run eagerly rather
than compile a second graph, unless `max_signatures` allows more.

Compilation costs seconds on a CPU (about 3 s for an SVGP or TGP bound with a warm inductor cache on the
project's 2-core machine, 5-10 s cold, while a C++ toolchain builds the kernels) and removes per-step
dispatch overhead only (the arithmetic is the same), so it pays off for long fits only; the training
loop's `compile=` is off by default, and `compile="auto"` compiles only when `compile_pays_off` finds the
remaining budget long enough to repay it. `compile_seconds` holds the time spent in compiling calls,
reported separately from step times by `benchmarks/perf/step_time.py`; `benchmarks/perf/compiled_fit_time.py`
measures whole fits end to end.
"""
from __future__ import annotations

import itertools
import os
import shutil
import time
import types
import warnings
from typing import Callable, Iterable

import torch

__all__ = ["CompiledObjective", "CompileFallbackWarning", "compile_unavailable_reason", "compile_pays_off",
           "AUTO_PROBE_STEPS", "AUTO_COMPILE_SECONDS", "AUTO_STEP_SAVING", "AUTO_MAX_STEP_SAVING_SECONDS"]

#: compile="auto": the eager steps timed before deciding (the first two, which allocate, are not counted)
AUTO_PROBE_STEPS = 10
#: what one compilation of a bound (forward and backward, default mode) costs, by device type: measured with a
#: warm inductor cache by benchmarks/perf/compiled_fit_time.py (CPU, 2 cores: 3.3-3.7 s for SVGP and TGP at M = 20
#: and 100) and on an H200 (about 6 s, docs/results/perf/gpu). A cold cache costs more (the C++ or Triton build).
AUTO_COMPILE_SECONDS = {"cpu": 3.5, "cuda": 6.0}
#: the largest share of an eager step that compiling removed in this project's measurements (CPU: SVGP at
#: M = 20, compiled 0.45x eager; H200: SVGP M = 100, B = 1 024, default mode 2.8 of 6.7 ms), by device type
AUTO_STEP_SAVING = {"cpu": 0.55, "cuda": 0.6}
#: and the most it removed from one step in seconds: compiling saves dispatch overhead and memory passes, not
#: arithmetic, so a long step saves no more than this (CPU: 1-3 ms at M = 100-500, where the step takes
#: 2-20 ms; H200: 3.9 ms)
AUTO_MAX_STEP_SAVING_SECONDS = {"cpu": 2e-3, "cuda": 4e-3}


class CompileFallbackWarning(RuntimeWarning):
    """Emitted once when a compiled objective could not be built and the eager one is used instead."""


def compile_unavailable_reason(device="cpu") -> str | None:
    """None when `torch.compile` can build kernels for `device` here, else why not (a short sentence).

    CPU kernels need a C++ compiler (`CXX` or c++/g++/clang++ on the PATH); CUDA kernels need Triton.
    """
    if not hasattr(torch, "compile") or not hasattr(torch, "compiler"):
        return f"torch {torch.__version__} has no torch.compile"
    kind = torch.device(device).type
    if kind == "cpu":
        candidates = [os.environ.get("CXX")] + ["c++", "g++", "clang++"]
        if not any(c and shutil.which(c) for c in candidates):
            return "no C++ compiler on the PATH (torch.compile builds CPU kernels with one); set CXX or install g++"
    elif kind == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "Triton is not installed (torch.compile builds CUDA kernels with it)"
    return None


def compile_pays_off(eager_step_seconds: float, remaining_steps: int, device="cpu",
                     compilations: int = 1) -> tuple[bool, str]:
    """Whether compiling can repay itself in the rest of a fit, and why (one sentence), for compile="auto".

    The most compiling can save per step is min(`AUTO_STEP_SAVING` x the eager step,
    `AUTO_MAX_STEP_SAVING_SECONDS`); it costs `AUTO_COMPILE_SECONDS` per compilation (`compilations`: 2 when
    the noise is unfrozen later in the fit, which changes the graph). Compile when
        remaining_steps * min(saving * eager_step_seconds, max_saving) > compilations * cost.
    Both savings are the best measured, so the rule compiles only fits that compiling can speed up, while
    a fit it leaves eager cannot have gained much: a 1 000-step SVGP fit on the project's CPU stays eager
    at M = 20 (1.2 ms a step), 100 and 500 (16-20 ms, where the compiled fit measured the same as the eager
    one within the machine's drift); at M = 20 a fit of more than about 5 000 steps is compiled.
    """
    if not eager_step_seconds >= 0.0:
        raise ValueError(f"eager_step_seconds must be a non-negative number, got {eager_step_seconds!r}")
    if isinstance(remaining_steps, bool) or not isinstance(remaining_steps, int) or remaining_steps < 0:
        raise ValueError(f"remaining_steps must be a non-negative integer, got {remaining_steps!r}")
    kind = torch.device(device).type
    known = kind if kind in AUTO_COMPILE_SECONDS else "cuda"  # another accelerator: the GPU's figures
    cost = compilations * AUTO_COMPILE_SECONDS[known]
    per_step = min(AUTO_STEP_SAVING[known] * eager_step_seconds, AUTO_MAX_STEP_SAVING_SECONDS[known])
    saving = remaining_steps * per_step
    verdict = saving > cost
    reason = (f"{remaining_steps} steps of {1e3 * eager_step_seconds:.2f} ms left: compiling could save up to "
              f"{saving:.1f} s against about {cost:.1f} s to compile on {kind}: "
              f"{'compiling' if verdict else 'staying eager'}")
    return verdict, reason


_INSTANCES = itertools.count()


def _own_code(objective: Callable) -> Callable:
    """A function calling `objective` whose code object belongs to the caller alone.

    Dynamo keeps compiled graphs and their guards on the code object of the function it compiles, and every
    objective the training loop builds is the same inner function: one cache for every model compiled in the
    process. The guards of all of them would then be checked on each call (slower), and past dynamo's recompile
    limit (8 graphs) later models would silently run eagerly. A copy of the code object gives each
    CompiledObjective a cache of its own.
    """
    def call(*args):
        return objective(*args)

    code = call.__code__.replace(co_name=f"flowgp_objective_{next(_INSTANCES)}")
    return types.FunctionType(code, call.__globals__, code.co_name, call.__defaults__, call.__closure__)


def _signature(value):
    """What a compiled graph is specialised on: shapes, dtypes and devices of the tensors in `value`."""
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.dtype, value.device.type, value.requires_grad)
    if isinstance(value, (tuple, list)):
        return tuple(_signature(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _signature(v)) for k, v in sorted(value.items()))
    fields = getattr(value, "__dataclass_fields__", None)
    if fields is not None:
        return (type(value).__name__,) + tuple(_signature(getattr(value, name)) for name in fields)
    return type(value).__name__


def _device(value):
    """The device of the first tensor found in `value` (the CPU when there is none)."""
    if isinstance(value, torch.Tensor):
        return value.device
    items = value if isinstance(value, (tuple, list)) else (
        value.values() if isinstance(value, dict) else
        [getattr(value, name) for name in getattr(value, "__dataclass_fields__", ())])
    for item in items:
        found = _device(item)
        if found is not None:
            return found
    return torch.device("cpu") if value is None or isinstance(value, (tuple, list)) else None


class CompiledObjective:
    """`objective(*args)` compiled with `torch.compile` (static shapes), with an eager fallback.

    Args:
        objective: callable(*args) -> scalar loss tensor (e.g. -model.elbo(x_b, y_b, num_data=N)).
        parameters: the tensors the loss is differentiated against (the backward is compiled on the first
            call, against these).
        mode: `torch.compile` mode (None: the default).
        backend: `torch.compile` backend ("inductor" builds fused kernels; "aot_eager" only traces forward
            and backward into graphs, with no toolchain and no speed-up: for checks).
        max_signatures: how many distinct batch signatures (shapes, dtypes, devices) get a graph of their
            own; later ones run eagerly. A change of which parameters require gradients recompiles for an
            admitted signature.
        generators: the torch.Generators the objective draws from (a deep GP's samples of U, MC-dropout
            masks). Every evaluation that is thrown away (the compiling call's trial evaluation, a compiled
            loss that is re-run eagerly) is undone on them, so that a compiled fit draws exactly the random
            numbers of the eager one.

    Attributes:
        compile_seconds: wall time spent in the calls that compiled (forward, backward and that step).
        compile_cpu_seconds: the CPU time of this process in those calls (compiler worker processes, which
            build the C++ kernels, are not included).
        eager_calls: calls answered eagerly (other signatures, non-finite compiled losses, fallback).
        failure: None, or why compilation was abandoned (the objective is then plain eager).
    """

    def __init__(self, objective: Callable, parameters: Iterable[torch.Tensor], *, mode: str | None = None,
                 backend: str = "inductor", max_signatures: int = 1, generators: Iterable = ()):
        if not callable(objective):
            raise TypeError(f"objective must be callable, got {type(objective).__name__}")
        if isinstance(max_signatures, bool) or not isinstance(max_signatures, int) or max_signatures < 0:
            raise ValueError(f"max_signatures must be a non-negative integer, got {max_signatures!r}")
        self.objective = objective
        self.parameters = [p for p in parameters]
        self.mode = mode
        self.backend = backend
        self.max_signatures = max_signatures
        self.generators = [g for g in generators if g is not None]
        for g in self.generators:
            if not isinstance(g, torch.Generator):
                raise TypeError(f"generators must be torch.Generator objects, got {type(g).__name__}")
        self.compile_seconds = 0.0
        self.compile_cpu_seconds = 0.0
        self.eager_calls = 0
        self.failure: str | None = None
        self._compiled = None
        self._shapes: set = set()
        self._signatures: set = set()

    @property
    def active(self) -> bool:
        """Whether calls of a compiled signature still go through the compiled graph."""
        return self.failure is None

    def _abandon(self, reason: str) -> None:
        self.failure = reason
        self._compiled = None
        warnings.warn(f"torch.compile of the training objective failed ({reason}); training continues eagerly "
                      "with the same results", CompileFallbackWarning, stacklevel=3)

    def _rng_states(self):
        return [g.get_state() for g in self.generators]

    def _restore(self, states) -> None:
        for g, state in zip(self.generators, states):
            g.set_state(state)

    def _first_call(self, args):
        """Compile forward and backward for a new signature; the loss of a fresh compiled evaluation."""
        start, cpu_start = time.perf_counter(), time.process_time()
        states = self._rng_states()
        try:
            reason = compile_unavailable_reason(_device(args)) if self.backend == "inductor" else None
            if reason is not None:
                raise RuntimeError(reason)
            if self._compiled is None:
                # one eager evaluation first: attributes a model settles on its first call (e.g. a warped
                # likelihood finding its flow is not affine) would otherwise change under the traced graph's
                # guards and force a second compilation; its draws are undone below
                self.objective(*args)
                self._restore(states)
                self._compiled = torch.compile(_own_code(self.objective), dynamic=False, mode=self.mode,
                                               backend=self.backend)
            value = self._compiled(*args)
            wanted = [p for p in self.parameters if p.requires_grad]
            if value.requires_grad and wanted:
                # compile the backward graph here, where a failure can still fall back (its gradients are
                # discarded: the caller differentiates the value returned below)
                torch.autograd.grad(value, wanted, allow_unused=True)
            self._restore(states)  # the trial evaluation's draws are not the step's
            return self._compiled(*args)
        finally:
            self.compile_seconds += time.perf_counter() - start
            self.compile_cpu_seconds += time.process_time() - cpu_start

    def _compiled_value(self, args):
        """The compiled loss, or None where this call is answered eagerly."""
        shape = _signature(args)
        # frozen parameters (e.g. the noise early in a fit) change the graph: a signature of their own,
        # compiled for a batch shape already admitted
        key = (shape, tuple(p.requires_grad for p in self.parameters))
        if key in self._signatures:
            return self._compiled(*args)
        if shape not in self._shapes and len(self._shapes) >= self.max_signatures:
            return None
        value = self._first_call(args)
        self._shapes.add(shape)
        self._signatures.add(key)
        return value

    def __call__(self, *args):
        states = self._rng_states()
        if self.failure is None:
            try:
                value = self._compiled_value(args)
            except Exception as err:  # a compiler failure (toolchain, unsupported op): eager from now on
                self._restore(states)
                value = self.objective(*args)  # a genuine error in the objective itself is raised here
                self._abandon(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300])
                self.eager_calls += 1
                return value
            if value is not None and bool(torch.isfinite(value).all()):
                return value
            # another batch signature, or a non-finite compiled loss (a failed Cholesky or bad data inside
            # the graph): the eager path retries with jitter (warning and remembering the level) or raises
            # the error that names the problem, with the draws the compiled evaluation took
            self._restore(states)
        self.eager_calls += 1
        return self.objective(*args)
