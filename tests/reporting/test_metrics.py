"""Scores in closed form (flowgp.reporting.metrics): RMSE, mean NLL, interval coverage, R²; mismatched rows refused."""
import numpy as np
import pytest

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
