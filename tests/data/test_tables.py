"""Tables (flowgp.data.tables): the benchmark dataset loaders (layout, splits, standardisation), the demo data,
the CSV loader, and their clear errors."""
from pathlib import Path

import numpy as np
import pytest

from bench_fixtures import make_data_dir
from flowgp.data import tables as D

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
needs_shared = pytest.mark.skipif(not (SHARED / "uci").is_dir(), reason="shared data folder not present")


@pytest.fixture
def data_dir(tmp_path):
    return make_data_dir(tmp_path)


def test_uci_split_uses_index_files(data_dir):
    x, y = D.load_uci("toy", data_dir)
    s = D.uci_split("toy", 1, data_dir)
    tr = np.loadtxt(data_dir / "uci/toy/index_train_1.txt", dtype=int)
    te = np.loadtxt(data_dir / "uci/toy/index_test_1.txt", dtype=int)
    np.testing.assert_array_equal(s.x_train, x[tr])
    np.testing.assert_array_equal(s.y_test, y[te])
    assert D.uci_num_splits("toy", data_dir) == 3
    assert s.x_train.shape == (32, 2) and s.x_test.shape == (8, 2)


def test_data_dir_resolution(data_dir, monkeypatch, tmp_path):
    monkeypatch.setenv("FLOWGP_DATA", str(data_dir))
    assert D.resolve_data_dir() == data_dir
    assert D.resolve_data_dir(data_dir) == data_dir
    monkeypatch.delenv("FLOWGP_DATA")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="--data-dir"):
        D.resolve_data_dir()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        D.resolve_data_dir(tmp_path / "nope")


def test_missing_split_file(data_dir):
    (data_dir / "uci/toy/index_test_2.txt").unlink()
    with pytest.raises(FileNotFoundError, match="index_test_2"):
        D.uci_split("toy", 2, data_dir)
    with pytest.raises(ValueError, match="split must be in 0..2"):
        D.uci_split("toy", 3, data_dir)


def test_malformed_uci_files(data_dir):
    (data_dir / "uci/toy/index_train_0.txt").write_text("1\n2\n999\n")
    with pytest.raises(ValueError, match="row indices"):
        D.uci_split("toy", 0, data_dir)
    (data_dir / "uci/toy/data.txt").write_text("1 2 3\n4 five 6\n")
    with pytest.raises(ValueError, match="not a numeric"):
        D.load_uci("toy", data_dir)
    (data_dir / "uci/toy/n_splits.txt").write_text("many\n")
    with pytest.raises(ValueError, match="one integer"):
        D.uci_num_splits("toy", data_dir)
    with pytest.raises(FileNotFoundError, match="known sets"):
        D.load_uci("nosuchset", data_dir)


def test_classification_split_is_stratified_and_seeded(data_dir):
    a = D.classification_split("banknote", 0, data_dir, test_fraction=0.25)
    b = D.classification_split("banknote", 0, data_dir, test_fraction=0.25)
    c = D.classification_split("banknote", 1, data_dir, test_fraction=0.25)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    assert not np.array_equal(a.x_test, c.x_test)
    _, y, classes = D.load_classification("banknote", data_dir)
    assert classes == ["0", "1"] and set(np.unique(y)) == {0, 1}
    # stratified: class proportions in test match the whole set within one sample
    assert abs(a.y_test.mean() * len(a.y_test) - y.mean() * len(a.y_test)) <= 1.0


def test_classification_errors(data_dir):
    path = data_dir / "classification/banknote_authentication.txt"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:3] + ["1.0,2.0,abc,4.0,1"] + lines[4:]) + "\n")
    with pytest.raises(ValueError, match="'abc' is not a number"):
        D.load_classification("banknote", data_dir)
    path.write_text("1,2,3\n")
    with pytest.raises(ValueError, match="target in column 4"):
        D.load_classification("banknote", data_dir)
    with pytest.raises(ValueError, match="unknown classification set"):
        D.load_classification("nope", data_dir)
    with pytest.raises(ValueError, match="official"):
        D.classification_split("avila", 1, data_dir)


def test_rainfall_and_air_quality(data_dir):
    s = D.rainfall_official_split(data_dir)
    assert s.x_train.shape == (10, 2) and s.x_test.shape == (20, 2)
    x, y = D.load_air_quality(data_dir)
    assert x.shape == (40, 1) and np.all(y > 0)
    path = data_dir / "sic97_rainfall/sic97_all.csv"
    path.write_text(path.read_text().replace("rainfall", "rain", 1))
    with pytest.raises(ValueError, match="lacks columns \\['rainfall'\\]"):
        D.load_rainfall(data_dir)
    path = data_dir / D.AIR_QUALITY_FILE
    path.write_text("datetime_gmt,hours_since_start,pm25\nt0,0,3.0\nt1,1,\n")
    with pytest.raises(ValueError, match="row 3, column 'pm25' is empty"):
        D.load_air_quality(data_dir)


