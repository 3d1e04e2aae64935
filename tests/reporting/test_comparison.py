"""Side-by-side arithmetic (flowgp.reporting.comparison): mean ± standard error, the difference in standard
errors (combined, or ours alone when the paper gives no spread), the ordering with depth, and the TGP paper's
few-inducing-points claim counted from rows."""
import math
import statistics

import pytest

from flowgp.reporting.comparison import (difference_in_se, inducing_claim, inducing_claim_counts,
                                         inducing_summary, mean_se, ordering)


def test_mean_se_is_the_sample_standard_error_and_skips_missing_values():
    values = [0.2, 0.5, 0.9, 1.4]
    mean, se, n = mean_se(values + [None, float("nan"), float("inf")])
    assert n == 4 and mean == pytest.approx(0.75)
    assert se == pytest.approx(statistics.stdev(values) / 2.0)


def test_mean_se_of_one_value_has_no_spread_and_of_none_no_mean():
    assert mean_se([3.0])[0] == 3.0 and math.isnan(mean_se([3.0])[1])
    mean, se, n = mean_se([])
    assert n == 0 and math.isnan(mean) and math.isnan(se)


def test_difference_in_se_combines_both_spreads_or_uses_ours_alone():
    assert difference_in_se(1.5, 0.3, 1.0, 0.4) == pytest.approx(1.0)  # 0.5 / 0.5
    assert difference_in_se(0.0, 0.25, 1.0) == pytest.approx(-4.0)  # no published spread: ours alone
    assert math.isnan(difference_in_se(1.0, float("nan"), 0.0))  # one run, no published spread
    assert difference_in_se(1.0, float("nan"), 0.0, 0.5) == pytest.approx(2.0)  # theirs alone
    assert math.isnan(difference_in_se(1.0, 0.0, 0.0, 0.0))


def test_ordering_names_the_direction_with_depth():
    assert ordering({2: -836.48, 3: -814.13, 4: -762.54, 5: -734.23}) == "rises: 2 < 3 < 4 < 5"
    assert ordering({3: -2.0, 2: -1.0}) == "falls: 2 > 3"
    assert ordering({2: 1.0, 3: 2.0, 4: 1.5}) == "mixed: 2 < 3 > 4"
    assert ordering({2: 1.0}) == "—"


def _row(dataset, model, m, nll, split, epochs=750):
    return {"dataset": dataset, "model": model, "num_inducing": m, "nll": nll, "rmse": 1.0, "split": split,
            "task": "regression", "epochs": epochs}


def test_inducing_claim_holds_within_the_larger_standard_error():
    rows = [_row("a", "svgp", 100, v, k) for k, v in enumerate((1.0, 1.2))]  # mean 1.1, se 0.1
    rows += [_row("a", "ba-tgp", 5, v, k) for k, v in enumerate((1.15, 1.25))]  # 1.2 ≤ 1.1 + 0.1: holds
    rows += [_row("a", "pe-tgp", 5, v, k) for k, v in enumerate((1.2, 1.3))]  # 1.25 > 1.2: fails
    rows += [_row("b", "svgp", 100, 2.0, 0), _row("b", "ba-tgp", 5, 1.9, 0)]  # one split: better than holds
    rows += [_row("c", "ba-tgp", 5, 0.0, 0)]  # no SVGP at M = 100: no claim row
    rows += [_row("a", "dgp2", 5, -9.0, 0), {**_row("a", "ba-tgp", 5, -9.0, 3), "task": "classification"}]
    summary = inducing_summary(rows)
    assert summary[("a", "svgp", 100)]["epochs"] == [750]
    table = inducing_claim(summary)
    assert [r["dataset"] for r in table] == ["a", "b"]
    a, b = table
    assert a["svgp_m100_nll"] == pytest.approx(1.1) and a["svgp_m100_se"] == pytest.approx(0.1)
    assert a["ba-tgp_holds"] and not a["pe-tgp_holds"] and a["ba-tgp_splits"] == 2
    assert b["ba-tgp_holds"] and "pe-tgp_holds" not in b
    assert inducing_claim_counts(table) == {"ba-tgp": (2, 2), "pe-tgp": (0, 1)}


def test_inducing_claim_refuses_few_not_below_many():
    with pytest.raises(ValueError, match="few"):
        inducing_claim({}, few=100, many=100)
