"""A fit never silently reuses another fit's state: a training checkpoint records the fingerprint of the run that
wrote it (digest of the training rows, estimator class, flowgp version, parameters) and is resumed only by that
run; a saved model does not carry its checkpoint into a refit."""
import warnings

import numpy as np
import pytest
import torch
from sklearn.exceptions import FitFailedWarning
from sklearn.model_selection import cross_val_score

import flowgp
from flowgp import SVGPRegressor
from flowgp.training.checkpoint import FingerprintMismatch, atomic_save, safe_load
from flowgp.data.sources import ArraySource, DataDigest, data_digest, scan
from flowgp.training.loop import train

FAST = dict(num_inducing=5, epochs=8, verbose=False, kmeans_restarts=1)


def _data(seed, n=40):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2))
    return x, np.sin(2 * x[:, 0]) + 0.1 * rng.normal(size=n)


def test_digest_depends_on_the_rows_only_not_on_the_chunking():
    x, y = _data(0, n=50)
    whole = data_digest(x, y)
    for size in (1, 7, 50):
        digest = DataDigest()
        for a in range(0, 50, size):
            digest.update(x[a:a + size], y[a:a + size])
        assert digest.hexdigest() == whole
    moved = x.copy()
    moved[17, 1] = np.nextafter(moved[17, 1], np.inf)  # one value, one ulp
    assert data_digest(moved, y) != whole
    assert data_digest(x, y[::-1].copy()) != whole  # other targets
    assert data_digest(x[:49], y[:49]) != whole
    assert data_digest(x) != whole  # no targets is not these targets


def test_streaming_scan_gives_the_digest_of_the_same_rows_as_arrays():
    x, y = _data(1, n=300)
    for chunk in (16, 64, 1000):
        source = ArraySource(np.column_stack([x, y]), 2, ["a", "b"], "y")
        assert scan(source, 20, chunk_rows=chunk).digest == data_digest(x, y)


def test_two_fits_on_other_data_of_the_same_size_cannot_share_a_checkpoint(tmp_path):
    ck = tmp_path / "ck.pt"
    x1, y1 = _data(1)
    x2, y2 = _data(2)
    SVGPRegressor(checkpoint=str(ck), **FAST).fit(x1, y1)
    written = ck.read_bytes()
    with pytest.raises(FingerprintMismatch, match=r"data: \w+ in the checkpoint, \w+ now.*Delete .*ck\.pt") as err:
        SVGPRegressor(checkpoint=str(ck), **FAST).fit(x2, y2)
    assert isinstance(err.value, ValueError)
    assert ck.read_bytes() == written  # the first fit's checkpoint is left as it was
    # other targets on the same inputs are other data too
    with pytest.raises(FingerprintMismatch, match="data:"):
        SVGPRegressor(checkpoint=str(ck), **FAST).fit(x1, -y1)


def test_a_changed_parameter_is_named_with_both_values(tmp_path):
    ck = tmp_path / "ck.pt"
    x, y = _data(1)
    SVGPRegressor(checkpoint=ck, **FAST).fit(x, y)
    with pytest.raises(FingerprintMismatch, match="parameter lr: 0.01 in the checkpoint, 0.05 now") as err:
        SVGPRegressor(checkpoint=ck, lr=0.05, **FAST).fit(x, y)
    assert "data:" not in str(err.value)  # only what differs is listed
    with pytest.raises(FingerprintMismatch, match="estimator: SVGPRegressor in the checkpoint, TGPRegressor now"):
        flowgp.TGPRegressor(flow="identity", checkpoint=ck, robust=False, **FAST).fit(x, y)


def test_the_same_fit_resumes_its_finished_checkpoint_without_training(tmp_path):
    # (an interrupted fit resuming on the same data:
    # tests/test_build.py::test_interrupted_fit_resumes_to_the_uninterrupted_result)
    ck = tmp_path / "ck.pt"
    x, y = _data(3)
    first = SVGPRegressor(checkpoint=ck, **FAST).fit(x, y)
    stamp = ck.stat().st_mtime_ns
    # settings of predictions alone are no other fit
    again = SVGPRegressor(checkpoint=ck, predict_quadrature_points=50, **FAST).fit(x, y)
    assert ck.stat().st_mtime_ns == stamp  # loaded back, nothing trained or written
    assert again.history_ == first.history_
    np.testing.assert_array_equal(again.predict(x), first.predict(x))


