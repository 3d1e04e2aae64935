"""benchmarks/cnf_dgp_vs_dsvi.py: issue 20's scorecard counts wins, ties and ranks the way its docstring says."""
import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "cnf_dgp_vs_dsvi.py"
_spec = importlib.util.spec_from_file_location("cnf_dgp_vs_dsvi", _PATH)
card = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(card)


def _pair(dataset, split, nll_cnf, nll_dsvi, elbo_cnf, elbo_dsvi, strength):
    common = {"dataset": dataset, "split": split, "n_train": 100, "y_scale": 1.0}
    return [{**common, "model": "cnf-dgp3", "nll": nll_cnf, "train_elbo": elbo_cnf, "flow_strength": strength},
            {**common, "model": "dgp3", "nll": nll_dsvi, "train_elbo": elbo_dsvi}]


def test_rank_ties_only_at_rounding_level():
    assert card.rank_by_test_nll(2.302585092994, 2.302585092994 + 2e-12) == 1.5  # the DSVI base itself, summed otherwise
    assert card.rank_by_test_nll(2.3025, 2.3026) == 1.0
    assert card.rank_by_test_nll(2.3026, 2.3025) == 2.0
    assert card.rank_by_test_nll(-1.0, -1.0 - 1e-7) == 2.0  # small but real: not a tie


def test_scorecard_counts_a_flow_kept_at_strength_zero_as_a_tie_in_both_columns():
    rows = (_pair("a", 0, 1.0, 1.1, -50.0, -52.0, 0.25)                   # flow wins both
            + _pair("a", 1, 1.2, 1.1, -50.0, -51.0, 0.25)                 # better bound, worse test NLL
            + _pair("b", 0, 0.9 + 3e-12, 0.9, -60.0, -60.0 + 1e-10, 0.0))  # identical model, rounding apart
    c = card.scorecard(rows)[3]
    assert (c["wins"], c["ties"], c["losses"]) == (2, 1, 0)
    assert (c["test_ll_wins"], c["test_ll_losses"]) == (1, 1)
    assert c["rank_cnf"] == pytest.approx((1.0 + 2.0 + 1.5) / 3)
    assert c["rank_cnf"] + c["rank_dsvi"] == pytest.approx(3.0)
    assert c["flow_kept"] == 2
    assert c["mean_test_ll_difference"] == pytest.approx((0.1 - 0.1 - 3e-12) / 3)


def test_refit_summary_counts_rows_that_moved_and_scoring_uses_the_refits():
    rows = _pair("a", 0, 1.0, 1.1, -50.0, -52.0, 0.25) + _pair("a", 1, 1.2, 1.1, -50.0, -51.0, 0.25)
    same = {**rows[0], "nll": 1.0 + 1e-9}                                      # a rerun equal to rounding
    sent_back = {**rows[2], "flow_strength": 0.0, "nll": 1.1, "train_elbo": -51.0}  # confirmation: λ* → 0
    text = card.refit_summary(rows, [same, sent_back])
    assert "unchanged (same kept strength and source, NLL and ELBO within 1e-06 relative): 1; changed: 1" in text
    assert "cnf-dgp3 a 1: λ* 0.25 → 0.0" in text
    c = card.scorecard(rows + [same, sent_back])[3]
    assert (c["wins"], c["ties"], c["losses"]) == (1, 1, 0)
    assert c["rank_cnf"] == pytest.approx((1.0 + 1.5) / 2)
