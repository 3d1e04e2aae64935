"""The run configuration: the budget derived once from the arguments, frozen, and each bad argument named."""
import dataclasses

import pytest
import torch

from flowgp.training.run_config import RunConfig


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
