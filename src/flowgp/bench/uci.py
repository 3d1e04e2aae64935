"""`flowgp bench uci`: UCI regression (and classification) over the standard splits, one JSON line per fit.

    flowgp bench uci --datasets boston,concrete --models svgp,tgp --splits 0-9 --inducing 5,100 \
        --preset quick --jobs 2 --out bench-results/uci

Rows go to OUT/uci.jsonl, keyed by (dataset, model, num_inducing, split, preset, seed, row_order); rerunning the same
command skips finished rows, and a fit interrupted mid-way (a machine stopping during a long reference-preset run)
continues from its checkpoint in the run's state folder, runs/bench/<name of OUT> unless `--state-dir` says
otherwise (`flowgp.bench.runner`; `--no-checkpoints`: none). Regression
rows hold nll, rmse, coverage95; classification rows accuracy, nll.
Datasets: the UCI folders under uci/ (standard 90/10 splits shipped with the data), the classification sets
(stratified 90/10 splits; avila: the official split, split 0 only), or `csv:PATH:TARGET` for a user's file
(random 90/10 splits). The reference presets split a UCI set as the DGP-IWVI authors do (`reference_split`),
with its rows in the order of their download: for power that is not our data file's order, and its rows say
`row_order: "authors"` (rows without the field, written before, used the file's order).
"""
from __future__ import annotations

import numpy as np

from ..cli.options import add_threads_option
from .runner import (ENGINE_KEY_DEFAULTS, add_checkpoint_argument, add_engine_arguments, engine_world_size,
                     parse_int_list, parse_name_list, place_estimator, run_suite)

NAME = "uci"
HELP = "UCI regression/classification benchmark over standard splits (resumable JSON lines)"
KEY_FIELDS = ("dataset", "model", "num_inducing", "split", "preset", "seed", "row_order", "device", "world_size")
# Rows written before `row_order` existed hold splits of the data file's own row order; rows written before
# `device` and `world_size` existed ran on the CPU in one process.
KEY_DEFAULTS = {"row_order": "file", **ENGINE_KEY_DEFAULTS}

# The DGP-IWVI/DREG authors' downloads whose rows are not in the order of our uci/<name>/data.txt: the shipped
# permutation (row i of their download is row order[i] of ours) and their download's first five rows, which the
# permutation must reproduce from the data on disk before it is used.
AUTHORS_ROW_ORDERS = {
    # Folds5x2_pp.xlsx, first sheet (bayesian_benchmarks' `Power`); rebuilt from a public CSV copy of that sheet
    "power": ("power_sheet1_order.npy", ((14.96, 41.76, 1024.07, 73.17, 463.26),
                                         (25.18, 62.96, 1020.04, 59.08, 444.37),
                                         (5.11, 39.40, 1012.16, 92.14, 488.56),
                                         (20.86, 57.32, 1010.24, 76.64, 446.48),
                                         (10.82, 37.50, 1009.23, 96.62, 473.90))),
}
DEFAULT_DATASETS = "boston,concrete,energy,kin8nm,power,wine-red,yacht"


def row_order_of(row: dict) -> str:
    """The row order a result row's split was made in: its `row_order` ("authors", "file", or the stem of a
    user's permutation file in ldgp_learning_curve.py's rows), "file" where the field is missing or null (rows
    written before it existed, and older learning-curve rows in the file's order)."""
    return row.get("row_order") or KEY_DEFAULTS["row_order"]


def add_arguments(parser) -> None:
    parser.add_argument("--datasets", default=DEFAULT_DATASETS,
                        help="comma-separated UCI/classification names or csv:PATH:TARGET (default: the 7 UCI sets)")
    parser.add_argument("--models", default="svgp,tgp", help="comma-separated model names (flowgp.bench.models)")
    parser.add_argument("--splits", default="0-9", help="split numbers, e.g. '0-9' or '0,3,5'")
    parser.add_argument("--inducing", default="100", help="numbers of inducing points, e.g. '5,100'")
    parser.add_argument("--preset", default="quick",
                        help="training budget: paper, quick, tiny, reference (DGP-IWVI Table 1 protocol and splits, "
                             "K = 5, batch 512) or reference-k50 (the same with the DREG authors' K = 50, batch 64)")
    parser.add_argument("--epochs", type=int, default=None, help="override the preset's epochs")
    parser.add_argument("--seed", type=int, default=0, help="base seed (split i uses seed + i)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (one torch thread each unless "
                        "--threads says otherwise)")
    add_threads_option(parser)
    parser.add_argument("--data-dir", default=None, help="data folder (default $FLOWGP_DATA, then ../shared/data)")
    parser.add_argument("--out", default="bench-results/uci", help="output folder (uci.jsonl is appended to)")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--wait", action="store_true",
                        help="if another run is writing the same output, wait for it (default: stop with a message)")
    add_checkpoint_argument(parser)
    add_engine_arguments(parser)


