"""benchmarks/ldgp_reg_vs_dreg.py: the outlier rule and the paired DREG − REG summaries the ldgp README quotes."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "ldgp_reg_vs_dreg.py"
_spec = importlib.util.spec_from_file_location("ldgp_reg_vs_dreg", _PATH)
table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(table)


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
    path.write_text("\n".join(__import__("json").dumps(r) for r in rows))
    table.main([str(path), "--preset", "p", "--score", "nll_kde"])
    out = capsys.readouterr().out
    assert "| wine-red | 0 | -2.000 | -1.500 | +0.500 |" in out and "| wine-red | 1 |" not in out
    table.main([str(path), "--preset", "p"])
    out = capsys.readouterr().out
    assert "| wine-red | 0 | -1.000 | -0.900 | +0.100 |" in out and "| wine-red | 1 |" in out


def test_rows_of_two_row_orders_are_not_paired_by_split(tmp_path):
    rows = [_row("ldgp2-reg", 0, 1.0), {**_row("ldgp2-dreg", 0, 0.9), "row_order": "authors"}]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(__import__("json").dumps(r) for r in rows))
    with pytest.raises(SystemExit, match="mix splits of row orders"):
        table.main([str(path), "--preset", "p"])
    # a row that says "file" is a row of the same order as one written before the field existed
    path.write_text("\n".join(__import__("json").dumps(r) for r in [rows[0], {**rows[1], "row_order": "file"}]))
    table.main([str(path), "--preset", "p"])