def test_cross_validation_folds_never_reuse_the_first_folds_model(tmp_path):
    ck = tmp_path / "ck.pt"
    x, y = _data(5, n=45)
    est = SVGPRegressor(checkpoint=str(ck), **FAST)
    with pytest.raises(FingerprintMismatch, match="one per fit"):
        cross_val_score(est, x, y, cv=3, error_score="raise")
    ck.unlink()
    with pytest.warns(FitFailedWarning):
        scores = cross_val_score(est, x, y, cv=3)
    assert np.isfinite(scores[0]) and np.isnan(scores[1:]).all()  # no fold is scored with another fold's model
    ck.unlink()
    plain = cross_val_score(SVGPRegressor(**FAST), x, y, cv=3)
    assert scores[0] == plain[0]


def test_a_loaded_model_refits_afresh_without_the_checkpoint_it_was_trained_with(tmp_path):
    ck = tmp_path / "ck.pt"
    x1, y1 = _data(6)
    x2, y2 = _data(7)
    est = SVGPRegressor(checkpoint=str(ck), **FAST).fit(x1, y1)
    est.save(tmp_path / "m.pt")
    assert "checkpoint" not in torch.load(tmp_path / "m.pt", weights_only=True)["params"]
    loaded = flowgp.load(tmp_path / "m.pt")
    assert loaded.checkpoint is None
    np.testing.assert_array_equal(loaded.predict(x1), est.predict(x1))
    stamp = ck.stat().st_mtime_ns
    refit = loaded.fit(x2, y2)
    assert ck.stat().st_mtime_ns == stamp
    np.testing.assert_allclose(refit.predict(x2), SVGPRegressor(**FAST).fit(x2, y2).predict(x2), rtol=1e-10)


def test_a_file_saved_with_a_checkpoint_parameter_loads_without_it(tmp_path):
    x, y = _data(8)
    SVGPRegressor(**FAST).fit(x, y).save(tmp_path / "m.pt")
    state = safe_load(tmp_path / "m.pt")
    state["params"]["checkpoint"] = str(tmp_path / "old-run.pt")  # as files were written before
    atomic_save(state, tmp_path / "m.pt")
    assert flowgp.load(tmp_path / "m.pt").checkpoint is None


def test_streamed_fits_check_the_digest_of_their_one_pass(tmp_path):
    ck = tmp_path / "ck.pt"
    x, y = _data(9, n=60)
    np.save(tmp_path / "a.npy", np.column_stack([x, y]))
    other = np.column_stack([x, y])
    other[30, 0] += 1.0
    np.save(tmp_path / "b.npy", other)
    first = SVGPRegressor(checkpoint=ck, **FAST).fit(str(tmp_path / "a.npy"))
    with pytest.raises(FingerprintMismatch, match="data:"):
        SVGPRegressor(checkpoint=ck, **FAST).fit(str(tmp_path / "b.npy"))
    again = SVGPRegressor(checkpoint=ck, **FAST).fit(str(tmp_path / "a.npy"))
    np.testing.assert_array_equal(again.predict(x), first.predict(x))


def test_train_refuses_a_checkpoint_written_on_other_tensors(tmp_path):
    from flowgp import GaussianLikelihood, make_kernel
    from flowgp.models import SVGP

    ck = tmp_path / "ck.pt"
    gen = torch.Generator().manual_seed(0)
    x1, x2 = (torch.randn(30, 1, generator=gen, dtype=torch.float64) for _ in range(2))
    y1, y2 = torch.sin(x1), torch.cos(x2)

    def model(x):
        return SVGP(make_kernel("rbf", 1), x[:5].clone(), GaussianLikelihood(0.5))

    train(model(x1), x1, y1, epochs=2, verbose=False, checkpoint_path=ck)
    with pytest.raises(FingerprintMismatch, match="data:"):
        train(model(x2), x2, y2, epochs=2, verbose=False, checkpoint_path=ck)
    train(model(x1), x1, y1, epochs=2, verbose=False, checkpoint_path=ck)  # the same run resumes


def test_a_checkpoint_written_before_fingerprints_resumes_with_a_warning(tmp_path):
    ck = tmp_path / "ck.pt"
    x, y = _data(10)
    first = SVGPRegressor(checkpoint=ck, **FAST).fit(x, y)
    state = safe_load(ck)
    del state["fingerprint"]
    atomic_save(state, ck)
    with pytest.warns(UserWarning, match="records no fingerprint") as caught:
        again = SVGPRegressor(checkpoint=ck, **FAST).fit(x, y)
    np.testing.assert_array_equal(again.predict(x), first.predict(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SVGPRegressor(**FAST).fit(x, y)  # without a checkpoint: nothing to say
