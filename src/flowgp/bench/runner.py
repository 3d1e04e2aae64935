"""Shared pieces of the bench subcommands: list parsing, metrics of one fit, and a resumable job runner.

`run_jobs(jobs, work, store, jobs_n)` runs every job whose key is not yet in the `ResultStore`, in this process
(`jobs_n=1`) or in `jobs_n` worker processes (each limited to one torch thread), and appends each finished row
from the parent process only, so the file has a single writer. A job that raises is reported on stderr and
written to `<store>.errors.jsonl` (not to the store), so a rerun retries it. Workers die with the parent, even
when it is killed with SIGKILL (`die_with_parent`), so an interrupted bench leaves no orphan fits behind.

Subcommands that take `--no-checkpoints` (`add_checkpoint_argument`) also resume inside a fit: `run_suite` gives
every job a checkpoint file named by its key in the run's state folder (`--state-dir`, by default
`runs/bench/<name of OUT>` under the current directory: the state of runs in progress lives apart from their
results, so a results folder holds rows only), `fit_and_score` hands it to an estimator that takes `checkpoint`
(its training state is written there every 100 epochs and a rerun continues from it) and removes the fit's files
once its scores are in, just before the row is written. A checkpoint that cannot be
continued (written by other code or another budget, or damaged) is reported on stderr, removed, and the fit starts
from the beginning; a failure of the fit itself keeps the checkpoint.

Subcommands that take `--device` and `--nproc` (`add_engine_arguments`) run their fits where the library can:
on a GPU, and data-parallel in N processes (`flowgp.training.distributed`): `flowgp bench uci --nproc 2` starts
two copies of itself with torch's elastic launcher (`launch_engine`), every copy runs the same jobs in the same
order, each fit split over both, and rank 0 alone writes the rows. Each row records `device` and `world_size`
(key fields; rows written before they existed count as cpu and 1). Subcommands that run their own loop of fits
rather than independent jobs (`timing`, `amogp`) do the same through `engine_store` (rank 0's store decides for
every rank which fits are left), and those that write no rows (`ldgp-demo`) through `engine_world`.
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import re
import sys
import threading
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

__all__ = ["parse_int_list", "parse_name_list", "evaluate_regression", "evaluate_classification", "fit_and_score",
           "add_checkpoint_argument", "state_folder", "checkpoint_file", "run_jobs", "run_suite", "limit_threads", "die_with_parent",
           "add_engine_arguments", "check_engine", "engine_world_size", "launch_engine", "ENGINE_KEY_DEFAULTS",
           "place_estimator", "engine_world", "EngineStore", "engine_store"]

#: the engine's key fields' values in rows written before they existed
ENGINE_KEY_DEFAULTS = {"device": "cpu", "world_size": 1}


def parse_int_list(text: str, what: str = "value") -> list[int]:
    """'0-4,7,9' -> [0, 1, 2, 3, 4, 7, 9] (ranges inclusive, order kept, duplicates dropped)."""
    out: list[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part[1:]:
                lo, hi = part.split("-", 1) if not part.startswith("-") else (part, part)
                lo, hi = int(lo), int(hi)
                if hi < lo:
                    raise ValueError
                vals = range(lo, hi + 1)
            else:
                vals = [int(part)]
        except ValueError:
            raise ValueError(f"bad {what} list '{text}': use integers and inclusive ranges such as '0-4,7'") from None
        out += [v for v in vals if v not in out]
    if not out:
        raise ValueError(f"empty {what} list '{text}'")
    return out


def parse_name_list(text: str, known=None, what: str = "name") -> list[str]:
    names = [p.strip() for p in str(text).split(",") if p.strip()]
    if not names:
        raise ValueError(f"empty {what} list '{text}'")
    if known is not None:
        unknown = [n for n in names if n not in known]
        if unknown:
            raise ValueError(f"unknown {what}(s) {unknown}; choose from {', '.join(known)}")
    return names


def limit_threads() -> None:
    """One torch/BLAS thread per process: parallelism comes from processes (--jobs)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    import torch

    torch.set_num_threads(1)


