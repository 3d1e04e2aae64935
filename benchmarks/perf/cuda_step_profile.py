"""Where one flowgp SVGP / TGP training step spends its time on a GPU: kernel launches, host-device syncs, copies.

    python -m benchmarks.perf.cuda_step_profile --device cuda --inducing 100 --batch 1024

Builds the step of benchmarks/perf/step_time.py (the same closure), warms it up, then records `--steps` steps with
torch.profiler and prints, per step: wall time, CPU time of the process, and the counts of CUDA runtime calls that
matter for a launch-bound step (kernel launches, stream/device synchronisations, memory copies), followed by the
operators with the most self CPU time. Runs on the CPU too (without the CUDA counts), as a dry run.

`--memory` also records one step's allocations (`profile_memory=True`) and prints how many fresh buffers of at
least 100 kB it makes and their total size: on CPU each is memory the kernel may have to map and zero again
(glibc returns large freed blocks to the system), a cost that does not show up as an operator. For example

    python -m benchmarks.perf.cuda_step_profile --device cpu --dtype float32 --inducing 500 --batch 512 \
        --num-data 10240 --models svgp --steps 40 --memory

`--compile` profiles the compiled step instead (`flowgp.training.compiled.CompiledObjective`, compiled before timing), e.g.
the TGP's compiled extra at M = 20 (docs/results/perf/step-time, 2026-11-29):

    python -m benchmarks.perf.cuda_step_profile --device cpu --dtype float32 --inducing 20 --batch 512 \
        --num-data 10240 --steps 100 --compile
"""
from __future__ import annotations

import argparse
import time

import torch

from benchmarks.lib.steps import flowgp_step, sync
from flowgp import TGP, SVGP, GaussianLikelihood, make_flow, make_kernel

RUNTIME_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC",
                 "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpyAsync",
                 "cudaMemsetAsync", "cudaMemcpy")


def large_allocations(step, device, threshold=100_000) -> str:
    """Fresh buffers of at least `threshold` bytes that one step allocates, and their total size."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
        sync(device)
    # each operator's own net allocation (what it allocates minus what it frees before returning): the buffers it
    # hands on; frees outside operators are separate "[memory]" events with negative sizes
    sizes = [e.self_cpu_memory_usage if device.type == "cpu" else e.self_device_memory_usage
             for e in prof.events() if e.name != "[memory]"]
    big = [b for b in sizes if b >= threshold]
    return (f"one step allocates {len(big)} buffers of >= {threshold // 1000} kB, {sum(big) / 1e6:.1f} MB in all "
            f"({sum(b for b in sizes if b > 0) / 1e6:.1f} MB in {sum(b > 0 for b in sizes)} operators that allocate)")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--inducing", type=int, default=100)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--num-data", type=int, default=100_000)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--models", default="svgp,tgp")
    p.add_argument("--memory", action="store_true", help="also count one step's large allocations")
    p.add_argument("--compile", action="store_true", help="profile the compiled step (flowgp.training.compiled)")
    a = p.parse_args()
    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(a.num_data, 8, generator=g, dtype=torch.float64)
    y = torch.sin(x[:, :1]) + 0.1 * torch.randn(a.num_data, 1, generator=g, dtype=torch.float64)
    x, y = x.to(device, dtype), y.to(device, dtype)
    z = x[torch.randperm(a.num_data, generator=g)[: a.inducing].to(device)].clone()
    for name in a.models.split(","):
        if name == "svgp":
            model = SVGP(make_kernel("rbf", 8), z, GaussianLikelihood(0.05))
        else:
            model = TGP(make_kernel("rbf", 8), z, make_flow("sal+softplus"), GaussianLikelihood(0.05))
        step = flowgp_step(model.to(device, dtype), x, y, a.batch, compiled=a.compile)
        for _ in range(10):
            step()
        sync(device)
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(a.steps):
            step()
        sync(device)
        wall, cpu = (time.perf_counter() - wall) / a.steps, (time.process_time() - cpu) / a.steps
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(a.steps):
                step()
            sync(device)
        events = prof.key_averages()
        counts = {e.key: e.count / a.steps for e in events if e.key in RUNTIME_CALLS}
        gpu_us = sum(getattr(e, "self_device_time_total", 0.0) for e in events) / a.steps
        print(f"== {name}{' compiled' if a.compile else ''} {a.dtype} M={a.inducing} B={a.batch} on {device}: "
              f"{1e3 * wall:.2f} ms wall per step, "
              f"{1e3 * cpu:.2f} ms CPU; GPU busy {gpu_us / 1e3:.2f} ms per step (profiled)")
        print("   runtime calls per step: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(counts.items())))
        print(events.table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=48))
        if a.memory:
            print("   " + large_allocations(step, device))
        if device.type == "cuda":
            # where the step waits for the GPU: one step under CUDA's sync debug mode, each synchronising
            # call reported once by the Python line that made it
            import warnings

            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    step()
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            lines = {}
            for w in caught:
                if "synchroniz" in str(w.message):
                    key = f"{w.filename}:{w.lineno}"
                    lines[key] = lines.get(key, 0) + 1
            print(f"   synchronising calls in one step: {sum(lines.values())}")
            for key, n in sorted(lines.items()):
                print(f"     {n} x {key}")


if __name__ == "__main__":
    main()
