"""Exact across world sizes: with the global batch cut into fixed parts (`World.parts`, FLOWGP_REDUCE_PARTS), two
processes train every regression estimator's default fit, and the multi-output (AMO-GP) estimator's, to the model
one process trains.

Without the parts the two runs differ by the rounding of their sums (one rank adds B rows, two ranks B/2 each),
which the robust TGP fit's L-BFGS refinement amplifies: on this data the 1- and 2-process TGP predictions then
differ by 1e-2 (relative)."""
import os
import tempfile

import numpy as np
import pytest
import torch

from flowgp.estimators import (AlignedMultiOutputGPRegressor, DeepGPRegressor, LatentDeepGPRegressor,
                               SVGPRegressor, TGPRegressor, WarpedGPRegressor)
from flowgp.training.distributed import PARTS_VARIABLE, World

PARTS = 2
SMALL = dict(num_inducing=20, epochs=3, batch_size=128, seed=0, verbose=False, kmeans_restarts=1)
ESTIMATORS = {
    "svgp": lambda: SVGPRegressor(**SMALL),
    "tgp": lambda: TGPRegressor(**SMALL),
    "wgp": lambda: WarpedGPRegressor(**SMALL),
    "deep": lambda: DeepGPRegressor(layers=2, num_samples_predict=8, **SMALL),
    "latent": lambda: LatentDeepGPRegressor(num_samples_predict=16, **SMALL),
}


def _data(n=512, seed=2):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, size=(n, 2))
    return x, np.sin(x[:, 0]) + 0.1 * rng.standard_normal(n)


def _predictions():
    x, y = _data()
    grid = np.linspace(-2, 2, 7)[:, None].repeat(2, 1)
    return {name: make().fit(x, y).predict(grid) for name, make in ESTIMATORS.items()}


def _series(n=40, seed=1):
    """Two series on their own inputs, the second shifted: (x [2n, 1], y [2n], output [2n])."""
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0, 5, (2, n)), axis=1)
    y = np.concatenate([np.sin(t[0]), np.sin(t[1] - 0.4)]) + 0.05 * rng.standard_normal(2 * n)
    return t.reshape(-1, 1), y, np.repeat([0, 1], n)


def _multioutput_predictions():
    """The AMO-GP default fit (alignment and warping GPs, natural-gradient steps on the CP layer, the full batch
    with the best point kept) and a minibatch fit, small: both series' predictions on a grid."""
    x, y, output = _series()
    grid = np.linspace(0, 5, 7)[:, None]
    small = dict(num_inducing=6, num_inducing_alignment=4, num_inducing_warping=4, epochs=20, num_samples=5,
                 verbose=False)
    out = {}
    for name, batch_size in (("full batch", "auto"), ("minibatch", 32)):
        est = AlignedMultiOutputGPRegressor(batch_size=batch_size, **small).fit(x, y, output)
        out[name] = np.concatenate([est.predict(grid, np.full(7, d)) for d in (0, 1)])
    return out


def _worker(rank, size, init_file, out_dir, predictions=_predictions):
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=size)
    try:
        torch.save(predictions(), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        torch.distributed.destroy_process_group()


def _one_and_two_processes(monkeypatch, predictions):
    """(predictions of one process, [those of each of two ranks]) with PARTS fixed parts."""
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    monkeypatch.setenv(PARTS_VARIABLE, str(PARTS))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers' count: a reduction's order may depend on it
    try:
        single = predictions()
    finally:
        torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        torch.multiprocessing.start_processes(_worker, args=(2, os.path.join(tmp, "init"), tmp, predictions),
                                              nprocs=2, join=True, start_method="fork")
        ranks = [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(2)]
    return single, ranks


def test_parts_must_be_a_multiple_of_the_world_size():
    with pytest.raises(ValueError, match="multiple of the world size"):
        World(0, 2, parts=3)
    assert World(1, 2, parts=4).local_parts == 2 and World().local_parts == 1


def _assert_ranks_equal_one_process(single, ranks, label=""):
    """Every rank's predictions equal the one-process fit's to 1e-6 (relative to the largest)."""
    for name, a in single.items():
        for b in ranks:
            err = np.max(np.abs(a - b[name])) / np.max(np.abs(a))
            assert err <= 1e-6, f"{label}{name}: 1 and 2 processes differ by {err:.3g} (relative)"


def test_two_processes_fit_what_one_fits_with_fixed_parts(monkeypatch):
    _assert_ranks_equal_one_process(*_one_and_two_processes(monkeypatch, _predictions))


def test_two_processes_fit_the_multi_output_model_one_fits_with_fixed_parts(monkeypatch):
    _assert_ranks_equal_one_process(*_one_and_two_processes(monkeypatch, _multioutput_predictions), "AMO-GP ")
