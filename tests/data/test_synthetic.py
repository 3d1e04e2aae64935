"""The two-mode demo set of the DGP-IWVI/DREG supplement (flowgp.data.synthetic, eqs. E.25-E.28): the two
functions, the mixing probability 0.6, the noise as printed (0.2 e^ε) or read as Gaussian, seeded draws, and
clear errors."""
import numpy as np
import pytest

from flowgp.data.synthetic import make_multimodal_demo


def _f(x, mode):
    return np.where(mode == 0, np.sin(4 * x) / 3, 9 * x**2 / 30 + 1.5)


def test_shapes_dtypes_range_and_seeds():
    x, y, mode = make_multimodal_demo(50, seed=3, x_range=(-1.0, 0.5))
    assert x.shape == (50, 1) and y.shape == (50,) and mode.shape == (50,)
    assert x.dtype == y.dtype == np.float64 and mode.dtype == np.int64
    assert x.min() >= -1.0 and x.max() < 0.5 and set(np.unique(mode)) <= {0, 1}
    again = make_multimodal_demo(50, seed=3, x_range=(-1.0, 0.5))
    assert all(np.array_equal(a, b) for a, b in zip((x, y, mode), again))
    assert not np.array_equal(y, make_multimodal_demo(50, seed=4, x_range=(-1.0, 0.5))[1])


def test_the_first_function_has_probability_0_6_and_the_noise_is_log_normal():
    x, y, mode = make_multimodal_demo(20000, seed=0)
    assert (mode == 0).mean() == pytest.approx(0.6, abs=0.015)  # 4 standard errors
    eps = np.log((y - _f(x[:, 0], mode)) / 0.2)  # 0.2 e^ε > 0: ε ~ N(0, 1) recovered exactly
    assert eps.mean() == pytest.approx(0.0, abs=0.03) and eps.std() == pytest.approx(1.0, abs=0.03)


def test_gaussian_noise_reads_the_term_as_0_2_eps():
    x, y, mode = make_multimodal_demo(20000, seed=1, noise="gaussian")
    resid = y - _f(x[:, 0], mode)
    assert resid.mean() == pytest.approx(0.0, abs=0.006) and resid.std() == pytest.approx(0.2, abs=0.006)
    assert (resid < 0).any()  # unlike 0.2 e^ε


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_points=0), "num_points"), (dict(num_points=True), "num_points"), (dict(num_points=2.0), "num_points"),
    (dict(noise="laplace"), "noise must be one of"), (dict(x_range=(1.0, -1.0)), "x_range"),
])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_multimodal_demo(**{"num_points": 10, **kwargs})
