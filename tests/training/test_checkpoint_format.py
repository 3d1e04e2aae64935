"""Checkpoints written by an earlier release of the training loop still resume on the same trajectory.

tests/data/training_checkpoint/svgp_step12.pt was written by `train` (format version 1) for the run `RUN` below,
stopped by Ctrl-C after step `STOP_AT`; svgp_uninterrupted.pt holds the history and parameters of the same run
taken without interruption by that release.
"""
import shutil
from pathlib import Path

import pytest
import torch

from flowgp.gp.kernels import make_kernel
from flowgp.gp.likelihoods import GaussianLikelihood
from flowgp.models import SVGP
from flowgp.training.checkpoint import safe_load
from flowgp.training.loop import train

DATA = Path(__file__).resolve().parents[1] / "data" / "training_checkpoint"
RUN = dict(steps=20, batch_size=10, lr=0.02, seed=3, verbose=False, checkpoint_every=5, keep_best=True,
           fix_noise_fraction=0.25)
STOP_AT = 12

pytestmark = pytest.mark.usefixtures("float64_default")


def problem():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(40, 1, generator=g, dtype=torch.float64) * 6 - 3
    y = torch.sin(2 * x) + 0.1 * torch.randn(40, 1, generator=g, dtype=torch.float64)
    return x, y


def model(x):
    return SVGP(make_kernel("rbf", 1), x[:5].clone(), GaussianLikelihood(0.5))


def test_a_checkpoint_written_by_the_earlier_loop_resumes_on_the_same_trajectory(tmp_path):
    x, y = problem()
    path = tmp_path / "run.pt"
    shutil.copyfile(DATA / "svgp_step12.pt", path)
    assert int(safe_load(path)["step"]) == STOP_AT
    resumed = model(x)
    history = train(resumed, x, y, checkpoint_path=path, **RUN)
    reference = torch.load(DATA / "svgp_uninterrupted.pt", weights_only=True)
    assert history == reference["history"]
    for name, value in resumed.state_dict().items():
        assert torch.equal(value, reference["state"][name]), name
    assert safe_load(path)["finished"] is True