def evaluate_regression(est, x_test, y_test) -> dict:
    """Test NLL (mean negative log predictive density), RMSE of the predictive mean, 95 % interval coverage;
    where the estimator's `predictive_summary` gives one, also "nll_kde" (the latent DGP: the NLL by the IWVI
    authors' public script's KDE of predictive draws, `flowgp.gp.prediction.silverman_kde_log_density`)."""
    from ..estimators.regression import summary_from_predictions
    from ..reporting.metrics import coverage, mean_nll, rmse

    if hasattr(est, "predictive_summary"):
        # one call: a Monte Carlo predictive (the latent DGP's 10 000 draws of z per point) is drawn once
        summary = est.predictive_summary(x_test, y_test, 0.95)
    else:  # a user's own registered regressor
        summary = summary_from_predictions(est, x_test, y_test, 0.95)
    scores = {"nll": mean_nll(summary["log_density"]), "rmse": rmse(y_test, summary["mean"]),
              "coverage95": coverage(y_test, summary["lower"], summary["upper"])}
    if "log_density_kde" in summary:
        # the latent DGP: the IWVI authors' public script's KDE estimate next to the supplement's E.3 one
        scores["nll_kde"] = mean_nll(summary["log_density_kde"])
    return scores


def evaluate_classification(est, x_test, y_test) -> dict:
    """Accuracy of the most probable class and NLL = -mean log p(y* | x*) from `predict_proba`."""
    proba = np.asarray(est.predict_proba(x_test), dtype=float)
    y = np.asarray(y_test, dtype=np.int64)
    p_true = np.clip(proba[np.arange(len(y)), y], 1e-300, None)
    from ..reporting.metrics import expected_calibration_error

    return {"accuracy": float(np.mean(proba.argmax(1) == y)), "nll": float(-np.mean(np.log(p_true))),
            "ece": expected_calibration_error(y, proba)}


#: where a run's in-flight fit states go by default: runs/bench/<name of its OUT folder>, under the current directory
STATE_ROOT = Path("runs") / "bench"


def add_engine_arguments(parser) -> None:
    """--device and --nproc (and the hidden flag of the processes --nproc starts)."""
    parser.add_argument("--device", default="cpu", help="where the fits run: cpu, or cuda (cuda:N) where torch "
                                                        "sees a GPU")
    parser.add_argument("--nproc", type=int, default=1,
                        help="train every fit data-parallel in this many processes on this machine (torch's "
                             "elastic launcher; with --device cuda one GPU per process); rows record it as "
                             "world_size")
    parser.add_argument("--launched-by-nproc", action="store_true", help=argparse.SUPPRESS)


