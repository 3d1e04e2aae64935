import numpy as np
import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    np.random.seed(0)
    yield


@pytest.fixture
def bench_state_in_tmp(monkeypatch, tmp_path):
    """The bench keeps fits' training state under runs/bench/ of the current directory by default: a bench test
    that runs bench commands uses it (`pytestmark = pytest.mark.usefixtures("bench_state_in_tmp")`) to run in its
    own tmp_path, so no state lands in the working tree (subprocesses inherit the directory)."""
    monkeypatch.chdir(tmp_path)
    yield


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped without one)")


@pytest.fixture
def float64_default():
    """Build parameters in float64 for this test, then restore the global default."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)