def test_cv_splits_partition():
    folds = D.cv_splits(23, 5, seed=3)
    tests = np.concatenate([te for _, te in folds])
    assert sorted(tests.tolist()) == list(range(23))
    for tr, te in folds:
        assert np.intersect1d(tr, te).size == 0 and len(tr) + len(te) == 23
    assert not np.array_equal(folds[0][1], D.cv_splits(23, 5, seed=4)[0][1])
    with pytest.raises(ValueError, match="k must be"):
        D.cv_splits(3, 5)


def test_standardize_uses_training_statistics_only():
    rng = np.random.default_rng(0)
    train, test = rng.normal(3, 2, (50, 2)), rng.normal(100, 50, (10, 2))
    tr, te, mean, std = D.standardize(train, test)
    np.testing.assert_allclose(tr.mean(0), 0, atol=1e-12)
    np.testing.assert_allclose(tr.std(0), 1, atol=1e-12)
    np.testing.assert_allclose(te, (test - train.mean(0)) / train.std(0))
    # a constant column keeps std 1 instead of dividing by zero
    _, _, s = D.standardize(np.ones((4, 1)))
    assert s[0] == 1.0


@needs_shared
def test_shared_data_shapes():
    expected = {"boston": (506, 13), "concrete": (1030, 8), "energy": (768, 8), "kin8nm": (8192, 8),
                "power": (9568, 4), "wine-red": (1599, 11), "yacht": (308, 6)}
    for name, shape in expected.items():
        x, y = D.load_uci(name, SHARED)
        assert x.shape == shape and y.shape == (shape[0],)
        assert D.uci_num_splits(name, SHARED) == 20
    s = D.classification_split("avila", 0, SHARED)
    assert s.x_train.shape == (10430, 10) and s.x_test.shape == (10437, 10)
    assert D.load_classification("activity", SHARED)[1].max() == 6
    x, y, _ = D.load_classification("heart", SHARED)  # 26 rows with empty cells are left out
    assert x.shape == (273, 12)
    s = D.rainfall_official_split(SHARED)
    assert len(s.y_train) == 100 and len(s.y_test) == 367
    assert D.load_air_quality(SHARED)[0].shape == (744, 1)


def test_load_csv_refuses_duplicate_names_and_the_target_as_a_feature(tmp_path):
    # was: a header `a,a,y` silently used the first `a` twice; the target listed as a feature was used as one
    import pytest
    from flowgp.data.tables import load_csv

    dup = tmp_path / "dup.csv"
    dup.write_text("a,a,y\n1,2,3\n")
    with pytest.raises(ValueError, match=r"duplicate column names \['a'\]"):
        load_csv(dup, "y")
    ok = tmp_path / "ok.csv"
    ok.write_text("a,b,y\n1,2,3\n4,5,6\n")
    with pytest.raises(ValueError, match="'y' is also listed as a feature"):
        load_csv(ok, "y", ["a", "y"])
    with pytest.raises(ValueError, match=r"\['b'\] are listed more than once"):
        load_csv(ok, "y", ["b", "b"])
    x, y, names = load_csv(ok, "y", ["b", "a"])
    assert names == ["b", "a"] and x.tolist() == [[2, 1], [5, 4]] and y.tolist() == [3, 6]


def test_demo_data_is_a_warped_sine():
    x, y = D.make_tanh_sine(150, seed=0)
    assert x.shape == (150, 1) and y.shape == (150,)
    resid = y - np.tanh(4 * np.sin(2 * np.pi * x[:, 0]))
    assert resid.std() == pytest.approx(0.05, rel=0.2)


def test_load_csv_and_its_errors(tmp_path):
    good = tmp_path / "d.csv"
    good.write_text("a,b,t\n1,2,3\n4,5,6\n")
    x, y, names = D.load_csv(good, "t")
    assert names == ["a", "b"] and x.tolist() == [[1, 2], [4, 5]] and y.tolist() == [3, 6]
    x, y, _ = D.load_csv(good, None)
    assert y is None and x.shape == (2, 3)
    with pytest.raises(FileNotFoundError):
        D.load_csv(tmp_path / "missing.csv", "t")
    with pytest.raises(ValueError, match="target column 'zz'"):
        D.load_csv(good, "zz")
    with pytest.raises(ValueError, match=r"\['q'\]"):
        D.load_csv(good, "t", ["a", "q"])
    bad = tmp_path / "bad.csv"
    bad.write_text("a,t\n1,2\nx,3\n")
    with pytest.raises(ValueError, match="row 3, column 'a'"):
        D.load_csv(bad, "t")
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("a,t\n1,2,3\n")
    with pytest.raises(ValueError, match="cells"):
        D.load_csv(ragged, "t")
