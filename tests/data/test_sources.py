"""Streamed tables (flowgp.data.sources): readers, the one-pass statistics, fits and predictions in chunks."""
from __future__ import annotations

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from flowgp.data.sources import ArraySource, check_table, open_table, scan  # noqa: E402
from flowgp.estimators.regression import SVGPRegressor, TGPRegressor  # noqa: E402


def _data(n=300, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, (n, 2))
    y = np.sin(2 * x[:, 0]) + 0.1 * rng.standard_normal(n)
    return x, y


def _write_all(tmp_path, x, y, row_group=None):
    table = pa.table({"a": x[:, 0], "b": x[:, 1], "y": y})
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=row_group)
    with open(tmp_path / "d.csv", "w") as fh:
        fh.write("a,b,y\n" + "\n".join(f"{p!r},{q!r},{t!r}" for (p, q), t in zip(x.tolist(), y.tolist())) + "\n")
    np.save(tmp_path / "d.npy", np.column_stack([x, y]))
    return tmp_path / "d.parquet", tmp_path / "d.csv", tmp_path / "d.npy"


def test_every_format_reads_the_same_rows(tmp_path):
    x, y = _data(250)
    for path in _write_all(tmp_path, x, y, row_group=64):
        source = open_table(path, "y" if path.suffix != ".npy" else -1)
        try:
            assert source.num_rows == 250
            parts = [source.read(a, b) for a, b in source.blocks]
            np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), x)
            np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), y)
            xs, ys = zip(*source.chunks(100))
            np.testing.assert_array_equal(np.concatenate(xs), x)
            a, b = source.read(60, 70)  # a range across a block boundary
            np.testing.assert_array_equal(a, x[60:70])
        finally:
            source.close()


def test_scan_moments_and_a_uniform_reservoir():
    x, y = _data(1000)
    source = ArraySource(np.column_stack([x, y]), 2, ["a", "b"], "y", block_rows=97)
    stats = scan(source, sample_size=50, seed=1, chunk_rows=37)
    np.testing.assert_allclose(stats.x_mean, x.mean(0), rtol=1e-12)
    np.testing.assert_allclose(stats.x_std, x.std(0), rtol=1e-12)
    assert stats.y_mean == pytest.approx(y.mean(), rel=1e-12) and stats.y_std == pytest.approx(y.std(), rel=1e-12)
    assert (stats.y_min, stats.y_max) == (y.min(), y.max())
    # the sample consists of real rows, without repeats, and does not depend on the chunking
    assert len(stats.sample_x) == 50 and len({tuple(r) for r in stats.sample_x}) == 50
    rows = {tuple(r): i for i, r in enumerate(x)}
    assert all(tuple(r) in rows for r in stats.sample_x)
    again = scan(source, sample_size=50, seed=1, chunk_rows=200)
    np.testing.assert_array_equal(again.sample_x, stats.sample_x)
    # each row is kept with probability S / N = 1/4: over 400 seeds the count of a row is Binomial(400, 1/4)
    small = ArraySource(np.column_stack([np.arange(8.0), np.zeros(8)]), 1, ["i"], "y")
    counts = np.zeros(8)
    for seed in range(400):
        counts[scan(small, sample_size=2, seed=seed, chunk_rows=3).sample_x[:, 0].astype(int)] += 1
    assert np.all(np.abs(counts - 100) < 5 * np.sqrt(400 * 0.25 * 0.75)), counts


def test_scan_names_the_row_with_a_missing_value():
    a = np.column_stack([np.arange(5.0), np.arange(5.0)])
    a[3, 0] = np.nan
    with pytest.raises(ValueError, match="row 3"):
        scan(ArraySource(a, 1, ["a"], "y"))