def engine_world_size(args) -> int:
    """The processes each fit is split over: WORLD_SIZE under a launcher, else --nproc."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    return launched if launched > 1 else int(getattr(args, "nproc", 1))


def check_engine(args) -> None:
    """--device and --nproc checked before any work (ValueError naming the flag and the fix)."""
    from ..estimators.validation import check_device

    check_device(args.device, "--device")
    nproc = args.nproc
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"--nproc must be a positive integer, got {nproc!r}")
    if nproc > 1 and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("--nproc: this process is already one of several started by torchrun; drop --nproc")
    if engine_world_size(args) > 1 and getattr(args, "jobs", 1) > 1:
        raise ValueError("--jobs and --nproc cannot be combined: with --nproc every fit already uses the processes; "
                         "pass --jobs 1")
    if nproc > 1 and torch_device_type(args.device) == "cuda":
        import torch

        if torch.cuda.device_count() < nproc:
            raise ValueError(f"--nproc {nproc} with --device cuda needs {nproc} GPUs, this machine has "
                             f"{torch.cuda.device_count()}; use fewer processes or --device cpu")


def torch_device_type(name: str) -> str:
    import torch

    return torch.device(name).type


def launch_engine(argv, nproc: int) -> int:
    """Run `python -m flowgp <argv>` (a bench command line) in `nproc` processes, --nproc left out."""
    from ..training.distributed import launch

    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            out.append(a)
    return launch(out + ["--launched-by-nproc"], nproc)


def place_estimator(est, device: str):
    """`est` set to train on `device` (under a launcher a bare "cuda" is this process's GPU, cuda:LOCAL_RANK)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and device == "cuda":
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    if "device" in est.get_params():
        est.set_params(device=device)
    elif device != "cpu":
        raise ValueError(f"{type(est).__name__} cannot run on --device {device}")
    return est


def add_checkpoint_argument(parser) -> None:
    """`--no-checkpoints` and `--state-dir` of the subcommands whose fits resume from a checkpoint (module doc)."""
    parser.add_argument("--no-checkpoints", action="store_true",
                        help="do not save fits' training state (by default a fit interrupted mid-way continues "
                             "from its last checkpoint when the command is rerun)")
    parser.add_argument("--state-dir", default=None,
                        help="folder for the training state of fits in progress, removed fit by fit as their rows "
                             f"land (default: {STATE_ROOT}/<name of OUT> under the current directory)")


def state_folder(args) -> Path:
    """The folder of a run's in-flight fit states: `args.state_dir`, else runs/bench/<name of args.out>."""
    if getattr(args, "state_dir", None):
        return Path(args.state_dir)
    name = Path(args.out).resolve().name
    if not name:
        raise ValueError(f"--out {args.out!r} has no folder name to name its state folder by; give --state-dir")
    return STATE_ROOT / name


def checkpoint_file(folder, job: dict, key_fields, key_defaults=None) -> str:
    """Where the fit of `job` keeps its training state: <folder>/<its row key>.pt, `folder` being the run's
    `state_folder` (characters outside [A-Za-z0-9._-] of the key, e.g. a csv: dataset's path, replaced by '_'). A
    key field at its `key_defaults` value is left out of the name, so fits begun before the field was added keep
    their checkpoints."""
    key_defaults = key_defaults or {}
    key = "_".join(str(job.get(k)) for k in key_fields
                   if k not in key_defaults or job.get(k, key_defaults[k]) != key_defaults[k])
    return str(Path(folder) / (re.sub(r"[^A-Za-z0-9._-]+", "_", key) + ".pt"))


def _checkpoint_files(checkpoint: str) -> list:
    """The fit's files: every training stage's, `checkpoint` + suffix."""
    folder = Path(checkpoint).parent
    return list(folder.glob(Path(checkpoint).name + "*")) if folder.is_dir() else []


def _earlier_training_seconds(checkpoint: str) -> float:
    """The training seconds recorded in the fit's checkpoint files (all stages), 0 for an unreadable one."""
    from ..training.loop import checkpoint_training_seconds

    total = 0.0
    for path in _checkpoint_files(checkpoint):
        try:
            total += checkpoint_training_seconds(path)
        except (ValueError, OSError, RuntimeError, KeyError):
            pass  # damaged: the fit itself reports it (and starts afresh)
    return total


def _stale(err: Exception, checkpoint: str) -> bool:
    """Whether `err` says the fit's checkpoint cannot be continued: the training loop's and `safe_load`'s errors
    name the file (another budget, data size or optimiser set; unreadable or corrupted), `load_state_dict`'s name
    the state dict (another model layout)."""
    text = str(err)
    return str(Path(checkpoint).parent) in text or "state_dict" in text


def _remove_checkpoint(checkpoint: str) -> None:
    """The fit's files, and their folder once it is empty (with the default root's runs/bench and runs when those
    are empty too: a finished run leaves nothing behind)."""
    folder = Path(checkpoint).parent
    for path in _checkpoint_files(checkpoint):
        path.unlink(missing_ok=True)
    empty = [folder]
    if folder.parent == STATE_ROOT:
        empty += [STATE_ROOT, STATE_ROOT.parent]
    for path in empty:
        try:
            path.rmdir()
        except OSError:
            break  # other fits' files (parallel workers, interrupted rows), or other runs' folders, are still there


def fit_and_score(est, split, task: str = "regression", checkpoint: str | None = None, callback=None) -> dict:
    """Fit on the split's training part only (the estimators standardise on what they are fitted on, so no
    test statistics leak in), then score on its test part; adds train/predict wall seconds. `checkpoint`: a
    file for an estimator that takes one (a rerun's fit continues from the state an interrupted one left there),
    removed once the scores are in. `callback`: passed to `est.fit` (a `train` callback, e.g. a
    `flowgp.bench.learning_curve.CurveRecorder`), for estimators whose fit takes one."""
    fit_options = {} if callback is None else {"callback": callback}
    resumable = checkpoint is not None and "checkpoint" in inspect.signature(type(est)).parameters
    if resumable:
        est.checkpoint = checkpoint
    resuming = resumable and bool(_checkpoint_files(checkpoint))
    earlier = _earlier_training_seconds(checkpoint) if resuming else 0.0
    start = time.perf_counter()
    try:
        est.fit(split.x_train, split.y_train, **fit_options)
    except (ValueError, KeyError, RuntimeError) as err:
        if not (resuming and _stale(err, checkpoint)):
            raise  # the fit's own failure: a checkpoint stays for a rerun after the cause is fixed
        # a state written by other code (another budget or data, another model layout) or damaged cannot be
        # continued; the files are the bench's own scratch, so they go and the fit starts from the beginning
        print(f"bench: could not continue from {checkpoint} ({type(err).__name__}: {str(err)[:200]}); "
              "fitting from the start", file=sys.stderr)
        _remove_checkpoint(checkpoint)
        earlier = 0.0
        start = time.perf_counter()
        est.fit(split.x_train, split.y_train, **fit_options)
    train_seconds = time.perf_counter() - start
    start = time.perf_counter()
    if task == "classification":
        scores = evaluate_classification(est, split.x_test, split.y_test)
    else:
        scores = evaluate_regression(est, split.x_test, split.y_test)
    # a resumed fit's training time includes the loops of the processes before it (their checkpoint's count)
    row = {**scores, "train_seconds": train_seconds + earlier, "predict_seconds": time.perf_counter() - start}
    if resuming:
        row["resumed_train_seconds"] = earlier
    if task == "regression":
        objective = getattr(est, "objective", None)
        if isinstance(objective, str) and objective != "bound":
            # a training objective that is not a bound (the latent deep GP's "per-slot", the DREG authors'
            # objective): its final value under its own name, never as an ELBO
            row["objective"] = objective
            row["train_objective"] = float(est.training_objective(split.x_train, split.y_train))
        else:
            # the final training ELBO (units of y) and the target scale, which turns it into the ELBO of the
            # standardised targets that papers report (CNF-DGP Table I): elbo + n_train·log(y_scale)
            row["train_elbo"] = float(est.elbo(split.x_train, split.y_train))
        if getattr(est, "y_scale_", None) is not None:
            row["y_scale"] = float(est.y_scale_)
        # flow estimators fitted robustly carry the bound of the SVGP they were warm-started from:
        # the TGP row's training bound next to the SVGP's (same units)
        report = getattr(est, "fit_report_", None)
        if isinstance(report, dict) and report.get("svgp_bound") is not None:
            row["svgp_train_elbo"] = float(report["svgp_bound"]) * len(split.y_train)
    # deep GPs with the Gaussian-base flow: the strength the flow was kept at (0 = its DSVI base)
    strength = getattr(est, "flow_strength_", None)
    if isinstance(strength, dict):
        row["flow_strength"] = float(strength["selected"])
        row["flow_source"] = strength.get("source", "trained")
    if checkpoint is not None and _main_process():  # (in a data-parallel fit rank 0 owns the files)
        _remove_checkpoint(checkpoint)
    return row


def _main_process() -> bool:
    from ..training.distributed import current_world

    return current_world().is_main


_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def _end_now() -> None:
    # Kill this process outright (no cleanup: an orphaned worker has nothing left to report to).
    import signal

    os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))


