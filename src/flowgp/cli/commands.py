"""Command line: `flowgp demo`, `flowgp fit`, `flowgp predict`, `flowgp bench ...` (thin layers over the estimators).

Exit codes (`flowgp.cli.exit_codes`, listed by `flowgp --help`): 0 success, 1 any other failure, 2 usage error
(one line, before any work), 75 busy (another process writes the same output), 130 interrupted (one line saying
what was saved). No output may be an input (`flowgp.data.paths`): `--out` equal to `--data`, `--model`,
`--checkpoint` or the model's metadata file is refused before any work, and so is a `--out` whose metadata file
`OUT.json` exists without being flowgp's.
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from .exit_codes import EPILOG, EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, interrupted_line
from .options import add_threads_option
from ..training.threads import check_threads
from ..gp.defaults import DEFAULTS
from ..data.paths import METADATA_MARKER, check_distinct, check_metadata_file, is_metadata_file, metadata_path

__all__ = ["main"]

#: `flowgp fit` flags that set a named model's options (`flowgp.registry.MODELS`), flag -> option name
_OPTION_FLAGS = {"--flow": "flow", "--flow-init": "flow_init", "--layers": "layers", "--posterior": "posterior",
                 "--num-importance": "num_importance", "--gradient": "gradient", "--objective": "objective",
                 "--compile": "compile"}


def _models():
    """The named models (`flowgp.registry.MODELS`, filled by `flowgp.bench.models`)."""
    from ..bench import models
    from ..registry import MODELS

    return MODELS


def _csv_models() -> list[str]:
    """Named models `flowgp fit` can train on a table: the regressors (the multi-output ones with --output)."""
    models = _models()
    return [n for n in models.names() if "regression" in models.get(n).tasks]


def _multi_output_models() -> list[str]:
    from ..bench.models import is_multi_output

    models = _models()
    return [n for n in _csv_models() if is_multi_output(models.get(n))]


#: `flowgp fit`'s values for the shared flags a single-output model gets when they are not given (a multi-output
#: model keeps its estimator's own defaults: its inducing sets, epochs and batch rule differ)
_SHARED_DEFAULTS = {"kernel": DEFAULTS.kernel, "num_inducing": DEFAULTS.num_inducing, "epochs": DEFAULTS.epochs,
                    "lr": DEFAULTS.lr}


def version_line() -> str:
    """What `flowgp --version` prints: flowgp's version and the torch and Python it runs on."""
    import platform

    import torch

    from .. import __version__

    return f"flowgp {__version__} (torch {torch.__version__}, Python {platform.python_version()})"


def _name_ranges(names) -> list[str]:
    """Names that differ only in one number, written once with a brace range: dgp2 dgp3 dgp4 -> dgp{2..4}."""
    import re

    groups: dict = {}
    for name in names:
        match = re.fullmatch(r"(\D*?)(\d+)(\D.*)?", name)
        key = (match.group(1), match.group(3) or "") if match else (name, None)
        groups.setdefault(key, []).append(int(match.group(2)) if match else None)
    out = []
    for (head, tail), numbers in groups.items():
        if tail is None:
            out.append(head)
        elif len(numbers) > 1 and sorted(numbers) == list(range(min(numbers), max(numbers) + 1)):
            out.append(f"{head}{{{min(numbers)}..{max(numbers)}}}{tail}")
        else:
            out.extend(f"{head}{n}{tail}" for n in numbers)
    return out


def models_by_family_text(width: int = 100) -> str:
    """`flowgp fit --help`'s list of the --model names, one block per estimator (generated from the registry)."""
    import textwrap

    models, multi = _models(), set(_multi_output_models())
    families: dict = {}
    for name in _csv_models():
        families.setdefault(models.get(name).regressor, []).append(name)
    lines = ["--model names by family (NAME{2..4} stands for NAME2, NAME3, NAME4):"]
    for family, names in families.items():
        label = f"{family}" + (" (multi-output: with --output)" if set(names) <= multi else "")
        lines.append(f"  {label}:")
        lines.extend(textwrap.wrap(", ".join(_name_ranges(names)), width, initial_indent="    ",
                                   subsequent_indent="    ", break_on_hyphens=False))
    return "\n".join(lines)


