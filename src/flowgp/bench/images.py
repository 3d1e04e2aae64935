"""`flowgp bench images`: image classification of CNF-DGP §IV-B (Table III), resumable like the other suites.

Models: `sgp` (one sparse GP layer), `dgpL` (DSVI deep GP with L layers) and `cnf-dgpL` (the Gaussian-base
convolutional flow posterior, DSVI warm-up for half the steps), all with the robust-max likelihood and M
inducing inputs per layer; `--skip` chooses the hidden layers' skip-layer connection: `conv` (the paper's CSC,
default), `dense` (the fully connected trainable skip it replaces) or `linear` (DSVI's fixed projection at
width min(D, 16)). Rows report test accuracy, NLL and ECE (15 bins), and seconds.

Presets (the paper states only L = 4, M = 100 and the robust max): `paper` 20 000 steps of 256 images, 100
prediction samples; `quick` 2 000 steps; `tiny` 20 steps on at most 500 training images (a smoke test).
`--max-train N` trains on a seeded subset of N images and `--steps N` takes N training steps instead of the
preset's (reduced CPU budgets; rows record both); `--dtype float32` trains in single precision (half the memory,
and on CPUs less than half the step time: `benchmarks/perf/image_dgp_step.py`); `--device cuda` runs on a GPU
(an error before any work where torch sees none) and `--nproc N` trains every fit data-parallel in N processes
(rank 0 writes the rows); rows record `device` and `world_size` (key fields; rows written before them count as
cpu and 1). Data:
`flowgp.data.images` (MNIST, Fashion-MNIST, CIFAR-10 from --data-dir / $FLOWGP_DATA; `digits` embedded).
"""
from __future__ import annotations

import re

import numpy as np

from .runner import (ENGINE_KEY_DEFAULTS, add_checkpoint_argument, add_engine_arguments, engine_world_size,
                     parse_int_list, parse_name_list, place_estimator, run_suite)

NAME = "images"
HELP = "image classification of CNF-DGP §IV-B (Table III): SGP, DGP and CNF-DGP with the conv skip"

KEY_FIELDS = ("dataset", "model", "skip", "seed", "preset", "max_train", "steps", "dtype", "device", "world_size")
#: the values of key fields added later, in rows written before them (before `device` and `world_size`: the CPU,
#: one process)
KEY_DEFAULTS = {"steps": None, "dtype": "float64", **ENGINE_KEY_DEFAULTS}

#: preset -> (steps, batch size, inducing points, prediction samples, training-row cap)
PRESETS = {"paper": (20000, 256, 100, 100, None), "quick": (2000, 256, 100, 20, None),
           "tiny": (20, 128, 20, 5, 500)}
_MODEL = re.compile(r"^(sgp|dgp(\d+)|cnf-dgp(\d+))$")


def parse_model(name: str) -> tuple[int, str]:
    """'sgp' -> (1, 'gaussian'), 'dgp4' -> (4, 'gaussian'), 'cnf-dgp4' -> (4, 'cnf'); ValueError otherwise."""
    match = _MODEL.match(name)
    if not match:
        raise ValueError(f"unknown model {name!r}; use sgp, dgpL or cnf-dgpL (L layers, e.g. dgp4, cnf-dgp4)")
    if name == "sgp":
        return 1, "gaussian"
    layers = int(match.group(2) or match.group(3))
    if layers < 2:
        raise ValueError(f"{name}: a deep GP needs at least 2 layers (sgp is the one-layer model)")
    return layers, "cnf" if name.startswith("cnf") else "gaussian"


def make_classifier(model: str, skip: str, image_shape, preset: str, n_train: int, seed: int, *,
                    steps: int | None = None, dtype: str = "float64", device: str = "cpu"):
    """The bench's DeepGPClassifier for `model` under `preset` (`steps`: that many training steps instead of the
    preset's, rounded to whole epochs)."""
    from ..estimators.deep import DeepGPClassifier

    layers, posterior = parse_model(model)
    preset_steps, batch, m, samples, _ = PRESETS[preset]
    steps = preset_steps if steps is None else steps
    batch = min(batch, n_train)
    epochs = max(1, int(round(steps * batch / n_train)))
    return DeepGPClassifier(
        layers=layers, posterior=posterior, likelihood="robustmax", num_inducing=min(m, n_train),
        skip=skip if layers > 1 else "linear", image_shape=tuple(image_shape), batch_size=batch, epochs=epochs,
        lr=0.01, seed=seed, num_samples_predict=samples, kmeans_restarts=1 if preset == "tiny" else 3,
        dtype=dtype, device=device, verbose=False)  # cnf: DSVI's own gradient for its base (the default), so λ* = 0 is the dgpL fit itself