def _watch_parent(parent_pid: int, interval: float) -> None:
    # Orphans are re-parented (to init or a subreaper), so a changed parent PID means the parent is gone.
    while os.getppid() == parent_pid:
        time.sleep(interval)
    _end_now()


def die_with_parent(parent_pid: int, poll_interval: float = 0.5) -> str:
    """Make this (worker) process end when process `parent_pid`, its parent, dies - even by SIGKILL, which
    the parent cannot pass on. Returns the mechanism used.

    Linux: prctl(PR_SET_PDEATHSIG, SIGKILL) through ctypes, so the kernel kills the worker when its parent
    goes ("pdeathsig"). Elsewhere (or if that call fails): a daemon thread polls `os.getppid()` every
    `poll_interval` seconds and exits when it changes ("poll"). Called as the pool's worker initializer."""
    if os.getppid() != parent_pid:  # the parent died before we got here
        _end_now()
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            import signal

            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0:
                if os.getppid() != parent_pid:  # it died between the check above and prctl
                    _end_now()
                return "pdeathsig"
        except (OSError, AttributeError):
            pass
    threading.Thread(target=_watch_parent, args=(parent_pid, poll_interval), daemon=True,
                     name="flowgp-die-with-parent").start()
    return "poll"


#: in a pool worker: the parent's event "interrupted, start no further job" (set by `_init_worker`)
_STOP = None


