"""AMO-GP training-step time against the MO-GP it extends, side by side in one run (ratio AMO-GP / MO-GP).

The setting (`benchmarks/lib/amogp_setting.py`): the four London sites of the shared PM2.5 file, 2019-03-01 00:00 + 21 days hourly
(2 004 rows after dropping missing values), `AlignedMultiOutputGPRegressor(num_inducing=50)` (8 alignment and
8 warping inducing points per site), float64, one torch thread. `--cp-inducing output` gives the supplement's
model (50 CP inducing points per site, 200 in all); the default, the estimator's, puts `--num-inducing` on the
latent. The MO-GP is the same estimator with `alignment="identity", warping="identity"` (the CP kernel alone). One step = bound on a batch, backward, Adam - the optimiser `flowgp.training.loop.train` builds
(`default_optimizer`: fused Adam), for both models.

Part 1: minibatch steps (`--batch`, default 256) and full-batch steps, the two models interleaved: every round
times each model for `--steps` steps (after one untimed step) and the value reported is the median over rounds of
each round's median,
so slow drifts of the load on a shared machine do not enter the ratio. Printed: ms per step and the ratio
AMO-GP / MO-GP (the aim: <= 3; 2.7-2.9 at full batch and 2.4 at B = 256 with the estimator's defaults on
2026-11-27). `--separate K` times each model in its own fresh process instead
(K rounds, alternating): in one process the model timed second inherits the first one's allocator state (glibc
returns freed heap to the system and the next step faults it back in), which slowed the MO-GP's full-batch step
by 20-50 % when interleaved with the AMO-GP's.

Part 2 (`--fit-epochs`, default 0 = skipped): wall-clock time of the estimator's default fit
(full batch, as `batch_size="auto"` picks for 2 004 rows) for that many epochs, with the plateau stop off.
Without it, the time of a 1 500-epoch fit is extrapolated from the full-batch step time of part 1.

    OMP_NUM_THREADS=1 nice -n 10 python -m benchmarks.perf.amogp_step_time
    OMP_NUM_THREADS=1 nice -n 10 python -m benchmarks.perf.amogp_step_time --fit-epochs 1500

`--lengthscale` sets the initial CP lengthscale (default 0.3, the estimator's default; hourly PM2.5 over three
weeks wants about 0.05): the contraction skips inducing inputs out of reach of a chunk of points, so its cost
falls as the lengthscale shrinks.

Results go to a JSON file with `--json PATH` (nothing is written without it).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.lib.amogp_setting import add_state_arguments, cp_grid_option, data, model_and_tensors
from flowgp import AlignedMultiOutputGPRegressor
from flowgp.training.loop import default_optimizer


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_state_arguments(p)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=6, help="minibatch steps per model and round")
    p.add_argument("--full-steps", type=int, default=2, help="full-batch steps per model and round")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed steps of each model before its timed steps in every round")
    p.add_argument("--only", choices=["amogp", "mogp"], default=None,
                   help="time one model only (in this process)")
    p.add_argument("--separate", type=int, default=0,
                   help="K > 0: K rounds of the two models each in a fresh process (--only), instead of both "
                        "interleaved in this one")
    p.add_argument("--keep-heap", action="store_true",
                   help="first tell glibc's malloc (mallopt) to keep freed memory in the heap instead of returning it "
                        "to the system (no trimming, no mmap for large blocks): both models' steps then run without "
                        "the page faults of re-grown heap (a process setting of this benchmark, not of the library)")
    p.add_argument("--steady", type=int, default=0,
                   help="N > 0: also time N consecutive full-batch steps of each model alone (a fit's steady "
                        "state) and report median, mean and largest step, minor page faults per step and the "
                        "pauses of Python's cyclic garbage collector")
    p.add_argument("--fit-epochs", type=int, default=0)
    p.add_argument("--profile-steps", type=int, default=0,
                   help="also profile this many full-batch AMO-GP steps (torch.profiler) and print where they go")
    p.add_argument("--denormal-check", type=int, default=0,
                   help="N > 0: also time N full-batch steps of each model with the CPU's flush-to-zero off, on, off, on "
                        "(torch.set_flush_denormal, a process setting of this benchmark): equal medians mean no "
                        "subnormal numbers slow the step")
    p.add_argument("--json", default=None, help="write the step times and the setting to this file")
    return p.parse_args(argv)


def step(model, opt, xt, yt, ot, idx=slice(None)):
    """One training step on the rows idx: bound, backward, the optimiser's update."""
    opt.zero_grad()
    loss = -model.elbo(xt[idx], yt[idx], ot[idx], num_data=xt.shape[0])
    loss.backward()
    opt.step()


