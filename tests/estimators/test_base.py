"""The `shard_reads` parameter of the streaming estimators (`flowgp.estimators.base.Estimator.fit_stream`): how the
processes of a data-parallel run read a streamed table. "auto" (default) and True shard the reading, False is exact
mode; the `fit_stream(shard_reads=...)` keyword wins over the parameter; bad values are refused before the table is
opened; `save` records the parameter, and files saved before it existed load with "auto", the behaviour they had."""
import os
import tempfile
import warnings

import numpy as np
import pytest
import torch

import flowgp
from flowgp.compat import SavedFileUpgradeWarning
from flowgp.estimators import AlignedMultiOutputGPRegressor, SVGPRegressor
from flowgp.estimators.validation import InvalidParameterError
from flowgp.training.checkpoint import atomic_save, safe_load

SMALL = dict(num_inducing=6, epochs=4, batch_size=16, lr=0.03, verbose=False, kmeans_restarts=1, seed=2)


def _table(folder, n=96, seed=0):
    """A .npy table [x0, x1, y] of n rows; returns its path."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, (n, 2))
    path = os.path.join(folder, "table.npy")
    np.save(path, np.column_stack([x, np.sin(x[:, 0]) + 0.1 * rng.standard_normal(n)]))
    return path


def test_the_keyword_wins_over_the_parameter_and_auto_shards():
    for param, keyword, expected in [("auto", None, True), (True, None, True), (False, None, False),
                                     (False, True, True), ("auto", False, False), (np.bool_(False), None, False)]:
        assert SVGPRegressor(shard_reads=param).resolved_shard_reads(keyword) is expected, (param, keyword)
    with pytest.raises(TypeError, match="shard_reads must be True, False or None"):
        SVGPRegressor().resolved_shard_reads("no")


@pytest.mark.parametrize("make", [lambda **kw: SVGPRegressor(**SMALL, **kw),
                                  lambda **kw: AlignedMultiOutputGPRegressor(epochs=2, verbose=False, **kw)],
                         ids=["svgp", "amogp"])
def test_a_bad_shard_reads_is_refused_before_the_table_is_opened(make, tmp_path):
    missing = tmp_path / "absent.npy"  # opening it would be a FileNotFoundError: the check must come first
    options = {"output": 1} if "Aligned" in type(make()).__name__ else {}
    est = make(shard_reads="no")
    with pytest.raises(InvalidParameterError, match="^shard_reads must be 'auto'"):
        est.fit_stream(missing, 2, **options)
    with pytest.raises(TypeError, match="^shard_reads must be True, False or None"):
        make().fit_stream(missing, 2, shard_reads=1, **options)
    assert not hasattr(est, "model_")


def test_save_records_shard_reads_and_older_files_load_with_auto(tmp_path):
    est = SVGPRegressor(**SMALL, shard_reads=False).fit_stream(_table(str(tmp_path)), 2)
    assert est.get_params()["shard_reads"] is False
    x = np.linspace(-2, 2, 5)[:, None].repeat(2, 1)
    path = est.save(tmp_path / "model.pt")
    assert safe_load(path)["params"]["shard_reads"] is False
    loaded = flowgp.load(path)
    assert loaded.shard_reads is False
    np.testing.assert_array_equal(loaded.predict(x), est.predict(x))
    # a file written before the parameter existed: same format version, no entry
    state = safe_load(path)
    del state["params"]["shard_reads"]
    atomic_save(state, tmp_path / "old.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("error", SavedFileUpgradeWarning)  # nothing to upgrade: "auto" is what it did
        old = flowgp.load(tmp_path / "old.pt")
    assert old.shard_reads == "auto"
    np.testing.assert_array_equal(old.predict(x), est.predict(x))


def _fits(path):
    """The models fitted on the table by the parameter (False, "auto") and by the keyword over the parameter."""
    fits = {"parameter False": SVGPRegressor(**SMALL, shard_reads=False).fit_stream(path, 2),
            "parameter auto": SVGPRegressor(**SMALL).fit_stream(path, 2),
            "keyword True over parameter False": SVGPRegressor(**SMALL, shard_reads=False).fit_stream(
                path, 2, shard_reads=True)}
    return {name: {k: v.detach().clone() for k, v in est.model_.state_dict().items()} for name, est in fits.items()}


def _worker(rank, size, init_file, path, out_dir):
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=size)
    try:
        torch.save(_fits(path), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        torch.distributed.destroy_process_group()


def _difference(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-12)) for k in a)


def test_with_two_processes_the_parameter_decides_the_reading_and_the_keyword_wins():
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    with tempfile.TemporaryDirectory() as tmp:
        path = _table(tmp)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            single = _fits(path)["parameter auto"]  # one process: every choice reads the whole table
        finally:
            torch.set_num_threads(threads)
        torch.multiprocessing.start_processes(_worker, args=(2, os.path.join(tmp, "init"), path, tmp), nprocs=2,
                                              join=True, start_method="fork")
        ranks = [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(2)]
    for fits in ranks:
        assert _difference(fits["parameter False"], single) < 1e-8  # exact mode: one process's fit
        assert _difference(fits["parameter auto"], single) > 1e-3  # sharded: other minibatches, another fit
        assert _difference(fits["keyword True over parameter False"], fits["parameter auto"]) < 1e-8