def _work(job: dict) -> dict:
    from ..data.tables import Split
    from ..data.images import load_images
    from .runner import fit_and_score

    data = load_images(job["dataset"], job["data_dir"])
    x, y = data.x_train, data.y_train
    cap = job["max_train"] or PRESETS[job["preset"]][4]
    if cap and cap < len(y):
        rows = np.random.default_rng(job["seed"]).permutation(len(y))[:cap]
        x, y = x[rows], y[rows]
    est = make_classifier(job["model"], job["skip"], data.image_shape, job["preset"], len(y), job["seed"],
                          steps=job["steps"], dtype=job["dtype"])
    place_estimator(est, job["device"])  # (under --nproc with cuda: this process's GPU)
    row = {k: job[k] for k in KEY_FIELDS}
    row.update(n_train=len(y), n_test=len(data.y_test), layers=int(est.layers), posterior=est.posterior,
               num_inducing=int(est.num_inducing), epochs=int(est.epochs), batch_size=int(est.batch_size),
               **fit_and_score(est, Split(x, y, data.x_test, data.y_test), task="classification",
                               checkpoint=job.get("checkpoint")))
    return row


def add_arguments(parser) -> None:
    parser.add_argument("--datasets", default="mnist,fashion-mnist,cifar10",
                        help="comma list of mnist, fashion-mnist, cifar10, digits")
    parser.add_argument("--models", default="sgp,dgp4,cnf-dgp4", help="sgp, dgpL, cnf-dgpL (comma list)")
    parser.add_argument("--skip", default="conv", help="hidden layers' skip: conv (CSC), dense, linear; a comma "
                                                       "list runs each")
    parser.add_argument("--preset", default="quick", choices=sorted(PRESETS))
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--max-train", type=int, default=None, help="train on a seeded subset of this many images")
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps instead of the preset's (rounded to whole epochs; rows record it)")
    parser.add_argument("--dtype", default="float64", choices=("float64", "float32"))
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", default="bench-results/images")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--wait", action="store_true",
                        help="if another run is writing the same output, wait for it (default: stop with a message)")
    add_checkpoint_argument(parser)
    add_engine_arguments(parser)


def build_jobs(args) -> list[dict]:
    from ..data.images import IMAGE_DATASETS, load_images

    datasets = parse_name_list(args.datasets, known=tuple(IMAGE_DATASETS), what="dataset")
    models = parse_name_list(args.models, what="model")
    for model in models:
        parse_model(model)
    skips = parse_name_list(args.skip, known=("conv", "dense", "linear"), what="skip")
    if args.max_train is not None and args.max_train < 2:
        raise ValueError(f"--max-train must be at least 2, got {args.max_train}")
    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps must be a positive number of training steps, got {args.steps}")
    _check_device(args.device)
    for name in datasets:
        load_images(name, args.data_dir, verify=False)  # fail fast, with where to put which file
    jobs = []
    for seed in parse_int_list(args.seeds, "seed"):
        for name in datasets:
            for model in models:
                for skip in (skips if model != "sgp" else ["none"]):
                    jobs.append({"dataset": name, "model": model, "skip": skip, "seed": seed, "preset": args.preset,
                                 "max_train": args.max_train, "steps": args.steps, "dtype": args.dtype,
                                 "device": args.device, "world_size": engine_world_size(args),
                                 "data_dir": args.data_dir})
    return jobs


def _check_device(device: str) -> None:
    """`--device` as torch names it, and present: a missing GPU is an error before any data is read or fit run."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"--device must be cpu or cuda (cuda:N), got {device!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: torch sees no CUDA device on this machine (torch.cuda.is_available() "
                         "is False); run where a GPU is present or use --device cpu")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda (cuda:N), got {device!r}")


def run(args) -> int:
    # `bench report` tabulates regression suites; image rows are read from images.jsonl directly
    return run_suite(args, build_jobs(args), _work, KEY_FIELDS, "images", report_hint=False, key_defaults=KEY_DEFAULTS)