def time_steps(model, opt, xt, yt, ot, batches, warmup: int = 1):
    """Median time of one step (bound, backward, optimiser) over `batches`, after `warmup` untimed steps: the
    first steps after the other model ran pay for the allocator's state the other model left (page faults of
    regrown buffers, measured up to +40 % on the MO-GP's full-batch step), which a fit does once, not every step."""
    times = []
    for idx in batches[:1] * warmup + batches:
        t0 = time.perf_counter()
        step(model, opt, xt, yt, ot, idx)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[warmup:])


def steady_steps(model, opt, xt, yt, ot, count):
    """`count` consecutive full-batch steps after 5 untimed ones: ms per step (median, mean, largest), minor page
    faults per step (`resource.getrusage`) and Python's cyclic-collector pauses (`gc.callbacks`: count and the
    longest, ms), the costs a median hides."""
    import gc
    import resource

    pauses, start = [], []

    def on_gc(phase, info):
        if phase == "start":
            start.append(time.perf_counter())
        elif start:
            pauses.append(1e3 * (time.perf_counter() - start.pop()))

    for _ in range(5):
        step(model, opt, xt, yt, ot)
    gc.callbacks.append(on_gc)
    try:
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        times = []
        for _ in range(count):
            t0 = time.perf_counter()
            step(model, opt, xt, yt, ot)
            times.append(1e3 * (time.perf_counter() - t0))
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / count
    finally:
        gc.callbacks.remove(on_gc)
    return {"median_ms": statistics.median(times), "mean_ms": statistics.fmean(times), "max_ms": max(times),
            "minor_faults_per_step": faults, "gc_collections": len(pauses),
            "gc_longest_ms": max(pauses, default=0.0)}


def profile_full_batch(model, xt, yt, ot, opt, steps):
    """Per full-batch step: the custom autograd nodes' forward and backward times and the other autograd nodes
    of the backward (torch.profiler's CPU totals; the profiler adds its own overhead to every operation)."""
    from torch.profiler import profile

    step(model, opt, xt, yt, ot)
    t0 = time.perf_counter()
    with profile(record_shapes=True) as prof:
        for _ in range(steps):
            step(model, opt, xt, yt, ot)
    total = (time.perf_counter() - t0) / steps * 1e3
    prefix = "autograd::engine::evaluate_function: "
    rows = {e.key: e.cpu_time_total / steps / 1e3 for e in prof.key_averages()}
    custom = {k: v for k, v in rows.items() if k[:1] == "_" and not k.startswith("_to")}  # autograd.Function nodes
    graph = {k[len(prefix):]: v for k, v in rows.items() if k.startswith(prefix) and not k[len(prefix):].startswith("_")}
    print(f"profiled full-batch AMO-GP step: {total:.1f} ms (with the profiler's overhead)")
    for name, ms in sorted(custom.items(), key=lambda kv: -kv[1]):
        print(f"  {ms:7.2f} ms  {name}")
    print(f"  {sum(graph.values()):7.2f} ms  the other {len(graph)} kinds of autograd node in the backward; largest:")
    for name, ms in sorted(graph.items(), key=lambda kv: -kv[1])[:5]:
        print(f"  {ms:7.2f} ms    {name}")
    # the largest single operations by input shape (own time): where a step's time is passes over big arrays
    print("  largest aten operations by input shape (own time per step, calls per step):")
    ops = [e for e in prof.key_averages(group_by_input_shape=True) if e.key.startswith("aten::")]
    for e in sorted(ops, key=lambda e: -e.self_cpu_time_total)[:8]:
        print(f"  {e.self_cpu_time_total / steps / 1e3:7.2f} ms  {e.key} x{e.count / steps:g} {e.input_shapes[:2]}")


