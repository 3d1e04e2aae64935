"""The parts of the training loop on their own: run configuration, run state, early stop, interrupt guard,
auto-compile policy and stepper."""
import dataclasses
import math
import signal

import pytest
import torch

from flowgp.training.compile_policy import AutoCompile
from flowgp.training.compiled import AUTO_PROBE_STEPS
from flowgp.training.distributed import World
from flowgp.training.early_stop import EarlyStop, Plateau
from flowgp.training.interrupt import InterruptGuard, TrainingInterrupted
from flowgp.training.run_config import RunConfig
from flowgp.training.run_state import RunState
from flowgp.training.stepper import Optimisers, Stepper


def _config(**overrides):
    x = torch.zeros(40, 1, dtype=torch.float64)
    kwargs = dict(steps=None, optimizer=None, natural_gradient=None, schedule=None, early_stop=None, callback=None,
                  loss=None, generator=None, keep_best=False, nonfinite="raise", world=None, compile=False,
                  regulariser=None, extend_budget=False)
    kwargs.update(overrides)
    return RunConfig.from_arguments(x, x, 3, 10, 0.01, 0.25, 0, False, None, 100, "t", **kwargs)


def test_run_config_derives_the_budget_and_is_frozen():
    config = _config()
    assert (config.unit, config.budget, config.steps_per_epoch, config.total, config.frozen_steps) == \
        ("epochs", 3, 4, 12, 3)
    assert _config(steps=7).total == 7 and _config(steps=7).unit == "steps"
    assert _config(keep_best=True).best is not None and config.best is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.total = 5


@pytest.mark.parametrize("bad, error, match", [
    (dict(nonfinite="skip"), ValueError, "nonfinite"),
    (dict(compile="fast"), ValueError, "compile="),
    (dict(keep_best="yes"), TypeError, "keep_best"),
    (dict(regulariser=3), TypeError, "regulariser"),
    (dict(steps=-1), ValueError, "steps"),
])
def test_run_config_names_the_bad_argument(bad, error, match):
    with pytest.raises(error, match=match):
        _config(**bad)


def test_run_state_round_trips_through_its_checkpoint_entries():
    state = RunState(history=[3.0, 2.5], step=7, epoch_sum=1.25, epoch_count=3,
                     early_stop={"best": 2.5, "window_best": 3.0}, initial_lrs=[[0.01, 0.02]], earlier_seconds=4.0)
    entries = state.to_dict(finished=True)
    assert entries["training_seconds"] >= 4.0
    back = RunState.from_dict(entries)
    for name in ("history", "step", "epoch_sum", "epoch_count", "early_stop", "initial_lrs"):
        assert getattr(back, name) == getattr(state, name), name
    assert back.finished is True and RunState.from_dict(entries, extending=True).finished is False
    del entries["training_seconds"]  # files written before the count was kept
    assert RunState.from_dict(entries).earlier_seconds == 0.0


def test_plateau_stops_on_a_flat_window_and_at_the_absolute_tolerance():
    stop = Plateau(EarlyStop(window=2, rel_tol=0.1), {"best": math.inf, "window_best": math.inf})
    assert [stop(i, v) for i, v in enumerate([10.0, 9.0, 8.95, 8.9])] == [False, False, False, True]
    assert Plateau(EarlyStop(window=None, abs_tol=1.0), {"best": math.inf, "window_best": math.inf})(0, 0.5)
    assert not Plateau(None, {"best": math.inf, "window_best": math.inf})(0, -1e9)


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


def test_auto_compile_compiles_when_it_pays_off_and_goes_back_when_not_faster():
    tracked = [torch.zeros(1)]
    eager, compiled, reports = object(), object(), []
    policy = AutoCompile(True, 0, eager, tracked, None, World(), reports.append, 1000, lambda step: False,
                         compiler=lambda *a, **k: compiled, pays_off=lambda *a, **k: (True, "pays"))
    step = 0
    while policy.timing and step < AUTO_PROBE_STEPS:
        policy.record(1.0)
        step += 1
        switched = policy.after_step(step)
    assert switched is compiled and policy.timing  # now the compiled steps are timed
    for _ in range(AUTO_PROBE_STEPS):
        policy.record(2.0)  # slower than eager
        step += 1
        switched = policy.after_step(step)
    assert switched is eager and not policy.timing and reports[0] == "pays" and "back to eager" in reports[1]


def test_stepper_backs_off_a_non_finite_step():
    w = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    adam = torch.optim.Adam([w], lr=0.1)
    values = iter([math.nan, 2.0])

    def objective(batch):
        return (w - 3.0).square().sum() * next(values)

    stepper = Stepper(objective, Optimisers([w], adam, None, [adam], []), None, True, World(), [[0.1]], 1)
    assert stepper.step(None, 0) == (math.inf, False)
    assert w.item() == 1.0 and adam.param_groups[0]["lr"] == 0.05
    value, taken = stepper.step(None, 1)
    assert taken and value == 8.0 and w.item() != 1.0
    raising = Stepper(lambda batch: w.sum() * math.nan, Optimisers([w], adam, None, [adam], []), None, False,
                      World(), [[0.1]], 1)
    with pytest.raises(FloatingPointError, match="nonfinite='backoff'"):
        raising.step(None, 0)
