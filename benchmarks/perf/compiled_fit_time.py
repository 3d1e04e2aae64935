"""End-to-end time of whole fits: eager, compiled (`compile=True`) and `compile="auto"`, each in a fresh process.

Run from the repository root:

    python -m benchmarks.perf.compiled_fit_time                          # SVGP, M in {20, 100, 500}, 1 000 steps
    python -m benchmarks.perf.compiled_fit_time --models svgp,tgp --rounds 3 --json fits.json
    python -m benchmarks.perf.compiled_fit_time --cold                   # every compiled fit with an empty cache

The aim: compiling must not make a 1 000-step fit slower end to end than the eager one. Step
times (`benchmarks/perf/step_time.py`) leave out what a user waits for once per fit: tracing, compiling and loading
the kernels. So every fit here runs `flowgp.training.loop.train` (float32, N = 10 240, D = 8, B = 512 by default)
in a process of its own, and the time reported is the wall time of the `train` call: compilation included,
imports and data excluded (the same for every variant). The variants of one configuration run in alternating
order within each round, so a drift in the machine's speed reaches all of them alike; the table gives the
median over rounds and each variant's ratio to the eager fit's median.

The inductor cache persists between processes (torch's default location) unless `--cold`, which gives every
compiled fit a fresh, empty cache directory: the cost of a configuration compiled for the first time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

VARIANTS = {"eager": False, "compiled": True, "auto": "auto"}


def child(model: str, m: int, variant: str, steps: int, num_data: int, dim: int, batch: int, dtype: str) -> dict:
    """One fit in this process; its wall time and final loss (called in a fresh interpreter)."""
    import torch

    from flowgp import SVGP, TGP, GaussianLikelihood, make_flow, make_kernel
    from flowgp.training.loop import train

    g = torch.Generator().manual_seed(0)
    x = torch.randn(num_data, dim, generator=g)
    y = torch.sin(x.sum(1, keepdim=True)) + 0.1 * torch.randn(num_data, 1, generator=g)
    z = x[:m].clone()
    if model == "svgp":
        gp = SVGP(make_kernel("rbf", dim), z, GaussianLikelihood(0.05))
    else:
        gp = TGP(make_kernel("rbf", dim), z, make_flow("sal+softplus"), GaussianLikelihood(0.05),
                 quadrature_points=20)
    gp = gp.to(getattr(torch, dtype))
    x, y = x.to(getattr(torch, dtype)), y.to(getattr(torch, dtype))
    start = time.perf_counter()
    history = train(gp, x, y, batch_size=batch, steps=steps, verbose=False, compile=VARIANTS[variant])
    seconds = time.perf_counter() - start
    return {"model": model, "inducing": m, "variant": variant, "steps": steps, "fit_s": seconds,
            "final_loss": history[-1]}


def round_order(variants: list, r: int) -> list:
    """The variants in the order round `r` runs them: rotated by one each round, so none always goes first."""
    k = r % len(variants)
    return variants[k:] + variants[:k]


def run_one(args, model, m, variant) -> dict:
    env = dict(os.environ)
    cache = None
    if args.cold and variant != "eager":
        cache = tempfile.TemporaryDirectory(prefix="inductor-cold-")
        env["TORCHINDUCTOR_CACHE_DIR"] = cache.name
    command = [sys.executable, __file__, "--child", model, str(m), variant, "--steps", str(args.steps),
               "--num-data", str(args.num_data), "--dim", str(args.dim), "--batch", str(args.batch),
               "--dtype", args.dtype]
    try:
        out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    except subprocess.CalledProcessError as err:
        raise RuntimeError(f"the {variant} fit of {model} M={m} failed:\n{err.stderr[-2000:]}") from None
    finally:
        if cache is not None:
            cache.cleanup()
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="svgp", help="comma-separated: svgp, tgp")
    p.add_argument("--inducing", default="20,100,500")
    p.add_argument("--variants", default="eager,compiled,auto")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--num-data", type=int, default=10240)
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--cold", action="store_true", help="every compiled fit starts from an empty inductor cache")
    p.add_argument("--json", default=None, help="write every fit's row here")
    p.add_argument("--child", nargs=3, metavar=("MODEL", "M", "VARIANT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        model, m, variant = args.child
        print(json.dumps(child(model, int(m), variant, args.steps, args.num_data, args.dim, args.batch,
                               args.dtype)))
        return 0
    models = [s for s in args.models.split(",") if s]
    bad = [s for s in models if s not in ("svgp", "tgp")]
    if bad:
        p.error(f"--models takes svgp and tgp, got {bad}")
    variants = [s for s in args.variants.split(",") if s]
    if any(v not in VARIANTS for v in variants) or "eager" not in variants:
        p.error(f"--variants takes {', '.join(VARIANTS)} and must include eager")
    rows = []
    for model in models:
        for m in (int(s) for s in args.inducing.split(",")):
            for r in range(args.rounds):
                for variant in round_order(variants, r):
                    row = run_one(args, model, m, variant)
                    row["round"] = r
                    rows.append(row)
                    print(f"  {model} M={m} round {r} {variant:9s} {row['fit_s']:7.2f} s  loss {row['final_loss']:.4f}",
                          flush=True)
    print(f"\n{args.steps}-step fits, {args.dtype}, N={args.num_data}, D={args.dim}, B={args.batch}, "
          f"{'cold' if args.cold else 'warm'} inductor cache; median over {args.rounds} rounds (ratio to eager)")
    print(f"| model | M | " + " | ".join(variants) + " |")
    print("|---|---|" + "---|" * len(variants))
    for model in models:
        for m in (int(s) for s in args.inducing.split(",")):
            med = {v: statistics.median(r["fit_s"] for r in rows if r["model"] == model and r["inducing"] == m
                                        and r["variant"] == v) for v in variants}
            cells = [f"{med[v]:.2f} s" + ("" if v == "eager" else f" ({med[v] / med['eager']:.2f})") for v in variants]
            print(f"| {model} | {m} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
