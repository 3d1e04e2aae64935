"""Seeds for draws from the predictive (flowgp.estimators.sampling): random_state as scikit-learn takes it (None,
an int, a RandomState, a Generator), never the global random state, and anything else refused."""
import numpy as np
import pytest

from flowgp import SVGPRegressor
from flowgp.estimators.sampling import resolve_seed


def test_random_state_resolves_as_scikit_learn_takes_it():
    assert resolve_seed(None, 11) == 11 and resolve_seed(5, 11) == 5 and resolve_seed(np.int64(7), 0) == 7
    a, b = resolve_seed(np.random.RandomState(3), 0), resolve_seed(np.random.RandomState(3), 0)
    assert a == b and a != resolve_seed(np.random.RandomState(4), 0)
    rs = np.random.RandomState(3)
    assert resolve_seed(rs, 0) != resolve_seed(rs, 0)  # a RandomState advances, as check_random_state's would
    assert resolve_seed(np.random.default_rng(1), 0) == resolve_seed(np.random.default_rng(1), 0)


def test_the_global_random_state_is_neither_read_nor_advanced():
    np.random.seed(0)
    before = np.random.get_state()[1].copy()
    resolve_seed(np.random.RandomState(1), 0)
    resolve_seed(np.random.default_rng(1), 0)
    assert np.array_equal(np.random.get_state()[1], before)


@pytest.mark.parametrize("bad", [True, np.bool_(False), 1.5, "3", [1]])
def test_other_random_states_are_a_type_error(bad):
    with pytest.raises(TypeError, match="random_state must be None, an int or a numpy RandomState/Generator"):
        resolve_seed(bad, 0)


def test_sample_y_takes_a_random_state_object():
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (30, 1))
    est = SVGPRegressor(num_inducing=5, epochs=2, seed=0).fit(x, np.sin(x[:, 0]))
    a = est.sample_y(x[:4], 3, random_state=np.random.RandomState(9))
    b = est.sample_y(x[:4], 3, random_state=np.random.RandomState(9))
    assert a.shape == (4, 3) and np.array_equal(a, b)
    assert not np.array_equal(a, est.sample_y(x[:4], 3, random_state=np.random.RandomState(10)))
    with pytest.raises(TypeError, match="random_state"):
        est.sample_y(x[:4], 3, random_state="seed")
