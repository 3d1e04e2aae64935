"""Learning curves of the bench: a fit's held-out scores as it trains, one JSON line per point.

`CurveRecorder` is a `flowgp.training.loop.train` callback (handed to the estimator's `fit(..., callback=...)`):
every `every` training steps, and after the last one, it scores the model with the caller's `evaluate()` (e.g.
accuracy, NLL and ECE on a fixed test subset, `stratified_subset`) and appends one line to a JSON-lines file:
the fit's key fields, the step, the epoch, the scores, the mean training objective per point since the previous
point, the training seconds so far and the seconds the evaluation took.

- The fit is the one it would be without the recorder: the evaluation runs without gradients and with the model in
  eval mode, then the model's training mode and torch's (CPU and initialised CUDA) and NumPy's global random
  states are restored; the training loop's own generators are never touched.
- The clock (`train_seconds`) runs from the recorder's construction (just before the fit) and leaves out every
  evaluation: the fit's wall seconds, summed over the processes that continued it, each up to its last checkpoint
  (the count is part of the recorder's state, which the training loop keeps in its checkpoints).
- Interruption and resume: a point is written before the checkpoint of the same step, and a checkpoint saved
  while a point's evaluation was cut short (Ctrl-C) first completes that point. A fit that continues from step s
  (its first call in a process is after step s + 1) drops the points of the same fit (same key fields) at steps
  after s from the file: those are the points that an interrupted process wrote after its last checkpoint, and
  the resumed fit writes them again on the same trajectory. So the curve holds each step once, and none is skipped.
- Several processes (bench workers) may write one file: every change holds an exclusive lock on `<file>.lock`,
  appends are one write of a whole line, rewrites are atomic (a temporary file renamed over it), and a torn last
  line is cut off before the next append.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from .results import lock_path, read_rows

try:  # POSIX advisory locks (released by the kernel with the process)
    import fcntl
except ImportError:  # pragma: no cover - Windows: one writer per file is then the caller's duty
    fcntl = None

__all__ = ["CurveRecorder", "stratified_subset", "drop_points_after", "append_point", "positive_steps"]


def positive_steps(value, option: str, allow_zero: bool = False) -> int:
    """`value` (an int or its text) as a positive number of steps, or 0 where `allow_zero`; a ValueError naming
    `option` and what it takes otherwise (negative, fractional, not a number, a bool).

    Args:
        value: the value given (int, or the command line's text).
        option: its name in the message, e.g. "--curve-every".
        allow_zero: whether 0 (off) is allowed.

    See Also:
        :class:`flowgp.bench.learning_curve.CurveRecorder`.
    """
    text = str(value).strip()
    least = 0 if allow_zero else 1
    try:
        if isinstance(value, bool):
            raise ValueError
        number = int(text)
    except ValueError:
        number = None
    if number is None or number < least:
        what = "a non-negative whole number of steps (0: off)" if allow_zero else "a positive whole number"
        raise ValueError(f"{option} must be {what}, got {value!r}")
    return number


def stratified_subset(labels, size: int, seed: int = 0) -> np.ndarray:
    """Indices (sorted) of a seeded subset of `size` rows with each class in its share of `labels` (largest
    remainders; every row when `size` >= len(labels)): the same subset for every model and seed of a run.

    Args:
        labels: class labels [n].
        size: rows to keep (a positive integer).
        seed: seed of the draw within each class.

    Examples:
        >>> from flowgp.bench.learning_curve import stratified_subset
        >>> stratified_subset([0, 0, 0, 0, 1, 1, 1, 1], 4).tolist()
        [0, 2, 6, 7]
    """
    labels = np.asarray(labels)
    size = positive_steps(size, "size")
    if size >= len(labels):
        return np.arange(len(labels))
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    share = counts * size / len(labels)
    take = np.floor(share).astype(int)
    order = np.argsort(-(share - take), kind="stable")  # the largest remainders get the rows left over
    take[order[: size - take.sum()]] += 1
    rng = np.random.default_rng(seed)
    chosen = [rng.permutation(np.flatnonzero(inverse == c))[:k] for c, k in enumerate(take)]
    return np.sort(np.concatenate(chosen))


@contextlib.contextmanager
def _locked(path: Path):
    """Hold the exclusive lock `<path>.lock` (blocking) for one change of the file."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (drops the lock)


def _same_fit(row: dict, key: dict) -> bool:
    return all(row.get(k) == v for k, v in key.items())


def drop_points_after(path, key: dict, step: int) -> int:
    """Remove from the curve file `path` the points of the fit `key` (rows whose key fields equal it) at steps
    after `step`, and malformed lines; returns how many points went (the file is rewritten only if any did).

    Args:
        path: the curve's JSON-lines file (nothing happens if it does not exist).
        key: the fit's key fields, e.g. {"dataset": ..., "model": ..., "seed": ...}.
        step: the step the fit continues from.

    See Also:
        :class:`flowgp.bench.learning_curve.CurveRecorder` (which calls it when a fit continues).
    """
    path = Path(path)
    if not path.exists():
        return 0
    with _locked(path):
        lines = path.read_bytes().split(b"\n")
        keep, dropped, damaged = [], 0, False
        for raw in lines:
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                damaged = True
                continue
            if isinstance(row, dict) and _same_fit(row, key) and int(row.get("step", 0)) > step:
                dropped += 1
                continue
            keep.append(raw)
        if dropped or damaged:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                fh.write(b"".join(line + b"\n" for line in keep))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
    return dropped


def append_point(path, row: dict) -> None:
    """Append `row` to the curve file `path` as one JSON line (one write, then fsync), after cutting off a torn
    last line that an interrupted writer left.

    Args:
        path: the curve's JSON-lines file (created, with its folder, if missing).
        row: the point (JSON-serialisable values).

    See Also:
        :func:`flowgp.bench.learning_curve.drop_points_after`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(row, sort_keys=False) + "\n").encode("utf-8")
    with _locked(path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = os.pread(fd, size, 0)
                os.ftruncate(fd, data.rfind(b"\n") + 1)
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)


class CurveRecorder:
    """A `train` callback that writes a learning curve (module doc): every `every` steps and after step `total`,
    `evaluate()` scores the model and a point is appended to `path`.

    Args:
        path: the curve's JSON-lines file (shared by the fits of a run).
        key: the fit's key fields, written in every point; the points of this fit are the rows that match them.
        evaluate: evaluate() -> dict of scores of the model as it is now (called without gradients, with the
            model in eval mode).
        every: steps between two points (a positive integer).
        total: the fit's number of training steps (its last point is written after it).
        steps_per_epoch: training steps per pass over the data (for the points' `epoch`).
        num_data: training rows N: `train_objective` is the mean of -loss / N (the bound per point, for a loss that
            is the negative bound) over the steps since the previous point; None: no `train_objective`.
        extra: further fields written in every point (settings of the evaluation, e.g. the test subset's size).

    Attributes:
        eval_seconds: seconds spent evaluating, in every process that continued the fit (up to its checkpoint).

    See Also:
        :func:`flowgp.bench.learning_curve.stratified_subset`, :meth:`flowgp.DeepGPClassifier.fit`.

    Examples:
        >>> import numpy as np, tempfile, os
        >>> from flowgp import DeepGPClassifier
        >>> from flowgp.bench.learning_curve import CurveRecorder
        >>> from flowgp.bench.results import read_rows
        >>> X = np.random.default_rng(0).normal(size=(60, 2)); y = (X[:, 0] > 0).astype(int)
        >>> est = DeepGPClassifier(layers=2, num_inducing=8, batch_size=20, epochs=2, verbose=False)
        >>> path = os.path.join(tempfile.mkdtemp(), "curve.jsonl")
        >>> curve = CurveRecorder(path, {"model": "dgp2"}, lambda: {"accuracy": est.score(X, y)}, every=4,
        ...                       total=6, steps_per_epoch=3)
        >>> _ = est.fit(X, y, callback=curve)
        >>> [row["step"] for row in read_rows(path)]
        [4, 6]
    """

    def __init__(self, path, key: dict, evaluate, *, every: int, total: int, steps_per_epoch: int,
                 num_data: int | None = None, extra: dict | None = None):
        self.path = Path(path)
        self.key = dict(key)
        self.evaluate = evaluate
        self.every = positive_steps(every, "every")
        self.total = positive_steps(total, "total")
        self.steps_per_epoch = positive_steps(steps_per_epoch, "steps_per_epoch")
        self.num_data = None if num_data is None else positive_steps(num_data, "num_data")
        self.extra = dict(extra or {})
        self._start = time.perf_counter()
        self._earlier = 0.0  # training seconds of the processes before this one (restored from the checkpoint)
        self._earlier_eval = 0.0
        self._eval = 0.0  # this process's evaluation seconds
        self._objective = [0.0, 0]  # sum and count of -loss / N since the previous point
        self._seen = None  # steps done at this process's last call (None: no call yet)
        self._written = None  # step of the last point this process wrote
        self._model = None

    @property
    def eval_seconds(self) -> float:
        return self._earlier_eval + self._eval

    def train_seconds(self) -> float:
        """The fit's training seconds so far (module doc: evaluations left out)."""
        return self._earlier + time.perf_counter() - self._start - self._eval

    def __call__(self, step, loss, model):
        done = int(step) + 1
        if self._seen is None:  # the first step of this process: it continues from `step`
            drop_points_after(self.path, self.key, int(step))
        self._seen, self._model = done, model
        if self.num_data is not None and math.isfinite(float(loss)):
            self._objective[0] -= float(loss) / self.num_data
            self._objective[1] += 1
        if done % self.every == 0 or done == self.total:
            self._record(done, model)
        return False

    def _record(self, done: int, model) -> None:
        seconds = self.train_seconds()
        started = time.perf_counter()
        scores = self._score(model)
        scored = time.perf_counter()
        total, count = self._objective
        try:
            append_point(self.path, {
                **self.key, **self.extra, "step": done, "steps_total": self.total,
                "epoch": done / self.steps_per_epoch, **scores,
                "train_objective": total / count if count else None,
                "train_seconds": seconds, "eval_seconds": scored - started})
        finally:
            self._eval += time.perf_counter() - scored  # (writing the point is not training either)
        self._objective = [0.0, 0]
        self._written = done

    def _score(self, model) -> dict:
        """evaluate() without gradients in eval mode; the model's mode and the global random states restored."""
        was_training = model.training
        cpu_state, numpy_state = torch.get_rng_state(), np.random.get_state()
        cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        started = time.perf_counter()
        try:
            model.eval()
            with torch.no_grad():
                return {k: float(v) for k, v in self.evaluate().items()}
        finally:
            model.train(was_training)
            torch.set_rng_state(cpu_state)
            np.random.set_state(numpy_state)
            if cuda_states is not None:
                torch.cuda.set_rng_state_all(cuda_states)
            self._eval += time.perf_counter() - started  # (an evaluation cut short is not training either)

    def state_dict(self) -> dict:
        """The clock and the running objective, for the training checkpoint; a point due at the checkpoint's step
        whose evaluation an interruption cut short is written first (so that no point is skipped on resume)."""
        due = self._seen is not None and (self._seen % self.every == 0 or self._seen == self.total)
        if due and self._written != self._seen:
            self._record(self._seen, self._model)
        return {"train_seconds": self.train_seconds(), "eval_seconds": self.eval_seconds,
                "objective_sum": self._objective[0], "objective_count": self._objective[1]}

    def load_state_dict(self, state) -> None:
        """Continue the clock and the running objective of the checkpoint's state."""
        self._earlier = float(state["train_seconds"])
        self._earlier_eval = float(state["eval_seconds"])
        self._objective = [float(state["objective_sum"]), int(state["objective_count"])]
