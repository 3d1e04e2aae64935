"""How many torch threads a fit should use: the cut-over in M and batch size, and fits on a busy machine.

Run from the repository root (without OMP_NUM_THREADS in the environment, which would cap torch):

    python -m benchmarks.perf.threads cutover     # SVGP step, float64: 1 vs 2 threads over M x batch
    python -m benchmarks.perf.threads busy        # two busy processes: threads="auto" vs 1; n_jobs=2 vs 1

`cutover` times one SVGP training step (minibatch bound, backward, Adam; N = 10 000, D = 8, float64) with one
and with two torch threads for every M in --inducing and batch size in --batch, the two settings in alternating
blocks (1, 2, 1, 2, ...) so that drifts of a shared machine's load hit both alike; each row records the step's
size `step_work(batch, M)` (batch x M² + M³ multiply-adds), the median step times, their ratio (2 threads / 1)
and the machine's load average and run queue (`busy_cores`) while it was timed. The smallest work above which
two threads were faster in every row is what `flowgp.training.threads.SMALL_STEP_WORK` should be; the script
prints it. A ratio measured on a loaded machine says what two threads buy there, which is less than on an idle one.

`busy` starts two CPU-bound processes (Python busy loops) and, while they run, times a default TGPRegressor fit
(robust, M = 100, full batch; --epochs) on 2 000 rows with threads="auto" and with threads=1 (what
OMP_NUM_THREADS=1 gives), interleaved, and `cross_val_score(estimator, cv=2)` with n_jobs=2 and n_jobs=1. The
claims: auto at most 1.5x threads=1, n_jobs=2 not slower than n_jobs=1. --torch-default adds threads=2 (torch's
own default on two cores) to show what "auto" avoids.

Rows go to docs/results/perf/threads/{cutover,busy}.csv and .json (--out).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.lib.steps import flowgp_step, synthetic_data
from flowgp import SVGP, GaussianLikelihood, TGPRegressor, make_kernel
from flowgp.training.threads import SMALL_STEP_WORK, available_cores, busy_cores, step_work, thread_limit

OUT = Path("docs/results/perf/threads")


def machine_load() -> dict:
    """The 1-minute load average and the other processes' runnable tasks now."""
    return {"loadavg_1min": round(os.getloadavg()[0], 2), "busy_cores": busy_cores()}


def write_rows(rows: list[dict], name: str, out: Path, meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{name}.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / f"{name}.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")


def interleaved_step_times(step, settings=(1, 2), budget_s=8.0, block_s=0.15, min_rounds=4) -> dict:
    """Median seconds per step of `step` under each thread count in `settings`, in alternating blocks of about
    `block_s` seconds (one untimed step first in each block), for about `budget_s` seconds in all."""
    with thread_limit(1):
        step()
        start = time.perf_counter()
        step()
        guess = time.perf_counter() - start
    per_block = max(1, int(block_s / max(guess, 1e-6)))
    times = {s: [] for s in settings}
    start_all, rounds = time.perf_counter(), 0
    while rounds < min_rounds or time.perf_counter() - start_all < budget_s:
        for s in settings:
            with thread_limit(s):
                step()
                for _ in range(per_block):
                    t0 = time.perf_counter()
                    step()
                    times[s].append(time.perf_counter() - t0)
        rounds += 1
        if rounds >= 40:
            break
    return {s: statistics.median(t) for s, t in times.items()}


def cutover(args) -> list[dict]:
    x, y, g = synthetic_data(10_000, 8)
    rows = []
    grid = sorted(((m, b) for m in args.inducing for b in args.batch), key=lambda mb: step_work(mb[1], mb[0]))
    started = time.perf_counter()
    for m, batch in grid:  # smallest steps first: on a loaded machine the largest may not fit in --max-seconds
        if time.perf_counter() - started > args.max_seconds:
            print(f"M={m:4d} batch={batch:5d}: skipped (--max-seconds {args.max_seconds:g} spent)", flush=True)
            continue
        z = x[torch.randperm(x.shape[0], generator=g)[:m]].clone()
        model = SVGP(make_kernel("rbf", 8), z, GaussianLikelihood(0.05)).to(torch.float64)
        step = flowgp_step(model, x, y, batch)
        before = machine_load()
        medians = interleaved_step_times(step, budget_s=args.budget, min_rounds=3)
        after = machine_load()
        row = {"M": m, "batch": batch, "work": step_work(batch, m), "t1_ms": round(1e3 * medians[1], 3),
               "t2_ms": round(1e3 * medians[2], 3), "ratio_2_over_1": round(medians[2] / medians[1], 3),
               "loadavg_1min": max(before["loadavg_1min"], after["loadavg_1min"]),
               "busy_cores": max(before["busy_cores"], after["busy_cores"])}
        rows.append(row)
        print(f"M={m:4d} batch={batch:5d} work={row['work']:.2e}  1 thread {row['t1_ms']:9.3f} ms  "
              f"2 threads {row['t2_ms']:9.3f} ms  ratio {row['ratio_2_over_1']:.3f}  load "
              f"{row['loadavg_1min']:.2f} busy {row['busy_cores']}", flush=True)
    faster = [r["work"] for r in rows if r["ratio_2_over_1"] < args.gain]
    slower = [r["work"] for r in rows if r["ratio_2_over_1"] >= args.gain]
    threshold = min((w for w in faster if all(s < w for s in slower)), default=None)
    print(f"two threads faster by more than {100 * (1 - args.gain):.0f}% in every row from work "
          f"{threshold if threshold is None else f'{threshold:.2e}'} (SMALL_STEP_WORK now {SMALL_STEP_WORK:.2e})")
    return rows