def test_a_fit_is_the_same_from_every_format_and_from_chunks(tmp_path):
    x, y = _data(300)
    paths = _write_all(tmp_path, x, y)
    kw = dict(num_inducing=8, epochs=3, batch_size=64, verbose=False, kmeans_restarts=2)
    fits = [SVGPRegressor(**kw).fit(p, "y" if p.suffix != ".npy" else None) for p in paths]
    fits.append(SVGPRegressor(**kw).fit(iter([(x[:120], y[:120]), (x[120:], y[120:])])))
    grid = np.linspace(-2, 2, 7)[:, None].repeat(2, 1)
    reference = fits[0].predict(grid)
    for est in fits[1:]:
        np.testing.assert_allclose(est.predict(grid), reference, rtol=1e-10)
    assert fits[0].feature_names_ == ["a", "b"]


def test_a_streamed_fit_learns_the_function(tmp_path):
    x, y = _data(400, seed=2)
    np.save(tmp_path / "d.npy", np.column_stack([x, y]))
    est = SVGPRegressor(num_inducing=12, epochs=15, batch_size=100, lr=0.05, verbose=False,
                        kmeans_restarts=2).fit(tmp_path / "d.npy")
    xt, yt = _data(200, seed=5)
    rmse = np.sqrt(np.mean((est.predict(xt) - np.sin(2 * xt[:, 0])) ** 2))
    assert rmse < 0.15, rmse  # the noise std is 0.1; predicting the mean alone gives ~0.7


def test_predict_to_file_matches_predict_and_scores(tmp_path):
    x, y = _data(150)
    parquet, csv, _ = _write_all(tmp_path, x, y)
    est = SVGPRegressor(num_inducing=6, epochs=2, batch_size=50, verbose=False, kmeans_restarts=1).fit(parquet, "y")
    mean, std = est.predict(x, return_std=True)
    lower, upper = est.predict_interval(x, 0.9)
    for out in (tmp_path / "p.parquet", tmp_path / "p.csv"):
        summary = est.predict_to_file(csv, out, level=0.9, target="y", chunk_rows=40, verbose=False)
        got = (pq.read_table(out) if out.suffix == ".parquet" else
               pa.csv.read_csv(out) if hasattr(pa, "csv") else None)
        if got is None:
            import pyarrow.csv as pcsv
            got = pcsv.read_csv(out)
        for name, want in (("mean", mean), ("std", std), ("lower", lower), ("upper", upper)):
            np.testing.assert_allclose(got.column(name).to_numpy(), want, rtol=1e-12)
        assert summary["rows"] == 150
        assert summary["rmse"] == pytest.approx(np.sqrt(np.mean((y - mean) ** 2)), rel=1e-10)
        assert summary["coverage90"] == pytest.approx(np.mean((y >= lower) & (y <= upper)))
        assert summary["nll"] == pytest.approx(-np.mean(est.log_predictive_density(x, y)), rel=1e-10)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_bad_tables_give_one_clear_error(tmp_path):
    x, y = _data(20)
    parquet, csv, npy = _write_all(tmp_path, x, y)
    with pytest.raises(ValueError, match="target column 'nope'"):
        open_table(parquet, "nope")
    with pytest.raises(ValueError, match="no such file"):
        check_table(tmp_path / "missing.parquet", "y")
    text = tmp_path / "t.csv"
    text.write_text("a,b,y\n1,x,2\n3,y,4\n")
    with pytest.raises(ValueError, match="column 'b'"):
        open_table(text, "y")
    pq.write_table(pa.table({"a": [1.0, 2.0], "s": ["u", "v"], "y": [0.0, 1.0]}), tmp_path / "t.parquet")
    with pytest.raises(ValueError, match="column 's'"):
        check_table(tmp_path / "t.parquet", "y")
    with pytest.raises(ValueError, match="column index"):
        open_table(npy, "y")
    with pytest.raises(TypeError, match=r"\(X, y\) pairs"):
        open_table(iter([np.zeros((2, 2))]))


