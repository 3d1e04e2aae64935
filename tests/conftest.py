import numpy as np
import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    np.random.seed(0)
    yield


@pytest.fixture(autouse=True)
def _bench_state_in_tmp(request):
    """The bench keeps fits' training state under runs/bench/ of the current directory by default: a bench test
    runs in its own tmp_path, so no state lands in the working tree (subprocesses inherit the directory)."""
    if request.path.parent.name == "bench":  # tests/bench/, the tests of flowgp.bench
        request.getfixturevalue("monkeypatch").chdir(request.getfixturevalue("tmp_path"))
    yield


@pytest.fixture
def float64_default():
    """Build parameters in float64 for this test, then restore the global default."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)

