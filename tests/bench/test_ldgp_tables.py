"""flowgp.bench.ldgp_tables: the outlier rule and the paired DREG − REG summaries of `flowgp bench ldgp-table`;
a learning curve's fit scored by the mean of its last scorings, paired only on splits both models finished."""
import json

import numpy as np
import pytest
from scipy import stats

from flowgp.bench import ldgp_tables as table
from flowgp.bench.cli import main as bench


def _row(model, split, nll, elbo=None, n_train=100):
    row = {"dataset": "wine-red", "model": model, "split": split, "nll": nll, "n_train": n_train,
           "preset": "p", "y_scale": 1.0}
    if elbo is not None:
        row["train_elbo"] = elbo
    return row


def test_outlier_rule_drops_a_split_more_than_two_sd_from_its_mean():
    values = {"reg": {s: 0.8 + 0.001 * s for s in range(12)}, "dreg": {s: 0.8 for s in range(12)}}
    values["reg"][5] = -3.0
    assert table.outlier_splits(values) == {5}


def test_paired_difference_gives_the_student_t_interval():
    d = np.array([0.1, -0.05, 0.02, 0.03])
    se = d.std(ddof=1) / 2.0
    half = stats.t.ppf(0.975, 3) * se
    text = table.paired_difference(d)
    assert f"[{d.mean() - half:+.3f}, {d.mean() + half:+.3f}]" in text and "positive 3/4" in text


def test_dreg_minus_reg_pairs_by_split_and_skips_rows_without_a_bound():
    rows = [_row("ldgp2-reg", 0, 1.0, elbo=-50.0), _row("ldgp2-dreg", 0, 0.9, elbo=-40.0),
            _row("ldgp2-reg", 1, 1.0, elbo=-50.0), _row("ldgp2-dreg", 1, 1.2, elbo=-60.0),
            _row("ldgp2-reg", 2, 1.0), _row("ldgp2-dreg", 2, 0.7),        # a curve row: no bound
            _row("ldgp2-dreg", 3, 0.1, elbo=0.0)]                          # no REG partner: left out
    test_line, bound_line = table.dreg_minus_reg_lines(rows, "p")
    assert "positive 2/3" in test_line  # +0.1, −0.2, +0.3
    assert f"{np.mean([0.1, -0.2, 0.3]):+.3f} ± " in test_line
    assert "positive 1/2" in bound_line and "+0.000 ± 0.100" in bound_line  # (+10 − 10)/100 per point
    assert table.dreg_minus_reg_lines(rows, "other") == []


def test_score_nll_kde_uses_the_kde_column_and_leaves_out_rows_without_it(capsys, tmp_path):
    rows = [{**_row("ldgp2-reg", 0, 1.0), "nll_kde": 2.0}, {**_row("ldgp2-dreg", 0, 0.9), "nll_kde": 1.5},
            _row("ldgp2-reg", 1, 1.0), _row("ldgp2-dreg", 1, 0.9)]                 # older rows: no KDE
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert bench(["ldgp-table", str(path), "--preset", "p", "--score", "nll_kde"]) == 0
    out = capsys.readouterr().out
    assert "| wine-red | 0 | -2.000 | -1.500 | +0.500 |" in out and "| wine-red | 1 |" not in out
    assert bench(["ldgp-table", str(path), "--preset", "p"]) == 0
    out = capsys.readouterr().out
    assert "| wine-red | 0 | -1.000 | -0.900 | +0.100 |" in out and "| wine-red | 1 |" in out


def test_rows_of_two_row_orders_are_not_paired_by_split(tmp_path, capsys):
    rows = [_row("ldgp2-reg", 0, 1.0), {**_row("ldgp2-dreg", 0, 0.9), "row_order": "authors"}]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(ValueError, match="mix splits of row orders"):
        table.collect(rows, table.PAIR, "p")
    assert bench(["ldgp-table", str(path), "--preset", "p"]) == 2
    assert "mix splits of row orders" in capsys.readouterr().err
    # a row that says "file" is a row of the same order as one written before the field existed
    path.write_text("\n".join(json.dumps(r) for r in [rows[0], {**rows[1], "row_order": "file"}]))
    assert bench(["ldgp-table", str(path), "--preset", "p"]) == 0


def test_curve_rows_at_one_budget_join_the_tables_under_the_preset(tmp_path, capsys):
    curve = tmp_path / "curve.jsonl"
    curve.write_text("".join(json.dumps({**_row(m, 3, nll), "iterations": it, "preset": None}) + "\n"
                             for m, nll, it in (("ldgp2-reg", 1.0, 500), ("ldgp2-reg", 0.8, 1000),
                                                ("ldgp2-dreg", 0.7, 1000))))
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(_row("ldgp2-reg", 0, 1.0)) + "\n")
    assert bench(["ldgp-table", str(rows), "--preset", "p", "--curve", f"{curve}:1000"]) == 0
    assert "| wine-red | 3 | -0.800 | -0.700 | +0.100 |" in capsys.readouterr().out
    with pytest.raises(ValueError, match="FILE:ITERATIONS"):
        table.curve_rows(str(curve), "p")


# ----- a fit scored by the mean of its last scorings ---------------------------------------------------------
def _curve_row(model, split, it, ll):
    return {"model": model, "split": split, "iterations": it, "test_ll_std": ll}


def test_tail_mean_pairs_finished_splits_only():
    rows = [_curve_row("reg", 0, 10000, -5.0), _curve_row("reg", 0, 19000, 0.2), _curve_row("reg", 0, 20000, 0.4),
            _curve_row("reg", 0, 20010, 0.6), _curve_row("reg", 0, 30000, 9.0),
            _curve_row("dreg", 0, 19500, 0.1), _curve_row("dreg", 0, 20000, 0.3),
            _curve_row("reg", 1, 20000, 1.0), _curve_row("dreg", 1, 19000, 2.0)]  # DREG split 1 has not reached 20 000
    scores = table.tail_scores(rows, 20000, 1000)
    assert scores[("reg", 0)] == [0.2, 0.4, 0.6]  # 10 000 and 30 000 lie outside the window
    assert ("dreg", 1) not in scores
    (only,) = table.paired_differences(scores, "reg", "dreg")
    assert only["split"] == 0 and only["n"] == (3, 2)
    assert only["reg"] == pytest.approx(0.4) and only["dreg"] == pytest.approx(0.2)
    assert only["difference"] == pytest.approx(-0.2) and only["reg_sd"] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="window"):
        table.tail_scores(rows, 20000, 0)