@pytest.mark.cuda
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_streamed_fit_and_prediction_on_cuda(tmp_path, dtype):
    x, y = _data(300)
    parquet, _, _ = _write_all(tmp_path, x, y, row_group=128)
    kw = dict(num_inducing=8, epochs=3, batch_size=64, verbose=False, kmeans_restarts=1, dtype=dtype)
    gpu = SVGPRegressor(device="cuda", **kw).fit(parquet, "y")
    cpu = SVGPRegressor(device="cpu", **kw).fit(parquet, "y")
    assert gpu.model_.gp.inducing_points.device.type == "cuda"
    tol = 1e-3 if dtype == "float32" else 1e-8
    np.testing.assert_allclose(gpu.predict(x[:20]), cpu.predict(x[:20]), rtol=tol, atol=tol)
    summary = gpu.predict_to_file(parquet, tmp_path / "p.parquet", target="y", chunk_rows=100, verbose=False)
    assert summary["rows"] == 300 and np.isfinite(summary["nll"])


def test_a_deep_gp_fit_streams_a_table(tmp_path):
    # the deep GP regressor takes a path as SVGPRegressor does: built from the reservoir sample (all
    # 300 rows here, so the same model as in memory), trained block by block; from every format the same fit
    from flowgp.estimators.deep import DeepGPRegressor

    x, y = _data(300, seed=3)
    parquet, _, npy = _write_all(tmp_path, x, y)
    kw = dict(layers=2, num_inducing=8, epochs=4, batch_size=64, lr=0.05, verbose=False, kmeans_restarts=1,
              num_samples_predict=20)
    a = DeepGPRegressor(**kw).fit(parquet, "y")
    b = DeepGPRegressor(**kw).fit(npy)
    c = DeepGPRegressor(**kw).fit(iter([(x[:100], y[:100]), (x[100:], y[100:])]))
    grid = np.linspace(-2, 2, 7)[:, None].repeat(2, 1)
    for est in (b, c):
        np.testing.assert_allclose(est.predict(grid), a.predict(grid), rtol=1e-10)
    assert len(a.history_) == 4 and a.feature_names_ == ["a", "b"]
    warm = DeepGPRegressor(posterior="cnf", dsvi_warmup=0.5, **kw).fit(npy)  # two stages, each on the stream
    assert len(warm.history_) == 4 and np.all(np.isfinite(warm.predict(grid)))
    with pytest.raises(ValueError, match="image_shape"):
        DeepGPRegressor(skip="conv", image_shape=(1, 1, 2), **kw).fit(npy)


def test_a_streamed_deep_gp_learns_the_function(tmp_path):
    from flowgp.estimators.deep import DeepGPRegressor

    x, y = _data(400, seed=2)
    np.save(tmp_path / "d.npy", np.column_stack([x, y]))
    est = DeepGPRegressor(layers=2, num_inducing=12, epochs=20, batch_size=100, lr=0.05, verbose=False,
                          kmeans_restarts=2, num_samples_predict=50).fit(tmp_path / "d.npy")
    xt, _ = _data(200, seed=5)
    rmse = np.sqrt(np.mean((est.predict(xt) - np.sin(2 * xt[:, 0])) ** 2))
    assert rmse < 0.2, rmse  # the noise std is 0.1; predicting the mean alone gives ~0.7


