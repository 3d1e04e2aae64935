import numpy as np
import pytest

from flowgp.data.tables import load_csv, make_tanh_sine
from flowgp.reporting.metrics import coverage, mean_nll, r2, rmse


def test_metrics_closed_forms():
    y = np.array([1.0, 2.0, 3.0, 4.0])
    assert rmse(y, y + 2) == pytest.approx(2.0)
    assert mean_nll([-1.0, -3.0]) == pytest.approx(2.0)
    assert coverage(y, y - 1, np.array([5, 5, 2, 5.0])) == pytest.approx(0.75)
    assert r2(y, y) == pytest.approx(1.0)
    assert r2(y, np.full(4, y.mean())) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="rows"):
        rmse(y, y[:2])


def test_demo_data_is_a_warped_sine():
    x, y = make_tanh_sine(150, seed=0)
    assert x.shape == (150, 1) and y.shape == (150,)
    resid = y - np.tanh(4 * np.sin(2 * np.pi * x[:, 0]))
    assert resid.std() == pytest.approx(0.05, rel=0.2)


def test_load_csv_and_its_errors(tmp_path):
    good = tmp_path / "d.csv"
    good.write_text("a,b,t\n1,2,3\n4,5,6\n")
    x, y, names = load_csv(good, "t")
    assert names == ["a", "b"] and x.tolist() == [[1, 2], [4, 5]] and y.tolist() == [3, 6]
    x, y, _ = load_csv(good, None)
    assert y is None and x.shape == (2, 3)
    with pytest.raises(FileNotFoundError):
        load_csv(tmp_path / "missing.csv", "t")
    with pytest.raises(ValueError, match="target column 'zz'"):
        load_csv(good, "zz")
    with pytest.raises(ValueError, match=r"\['q'\]"):
        load_csv(good, "t", ["a", "q"])
    bad = tmp_path / "bad.csv"
    bad.write_text("a,t\n1,2\nx,3\n")
    with pytest.raises(ValueError, match="row 3, column 'a'"):
        load_csv(bad, "t")
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("a,t\n1,2,3\n")
    with pytest.raises(ValueError, match="cells"):
        load_csv(ragged, "t")