def _init_worker(parent_pid: int, stop=None) -> None:
    import signal

    global _STOP
    die_with_parent(parent_pid)
    limit_threads()
    _STOP = stop
    # a Ctrl-C reaches every process of the terminal's group: an idle worker ignores it (the parent stops the
    # pool) and a working one stops its job (`_call_in_worker`), so no worker prints a traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _call_in_worker(work, job):
    """`_call` in a pool worker: a Ctrl-C interrupts the job (a checkpointed fit saves its state first), and
    once the parent was interrupted no queued job starts."""
    import signal

    if _STOP is not None and _STOP.is_set():
        raise KeyboardInterrupt
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _call(work, job)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _stop_workers(futures, stop, grace: float = 2.0) -> None:
    """After a Ctrl-C in the parent: no further job starts (`stop`), and the running ones stop at their next step
    (a worker that got no Ctrl-C of its own, e.g. when only the parent was signalled, is sent one after `grace`
    seconds, time enough for one it did reach to finish its step and save it)."""
    import multiprocessing as mp
    import signal
    from concurrent.futures import wait

    stop.set()
    for fut in futures:
        fut.cancel()
    running = [f for f in futures if not f.done()]
    if running and wait(running, timeout=grace).not_done:
        for child in mp.active_children():
            try:
                os.kill(child.pid, signal.SIGINT)
            except OSError:
                pass  # it has just ended


def _call(work, job):
    limit_threads()
    try:
        return job, work(job), None
    except Exception as err:  # reported by the parent; the row is not written, so a rerun retries it
        return job, None, f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}"


def run_jobs(jobs, work, store, jobs_n: int = 1, desc: str = "bench", verbose: bool = True) -> int:
    """Run `work(job) -> row` for every job not yet in `store`; returns the number of failed jobs.

    `work` must be a module-level function (it is pickled to worker processes when jobs_n > 1).
    """
    from tqdm.auto import tqdm

    todo = [j for j in jobs if not store.is_done(j)]
    skipped = len(jobs) - len(todo)
    if verbose and skipped:
        print(f"{desc}: {skipped} of {len(jobs)} rows already in {store.path}, skipping them", file=sys.stderr)
    failures = 0
    err_path = None if store.path is None else store.path.with_suffix(".errors.jsonl")

    def _record(job, row, err):
        nonlocal failures
        if err is None:
            store.append(row)
            return
        failures += 1
        if err_path is None:  # a rank other than 0 of a data-parallel bench: rank 0 reports
            return
        print(f"{desc}: job {json.dumps(job)} failed: {err.splitlines()[0]}", file=sys.stderr)
        with open(err_path, "a") as fh:
            fh.write(json.dumps({**job, "error": err}) + "\n")

    bar = tqdm(total=len(todo), desc=desc, disable=not verbose)
    if jobs_n <= 1 or len(todo) <= 1:
        limit_threads()
        for job in todo:
            _record(*_call(work, job))
            bar.update()
    else:
        import multiprocessing as mp

        # Workers are started by this thread's submits (a replacement for a dead worker by the pool's manager
        # thread, which lives as long as the pool), so PR_SET_PDEATHSIG - it fires when the creating *thread*
        # ends - fires only when this process ends or the pool is done.
        context = mp.get_context("spawn")
        stop = context.Event()
        with ProcessPoolExecutor(max_workers=int(jobs_n), mp_context=context,
                                 initializer=_init_worker, initargs=(os.getpid(), stop)) as pool:
            futures = [pool.submit(_call_in_worker, work, job) for job in todo]
            try:
                for fut in as_completed(futures):
                    _record(*fut.result())
                    bar.update()
            except KeyboardInterrupt:
                _stop_workers(futures, stop)  # leaving the block then waits for them to end
                bar.close()
                raise
    bar.close()
    return failures


class _NoStore:
    """The store of a rank other than 0: it writes nothing (rank 0 writes every row)."""

    path = None

    def is_done(self, job) -> bool:
        return False

    def append(self, row) -> None:
        pass


def _engine_world(args):
    """The process group of a bench started by --nproc or torchrun (World(0, 1) otherwise)."""
    from ..training.distributed import World, init_from_env

    if not hasattr(args, "nproc"):
        return World()
    return init_from_env(args.device)


def _broadcast(jobs):
    """Rank 0's list of jobs, on every rank."""
    import torch

    box = [jobs]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


