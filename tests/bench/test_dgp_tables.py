"""flowgp.bench.dgp_tables: the deep-GP UCI tables average only over splits every model finished; the flow
posterior's scorecard against DSVI counts wins, ties and ranks the way its docstring says."""
import json
import math

import pytest

from flowgp.bench import dgp_tables as table
from flowgp.bench.cli import main as bench


def _row(dataset, model, split, nll, elbo=-100.0):
    return {"dataset": dataset, "model": model, "split": split, "nll": nll, "train_elbo": elbo,
            "y_scale": 1.0, "n_train": 10}


def test_split_ranges_compresses_runs():
    assert table.split_ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert table.split_ranges([3]) == "3"
    assert table.split_ranges([]) == ""


def test_tables_use_only_common_splits_and_rank():
    # On dataset x only model a finished split 1, so split 1 must not enter x's means: a's is -1.0, not -(1.0+9.0)/2.
    rows = [_row("x", "a", 0, 1.0), _row("x", "b", 0, 2.0), _row("x", "a", 1, 9.0),
            _row("y", "a", 0, 3.0), _row("y", "b", 0, 1.0)]
    lines = "\n".join(table.tables(rows, ["a", "b"])).splitlines()
    x_line = next(l for l in lines if l.startswith("| x | 0 |") and "±" in l)
    assert "**-1.000 ± " in x_line and "-2.000" in x_line  # a best on x, over split 0 only
    y_line = next(l for l in lines if l.startswith("| y | 0 |") and "±" in l)
    assert "**-1.000 ± " in y_line and "-3.000" in y_line  # b best on y
    rank_line = lines[lines.index("| a | b |") + 2]
    assert rank_line == "| 1.50 | 1.50 |"
    coverage_line = next(l for l in lines if l.startswith("| x | 0-1 |"))
    assert coverage_line == "| x | 0-1 | 0 |"


def test_head_to_head_wins_count_common_splits():
    rows = [_row(d, m, s, nll) for d, s, (n_svgp, n_dgp2) in
            [("x", 0, (1.0, 0.5)), ("x", 1, (1.0, 1.5)), ("y", 0, (2.0, 1.0))]
            for m, nll in (("svgp", n_svgp), ("dgp2", n_dgp2))]
    lines = table.tables(rows, ["svgp", "dgp2"])
    win = next(l for l in lines if l.startswith("| dgp2 vs svgp |"))
    assert win == f"| dgp2 vs svgp | 2 / 3 | {(0.5 - 0.5 + 1.0) / 3:+.3f} |"


def test_table_one_standardises_elbo():
    rows = [dict(_row("boston", "dgp2", s, 2.0, elbo=-50.0 - s), y_scale=math.e) for s in range(2)]
    line = next(l for l in table.table_one(rows) if l.startswith("| 2 |"))
    # elbo + n·log(e) = -40 and -41: mean -40.5, s.e. 0.5, 2 splits; no CNF rows.
    assert line.startswith("| 2 | -40.5 ± 0.5 | 2 | — | 0 |")


def test_splice_replaces_between_markers(tmp_path):
    doc = tmp_path / "README.md"
    doc.write_text(f"head\n{table.START}\nold\n{table.END}\ntail\n")
    table.splice(doc, "new table\n")
    assert doc.read_text() == f"head\n{table.START}\n\nnew table\n\n{table.END}\ntail\n"


def test_splice_needs_markers(tmp_path):
    doc = tmp_path / "README.md"
    doc.write_text("no markers\n")
    with pytest.raises(ValueError, match="--readme"):
        table.splice(doc, "x")


# ----- the flow posterior against DSVI -----------------------------------------------------------------------
def _pair(dataset, split, nll_cnf, nll_dsvi, elbo_cnf, elbo_dsvi, strength):
    common = {"dataset": dataset, "split": split, "n_train": 100, "y_scale": 1.0}
    return [{**common, "model": "cnf-dgp3", "nll": nll_cnf, "train_elbo": elbo_cnf, "flow_strength": strength},
            {**common, "model": "dgp3", "nll": nll_dsvi, "train_elbo": elbo_dsvi}]


def test_rank_ties_only_at_rounding_level():
    assert table.rank_by_test_nll(2.302585092994, 2.302585092994 + 2e-12) == 1.5  # the DSVI base itself, summed otherwise
    assert table.rank_by_test_nll(2.3025, 2.3026) == 1.0
    assert table.rank_by_test_nll(2.3026, 2.3025) == 2.0
    assert table.rank_by_test_nll(-1.0, -1.0 - 1e-7) == 2.0  # small but real: not a tie


def test_scorecard_counts_a_flow_kept_at_strength_zero_as_a_tie_in_both_columns():
    rows = (_pair("a", 0, 1.0, 1.1, -50.0, -52.0, 0.25)                   # flow wins both
            + _pair("a", 1, 1.2, 1.1, -50.0, -51.0, 0.25)                 # better bound, worse test NLL
            + _pair("b", 0, 0.9 + 3e-12, 0.9, -60.0, -60.0 + 1e-10, 0.0))  # identical model, rounding apart
    c = table.scorecard(rows)[3]
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
    text = table.refit_summary(rows, [same, sent_back])
    assert "unchanged (same kept strength and source, NLL and ELBO within 1e-06 relative): 1; changed: 1" in text
    assert "cnf-dgp3 a 1: λ* 0.25 → 0.0" in text
    c = table.scorecard(rows + [same, sent_back])[3]
    assert (c["wins"], c["ties"], c["losses"]) == (1, 1, 0)
    assert c["rank_cnf"] == pytest.approx((1.0 + 1.5) / 2)


def test_the_subcommand_prints_the_tables_splices_a_readme_and_refuses_a_missing_file(tmp_path, capsys):
    rows = [_row("x", "a", 0, 1.0), _row("x", "b", 0, 2.0)]
    path = tmp_path / "uci.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    readme = tmp_path / "README.md"
    readme.write_text(f"head\n{table.START}\n{table.END}\n")
    assert bench(["dgp-table", str(path), "--models", "a,b", "--readme", str(readme)]) == 0
    out = capsys.readouterr().out
    assert "| x | 0 | **-1.000 ± 0.000** | -2.000 ± 0.000 |" in out
    assert "| x | 0 | **-1.000 ± 0.000** |" in readme.read_text()
    assert bench(["dgp-table", str(tmp_path / "missing.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_side_by_side_names_the_baselines_cnf_rows_the_papers_design(tmp_path, capsys):
    new = [_row("x", "cnf-dgp2", 0, 1.0, elbo=-10.0), _row("x", "dgp2", 0, 1.2, elbo=-20.0)]
    old = [_row("x", "cnf-dgp2", 0, 1.5, elbo=-30.0)]
    lines = table.side_by_side(new, old)
    assert lines[2] == "| x | 0 | 2 | -2.000 | -1.000 | -3.000 | 1.200 | 1.000 | 1.500 |"
    assert table.side_by_side(new)[2] == "| x | 0 | 2 | -2.000 | -1.000 | — | 1.200 | 1.000 | — |"
