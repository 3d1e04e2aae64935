"""Early stop as a callback: Plateau stops on a flat window or at the absolute tolerance, never without a rule."""
import math

from flowgp.training.early_stop import EarlyStop, Plateau


def test_plateau_stops_on_a_flat_window_and_at_the_absolute_tolerance():
    stop = Plateau(EarlyStop(window=2, rel_tol=0.1), {"best": math.inf, "window_best": math.inf})
    assert [stop(i, v) for i, v in enumerate([10.0, 9.0, 8.95, 8.9])] == [False, False, False, True]
    assert Plateau(EarlyStop(window=None, abs_tol=1.0), {"best": math.inf, "window_best": math.inf})(0, 0.5)
    assert not Plateau(None, {"best": math.inf, "window_best": math.inf})(0, -1e9)