def _estimator(name: str, **kw):
    """The unfitted estimator registered as `name`, with the shared keyword arguments and the model's options."""
    return _models().get(name)(**kw)


def _evaluate(est, x_test, y_test) -> dict:
    from ..reporting.metrics import coverage, mean_nll, rmse

    lower, upper = est.predict_interval(x_test, 0.95)
    return {
        "nll": mean_nll(est.log_predictive_density(x_test, y_test)),
        "rmse": rmse(y_test, est.predict(x_test)),
        "coverage95": coverage(y_test, lower, upper),
    }


#: the period initialisations (in units of x) the demo fits each model from, as in the paper
DEMO_PERIODS = (0.6, 0.7, 0.8, 0.9, 1.0)


def demo(out: str = "flowgp-demo", as_json: bool = False, epochs: int = 1000, seed: int = 0,
         periods=DEMO_PERIODS, threads="auto", progress=True) -> list[dict]:
    """Paper Fig. 4: SVGP vs TGP (tanh flow) vs v-WGP (SAL) with a periodic kernel on tanh(sine) data.

    As in the paper, each model is fitted from period initialisations 0.6, 0.7, ..., 1.0 (`periods`) and the fit
    with the best training ELBO is kept (test data are never used for the choice). One line per fit goes to
    `progress` (True: stderr; a file; None or False: silence) so that a long run is seen to move. `threads` goes to
    every estimator (set per fit and restored: "auto" gives these 150 x 30 problems one thread, which on a busy
    machine is 25-50x faster than several: 300 epochs of the TGP fit took 37-55 s with two threads and 1.1-1.5 s
    with one on two loaded cores).

    Args:
        out: the folder to write results.json and demo.png to (created; it must not be a file).
        as_json: print the result rows as JSON instead of a table.
        epochs: training epochs of every fit.
        seed: seed of the data and of every fit.
        periods: the initial periods tried per model (the best training ELBO kept).
        threads: as above.
        progress: as above.

    See Also:
        :func:`flowgp.data.tables.make_tanh_sine` (the data), the gallery's first example.
    """
    from ..data.tables import make_tanh_sine, tanh_sine
    from ..reporting.plotting import demo_figure

    periods = tuple(float(p) for p in periods)
    if not periods or any(not np.isfinite(p) or p <= 0 for p in periods):
        raise ValueError(f"periods must be positive numbers, got {periods}")
    check_threads(threads)

    out_dir = Path(out)
    if out_dir.exists() and not out_dir.is_dir():  # found now, not after the fits
        raise ValueError(f"--out {out} is a file; give a folder for results.json and demo.png")
    stream = sys.stderr if progress is True else (progress or None)

    def say(line: str) -> None:
        if stream is not None:
            print(line, file=stream, flush=True)

    x, y = make_tanh_sine(150, seed=seed)
    rng = np.random.default_rng(seed + 1)
    x_test = np.sort(rng.uniform(0.0, 2.0, 300))[:, None]
    y_test = tanh_sine(x_test[:, 0]) + 0.05 * rng.standard_normal(300)
    x_scale = float(x.std())
    configs = [("SVGP", "svgp", {}), ("TGP (tanh)", "tgp", {"flow": "tanh", "flow_init": "data"}),
               ("v-WGP (sal)", "wgp", {"flow": "sal", "flow_init": "data"})]
    total = len(configs) * len(periods)
    say(f"flowgp demo: {total} fits ({len(configs)} models x {len(periods)} period initialisations) of up to "
        f"{epochs} epochs each (the estimators' plateau stop ends them earlier), one line per fit")
    rows, fits, done = [], {}, 0
    for label, name, extra in configs:
        best, best_elbo, elapsed = None, -np.inf, 0.0
        for period in periods:
            est = _estimator(name, kernel="periodic", period=period / x_scale, lengthscale=1.0,
                             num_inducing=30, epochs=epochs, seed=seed, verbose=False, threads=threads,
                             **extra)
            start = time.perf_counter()
            est.fit(x, y)
            seconds = time.perf_counter() - start
            elapsed += seconds
            elbo = est.elbo(x, y)
            if elbo > best_elbo:
                best, best_elbo = est, elbo
            done += 1
            say(f"[{done:>2}/{total}] {label:<12} period {period:.2f}: ELBO {elbo:9.2f} ({seconds:.1f} s)")
        row = {"model": label, **_evaluate(best, x_test, y_test), "train_seconds": elapsed, "elbo": best_elbo}
        rows.append(row)
        fits[label] = best
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    grid = np.linspace(0.0, 2.0, 400)[:, None]
    panels = []
    for row, (label, est) in zip(rows, fits.items()):
        lower, upper = est.predict_interval(grid, 0.95)
        scores = {"test NLL": row["nll"], "test RMSE": row["rmse"], "95 % coverage": row["coverage95"]}
        panels.append((label, est.predict(grid), lower, upper, scores))
    demo_figure(grid[:, 0], panels, x[:, 0], y, path=out_dir / "demo.png", truth=tanh_sine(grid[:, 0]),
                test=(x_test[:, 0], y_test), level=0.95, interval_of="y", x_label="x (dimensionless)",
                y_label="y = tanh(4 sin 2πx) + ε",
                title="Fig. 4 of the TGP paper: SVGP, TGP and v-WGP on tanh-sine data (scores on the test points)")
    if as_json:
        for row in rows:
            print(json.dumps(row))
    else:
        print(f"{'model':<14}{'test NLL':>10}{'RMSE':>10}{'cov95':>8}{'train s':>9}")
        for r in rows:
            print(f"{r['model']:<14}{r['nll']:>10.4f}{r['rmse']:>10.4f}{r['coverage95']:>8.3f}{r['train_seconds']:>9.1f}")
        print(f"wrote {out_dir / 'results.json'} and {out_dir / 'demo.png'}")
    return rows


