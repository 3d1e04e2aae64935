"""Ctrl-C during `flowgp.training.loop.train`: while a checkpointed run is in the main thread, a first SIGINT is held
until the current step is done (then the state is saved and the run stops); a second one interrupts at once,
without saving. The interruption leaves `train` as a `TrainingInterrupted`.

A data-parallel run (`shared`) holds the first SIGINT whether or not it is checkpointed, and also at a step
boundary: the launcher passes a Ctrl-C on to every rank, each at its own moment, and a rank leaving on its own
would leave the others waiting in a collective (until torch's launcher kills them, ~30 s later). The ranks
instead send their `requested` flag with the step's gradient reduction and stop together after the step in which
any of them asked (`flowgp.training.stepper.Stepper.stop_agreed`), rank 0 saving one consistent checkpoint."""
from __future__ import annotations

import signal
import threading

__all__ = ["TrainingInterrupted", "InterruptGuard"]


class TrainingInterrupted(KeyboardInterrupt):
    """A KeyboardInterrupt (Ctrl-C) that stopped `train`: `step` is the number of steps completed, `checkpoint`
    the file that holds the state a rerun resumes from (None: nothing was saved)."""

    def __init__(self, step: int, checkpoint=None):
        super().__init__(f"interrupted at step {step}" + (f"; state saved to {checkpoint}" if checkpoint else ""))
        self.step = int(step)
        self.checkpoint = None if checkpoint is None else str(checkpoint)

    def __reduce__(self):  # rebuilt from (step, checkpoint), e.g. when a bench worker hands it to its parent
        return type(self), (self.step, self.checkpoint)


class InterruptGuard:
    """A context in which SIGINT is held until a step boundary when `hold` (a run with a checkpoint) and this is
    the main thread. The loop clears `boundary` when a step's state starts being torn and sets it when the
    step's bookkeeping is done; `requested` says a held Ctrl-C is waiting."""

    def __init__(self, hold: bool, shared: bool = False):
        self.requested = False
        self.boundary = True
        self.shared = shared
        self._hold = (hold or shared) and threading.current_thread() is threading.main_thread()
        self._previous = None

    def _handler(self, signum, frame):
        if self.requested or (self.boundary and not self.shared):
            raise KeyboardInterrupt
        self.requested = True  # finish the step, save, then stop

    def __enter__(self):
        if self._hold:
            self._previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
        return False

    def stop(self, err: KeyboardInterrupt, step: int, save, path):
        """Leave the run for the interruption `err` after `step` steps: save (`save()`) at a step boundary and
        raise TrainingInterrupted naming the file (one from a nested loop is raised as it is)."""
        saved = self.boundary and path is not None
        if self.boundary:
            save()
        if isinstance(err, TrainingInterrupted):  # from a nested loop (e.g. a callback's): already reported
            raise err
        raise TrainingInterrupted(step, path if saved else None).with_traceback(err.__traceback__) from None
