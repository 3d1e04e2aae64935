"""InterruptGuard: Ctrl-C is held until the step boundary, a second one interrupts at once, the handler is restored.

Ctrl-C in a data-parallel run: the ranks stop together. The launcher passes a SIGINT on to each rank at its
own moment; here only rank 1 gets one (at step 3). Both ranks must leave `train` after the same step, as
TrainingInterrupted, with one checkpoint saved, and promptly (a rank leaving alone would leave the other
waiting in the next step's collective until the process group's timeout)."""
import datetime
import os
import signal
import tempfile
import time

import numpy as np
import pytest
import torch

from flowgp.training.interrupt import InterruptGuard
from flowgp.build import SparseGPConfig, build
from flowgp.training.loop import TrainingInterrupted, train


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


TIMEOUT = 20  # seconds of the process group's collectives: what a rank left alone would wait


def _fit(checkpoint):
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.uniform(-2, 2, (64, 2)))
    y = torch.sin(x[:, :1]) + 0.1 * torch.as_tensor(rng.standard_normal((64, 1)))
    model = build(SparseGPConfig(num_inducing=5, kmeans_restarts=1), x, y, generator=torch.Generator().manual_seed(0))
    rank = torch.distributed.get_rank()

    def interrupt(step, loss, model):
        if rank == 1 and step == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return False

    try:
        train(model, x, y, steps=200, batch_size=16, callback=interrupt, checkpoint_path=checkpoint, verbose=False)
    except TrainingInterrupted as err:
        return err.step, err.checkpoint
    return None, None


def _worker(rank, size, init_file, out_dir):
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=size,
                                         timeout=datetime.timedelta(seconds=TIMEOUT))
    try:
        outcome = _fit(os.path.join(out_dir, "ckpt.pt"))
        torch.save(outcome, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        torch.distributed.destroy_process_group()


def test_a_ctrl_c_on_one_rank_stops_every_rank_after_the_same_step():
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        context = torch.multiprocessing.start_processes(_worker, args=(2, os.path.join(tmp, "init"), tmp),
                                                        nprocs=2, join=False, start_method="fork")
        try:
            while not context.join(timeout=1):
                pass
        except Exception:
            pass  # a rank that failed: its missing result fails the test below
        seconds = time.perf_counter() - started
        outcomes = [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False)
                    if os.path.exists(os.path.join(tmp, f"rank{r}.pt")) else None for r in range(2)]
        saved = torch.load(os.path.join(tmp, "ckpt.pt"), weights_only=False) if os.path.exists(
            os.path.join(tmp, "ckpt.pt")) else None
    assert outcomes[0] is not None and outcomes[1] is not None, outcomes
    (step0, path0), (step1, path1) = outcomes
    assert step0 == step1 == 5, outcomes  # rank 1 asked during step 4's reduction (after step 3): both stop after it
    assert path0 is not None and path0 == path1 and saved is not None
    assert seconds < TIMEOUT, f"the ranks took {seconds:.1f} s to stop"