def _check_output_path(path, flag: str) -> None:
    """ValueError before any work when `path` cannot be written as a file (a folder, or no writable parent)."""
    p = Path(path).expanduser().absolute()
    if p.is_dir():
        raise ValueError(f"{flag} {path} is a folder; give a file path such as {Path(path) / 'model.pt'}")
    if p.exists() and not os.access(p, os.W_OK):
        raise ValueError(f"{flag} {path} exists and is not writable")
    ancestor = p.parent
    while not ancestor.exists():  # the file's folders are created when it is written
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"{flag} {path}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: the folder {ancestor} is not writable")


def _check_device(name: str) -> None:
    """ValueError before any work when `name` is not a device torch can use here (the estimators' own check)."""
    from ..estimators.validation import check_device

    check_device(name, "--device")


def _table_features(args):
    return [f.strip() for f in args.features.split(",")] if args.features else None


def _check_data(args, nproc: int) -> None:
    """Cheap checks of --data before workers are launched: the path, the target and feature columns, the column
    types (from the header / schema, without reading the rows) and, where the row count is known without a
    pass (Parquet, .npy), that every process gets rows of each batch."""
    from ..data.sources import check_table

    rows = check_table(args.data, args.target, _table_features(args), name="--data", target_flag="--target")
    if nproc > 1:
        batch = args.batch_size if args.batch_size is not None else rows
        if batch is not None and nproc > min(batch, rows if rows is not None else batch):
            raise ValueError(f"--nproc {nproc} is larger than the {min(batch, rows or batch)} rows of each batch "
                             "(--batch-size, or the data's rows for full batches): use fewer processes")


def _without_nproc(argv) -> list:
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == "--nproc":
            skip = True
            continue
        if a.startswith("--nproc="):
            continue
        out.append(a)
    return out