def separate_processes(args, argv):
    """`--separate K`: K rounds, each timing the two models in two fresh processes (`--only`, in alternating order);
    per model and kind the median over rounds of each process's median. One process per model is how a fit runs:
    in a shared process the model timed second inherits the first's allocator state (the MO-GP's full-batch
    step measured 6.3 ms alone and 7.7-9.5 ms interleaved with the AMO-GP's)."""
    import subprocess
    import sys
    import tempfile

    # the child gets this run's arguments less --separate and --json (it writes its own)
    base = without_options(argv if argv is not None else sys.argv[1:], ("--separate", "--json"))
    per = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.separate):
            for name in (("amogp", "mogp") if r % 2 == 0 else ("mogp", "amogp")):
                out = Path(tmp) / f"{name}_{r}.json"
                cmd = [sys.executable, "-m", "benchmarks.perf.amogp_step_time", *base, "--only", name,
                       "--json", str(out)]
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                for key, value in json.loads(out.read_text())["results"].items():
                    per.setdefault(key, []).append(value)
    return {key: statistics.median(values) for key, values in per.items()}


def without_options(argv, options):
    """argv without each of `options` and its value (both `--opt v` and `--opt=v`)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in options:
            skip = True
        elif not any(a.startswith(option + "=") for option in options):
            out.append(a)
    return out


def keep_heap():
    """glibc's mallopt: no heap trimming (M_TRIM_THRESHOLD), mmap only for blocks above 32 MiB (M_MMAP_THRESHOLD,
    its largest value), 256 MiB top pad (M_TOP_PAD). By default glibc returns the top of the heap to the system
    once more than twice the largest recently freed block is free there, and each step then faults the pages back
    in: about 1 000-2 000 faults per full-batch AMO-GP step, none for the MO-GP's (`resource.getrusage`'s
    ru_minflt). False where this is not glibc."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        return all(libc.mallopt(option, value) == 1 for option, value in ((-1, 1 << 36), (-3, 1 << 25), (-2, 1 << 28)))
    except (OSError, AttributeError):
        return False