@contextlib.contextmanager
def engine_world(args):
    """The process group of a subcommand on the training engine for the block (joined from the environment of
    --nproc or torchrun; World(0, 1) in one process), left at its end.

    Args:
        args: the subcommand's parsed arguments (`--device` picks the backend).

    See Also:
        :func:`flowgp.bench.runner.engine_store`, :func:`flowgp.training.distributed.init_from_env`.
    """
    world = _engine_world(args)
    try:
        yield world
    finally:
        if world.distributed:
            from ..training.distributed import shutdown

            shutdown()


class EngineStore:
    """The rows of a subcommand that runs its own loop of fits on the training engine (`--device`, `--nproc`):
    rank 0's `ResultStore` answers `is_done` for every rank (its answer is broadcast, so that all ranks run the
    same fits in the same order, each fit split over them) and alone writes rows (`append` does nothing on the
    other ranks, whose `rows` are empty); `is_main` says whether this process writes the plots and tables too.

    Args:
        store: rank 0's ResultStore (None on the other ranks).
        world: the run's `flowgp.training.distributed.World`.

    See Also:
        :func:`flowgp.bench.runner.engine_store` (how a subcommand opens one).
    """

    def __init__(self, store, world):
        self.store, self.world = store, world

    @property
    def is_main(self) -> bool:
        return self.world.is_main

    @property
    def rows(self) -> list[dict]:
        return [] if self.store is None else self.store.rows

    def is_done(self, job: dict) -> bool:
        done = None if self.store is None else self.store.is_done(job)
        if self.world.distributed:
            import torch

            box = [done]
            torch.distributed.broadcast_object_list(box, src=0)
            done = box[0]
        return bool(done)

    def append(self, row: dict) -> None:
        if self.store is not None:
            self.store.append(row)


@contextlib.contextmanager
def engine_store(args, path, key_fields, key_defaults=None):
    """An `EngineStore` over `path` (a ResultStore keyed by `key_fields`, waiting for another writer with
    `--wait`, opened by rank 0 alone) inside the engine's process group (`engine_world`), for the block.

    Args:
        args: the subcommand's parsed arguments.
        path: the JSON-lines file of the rows.
        key_fields, key_defaults: as for :class:`flowgp.bench.results.ResultStore`.

    See Also:
        :func:`flowgp.bench.runner.run_suite` (the same for subcommands whose fits are independent jobs).
    """
    from .results import ResultStore

    with engine_world(args) as world:
        store = None
        try:
            if world.is_main:
                store = ResultStore(path, key_fields, wait=getattr(args, "wait", False), key_defaults=key_defaults)
            yield EngineStore(store, world)
        finally:
            if store is not None:
                store.close()


def run_suite(args, jobs, work, key_fields, name: str, report_hint: bool = True, key_defaults=None) -> int:
    """What a resumable bench subcommand's `run` does with its jobs: `run_jobs` into `<args.out>/<name>.jsonl`
    (a ResultStore keyed by `key_fields` with `key_defaults`, waiting for another writer with `--wait`), then say
    where the rows went (and, with `report_hint`, how to tabulate them); returns the exit code (1 if a job
    failed)."""
    from pathlib import Path

    from .results import ResultStore

    if not getattr(args, "no_checkpoints", True):  # a subcommand without the flag writes none
        folder = state_folder(args)
        for job in jobs:
            job.setdefault("checkpoint", checkpoint_file(folder, job, key_fields, key_defaults))
    world = _engine_world(args)
    try:
        if not world.is_main:  # the jobs rank 0 has still to do, then this rank's share of each fit
            failures = run_jobs(_broadcast(None), work, _NoStore(), 1, verbose=False)
            return 1 if failures else 0
        with ResultStore(Path(args.out) / f"{name}.jsonl", key_fields, wait=getattr(args, "wait", False),
                         key_defaults=key_defaults) as store:
            if world.distributed:
                _broadcast([j for j in jobs if not store.is_done(j)])
            failures = run_jobs(jobs, work, store, args.jobs, desc=f"bench {name}", verbose=not args.quiet)
    finally:
        if world.distributed:
            from ..training.distributed import shutdown

            shutdown()
    if not args.quiet:
        hint = f"; make tables with: flowgp bench report {args.out}" if report_hint else ""
        print(f"wrote {store.path} ({len(store)} rows){hint}", file=sys.stderr)
    return 1 if failures else 0