def _fit(args, argv) -> int:
    from ..training import distributed

    # everything that can be checked without data is checked before the data are read and the model trained
    entry = _models().get(args.model)
    options = {name: getattr(args, name) for name in _OPTION_FLAGS.values() if getattr(args, name) is not None}
    # the model's own options: its estimator's parameters that its name does not fix
    accepted = set(inspect.signature(entry.estimator_class().__init__).parameters) - set(entry.fixed)
    foreign = [flag for flag, name in _OPTION_FLAGS.items() if name in options and name not in accepted]
    if foreign:
        takes = ", ".join(f for f, n in _OPTION_FLAGS.items() if n in accepted) or "none of them"
        raise ValueError(f"--model {args.model} does not take {', '.join(foreign)} (of the model flags it takes "
                         f"{takes})")
    from ..bench.models import is_multi_output

    multi = is_multi_output(entry)
    if multi and args.output is None:
        raise ValueError(f"--model {args.model} is a multi-output model: name the column of each row's output index "
                         "(0..D-1) with --output COL; the other feature column is the input")
    if not multi and args.output is not None:
        raise ValueError(f"--output: --model {args.model} has one output; only the multi-output models "
                         f"({', '.join(_multi_output_models())}) take an output-index column")
    shared = {"kernel": args.kernel, "num_inducing": args.num_inducing, "epochs": args.epochs,
              "batch_size": args.batch_size, "lr": args.lr}
    if not multi:
        shared = {k: (_SHARED_DEFAULTS.get(k) if v is None else v) for k, v in shared.items()}
    refused = [k for k, v in shared.items() if v is not None and k not in accepted]
    if refused:
        raise ValueError(f"--model {args.model} does not take " + ", ".join("--" + k.replace("_", "-") for k in refused))
    shared = {k: v for k, v in shared.items() if v is not None}
    if "threads" in accepted:
        shared["threads"] = args.threads
    elif args.threads != "auto":
        raise ValueError(f"--model {args.model} does not take --threads")
    _check_output_path(args.out, "--out")
    check_distinct({"--out": args.out, "--out's metadata file": metadata_path(args.out),
                    "--checkpoint": args.checkpoint}, {"--data": args.data})
    check_metadata_file(args.out)
    _check_device(args.device)
    if args.checkpoint is not None:
        _check_output_path(args.checkpoint, "--checkpoint")
        if "checkpoint" not in entry.estimator_class()().get_params():
            raise ValueError(f"--checkpoint: {entry.regressor} of this flowgp version cannot resume a fit")
        options["checkpoint"] = args.checkpoint
    nproc = args.nproc
    if isinstance(nproc, bool) or nproc < 1:
        raise ValueError(f"--nproc must be a positive integer, got {nproc}")
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if nproc > 1 and launched:
        raise ValueError("--nproc: this process is already one of several started by torchrun; drop --nproc")
    _check_data(args, nproc)
    parts = args.reduce_parts
    if parts is not None and (parts < 1 or parts % nproc or parts % int(os.environ.get("WORLD_SIZE", "1"))):
        raise ValueError(f"--reduce-parts must be a positive multiple of the number of processes, got {parts}")
    with _parts_in_environment(parts):
        return _fit_processes(args, argv, nproc, launched, multi, entry, shared, options)


@contextlib.contextmanager
def _parts_in_environment(parts):
    """FLOWGP_REDUCE_PARTS set to `parts` for the fit (and the processes it launches), then restored."""
    from ..training import distributed

    name = distributed.PARTS_VARIABLE
    before = os.environ.get(name)
    if parts is not None:
        os.environ[name] = str(parts)
    try:
        yield
    finally:
        if parts is not None:
            if before is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = before


def _shard_reads(est, shard_reads) -> dict:
    """--no-shard-reads (`shard_reads` False; "auto" without it) as the estimator's `shard_reads` parameter, so
    that the saved model records it; the `fit_stream` keyword for an estimator without that parameter (a class
    registered by the user)."""
    if "shard_reads" in est.get_params():
        est.set_params(shard_reads=shard_reads)
        return {}
    return {} if shard_reads == "auto" else {"shard_reads": bool(shard_reads)}