def test_a_classifier_streams_a_table(tmp_path):
    # the classifiers take a path too; the classes come from a full pass (a class the reservoir sample
    # misses is still a class), the model from the sample, the training from the blocks
    from flowgp.estimators.classification import SVGPClassifier, TGPClassifier

    x, y = _data(300, seed=4)
    labels = np.digitize(y, [-0.5, 0.5]).astype(float)  # three classes
    labels[7] = 3.0  # a rare fourth class
    np.save(tmp_path / "d.npy", np.column_stack([x, labels]))
    kw = dict(num_inducing=8, epochs=6, batch_size=64, lr=0.05, verbose=False, kmeans_restarts=1, mc_samples=5,
              predict_samples=64)
    est = SVGPClassifier(**kw).fit_stream(tmp_path / "d.npy", sample_size=50)
    assert est.classes_.tolist() == [0.0, 1.0, 2.0, 3.0]
    chunks = SVGPClassifier(**kw).fit(iter([(x[:100], labels[:100]), (x[100:], labels[100:])]))
    full = SVGPClassifier(**kw).fit(tmp_path / "d.npy")
    np.testing.assert_allclose(chunks.predict_proba(x[:20]), full.predict_proba(x[:20]), rtol=1e-10)
    assert (full.predict(x) == labels).mean() > 0.7  # three classes: chance is about 1/3
    np.save(tmp_path / "cont.npy", np.column_stack([x, np.arange(300) / 7.0]))
    with pytest.raises(ValueError, match="continuous"):
        SVGPClassifier(**kw).fit(tmp_path / "cont.npy")
    # the TGP classifier's robust fit streams too: SVGP stage, then the flow, bounds estimated on the sample
    tgp = TGPClassifier(**kw).fit(tmp_path / "d.npy")
    assert tgp.classes_.tolist() == [0.0, 1.0, 2.0, 3.0] and np.isfinite(tgp.fit_report_["bound"])
    assert tgp.fit_report_["n"] == 300 and (tgp.predict(x) == labels).mean() > 0.7


def test_a_latent_dgp_streams_a_table(tmp_path):
    # the latent DGP (amortised q(z)) takes a path; the same fit from .npy and from chunks
    from flowgp.estimators.latent import LatentDeepGPRegressor

    x, y = _data(200, seed=6)
    np.save(tmp_path / "d.npy", np.column_stack([x, y]))
    kw = dict(layers=2, num_inducing=8, num_importance=3, epochs=3, batch_size=64, verbose=False,
              kmeans_restarts=1, num_samples_predict=30)
    steps = []
    a = LatentDeepGPRegressor(**kw).fit(tmp_path / "d.npy", callback=lambda step, loss, m: steps.append(step))
    b = LatentDeepGPRegressor(**kw).fit(iter([(x[:90], y[:90]), (x[90:], y[90:])]))
    grid = np.linspace(-2, 2, 5)[:, None].repeat(2, 1)
    np.testing.assert_allclose(a.predict(grid), b.predict(grid), rtol=1e-10)
    assert len(a.history_) == 3 * 4 and steps == list(range(12))  # epochs x ceil(200 / 64) iterations
    seen = []
    SVGPRegressor(num_inducing=8, epochs=2, batch_size=64, verbose=False).fit_stream(
        tmp_path / "d.npy", callback=lambda step, loss, m: seen.append(step))
    assert seen == list(range(8))  # the plain regressors' loop takes one: 2 epochs x ceil(200 / 64) steps
    with pytest.raises(TypeError, match="callback"):  # estimators whose training takes no callback refuse one
        TGPRegressor(num_inducing=8, epochs=1, verbose=False).fit_stream(tmp_path / "d.npy", callback=print)
    with pytest.raises(ValueError, match="amortized"):
        LatentDeepGPRegressor(amortized=False, **kw).fit(tmp_path / "d.npy")


def test_a_deep_gp_classifier_streams_a_table(tmp_path):
    from flowgp.estimators.deep import DeepGPClassifier

    x, y = _data(300, seed=4)
    labels = np.digitize(y, [-0.5, 0.5]).astype(float)
    np.save(tmp_path / "d.npy", np.column_stack([x, labels]))
    kw = dict(layers=2, num_inducing=8, epochs=8, batch_size=64, lr=0.05, verbose=False, kmeans_restarts=1,
              num_samples_predict=20)
    a = DeepGPClassifier(**kw).fit(tmp_path / "d.npy")
    b = DeepGPClassifier(**kw).fit(iter([(x[:100], labels[:100]), (x[100:], labels[100:])]))
    assert a.classes_.tolist() == [0.0, 1.0, 2.0]
    np.testing.assert_allclose(a.predict_proba(x[:10]), b.predict_proba(x[:10]), rtol=1e-10)
    assert (a.predict(x) == labels).mean() > 0.6  # three classes: chance is about 1/3


