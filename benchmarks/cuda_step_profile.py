"""Where one flowgp SVGP / TGP training step spends its time on a GPU: kernel launches, host-device syncs, copies.

    python benchmarks/cuda_step_profile.py --device cuda --inducing 100 --batch 1024

Builds the step of benchmarks/step_time.py (the same closure), warms it up, then records `--steps` steps with
torch.profiler and prints, per step: wall time, CPU time of the process, and the counts of CUDA runtime calls that
matter for a launch-bound step (kernel launches, stream/device synchronisations, memory copies), followed by the
operators with the most self CPU time. Runs on the CPU too (without the CUDA counts), as a dry run.
"""
from __future__ import annotations

import argparse
import time

import torch

from flowgp import TGP, SVGP, GaussianLikelihood, make_flow, make_kernel
from step_time import _sync, flowgp_step

RUNTIME_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC",
                 "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpyAsync",
                 "cudaMemsetAsync", "cudaMemcpy")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--inducing", type=int, default=100)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--num-data", type=int, default=100_000)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--models", default="svgp,tgp")
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
        step = flowgp_step(model.to(device, dtype), x, y, a.batch)
        for _ in range(10):
            step()
        _sync(device)
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(a.steps):
            step()
        _sync(device)
        wall, cpu = (time.perf_counter() - wall) / a.steps, (time.process_time() - cpu) / a.steps
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(a.steps):
                step()
            _sync(device)
        events = prof.key_averages()
        counts = {e.key: e.count / a.steps for e in events if e.key in RUNTIME_CALLS}
        gpu_us = sum(getattr(e, "self_device_time_total", 0.0) for e in events) / a.steps
        print(f"== {name} {a.dtype} M={a.inducing} B={a.batch} on {device}: {1e3 * wall:.2f} ms wall per step, "
              f"{1e3 * cpu:.2f} ms CPU; GPU busy {gpu_us / 1e3:.2f} ms per step (profiled)")
        print("   runtime calls per step: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(counts.items())))
        print(events.table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=48))
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