def _fit_processes(args, argv, nproc, launched, multi, entry, shared, options) -> int:
    """The fit itself: `nproc` workers launched, or this process's share of it."""
    from ..training import distributed

    if nproc > 1:
        # torch's elastic launcher starts nproc copies of this command (without --nproc); they find each other
        # through the environment it sets, as under torchrun
        return distributed.launch(_without_nproc(argv) + ["--launched-by-nproc"], nproc)
    device = args.device
    if launched and torch_device_type(device) == "cuda" and ":" not in device:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    world = distributed.init_from_env(device)
    try:
        est = _estimator(args.model, seed=args.seed, dtype=args.dtype, device=device,
                         verbose=not args.quiet and world.is_main, **shared, **options)
        features = _table_features(args)
        reading = _shard_reads(est, args.shard_reads)
        if multi:
            est.fit_stream(args.data, args.target, output=args.output, features=features, **reading)
            names = est.feature_names_
        elif getattr(est, "supports_streaming", lambda: False)():
            est.fit_stream(args.data, args.target, features=features, **reading)
            names = est.feature_names_
        else:  # families without a streamed fit read the table into memory
            from ..data.sources import open_table

            source = open_table(args.data, args.target, features, name="--data", target_flag="--target")
            try:
                x, y = source.read(0, source.num_rows)
                names = list(source.feature_names)
            finally:
                source.close()
            est.fit(x, y)
            est.target_name_ = args.target
        est.feature_names_ = names
        if world.is_main:
            path = est.save(args.out)
            meta = {**METADATA_MARKER, "features": names, "target": args.target, "model": args.model}
            if multi:
                meta["output"] = args.output
            metadata_path(path).write_text(json.dumps(meta, indent=2) + "\n")
            print(f"saved {type(est).__name__} to {path} (features: {', '.join(names)})")
        distributed.barrier(world)
    finally:
        distributed.shutdown()
    return 0


def torch_device_type(name: str) -> str:
    import torch

    return torch.device(name).type


def _predict(args) -> None:
    from .. import estimators
    from ..data.sources import check_table
    from ..estimators.features import table_feature_names

    _check_output_path(args.out, "--out")
    meta_path = metadata_path(args.model)
    check_distinct({"--out": args.out}, {"--model": args.model, "--model's metadata file": meta_path,
                                         "--data": args.data})
    if args.device is not None:
        _check_device(args.device)
    est = estimators.load(args.model, device=args.device)
    if "threads" in est.get_params(deep=False):  # the threads of this machine, not those of the fit's
        est.set_params(threads=args.threads)
    # the columns by name: as the model file records them; the .json beside it only for files written before
    # they were recorded there, and only when flowgp wrote it (a user's file of that name is not ours)
    meta_path = Path(str(args.model) + ".json")
    meta = json.loads(meta_path.read_text()) if is_metadata_file(meta_path) else {}
    features = table_feature_names(est) or meta.get("features")
    if args.target is not None:
        # asked for by name: a missing column is an error, never silently unscored
        target = args.target
    else:
        # the training target, scored only when the table has it
        target = getattr(est, "target_name_", None) or meta.get("target")
        if target is not None:
            try:
                check_table(args.data, target, features, name="--data")
            except ValueError:
                target = None
    if str(args.data).endswith(".npy"):
        features = None
    check_table(args.data, target, features, name="--data", target_flag="--target")
    output = getattr(est, "output_name_", None) or meta.get("output")
    extra = {} if output is None else {"output": output}
    summary = est.predict_to_file(args.data, args.out, level=args.level, target=target, features=features,
                                  chunk_rows=args.chunk_rows, verbose=not args.quiet, **extra)
    print(f"wrote {summary.pop('rows')} predictions to {args.out}")
    if summary:
        print(json.dumps(summary))


def main(argv=None) -> int:
    """Run the command line `argv` (default: sys.argv[1:]); returns the exit code (`flowgp.cli.exit_codes`): 0
    success, 1 any other failure, 2 usage error, 75 busy, 130 interrupted (one line on stderr, no traceback).

    Args:
        argv: the arguments, without the program name (None: sys.argv[1:]).

    See Also:
        :func:`flowgp.cli.demo` (the ``demo`` command), :func:`flowgp.bench.cli.main` (the ``bench`` command).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    # what the line of an interruption needs, filled in as the command line is understood
    context = {"label": "flowgp", "checkpoint": None, "silent": False}
    try:
        return _run(argv, context)
    except KeyboardInterrupt as err:  # also while torch is imported or the parser built
        if not context["silent"]:
            print(f"{context['label']}: {interrupted_line(err, context['checkpoint'])}", file=sys.stderr,
                  flush=True)
        return EXIT_INTERRUPTED


def _add_parallel_options(p_fit: argparse.ArgumentParser) -> None:
    """`flowgp fit`'s options for processes and threads: --nproc, --reduce-parts, --no-shard-reads, --threads."""
    p_fit.add_argument("--nproc", type=int, default=1,
                       help="train data-parallel in this many processes on this machine (torch's elastic "
                            "launcher; for several machines run `torchrun ... -m flowgp fit ...` instead)")
    p_fit.add_argument("--reduce-parts", type=int, default=None, metavar="P",
                       help="cut every global batch into P fixed parts summed in a fixed order: fits with any "
                            "--nproc dividing P give bitwise the same model (default: one part per process, "
                            "equal across --nproc up to rounding, which long L-BFGS refinements can amplify)")
    p_fit.add_argument("--no-shard-reads", dest="shard_reads", action="store_const", const=False, default="auto",
                       help="with several processes, let every process read the whole table each epoch and train "
                            "exactly as one process would (for debugging); by default each reads only its share "
                            "of the blocks (the same sampler law, 1/W of the reading)")
    add_threads_option(p_fit)
    # set by --nproc for the processes it starts: the launching process alone reports an interruption
    p_fit.add_argument("--launched-by-nproc", action="store_true", help=argparse.SUPPRESS)


