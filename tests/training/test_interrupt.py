"""InterruptGuard: Ctrl-C is held until the step boundary, a second one interrupts at once, the handler is restored."""
import signal

import pytest

from flowgp.training.interrupt import InterruptGuard, TrainingInterrupted


def test_interrupt_guard_holds_sigint_until_the_boundary_and_restores_the_handler():
    before = signal.getsignal(signal.SIGINT)
    with InterruptGuard(hold=True) as guard:
        handler = signal.getsignal(signal.SIGINT)
        assert handler is not before
        guard.boundary = False
        handler(signal.SIGINT, None)  # held: the step finishes first
        assert guard.requested
        with pytest.raises(KeyboardInterrupt):
            handler(signal.SIGINT, None)  # a second Ctrl-C interrupts at once
        saved = []
        guard.boundary = True
        with pytest.raises(TrainingInterrupted, match="step 4; state saved to f.pt"):
            guard.stop(KeyboardInterrupt(), 4, lambda: saved.append(True), "f.pt")
        assert saved == [True]
    assert signal.getsignal(signal.SIGINT) is before