def test_scan_gives_each_groups_moments_and_ranges_in_one_pass():
    rng = np.random.default_rng(4)
    n = 2000
    g = rng.integers(0, 4, n)
    x = rng.normal(size=n) + g
    y = rng.normal(size=n) * (g + 1) + 3 * g
    source = ArraySource(np.column_stack([x, g, y]), 2, ["x", "g"], "y", block_rows=300)
    stats = scan(source, 50, chunk_rows=333, group_feature=1)
    groups = stats.groups
    for i in range(4):
        rows = g == i
        assert groups["count"][i] == rows.sum()
        np.testing.assert_allclose(groups["y_mean"][i], y[rows].mean(), rtol=1e-12)
        np.testing.assert_allclose(groups["y_std"][i], y[rows].std(), rtol=1e-12)
        np.testing.assert_allclose(groups["x_min"][i], [x[rows].min(), i])
        np.testing.assert_allclose(groups["x_max"][i], [x[rows].max(), i])
    assert scan(source, 50).groups is None
    bad = ArraySource(np.column_stack([x, np.where(np.arange(n) == 700, 1.5, g), y]), 2, ["x", "g"], "y")
    with pytest.raises(ValueError, match="row 700 .*integers 0..G-1"):
        scan(bad, 50, group_feature=1)


def _series(n=300, seed=0):
    rng = np.random.default_rng(seed)
    o = rng.integers(0, 3, n)
    x = rng.uniform(0, 10, n)
    y = np.sin(x + 0.5 * o) + 0.1 * rng.standard_normal(n) + o
    return x, o, y


