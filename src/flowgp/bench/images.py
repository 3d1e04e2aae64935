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

Learning curves: `--curve-every K` scores every fit every K training steps and after its last one on a fixed
subset of the test set (`--curve-test N` images, stratified, the same for every model and seed) with
`--curve-samples S` prediction samples, and appends the points to `OUT/curve.jsonl`
(`flowgp.bench.learning_curve.CurveRecorder`: the fit itself is unchanged, the clock leaves the evaluations out,
and a resumed fit continues its curve). The rows' `train_seconds` leave the evaluations out too
(`curve_eval_seconds` says how long they took). `flowgp bench images-curve OUT/curve.jsonl` draws test accuracy
vs training steps, one line per fit, with the published Table III accuracies (`TABLE3`) as reference lines.
"""
from __future__ import annotations

import copy
import math
import re
import sys
from pathlib import Path

import numpy as np

from .learning_curve import positive_steps
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

#: CNF-DGP Table III, mean test accuracy (%): {dataset: {(method, "SGP" or "DGP 4"): value}}
TABLE3 = {
    name: {(method, model): value for method, row in zip(("DSVI", "SGHMC", "IPVI", "NF"), rows)
           for model, value in zip(("SGP", "DGP 4"), row)}
    for name, rows in (("mnist", ((97.32, 99.16), (96.41, 98.15), (97.02, 99.32), (97.37, 99.43))),
                       ("fashion-mnist", ((86.98, 91.57), (85.84, 88.14), (87.29, 91.78), (87.14, 92.03))),
                       ("cifar10", ((47.15, 75.05), (47.32, 70.78), (48.07, 76.11), (48.13, 76.81))))}
#: the Table III entries drawn as reference lines: the methods the bench runs (DSVI, the flow) for both models,
#: and the strongest other DGP 4 (IPVI)
TABLE3_REFERENCES = (("DSVI", "SGP"), ("NF", "SGP"), ("DSVI", "DGP 4"), ("IPVI", "DGP 4"), ("NF", "DGP 4"))
#: the seed of the learning curves' test subset (one subset for every model and seed of a run)
CURVE_SUBSET_SEED = 0
CURVE_FILE = "curve.jsonl"


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
    curve = curve_recorder(job, est, data, len(y)) if job.get("curve_every") else None
    row.update(n_train=len(y), n_test=len(data.y_test), layers=int(est.layers), posterior=est.posterior,
               num_inducing=int(est.num_inducing), epochs=int(est.epochs), batch_size=int(est.batch_size),
               **fit_and_score(est, Split(x, y, data.x_test, data.y_test), task="classification",
                               checkpoint=job.get("checkpoint"), callback=curve))
    if curve is not None:  # (the fit's clock counted the curve's evaluations, which are not training)
        row["train_seconds"] -= curve.eval_seconds
        row["curve_eval_seconds"] = curve.eval_seconds
    return row


def curve_recorder(job: dict, est, data, n_train: int):
    """The learning curve's recorder of a job's fit (`flowgp.bench.learning_curve.CurveRecorder`): accuracy, NLL
    and ECE of `--curve-samples` predictions on the fixed stratified subset of `--curve-test` test images.

    Args:
        job: the job (its key fields, "device", "curve_path", "curve_every", "curve_test", "curve_samples").
        est: the job's classifier (scored with its own model, as it trains).
        data: the image set (`flowgp.data.images.ImageSplit`).
        n_train: the training images the fit takes.

    See Also:
        :class:`flowgp.bench.learning_curve.CurveRecorder`.
    """
    from .learning_curve import CurveRecorder, stratified_subset
    from .runner import evaluate_classification

    rows = stratified_subset(data.y_test, job["curve_test"], seed=CURVE_SUBSET_SEED)
    x_test, y_test = data.x_test[rows], data.y_test[rows]

    def evaluate():
        light = copy.copy(est)  # the fit's own model, with fewer prediction samples than the row's
        light.num_samples_predict = int(job["curve_samples"])
        return evaluate_classification(light, x_test, y_test)

    per_epoch = math.ceil(n_train / int(est.batch_size))
    extra = {"device": job["device"], "n_train": n_train, "batch_size": int(est.batch_size),
             "curve_test": job["curve_test"], "curve_images": len(rows), "n_test": len(data.y_test),
             "curve_samples": job["curve_samples"]}
    return CurveRecorder(job["curve_path"], {k: job[k] for k in KEY_FIELDS}, evaluate, every=job["curve_every"],
                         total=int(est.epochs) * per_epoch, steps_per_epoch=per_epoch, num_data=n_train, extra=extra)


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
    parser.add_argument("--curve-every", default=0, metavar="K",
                        help="learning curve: every K training steps and after the last one, score the model on "
                             "a fixed test subset and append the point to OUT/curve.jsonl (default: 0, off)")
    parser.add_argument("--curve-test", default=2000, metavar="N",
                        help="the curve's test subset: N images, stratified by class, seeded (the same for every "
                             "model and seed; the whole test set where it is smaller) (default: 2000)")
    parser.add_argument("--curve-samples", default=5, metavar="S",
                        help="prediction samples per curve point (the final row uses the preset's) (default: 5)")
    add_checkpoint_argument(parser)
    add_engine_arguments(parser)


def _curve_options(args) -> dict:
    """--curve-every, --curve-test and --curve-samples checked (a ValueError naming the option, before any work)."""
    every = positive_steps(getattr(args, "curve_every", 0), "--curve-every", allow_zero=True)
    return {"curve_every": every,
            "curve_test": positive_steps(getattr(args, "curve_test", 2000), "--curve-test"),
            "curve_samples": positive_steps(getattr(args, "curve_samples", 5), "--curve-samples"),
            "curve_path": str(Path(args.out) / CURVE_FILE) if every else None}


def _check_curve_settings(jobs: list[dict]) -> None:
    """A fit's curve continues only with the test subset and samples it began with (else its points would not be
    comparable): a ValueError naming the settings to use, before any work."""
    from .results import read_rows

    if not jobs or not jobs[0]["curve_path"]:
        return
    for row in read_rows(jobs[0]["curve_path"]):
        for job in jobs:
            if all(row.get(k, KEY_DEFAULTS.get(k)) == job[k] for k in KEY_FIELDS) and \
                    (row.get("curve_test"), row.get("curve_samples")) != (job["curve_test"], job["curve_samples"]):
                raise ValueError(
                    f"{job['curve_path']} holds points of the fit {job['model']} / {job['skip']} / seed {job['seed']} "
                    f"scored on --curve-test {row.get('curve_test')} images with --curve-samples "
                    f"{row.get('curve_samples')}; continue it with those, or remove its points first")


def build_jobs(args) -> list[dict]:
    from ..data.images import IMAGE_DATASETS, load_images

    curve = _curve_options(args)
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
                                 "data_dir": args.data_dir, **curve})
    _check_curve_settings(jobs)
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


# ----- flowgp bench images-curve ----------------------------------------------------------------------------
CURVE_NAME = "images-curve"
CURVE_HELP = "draw the learning curves of `flowgp bench images --curve-every`: test accuracy vs training steps"


def add_curve_arguments(parser) -> None:
    parser.add_argument("curve", help="the curve file a run wrote, OUT/curve.jsonl")
    parser.add_argument("--figure", default=None,
                        help="the PNG to write (default: curve.png beside the curve file, replaced if there)")
    parser.add_argument("--dataset", default=None, help="the dataset whose curves to draw (default: the file's "
                                                         "only one; an error naming them if it holds several)")
    parser.add_argument("--no-nll", action="store_true", help="draw the accuracy alone (default: a second panel "
                                                               "with the test NLL)")


def _line_label(key: tuple, varying: list) -> str:
    fields = dict(zip(KEY_FIELDS, key))
    label = fields["model"] if fields["skip"] in ("none", None) else f"{fields['model']}, skip {fields['skip']}"
    words = {"preset": "preset {}", "max_train": "{} training images", "steps": "{} steps", "seed": "seed {}",
             "dtype": "{}"}
    extra = [words[k].format(fields[k]) for k in words if k in varying and fields[k] is not None]
    return label + (f" ({', '.join(extra)})" if extra else "")


def curve_lines(rows: list[dict], dataset: str | None = None) -> tuple[str, dict, str, str]:
    """(dataset, {label: {"step", "accuracy" (%), "nll"}}, title, x label) of a curve file's rows: one line per
    fit (model and skip; the preset, steps, seed, ... where the fits differ in them), points sorted by step.

    Args:
        rows: the curve file's rows (`flowgp.bench.results.read_rows`).
        dataset: the dataset to draw (None: the rows' only one).

    See Also:
        :func:`flowgp.reporting.plotting.learning_curve_figure` (which draws them).
    """
    names = sorted({r.get("dataset") for r in rows})
    if dataset is None:
        if len(names) != 1:
            raise ValueError(f"the curve file holds {len(names)} datasets {names}: choose one with --dataset")
        dataset = names[0]
    rows = [r for r in rows if r.get("dataset") == dataset and "step" in r and "accuracy" in r]
    if not rows:
        raise ValueError(f"the curve file holds no points of dataset {dataset!r} (it has {names})")
    fits: dict = {}
    for r in rows:
        fits.setdefault(tuple(r.get(k) for k in KEY_FIELDS), {})[int(r["step"])] = r  # (a step once: the last)
    varying = [k for i, k in enumerate(KEY_FIELDS) if len({key[i] for key in fits}) > 1]
    lines = {}
    for key in sorted(fits, key=lambda k: tuple(str(v) for v in k)):
        points = [fits[key][s] for s in sorted(fits[key])]
        lines[_line_label(key, varying)] = {"step": [p["step"] for p in points],
                                            "accuracy": [100.0 * p["accuracy"] for p in points],
                                            "nll": [p["nll"] for p in points if "nll" in p]}
    subsets = sorted({(r.get("curve_images"), r.get("n_test"), r.get("curve_samples")) for r in rows}, key=str)
    scored = " / ".join(f"{images} of the {total} test images, {samples} prediction samples"
                        for images, total, samples in subsets)
    title = f"{dataset}: accuracy on a fixed stratified test subset ({scored} per point)"
    batches = {r.get("batch_size") for r in rows}
    xlabel = f"training steps (batches of {batches.pop()} images)" if len(batches) == 1 else "training steps"
    return dataset, lines, title, xlabel


def run_curve(args) -> int:
    from ..reporting.plotting import learning_curve_figure
    from .results import read_rows

    source = Path(args.curve)
    if not source.is_file():
        raise FileNotFoundError(f"{source}: no such curve file (`flowgp bench images --curve-every K` writes "
                                f"OUT/{CURVE_FILE})")
    figure = Path(args.figure) if args.figure else source.with_name("curve.png")
    if figure.suffix.lower() != ".png" or figure.resolve() == source.resolve():
        raise ValueError(f"--figure must name a .png file other than the curve file, got {str(figure)!r}")
    dataset, lines, title, xlabel = curve_lines(read_rows(source), args.dataset)
    if args.no_nll:
        lines = {label: {k: v for k, v in line.items() if k != "nll"} for label, line in lines.items()}
    published = TABLE3.get(dataset, {})
    references = {f"Table III, {model}, {method}": published[(method, model)]
                  for method, model in TABLE3_REFERENCES if (method, model) in published}
    figure.parent.mkdir(parents=True, exist_ok=True)
    learning_curve_figure(lines, figure, references=references, title=title, xlabel=xlabel)
    print(f"wrote {figure}", file=sys.stderr)
    return 0


SUBCOMMANDS = ((NAME, HELP, add_arguments, run), (CURVE_NAME, CURVE_HELP, add_curve_arguments, run_curve))