def _busy_processes(count: int) -> list:
    """`count` Python processes spinning on a core each (ended by the caller)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def _data(n: int):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, 8))
    return X, np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.1 * rng.standard_normal(n)


def busy(args, meta: dict) -> list[dict]:
    from sklearn.model_selection import cross_val_score

    X, y = _data(args.rows)
    settings = ["auto", 1] + ([available_cores()] if args.torch_default else [])
    rows = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a `timeout` still ends the busy processes
    procs = _busy_processes(args.busy)
    try:
        time.sleep(1.0)  # let them reach the run queue
        for rep in range(args.repeats if "fit" in args.parts else 0):
            for threads in settings:
                load = machine_load()
                est = TGPRegressor(epochs=args.epochs, seed=0, verbose=False, threads=threads)
                start = time.perf_counter()
                est.fit(X, y)
                rows.append({"what": "fit", "setting": f"threads={threads}", "repeat": rep,
                             "seconds": round(time.perf_counter() - start, 3), **load})
                print(rows[-1], flush=True)
                write_rows(rows, f"busy-{args.tag}" if args.tag else "busy", args.out, meta)
        if "cv" in args.parts and not args.cold:  # joblib's workers started (flowgp imported there) before timing
            cross_val_score(TGPRegressor(epochs=1, seed=0, verbose=False), X, y, cv=2, n_jobs=2)
        for rep in range(args.repeats if "cv" in args.parts else 0):
            for jobs in (2, 1):
                load = machine_load()
                est = TGPRegressor(epochs=args.epochs, seed=0, verbose=False)
                start = time.perf_counter()
                cross_val_score(est, X, y, cv=2, n_jobs=jobs)
                rows.append({"what": "cross_val_score", "setting": f"n_jobs={jobs}", "repeat": rep,
                             "seconds": round(time.perf_counter() - start, 3), **load})
                print(rows[-1], flush=True)
                write_rows(rows, f"busy-{args.tag}" if args.tag else "busy", args.out, meta)
    finally:
        for p in procs:
            p.kill()
            p.wait()

    def median(setting):
        return statistics.median(r["seconds"] for r in rows if r["setting"] == setting)

    if "fit" in args.parts:
        print(f"fit: threads='auto' {median('threads=auto'):.2f} s, threads=1 {median('threads=1'):.2f} s: ratio "
              f"{median('threads=auto') / median('threads=1'):.2f} (claim <= 1.5)")
    if "fit" in args.parts and args.torch_default:
        n = available_cores()
        print(f"fit: threads={n} (torch's default) {median(f'threads={n}'):.2f} s: "
              f"{median(f'threads={n}') / median('threads=1'):.2f}x threads=1")
    if "cv" in args.parts:
        print(f"cross_val_score: n_jobs=2 {median('n_jobs=2'):.2f} s, n_jobs=1 {median('n_jobs=1'):.2f} s: ratio "
              f"{median('n_jobs=2') / median('n_jobs=1'):.2f} (claim <= 1)")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_cut = sub.add_parser("cutover", help="1 vs 2 threads per SVGP step over M x batch")
    p_cut.add_argument("--inducing", type=int, nargs="+", default=[20, 50, 100, 200, 500])
    p_cut.add_argument("--batch", type=int, nargs="+", default=[128, 512, 2048])
    p_cut.add_argument("--budget", type=float, default=4.0, help="seconds of timing per row (at least 3 rounds)")
    p_cut.add_argument("--max-seconds", type=float, default=240.0, help="rows left are skipped after this")
    p_cut.add_argument("--gain", type=float, default=0.9, help="ratio below which two threads count as faster")
    p_busy = sub.add_parser("busy", help="fits while two other processes keep the cores busy")
    p_busy.add_argument("--rows", type=int, default=2000)
    p_busy.add_argument("--epochs", type=int, default=100)
    p_busy.add_argument("--busy", type=int, default=2, help="busy processes started")
    p_busy.add_argument("--repeats", type=int, default=2)
    p_busy.add_argument("--torch-default", action="store_true", help="also time threads = the cores (slow)")
    p_busy.add_argument("--parts", nargs="+", choices=["fit", "cv"], default=["fit", "cv"])
    p_busy.add_argument("--tag", default="", help="suffix of the output files (busy-TAG.csv)")
    p_busy.add_argument("--cold", action="store_true",
                        help="time cross_val_score's n_jobs=2 with joblib's worker start-up (the first repeat)")
    for p in (p_cut, p_busy):
        p.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if os.environ.get("OMP_NUM_THREADS"):
        print(f"note: OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} is set; 'auto' is capped by it", flush=True)
    meta = {"command": "python -m benchmarks.perf.threads " + " ".join(argv if argv is not None else sys.argv[1:]),
            "cores": available_cores(), "torch": torch.__version__, "dtype": "float64",
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    if args.command == "cutover":
        write_rows(cutover(args), "cutover", args.out, meta)
    else:
        busy(args, meta)  # it writes its rows as they come
    return 0


if __name__ == "__main__":
    sys.exit(main())