def _dataset_task(name: str, data_dir=None) -> str:
    """'classification' for the classification sets, else 'regression' (a UCI folder or csv:PATH:TARGET)."""
    from ..data.tables import CLASSIFICATION_DATASETS, UCI_DATASETS, resolve_data_dir

    if name in CLASSIFICATION_DATASETS:
        return "classification"
    if name.startswith("csv:") or name in UCI_DATASETS or (resolve_data_dir(data_dir) / "uci" / name).is_dir():
        return "regression"
    raise ValueError(f"unknown dataset '{name}'; choose from {', '.join(UCI_DATASETS + tuple(CLASSIFICATION_DATASETS))}"
                     ", another folder under uci/, or csv:PATH:TARGET")


def authors_row_order(dataset: str, data_dir=None, data=None):
    """The permutation that puts uci/<dataset>/data.txt in the row order of the DGP-IWVI/DREG authors' download
    (`reference_split`'s `row_order`), or None where the two orders agree (wine-red and the other sets) or
    where the data on disk is not the file the shipped permutation was made for (then with a warning: its splits
    are those of the file's order, and the bench's rows say `row_order: "file"`). `data`: the (x, y) that
    `flowgp.data.tables.load_uci(dataset, data_dir)` returns, where the caller holds them already (not read again)."""
    import warnings
    from importlib.resources import files

    from ..data.tables import load_uci

    if dataset not in AUTHORS_ROW_ORDERS:
        return None
    name, first_rows = AUTHORS_ROW_ORDERS[dataset]
    with files(__package__).joinpath("data", name).open("rb") as fh:
        order = np.load(fh, allow_pickle=False)
    x, y = load_uci(dataset, data_dir) if data is None else data
    table = np.column_stack([x, y])
    if (order.shape != (len(y),) or not np.array_equal(np.sort(order), np.arange(len(y)))
            or table.shape[1] != len(first_rows[0]) or not np.allclose(table[order[:len(first_rows)]], first_rows)):
        warnings.warn(f"uci/{dataset}/data.txt is not the file flowgp's permutation to the DGP-IWVI authors' row "
                      f"order was made for ({len(y)} rows of {table.shape[1]} columns); its reference splits use "
                      "the file's own row order", RuntimeWarning, stacklevel=2)
        return None
    return order


def reference_split(dataset: str, split: int, data_dir=None, row_order=None, data=None):
    """Split `split` made as the DGP-IWVI/DREG authors' benchmark code makes it (hughsalimbeni/bayesian_benchmarks,
    `data.Dataset.__init__` with BASE_SEED = 0): the row indices 0..N-1 shuffled by NumPy's legacy Mersenne
    Twister seeded with `split` (their code seeds NumPy's global generator and shuffles), the first int(0.9 N) for training
    and the rest (10 %) for testing. Any split number >= 0 is valid (the paper uses 20). A local
    RandomState: the global NumPy RNG is not touched.

    The rule picks rows by position, so the same split of a file in another row order tests other points.
    `row_order` (a permutation of 0..N-1, or None for the file's order) says which row of `uci/<name>/data.txt` is
    the i-th row of the authors' download: with it the split holds the points theirs holds (`authors_row_order`
    gives it for the sets where the orders differ). `data`: as in `authors_row_order`."""
    from ..data.tables import Split, load_uci

    if isinstance(split, bool) or not isinstance(split, (int, np.integer)) or split < 0:
        raise ValueError(f"split must be an integer >= 0, got {split!r}")
    x, y = load_uci(dataset, data_dir) if data is None else data
    if row_order is not None:
        row_order = np.asarray(row_order)
        if row_order.shape != (len(y),) or not np.array_equal(np.sort(row_order), np.arange(len(y))):
            raise ValueError(f"row_order must be a permutation of 0..{len(y) - 1} (the rows of uci/{dataset}), "
                             f"got an array of shape {row_order.shape} that is not one")
        x, y = x[row_order], y[row_order]
    ind = np.arange(len(y))
    np.random.RandomState(int(split)).shuffle(ind)
    n = int(len(y) * 0.9)
    order = "" if row_order is None else " (rows in the given order)"
    return Split(x[ind[:n]], y[ind[:n]], x[ind[n:]], y[ind[n:]],
                 f"uci/{dataset} bayesian_benchmarks split {split}{order}")


def reference_row_order(dataset: str, data_dir=None) -> str:
    """The `row_order` label of `dataset`'s reference-protocol splits in `flowgp bench uci`: "authors" where
    `authors_row_order` has a permutation for the data on disk, else "file"."""
    return "file" if authors_row_order(dataset, data_dir) is None else "authors"