def test_an_amogp_streams_a_table(tmp_path):
    # the multi-output estimator takes a table with the input, the output index and the target:
    # standardised per output from one pass, built from it, trained block by block with the output index as a
    # batch tensor. From every format the same fit; against the same rows as arrays the same fit up to the
    # order of the full batch's sum (Adam turns rounding in near-zero gradients into ~1e-7 after 30 steps)
    from flowgp import AlignedMultiOutputGPRegressor

    x, o, y = _series()
    pq.write_table(pa.table({"t": x, "site": o.astype(float), "pm": y}), tmp_path / "s.parquet")
    np.save(tmp_path / "s.npy", np.column_stack([x, o, y]))
    kw = dict(num_inducing=10, num_inducing_alignment=5, num_inducing_warping=5, epochs=30, verbose=False)
    arrays = AlignedMultiOutputGPRegressor(**kw).fit(x[:, None], y, o)
    parquet = AlignedMultiOutputGPRegressor(**kw).fit(tmp_path / "s.parquet", "pm", output="site")
    npy = AlignedMultiOutputGPRegressor(**kw).fit(tmp_path / "s.npy", 2, output=1)
    chunks = AlignedMultiOutputGPRegressor(**kw).fit(
        iter([(np.column_stack([x[:120], o[:120]]), y[:120]), (np.column_stack([x[120:], o[120:]]), y[120:])]),
        output=1)
    grid, out = np.linspace(0, 10, 9)[:, None], np.arange(9) % 3
    for est in (npy, chunks):
        np.testing.assert_allclose(est.predict(grid, out), parquet.predict(grid, out), rtol=1e-10)
    np.testing.assert_allclose(parquet.predict(grid, out), arrays.predict(grid, out), rtol=1e-5)
    np.testing.assert_allclose(parquet.y_mean_, arrays.y_mean_, rtol=1e-12)
    np.testing.assert_allclose(parquet.y_std_, arrays.y_std_, rtol=1e-12)
    # prediction of a table chunk by chunk, written as it goes: the in-memory predictions and scores
    summary = parquet.predict_to_file(tmp_path / "s.parquet", tmp_path / "p.csv", target="pm", output="site",
                                      chunk_rows=70, verbose=False)
    written = np.loadtxt(tmp_path / "p.csv", delimiter=",", skiprows=1)
    mean, std = parquet.predict(x[:, None], o, return_std=True)
    np.testing.assert_allclose(written[:, 0], mean, rtol=1e-12)
    np.testing.assert_allclose(written[:, 1], std, rtol=1e-12)
    assert summary["rows"] == len(x)
    np.testing.assert_allclose(summary["rmse"], np.sqrt(np.mean((y - mean) ** 2)), rtol=1e-12)
    np.testing.assert_allclose(summary["nll"], -np.mean(parquet.log_predictive_density(x[:, None], y, o)), rtol=1e-9)
    with pytest.raises(TypeError, match="output"):
        SVGPRegressor(num_inducing=5, epochs=1, verbose=False).fit(x[:, None], y).predict_to_file(
            tmp_path / "s.parquet", tmp_path / "q.csv", target="pm", features=["t"], output="site")
    # minibatches from a sample smaller than the table: the alignment inducing ranges come from the full pass
    mini = AlignedMultiOutputGPRegressor(**{**kw, "epochs": 60, "lr": 0.02}, batch_size=64).fit_stream(
        tmp_path / "s.npy", 2, output=1, sample_size=40)
    truth = np.sin(grid[:, 0] + 0.5 * out) + out
    rmse = np.sqrt(np.mean((mini.predict(grid, out) - truth) ** 2))
    assert rmse < 0.15, rmse  # predicting each series' mean alone gives ~0.7 (measured: 0.044)
    with pytest.raises(ValueError, match="output: name"):
        AlignedMultiOutputGPRegressor(**kw).fit(tmp_path / "s.npy", 2)
    with pytest.raises(ValueError, match="not one of the table's feature columns"):
        AlignedMultiOutputGPRegressor(**kw).fit(tmp_path / "s.parquet", "pm", output="station")
    np.save(tmp_path / "wide.npy", np.column_stack([x, x, o, y]))
    with pytest.raises(ValueError, match="two feature columns"):
        AlignedMultiOutputGPRegressor(**kw).fit(tmp_path / "wide.npy", 3, output=2)
    np.save(tmp_path / "lonely.npy", np.column_stack([x, np.where(np.arange(len(x)) == 5, 3, o), y]))
    with pytest.raises(ValueError, match=r"output\(s\) \[3\] have \[1\]"):
        AlignedMultiOutputGPRegressor(**kw).fit(tmp_path / "lonely.npy", 2, output=1)
    with pytest.raises(TypeError, match="callback"):
        AlignedMultiOutputGPRegressor(**kw).fit_stream(tmp_path / "s.npy", 2, output=1, callback=print)


def test_amogp_builder_spreads_alignment_inducing_inputs_over_given_ranges():
    # a streamed fit builds from a sample: each alignment GP's inducing inputs span its output's range in the
    # whole table (from the scan), and the CP layer's the union of those ranges and the sample's
    import torch

    from flowgp.build import AMOGPConfig, build

    x, o = torch.tensor([[0.0], [1.0], [2.0], [3.0]]), torch.tensor([0, 0, 1, 1])
    config = AMOGPConfig(num_inducing=5, num_inducing_alignment=3, num_inducing_warping=3)
    model = build(config, x, torch.zeros(4), dtype=torch.float64, output=o,
                  input_ranges=np.array([[-1.0, 1.0], [2.0, 6.0]]))
    np.testing.assert_allclose(model.align.z.detach()[:, :, 0].numpy(), [[-1, 0, 1], [2, 4, 6]])
    np.testing.assert_allclose(model.latent.z.detach()[0, :, 0].numpy(), np.linspace(-1, 6, 5))
    with pytest.raises(ValueError, match="input_ranges must have shape"):
        build(config, x, torch.zeros(4), dtype=torch.float64, output=o, input_ranges=np.zeros((3, 2)))