def main(argv=None):
    args = parse(argv)
    if args.keep_heap and not keep_heap():
        raise SystemExit("--keep-heap: mallopt is not available here (not glibc)")
    torch.set_num_threads(1)
    X, y, o = data(args)
    n = len(y)
    if args.separate:
        res = separate_processes(args, argv)
        report(args, res, n)
        return
    models = {name: model_and_tensors(layers, X, y, o, args) for name, layers in
              (("amogp", "gp"), ("mogp", "identity")) if args.only in (None, name)}
    opts = {name: default_optimizer(m[0].parameters(), 0.01) for name, m in models.items()}
    gen = torch.Generator().manual_seed(0)
    per_round = {(name, kind): [] for name in models for kind in ("minibatch", "full")}
    for r in range(args.rounds):
        for kind, count, size in (("minibatch", args.steps, args.batch), ("full", args.full_steps, n)):
            if count == 0:  # --full-steps 0: minibatch steps only (e.g. for older, slower code)
                continue
            batches = [torch.randperm(n, generator=gen)[:size] for _ in range(count)]
            order = list(models) if r % 2 == 0 else list(models)[::-1]
            for name in order:
                model, xt, yt, ot = models[name]
                per_round[(name, kind)].append(time_steps(model, opts[name], xt, yt, ot, batches, args.warmup))
    res = {f"{name}_{kind}_ms": 1000 * statistics.median(v) for (name, kind), v in per_round.items() if v}
    if args.steady:
        for name in models:
            model, xt, yt, ot = models[name]
            res[f"{name}_steady"] = st = steady_steps(model, opts[name], xt, yt, ot, args.steady)
            print(f"{name}: {args.steady} consecutive full-batch steps: median {st['median_ms']:.1f} ms, mean "
                  f"{st['mean_ms']:.1f}, largest {st['max_ms']:.1f}; {st['minor_faults_per_step']:.0f} minor page "
                  f"faults per step; {st['gc_collections']} cyclic collections, longest {st['gc_longest_ms']:.1f} ms")
    if args.denormal_check:
        for name, (model, xt, yt, ot) in models.items():
            medians = []
            for flush in (False, True, False, True):
                torch.set_flush_denormal(flush)
                medians.append(1e3 * time_steps(model, opts[name], xt, yt, ot, [slice(None)] * args.denormal_check, 2))
            torch.set_flush_denormal(False)
            res[f"{name}_flush_off_on_ms"] = medians
            print(f"{name}: full-batch step with flush-to-zero off / on / off / on: "
                  + " / ".join(f"{m:.1f}" for m in medians) + " ms")
    if args.profile_steps and "amogp" in models:
        profile_full_batch(*models["amogp"], opts["amogp"], args.profile_steps)
    if args.fit_epochs:
        t0 = time.perf_counter()
        est = AlignedMultiOutputGPRegressor(num_inducing=args.num_inducing, epochs=args.fit_epochs, verbose=False,
                                            dtype=args.dtype, lengthscale=args.lengthscale, tol=None,
                                            cp_inducing=args.cp_inducing, cp_grid=cp_grid_option(args)).fit(X, y, o)
        res["fit_seconds"] = time.perf_counter() - t0
        res["fit_epochs"] = len(est.history_)
        print(f"fit of {len(est.history_)} epochs (batch {est.resolved_batch_size(n)}): {res['fit_seconds']:.0f} s")
    report(args, res, n)


def report(args, res, n):
    """Print the step times and ratios (where both models ran) and write them with the setting to `--json`."""
    for kind in ("minibatch", "full"):
        size = args.batch if kind == "minibatch" else n
        if f"amogp_{kind}_ms" in res and f"mogp_{kind}_ms" in res:
            res[f"ratio_{kind}"] = res[f"amogp_{kind}_ms"] / res[f"mogp_{kind}_ms"]
            print(f"{kind} (B={size}): AMO-GP {res[f'amogp_{kind}_ms']:.1f} ms, MO-GP {res[f'mogp_{kind}_ms']:.1f} ms, "
                  f"ratio {res[f'ratio_{kind}']:.2f}")
        else:
            for name in ("amogp", "mogp"):
                if f"{name}_{kind}_ms" in res:
                    print(f"{kind} (B={size}): {name} {res[f'{name}_{kind}_ms']:.1f} ms")
    if "amogp_full_ms" in res:
        res["extrapolated_1500_epoch_full_batch_fit_s"] = 1.5 * res["amogp_full_ms"]
        print(f"1 500 full-batch epochs extrapolated: {res['extrapolated_1500_epoch_full_batch_fit_s']:.0f} s")
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    out = {"setting": {"rows": n, "num_inducing": args.num_inducing, "batch": args.batch, "rounds": args.rounds,
                       "steps": args.steps, "full_steps": args.full_steps, "warmup": args.warmup, "dtype": args.dtype,
                       "start": args.start, "days": args.days, "lengthscale": args.lengthscale,
                       "cp_inducing": args.cp_inducing, "cp_grid": args.cp_grid, "start_epochs": args.start_epochs,
                       "separate": args.separate, "only": args.only, "keep_heap": args.keep_heap,
                       "steady": args.steady},
           "results": res, "machine": {"cpu": platform.processor() or platform.machine(), "threads": 1,
                                       "loadavg_at_end": load, "torch": torch.__version__}}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1))
    print(f"load average at the end: {load} (machine shared with other jobs)")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
