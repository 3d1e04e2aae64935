"""One training step of the CNF-DGP Table III deep GP on 256 Fashion-MNIST images: median time and profile.

The model is the one `flowgp bench images --models dgp4 --skip conv --preset paper` fits
(`flowgp.bench.images.make_classifier`; `--model cnf-dgp4` for the flow posterior's): 4 layers, 100 inducing
inputs per layer, robust max over 10 classes, the convolutional skip-layer connection (three 784-wide hidden
layers whose GPs share one kernel), DSVI. A step is what the training loop does per batch: the minibatch bound
(N = 60 000), its backward and the fused Adam update. Run from the repository root:

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/perf/image_dgp_step.py --dtypes float64,float32 \
        --steps 20 --profile 2 --reference-rev <git revision>

Images: Fashion-MNIST's training images where `flowgp.data.images.load_images` finds them (e.g. after
`apt-get install dataset-fashion-mnist`), else random 28 x 28 images (`--data synthetic`; the step's cost does
not depend on the pixels). The model is built from a pool of `--pool` images (k-means of the inducing inputs as
the bench does) and every step draws its batch from that pool with a seeded generator.

`--reference-rev REV` (or `--reference-src DIR`, a `src` folder) times another version of flowgp in the same run:
each version runs in its own worker process built identically (same data, seed and model), and the parent lets
them step in turn, `--chunk` steps at a time, so that the load of a shared machine falls on both alike. It also
prints both versions' bound, gradient norm and largest gradient difference at the same (perturbed initial)
parameters, batch and draws.

Prints one JSON object per (version, dtype): median / quartiles of the step's wall time over `--steps` timed steps
(after `--warmup` untimed ones) and the median of its CPU time (less sensitive to other processes on a shared machine,
which stretch the wall time), and with `--profile` torch.profiler's top operators (self CPU time) over a few steps.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]


# ----- the worker: one flowgp version, one dtype -----------------------------------------------------------------
def _images(source: str, pool: int, seed: int):
    import numpy as np

    if source.endswith(".npz"):  # the parent's pool, so that every version trains on the same images
        with np.load(source) as saved:
            return saved["x"], saved["y"], str(saved["data"])
    if source in ("auto", "fashion-mnist"):
        from flowgp.data.images import load_images

        try:
            data = load_images("fashion-mnist", verify=False)
            rows = np.random.default_rng(seed).permutation(len(data.y_train))[:pool]
            return data.x_train[rows], data.y_train[rows], "fashion-mnist"
        except (FileNotFoundError, ValueError):
            if source == "fashion-mnist":
                raise
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (pool, 784)).astype(np.float64), rng.integers(0, 10, pool), "synthetic"


class Worker:
    """The Table III model of one flowgp version and dtype, its Adam and a seeded batch stream."""

    def __init__(self, dtype: str, source: str, pool: int, batch: int, seed: int, model: str = "dgp4",
                 skip: str = "conv"):
        import numpy as np
        import torch

        from flowgp.bench.images import make_classifier
        from flowgp.build import build
        from flowgp.training.loop import default_optimizer

        x, y, self.data = _images(source, pool, seed)
        est = make_classifier(model, skip, (1, 28, 28), "paper", 60000, seed)
        est.set_params(dtype=dtype)
        est.classes_ = np.arange(10)
        xt = est.fit_input_scaling(x)
        self.x, self.y = xt, torch.as_tensor(y, dtype=torch.long)
        self.model = build(est.config(), xt, self.y, dtype=est.torch_dtype(), device="cpu",
                           generator=torch.Generator().manual_seed(seed))
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = default_optimizer(self.params, 0.01)
        self.batch, self.num_data = batch, 60000
        self.rows = torch.Generator().manual_seed(seed + 1)
        self.draws = torch.Generator().manual_seed(seed + 2)
        self.torch = torch

    def step(self) -> float:
        idx = self.torch.randint(0, self.x.shape[0], (self.batch,), generator=self.rows)
        self.optimizer.zero_grad(set_to_none=True)
        loss = -self.model.elbo(self.x[idx], self.y[idx], num_data=self.num_data, generator=self.draws)
        value = loss.item()
        loss.backward()
        self.optimizer.step()
        return value

    def timed(self, count: int) -> tuple[list[float], list[float]]:
        """Wall and CPU seconds (this process, all threads) of `count` steps."""
        wall, cpu = [], []
        for _ in range(count):
            start, start_cpu = time.perf_counter(), time.process_time()
            self.step()
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        return wall, cpu

    def check(self, path: str | None = None) -> dict:
        """The bound and its gradient's norm on a fixed batch and fixed draws, at the initial parameters moved by a
        seeded perturbation (away from the prior, where the bound depends on the data and every parameter); the
        gradients go to `path` (torch.save) when given."""
        torch = self.torch
        idx = torch.arange(self.batch)
        gen = torch.Generator().manual_seed(99)
        with torch.no_grad():
            for p in self.params:
                p.add_((0.01 * torch.randn(p.shape, generator=gen, dtype=torch.float64)).to(p.dtype))
                p.grad = None
        bound = self.model.elbo(self.x[idx], self.y[idx], num_data=self.num_data,
                                generator=torch.Generator().manual_seed(123))
        bound.backward()
        bound = bound.detach()
        norm = float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in self.params if p.grad is not None)))
        if path:
            named = {n: p.grad.double() for n, p in self.model.named_parameters() if p.grad is not None}
            torch.save(named, path)
        for p in self.params:
            p.grad = None
        return {"bound": float(bound), "grad_norm": norm}

    def profile(self, count: int, rows: int) -> str:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(count):
                self.step()
        return prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=rows)


def worker_main(args) -> None:
    """Serve commands on stdin, one JSON line each: {"steps": k}, {"check": 1}, {"profile": k}, {"quit": 1}."""
    w = Worker(args.dtype, args.data, args.pool, args.batch, args.seed, args.model, args.skip)
    print(json.dumps({"ready": True, "data": w.data, "parameters": sum(p.numel() for p in w.params)}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if "steps" in cmd:
            wall, cpu = w.timed(int(cmd["steps"]))
            out = {"times": wall, "cpu": cpu}
        elif "check" in cmd:
            out = w.check(cmd.get("path"))
        elif "profile" in cmd:
            out = {"table": w.profile(int(cmd["profile"]), args.profile_rows)}
        else:
            break
        print(json.dumps(out), flush=True)


# ----- the parent: workers per version, interleaved ---------------------------------------------------------------
def _reference_src(rev: str, into: Path) -> Path:
    """`git archive REV src` of this repository, unpacked into `into`; returns its src folder."""
    archive = into / "ref.tar"
    subprocess.run(["git", "-C", str(REPO), "archive", "-o", str(archive), rev, "src"], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


class Client:
    def __init__(self, name: str, src: Path, dtype: str, args):
        env = dict(os.environ, PYTHONPATH=str(src))
        cmd = [sys.executable, str(HERE), "--worker", "--dtype", dtype, "--data", args.data, "--pool", str(args.pool),
               "--batch", str(args.batch), "--seed", str(args.seed), "--profile-rows", str(args.profile_rows),
               "--model", args.model, "--skip", args.skip]
        self.name, self.dtype = name, dtype
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                     cwd=str(REPO))
        self.info = self._read()
        self.times: list[float] = []
        self.cpu: list[float] = []

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.name} ({self.dtype}) exited with {self.proc.wait()}")
        return json.loads(line)

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()


def _summary(times: list[float]) -> dict:
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return {"median_s": round(statistics.median(times), 4), "q1_s": round(q[0], 4), "q3_s": round(q[2], 4),
            "steps": len(times)}


def parent_main(args) -> None:
    versions = [("current", REPO / "src")]
    with tempfile.TemporaryDirectory() as tmp:
        if args.reference_rev:
            versions.append((f"reference {args.reference_rev}", _reference_src(args.reference_rev, Path(tmp))))
        elif args.reference_src:
            versions.append((f"reference {args.reference_src}", Path(args.reference_src).resolve()))
        import numpy as np

        x, y, data = _images(args.data, args.pool, args.seed)
        args.data, args.tmp = str(Path(tmp) / "pool.npz"), tmp
        np.savez(args.data, x=x, y=y, data=data)
        for dtype in args.dtypes.split(","):
            clients = [Client(name, src, dtype, args) for name, src in versions]
            try:
                _run_dtype(clients, args)
            finally:
                for c in clients:
                    c.close()


def _gradient_difference(paths) -> dict:
    """The largest difference of the two versions' gradients, relative to the larger one's largest entry, over
    the parameters: the worst one and its name."""
    import torch

    first, second = (torch.load(p, weights_only=True) for p in paths)
    worst = max(((float((first[n] - second[n]).abs().max() / second[n].abs().max().clamp_min(1e-300)), n)
                 for n in second), default=(0.0, None))
    return {"gradient_max_relative_difference": worst[0], "worst_parameter": worst[1]}


def _run_dtype(clients, args) -> None:
    paths = [str(Path(args.tmp) / f"grad{i}.pt") for i in range(len(clients))]
    checks = {c.name: c.ask(check=1, path=path) for c, path in zip(clients, paths)}
    for c in clients:
        c.ask(steps=args.warmup)
    done = 0
    while done < args.steps:
        k = min(args.chunk, args.steps - done)
        for c in clients:  # in turn: both see the same load
            out = c.ask(steps=k)
            c.times += out["times"]
            c.cpu += out["cpu"]
        done += k
    for c in clients:
        row = {"version": c.name, "model": args.model, "skip": args.skip, "dtype": c.dtype, "data": c.info["data"],
               "batch": args.batch,
               "parameters": c.info["parameters"], **checks[c.name], **_summary(c.times),
               "cpu_median_s": round(statistics.median(c.cpu), 4)}
        print(json.dumps(row), flush=True)
    if len(clients) == 2:
        a, b = (checks[c.name] for c in clients)
        print(json.dumps({"dtype": clients[0].dtype, "bound_difference": a["bound"] - b["bound"],
                          "relative": abs(a["bound"] - b["bound"]) / abs(b["bound"]),
                          "grad_norm_relative": abs(a["grad_norm"] - b["grad_norm"]) / b["grad_norm"],
                          "speedup_median": statistics.median(clients[1].times) / statistics.median(clients[0].times),
                          "speedup_cpu_median": statistics.median(clients[1].cpu) / statistics.median(clients[0].cpu),
                          **_gradient_difference(paths)}),
              flush=True)
    if args.profile:
        for c in clients:
            print(f"\n=== profile: {c.name}, {c.dtype}, {args.profile} steps (self CPU time) ===")
            print(c.ask(profile=args.profile)["table"], flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", default="float64,float32")
    p.add_argument("--steps", type=int, default=20, help="timed steps per version and dtype")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--chunk", type=int, default=2, help="steps a version takes before the other one's turn")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--pool", type=int, default=2048, help="images the model is built from and batches drawn from")
    p.add_argument("--data", default="auto", help="auto, fashion-mnist or synthetic")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="dgp4", help="a `flowgp bench images` model: dgp4 (DSVI), cnf-dgp4, sgp")
    p.add_argument("--skip", default="conv", help="the hidden layers' skip: conv (CSC), dense or linear")
    p.add_argument("--profile", type=int, default=0, help="profile this many steps per version and dtype (0: none)")
    p.add_argument("--profile-rows", type=int, default=25)
    p.add_argument("--reference-rev", default=None, help="a git revision of this repository to time alongside")
    p.add_argument("--reference-src", default=None, help="or the src folder of another flowgp checkout")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dtype", default="float64", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker_main(args)
    else:
        parent_main(args)


if __name__ == "__main__":
    main()