def _parser() -> argparse.ArgumentParser:
    """The `flowgp` command line's parser (the bench's subcommands included)."""
    from ..bench.cli import HelpFormatter, subcommand_summaries

    parser = argparse.ArgumentParser(prog="flowgp", description="Gaussian processes transformed by flows",
                                     epilog=EPILOG, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="fit SVGP, TGP and v-WGP on the embedded tanh-sine data (paper Fig. 4)",
                            formatter_class=HelpFormatter)
    p_demo.add_argument("--out", default="flowgp-demo", help="folder for results.json and demo.png")
    p_demo.add_argument("--json", action="store_true", help="print one JSON object per model")
    p_demo.add_argument("--epochs", type=int, default=1000)
    p_demo.add_argument("--seed", type=int, default=0)
    add_threads_option(p_demo)
    p_demo.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p_fit = sub.add_parser("fit", help="fit a model to a table (CSV, Parquet, .npy) and save it",
                           formatter_class=HelpFormatter, epilog=models_by_family_text() + "\n\n" + EPILOG)
    p_fit.add_argument("--data", "--csv", dest="data", required=True, metavar="PATH",
                       help="training table: .csv, .parquet (or a folder of them) or .npy, streamed in chunks")
    p_fit.add_argument("--target", required=True, help="name of the target column (.npy: its index, e.g. -1)")
    p_fit.add_argument("--features", default=None, help="comma-separated feature columns (default: all others)")
    p_fit.add_argument("--model", default="tgp", choices=_csv_models(), metavar="MODEL",
                       help="a named model of flowgp.registry.MODELS, listed by family below (default: %(default)s)")
    p_fit.add_argument("--output", default=None, metavar="COL",
                       help="multi-output models: the column of each row's output index 0..D-1 (the table's other "
                            "feature column is the input, e.g. time)")
    p_fit.add_argument("--flow", default=None, help="tgp/wgp: marginal flow, e.g. sal+softplus (default sal)")
    p_fit.add_argument("--flow-init", default=None, choices=["identity", "data", "random", "none"],
                       help="tgp/wgp: flow initialisation (default identity)")
    p_fit.add_argument("--layers", type=int, default=None, help="dgp/ldgp: number of GP layers (default 2)")
    # the names of flowgp.models.deep_gp.POSTERIORS, written out so that --help does not import torch
    p_fit.add_argument("--posterior", default=None, choices=["gaussian", "cnf", "cnf-paper", "flow-layerwise"],
                       help="dgp: q(U) family: DSVI Gaussian, convolutional flow over DSVI's base (cnf), the CNF "
                            "paper's exact design (cnf-paper) or the layer-wise ablation (default gaussian)")
    p_fit.add_argument("--num-importance", type=int, default=None, help="ldgp: importance samples K (default 5)")
    p_fit.add_argument("--gradient", default=None, choices=["dreg", "dreg-d23", "dreg-eps", "reg"],
                       help="ldgp: q(z) gradient estimator (default dreg; flowgp.models.latent.model."
                            "GRADIENT_ESTIMATORS)")
    # flowgp.models.latent.model.OBJECTIVES, written out so that --help does not import torch
    p_fit.add_argument("--objective", default=None, choices=["bound", "per-slot"],
                       help="ldgp: what training maximises: the importance-weighted bound (default) or the DREG "
                            "authors' published per-slot objective, which is not a bound")
    p_fit.add_argument("--kernel", default=None, help=f"default {DEFAULTS.kernel} (single-output models)")
    p_fit.add_argument("--num-inducing", type=int, default=None,
                       help=f"default {DEFAULTS.num_inducing} (multi-output models: the estimator's own rule)")
    p_fit.add_argument("--epochs", type=int, default=None, help=f"default {DEFAULTS.epochs} (multi-output models: 500)")
    p_fit.add_argument("--batch-size", type=int, default=None)
    p_fit.add_argument("--lr", type=float, default=None, help=f"default {DEFAULTS.lr}")
    p_fit.add_argument("--seed", type=int, default=0)
    p_fit.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    p_fit.add_argument("--device", default="cpu")
    # flowgp.training.loop.COMPILE_MODES, written out so that --help does not import torch
    # ("auto" is the training loop's own: compile only where the fit is long enough to repay it)
    p_fit.add_argument("--compile", nargs="?", const="auto", default=None, metavar="MODE",
                       choices=["auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
                       help="train through torch.compile. Alone or 'auto': time the first steps eagerly and "
                            "compile only if the rest of the fit can repay the compilation (seconds on a CPU); "
                            "a MODE (default, or reduce-overhead for CUDA graphs on a GPU) compiles regardless")
    p_fit.add_argument("--quiet", action="store_true")
    p_fit.add_argument("--out", required=True,
                       help="where to save the fitted model (.pt); the column names go to OUT.json beside it (a "
                            "file of that name not written by flowgp fit is never replaced: the fit is refused)")
    p_fit.add_argument("--checkpoint", default=None, metavar="PATH",
                       help="training checkpoint: resume from it when it exists (an interrupted fit continues "
                            "where it stopped), written while training")
    _add_parallel_options(p_fit)
    p_pred = sub.add_parser("predict", help="predict a table (CSV, Parquet, .npy) with a saved model, in chunks",
                            epilog=EPILOG, formatter_class=HelpFormatter)
    p_pred.add_argument("--model", required=True)
    p_pred.add_argument("--data", "--csv", dest="data", required=True, metavar="PATH")
    p_pred.add_argument("--target", default=None, help="target column to score against, if present")
    p_pred.add_argument("--level", type=float, default=0.95)
    p_pred.add_argument("--out", default="predictions.csv", help="a .csv or .parquet file, written as rows are predicted")
    p_pred.add_argument("--chunk-rows", type=int, default=65536, help="rows predicted at once (bounds the memory)")
    p_pred.add_argument("--quiet", action="store_true", help="no progress bar")
    add_threads_option(p_pred)
    p_pred.add_argument("--device", default=None,
                        help="where to predict (cpu, cuda, cuda:1); default: the device the model was trained on, "
                             "or the CPU where that is CUDA and this machine has none")
    p_bench = sub.add_parser("bench", help="run the benchmark suite: " +
                             ", ".join(name for name, _ in subcommand_summaries()),
                             epilog=EPILOG, formatter_class=HelpFormatter)
    from ..bench.cli import add_bench_parser

    add_bench_parser(p_bench)
    return parser


def _run(argv, context) -> int:
    from ..bench.cli import run_bench

    args = _parser().parse_args(argv)
    if args.command == "bench":
        return run_bench(args, argv)
    context.update(label=f"flowgp {args.command}", checkpoint=getattr(args, "checkpoint", None),
                   silent=getattr(args, "launched_by_nproc", False))
    try:
        if args.command == "demo":
            demo(args.out, args.json, args.epochs, args.seed, threads=args.threads,
                 progress=None if args.quiet else sys.stderr)
        elif args.command == "fit":
            return _fit(args, argv)
        else:
            _predict(args)
    except (ValueError, TypeError, FileNotFoundError) as err:
        message = " ".join(str(err).split())  # one line, whatever the message held
        print(f"flowgp {args.command}: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    except Exception:  # not a usage error: a failure to report with its traceback
        traceback.print_exc()
        return EXIT_FAILURE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