def load_split(dataset: str, split: int, data_dir=None, seed: int = 0, protocol: str = "standard",
               row_order: str = "file"):
    """The train/test Split `split` of a bench dataset name (see the module docstring); protocol "reference"
    gives a UCI set's split as the DGP-IWVI authors make it (`reference_split`), of the data file's rows in its
    own order (`row_order="file"`) or in the order of the authors' download (`"authors"`, see
    `authors_row_order`; the bench's default for the reference protocol)."""
    from ..data.tables import CLASSIFICATION_DATASETS, Split, classification_split, load_csv, load_uci, uci_split

    if row_order not in ("file", "authors"):
        raise ValueError(f"row_order must be 'file' or 'authors', got {row_order!r}")
    reference = protocol == "reference" and not dataset.startswith("csv:") and dataset not in CLASSIFICATION_DATASETS
    if row_order == "authors":
        data = load_uci(dataset, data_dir) if reference and dataset in AUTHORS_ROW_ORDERS else None
        order = authors_row_order(dataset, data_dir, data=data) if data is not None else None
        if order is None:
            raise ValueError(f"row_order='authors' needs the reference protocol and a dataset whose rows flowgp can "
                             f"put in the DGP-IWVI authors' order ({', '.join(AUTHORS_ROW_ORDERS)}), got dataset "
                             f"{dataset!r} with protocol {protocol!r}; pass row_order='file'")
        return reference_split(dataset, split, data_dir, row_order=order, data=data)
    if reference:
        return reference_split(dataset, split, data_dir)

    if dataset.startswith("csv:"):
        parts = dataset[4:].rsplit(":", 1)
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise ValueError(f"a CSV dataset is written csv:PATH:TARGET, got '{dataset}'")
        x, y, _ = load_csv(parts[0], parts[1])
        rng = np.random.default_rng(seed * 1000 + split)
        perm = rng.permutation(len(y))
        n_test = max(1, int(round(0.1 * len(y))))
        te, tr = np.sort(perm[:n_test]), np.sort(perm[n_test:])
        return Split(x[tr], y[tr], x[te], y[te], f"{parts[0]} random 90/10 split {split}")
    if dataset in CLASSIFICATION_DATASETS:
        return classification_split(dataset, split, data_dir, seed=seed)
    return uci_split(dataset, split, data_dir)


def _work(job: dict) -> dict:
    """One fit: a module-level function so worker processes can run it."""
    from .models import make_estimator
    from .presets import get_preset
    from .runner import fit_and_score

    preset = get_preset(job["preset_name"], epochs=job["epochs_override"])
    split = load_split(job["dataset"], job["split"], job["data_dir"], job["seed"] - job["split"],
                       protocol=preset.protocol, row_order=job["row_order"])
    n = len(split.y_train)
    m = min(job["num_inducing"], n)
    est = place_estimator(make_estimator(job["model"], preset, m, job["seed"], n, task=job["task"], threads=job.get("threads")),
                          job.get("device", "cpu"))
    scores = fit_and_score(est, split, job["task"], checkpoint=job.get("checkpoint"))
    row = {k: job[k] for k in KEY_FIELDS}
    row.update(task=job["task"], epochs=int(est.epochs), batch_size=est.batch_size, n_train=n,
               n_test=len(split.y_test), **scores)
    if hasattr(est, "flow"):
        row["flow"] = est.flow if isinstance(est.flow, str) else str(est.flow)
        row["flow_init"] = est.flow_init
    return row


def build_jobs(args) -> list[dict]:
    from .models import model_names, supports_task
    from .presets import get_preset

    protocol = get_preset(args.preset).protocol  # validates the name early
    datasets = parse_name_list(args.datasets, what="dataset")
    models = parse_name_list(args.models, known=model_names(), what="model")
    splits = parse_int_list(args.splits, "split")
    inducing = parse_int_list(args.inducing, "inducing")
    if min(inducing) < 1:
        raise ValueError("--inducing values must be >= 1")
    jobs = []
    for ds in datasets:
        task = _dataset_task(ds, args.data_dir)
        bad = [m for m in models if not supports_task(m, task)]
        if bad:
            raise ValueError(f"models {bad} do not handle {task} (dataset '{ds}')")
        if ds == "avila" and splits != [0]:
            raise ValueError("avila has one official train/test split; pass --splits 0")
        # the reference protocol splits the rows in the authors' order where it differs from the file's
        row_order = reference_row_order(ds, args.data_dir) if protocol == "reference" else "file"
        # fail fast on missing/malformed files
        load_split(ds, splits[0], args.data_dir, args.seed, protocol=protocol, row_order=row_order)
        for split in splits:
            for model in models:
                for m in inducing:
                    jobs.append({"dataset": ds, "model": model, "num_inducing": m, "split": split,
                                 "preset": args.preset if args.epochs is None else f"{args.preset}-e{args.epochs}",
                                 "seed": args.seed + split, "row_order": row_order, "task": task,
                                 "data_dir": args.data_dir,
                                 "preset_name": args.preset, "device": getattr(args, "device", "cpu"),
                                 "world_size": engine_world_size(args),
                                 "epochs_override": args.epochs,
                                 # not a key field: a row's result does not depend on it
                                 "threads": getattr(args, "threads", None)})
    return jobs


def run(args) -> int:
    return run_suite(args, build_jobs(args), _work, KEY_FIELDS, "uci", key_defaults=KEY_DEFAULTS)
