"""The tables of the documentation's "Reproducing the papers" page (docs/_ext/paper_tables.py), on small synthetic
row files: ours as mean ± standard error, the published value, the difference in standard errors (combined, or
ours alone when the paper gives no spread), the budget ratio, and "not run yet" where rows are still missing."""
import json
import math
import statistics
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
sys.path.insert(0, str(DOCS / "_ext"))
import paper_tables as pt  # noqa: E402


@pytest.fixture
def results(tmp_path, monkeypatch):
    """An empty docs/results in tmp_path, and a writer of row files into it."""
    monkeypatch.setattr(pt, "RESULTS", tmp_path)

    def write(relative: str, rows: list[dict]) -> None:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    return write


def _se(values):
    return statistics.stdev(values) / math.sqrt(len(values))


# ----- the shared cells -----------------------------------------------------------------------------------------
def test_compare_gives_ours_published_and_the_difference_in_combined_or_our_standard_error():
    values = [0.1, 0.3, 0.5]  # mean 0.3, se 0.11547
    ours, paper, gap = pt.compare(values, 0.1, 0.05)
    assert ours == "0.300 ± 0.115 (3)" and paper == "0.100 ± 0.050"
    assert float(gap) == pytest.approx(0.2 / math.hypot(_se(values), 0.05), abs=0.05)
    assert pt.compare(values, 0.1)[2] == f"{0.2 / _se(values):+.1f}"  # no published spread: ours alone
    assert pt.compare([], 0.1) == [pt.NOT_RUN, "0.100", "—"]
    assert pt.compare([0.4], 0.1)[2] == "—"  # one run and no published spread: no standard error at all
    assert pt.compare(values, None)[1:] == ["not published", "—"]
    assert pt.compare(values, 0.1, published_text="0.1 (DSVI)")[1] == "0.1 (DSVI)"


def test_budget_ratio_is_ours_over_the_papers_and_a_range_for_several_budgets():
    assert pt.budget_ratio(1500, 15000) == "0.1"
    assert pt.budget_ratio(10013, 300000) == "0.033"
    assert pt.budget_ratio([100, 1500, 100], 15000) == "0.0067-0.1"
    assert pt.budget_ratio([], 15000) == "—"


def test_steps_count_the_short_last_batch_of_an_epoch():
    assert pt.steps({"epochs": 589, "n_train": 8611, "batch_size": 512}) == 10013
    assert pt.steps({"epochs": 3, "n_train": 512, "batch_size": 512}) == 3


def test_the_difference_header_says_which_standard_error_it_uses():
    assert pt.difference_header([0.1, 0.2]) == pt.DIFF_COMBINED
    assert pt.difference_header([None]) == pt.DIFF_OURS
    assert pt.difference_header([None, 0.1]) == pt.DIFF_MIXED


def test_a_missing_result_folder_is_an_error_unless_it_is_optional(results):
    with pytest.raises(FileNotFoundError, match="no result rows"):
        pt.rows("tgp/absent")
    assert pt.optional_rows("tgp/absent") == []
    results("tgp/present/uci.jsonl", [{"dataset": "a", "model": "svgp", "num_inducing": 5, "split": 0}] * 2)
    assert len(pt.optional_rows("tgp/absent", "tgp/present")) == 1  # the repeat of one identity dropped
    assert len(pt.rows("tgp/present", unique=False)) == 2


# ----- TGP: the few-inducing-points claim -----------------------------------------------------------------------
def _uci(dataset, model, m, nll, split, epochs=750):
    return {"dataset": dataset, "model": model, "num_inducing": m, "split": split, "nll": nll, "rmse": 1.0,
            "task": "regression", "preset": "quick", "epochs": epochs, "n_train": 100, "batch_size": 100}


def test_inducing_claim_table_compares_m5_with_the_svgp_at_100_and_counts_the_sets(results):
    svgp, ba, pe = (1.0, 1.2), (1.15, 1.25), (1.3, 1.4)
    rows = [_uci("a", "svgp", 100, v, k) for k, v in enumerate(svgp)]
    rows += [_uci("a", "ba-tgp", 5, v, k) for k, v in enumerate(ba)]
    rows += [_uci("a", "pe-tgp", 5, v, k) for k, v in enumerate(pe)]
    rows += [_uci("b", "svgp", 100, 2.0, k, epochs=1500) for k in range(2)]
    rows += [_uci("b", "ba-tgp", 5, 1.5 + 0.1 * k, k, epochs=1500) for k in range(2)]
    results("tgp/sweep/uci.jsonl", rows)
    header, table = pt.inducing_claim_table("tgp/sweep/uci.jsonl")
    assert len(header) == len(table[0])
    a, b, count = table
    assert a[:2] == ["a", "1.100 ± 0.100 (2)"]
    assert a[2] == "1.200 ± 0.050 (2)" and a[4] == "yes"
    assert float(a[3]) == pytest.approx(0.1 / math.hypot(0.1, 0.05), abs=0.05)
    assert a[5] == "1.350 ± 0.050 (2)" and a[7] == "no"
    assert a[8] == "0.05" and b[8] == "0.1"  # 750 and 1 500 epochs against the paper's 15 000
    assert b[4] == "yes" and b[5] == pt.NOT_RUN
    assert count[4] == "2 of 2" and count[7] == "0 of 1"


# ----- DGP-IWVI / DREG Table 1 ----------------------------------------------------------------------------------
def _ldgp(dataset, model, split, test_ll, objective=None, preset="reference-e589", row_order=None):
    row = {"dataset": dataset, "model": model, "num_inducing": 128, "split": split, "preset": preset,
           "nll": -test_ll, "y_scale": 1.0, "epochs": 589, "n_train": 8611, "batch_size": 512, "task": "regression"}
    if objective:
        row["objective"] = objective
    if row_order:
        row["row_order"] = row_order
    return row


def test_dreg_published_is_the_supplements_table_1_from_the_authors_splits():
    published = pt.dreg_published()
    assert [round(published[k][0], 3) for k in [("power", "REG"), ("power", "DREG"), ("wine-red", "REG"),
                                                 ("wine-red", "DREG")]] == [0.211, 0.208, 0.568, 0.611]
    assert round(published[("power", "REG")][1], 3) == 0.009 and round(published[("wine-red", "DREG")][1], 3) == 0.204


def test_dreg_table_shows_both_objectives_and_not_run_yet_for_missing_cells(results):
    reg = (0.10, 0.14, 0.18)
    rows = [_ldgp("power", "ldgp2-reg", k, v) for k, v in enumerate(reg)]
    rows += [_ldgp("power", "ldgp2-reg", 0, 9.0, preset="reference-e300")]  # a smoke run: left out
    rows += [_ldgp("power", "svgp", 0, 9.0)]  # a baseline: not a Table 1 model
    results("ldgp/t1/uci.jsonl", rows)
    header, table = pt.dreg_table_1(("ldgp/t1",), ("ldgp/t1/table1",))  # the second folder does not exist yet
    assert len(table) == 8 and all(len(r) == len(header) for r in table)
    power_reg = table[0]
    assert power_reg[:3] == ["power", pt.OBJECTIVES[0][1], "REG"]
    assert power_reg[4] == "0.140 ± 0.023 (3)"
    pub, pub_se = pt.dreg_published()[("power", "REG")]
    assert float(power_reg[6]) == pytest.approx((0.14 - pub) / math.hypot(_se(reg), pub_se), abs=0.05)
    assert power_reg[7] == "0.033"  # 589 epochs × 17 batches = 10 013 of 300 000 iterations
    assert all(r[4] == pt.NOT_RUN for r in table[1:])

    results("ldgp/t1/table1/uci.jsonl", [_ldgp("power", "ldgp2-dreg-per-slot", k, 0.2 + 0.01 * k, "per-slot",
                                               row_order="authors") for k in range(4)])
    _, table = pt.dreg_table_1(("ldgp/t1",), ("ldgp/t1/table1",))
    per_slot_dreg = [r for r in table if r[1] == pt.OBJECTIVES[1][1] and r[0] == "power" and r[2] == "DREG"]
    assert len(per_slot_dreg) == 1 and per_slot_dreg[0][4] == "0.215 ± 0.006 (4)"
    assert "the authors' splits" in per_slot_dreg[0][3]


def test_a_learning_curve_point_joins_the_bench_rows_of_its_budget(results):
    """A split whose Table 1 score is a learning curve's point at the bench budget (wine-red's REG split 0)
    counts with the bench rows of that budget, and points at other iterations do not."""
    rows = [_ldgp("power", "ldgp2-reg", k, v) for k, v in ((1, 0.12), (2, 0.16))]
    results("ldgp/t1/uci.jsonl", rows)
    curve = [{"model": "ldgp2-reg", "dataset": "power", "split": 0, "iterations": it, "test_ll_std": v}
             for it, v in ((1000, -0.5), (10013, 0.14))]
    results("ldgp/t1/curve/curve.jsonl", curve)
    extra = pt.curve_rows_as_bench("ldgp/t1/curve/curve.jsonl", 10013, ("ldgp/t1",))
    assert len(extra) == 1 and extra[0]["split"] == 0 and extra[0]["preset"] == rows[0]["preset"]
    _, table = pt.dreg_table_1(("ldgp/t1",), extra=extra)
    assert table[0][4] == "0.140 ± 0.012 (3)"
    assert pt.curve_rows_as_bench("ldgp/t1/curve/curve.jsonl", 5000, ("ldgp/t1",)) == []


# ----- CNF-DGP Table III and the Table I depth trend ------------------------------------------------------------
def _image(model, skip, accuracy, seed=0, epochs=85):
    return {"dataset": "fashion-mnist", "model": model, "skip": skip, "seed": seed, "preset": "paper",
            "max_train": None, "accuracy": accuracy, "nll": 0.3, "ece": 0.02, "epochs": epochs, "n_train": 60000,
            "batch_size": 256, "num_inducing": 100}


def test_cnf_table_iii_sets_each_model_beside_its_published_cell(results):
    folders = {"mnist": None, "fashion-mnist": "cnf/fm", "cifar10": None}
    _, table = pt.cnf_table_iii(folders)
    assert [r[3] for r in table] == [pt.NO_DATA] * 3 + [pt.NOT_RUN] * 3 + [pt.NO_DATA] * 3
    assert table[4][4] == "91.57 (DSVI)" and table[5][4] == "92.03 (NF)"

    results("cnf/fm/images.jsonl", [_image("dgp4", "conv", 0.90, seed) for seed in (0, 1)]
            + [_image("dgp4", "dense", 0.91), _image("sgp", "none", 0.87)])
    header, table = pt.cnf_table_iii(folders)
    fm = {(r[1], r[2]): r for r in table if r[0] == "fashion-mnist"}
    assert set(fm) == {("sgp", "none"), ("dgp4", "conv"), ("dgp4", "dense"), ("cnf-dgp4", "—")}
    conv = fm[("dgp4", "conv")]
    assert conv[3] == "90.00 ± 0.00 (2)" and conv[5] == "—"  # no spread on either side
    assert fm[("dgp4", "dense")][3] == "91.00 (1)"
    assert conv[8] == "1"  # 85 epochs × 235 batches = 19 975 steps ≈ 20 000
    assert fm[("cnf-dgp4", "—")][3] == pt.NOT_RUN and len(header) == len(conv)


def _elbo_row(model, split, elbo_std, **extra):
    # standardised_elbo = train_elbo + n_train log(y_scale); y_scale 1 makes them equal
    return {"dataset": "boston", "model": model, "split": split, "num_inducing": 100, "train_elbo": elbo_std,
            "n_train": 455, "y_scale": 1.0, "epochs": 1500, **extra}


def test_depth_trend_table_gives_each_protocols_ordering_next_to_the_papers(results):
    quick = [_elbo_row(f"dgp{d}", k, -100.0 * d - k, preset="quick", batch_size=455)
             for d in (2, 3) for k in (0, 1)]
    results("q/uci.jsonl", quick)
    results("p/uci.jsonl", [_elbo_row(f"dgp{d}", 0, -50.0 + d, preset="paper", batch_size=455, epochs=15000)
                            for d in (2, 3, 4)])
    # two variants with the same bench identity: both kept
    results("abl.jsonl", [_elbo_row("dgp2", 0, -10.0, variant="identity-start"),
                          _elbo_row("dgp2", 0, -20.0, variant="default"),
                          _elbo_row("dgp3", 0, -30.0, variant="default")])
    header, table = pt.depth_trend_table("q", "p", "abl.jsonl")
    assert all(len(r) == len(header) for r in table)
    q, p, default, identity, nf, ipvi = table
    assert q[1] == "1 500" and q[2] == "-200.5 ± 0.5 (2)" and q[6] == "falls: 2 > 3"
    assert q[7] == "-100.0 ± 0.0 (L3 − L2, 2 splits)"
    assert p[1] == "15 000" and p[6] == "rises: 2 < 3 < 4" and p[7] == "+2.0 (L4 − L2, 1 split)"
    assert default[2:4] == ["-20.0 (1)", "-30.0 (1)"]
    assert identity[2] == "-10.0 (1)" and identity[6] == "—"
    assert nf[6] == "rises: 2 < 3 < 4 < 5" and nf[7] == "+102.25 (L5 − L2)"
    assert ipvi[2] == "-846.65"


# ----- the TGP tables with published spreads ---------------------------------------------------------------------
def test_airquality_comparison_uses_the_combined_standard_error_and_the_papers_epochs(results):
    from flowgp.bench.report import PAPER_REFERENCE, PAPER_RUNS

    mean, std = next((m, s) for ds, model, _f, size, metric, m, s, _src in PAPER_REFERENCE
                     if ds == "airquality" and model == "svgp" and size == 0.05 and metric == "rmse")
    rmse = [mean + 1.0, mean + 2.0, mean + 3.0]
    results("aq/airquality.jsonl", [
        {"dataset": "airquality", "model": "svgp", "fold": k, "inducing_fraction": 0.05, "fix_noise_fraction": 0,
         "rmse": v, "nll": 1.0, "epochs": 1000, "seed": 0, "preset": "quick", "protocol": "cv", "flow": "none",
         "flow_init": "none", "num_inducing": 30} for k, v in enumerate(rmse)])
    header, table = pt.paper_comparison_table(["aq"], {"airquality"})
    assert header[8] == pt.DIFF_COMBINED
    row = next(r for r in table if r[1] == "svgp" and r[5] == "RMSE")
    expected = 2.0 / math.hypot(_se(rmse), std / math.sqrt(PAPER_RUNS["airquality"]))
    assert float(row[8]) == pytest.approx(expected, abs=0.05)
    assert row[9] == "0.1"  # 1 000 of the appendix's 10 000 epochs


def test_table_iii_leaves_out_the_learning_curve_beside_the_rows(results):
    """`flowgp bench images --curve-every` writes curve.jsonl into the rows' folder: its points (a "step", no
    "epochs") are not fits, and a folder holding only a curve is still "not run yet"."""
    point = {"dataset": "fashion-mnist", "model": "sgp", "skip": "none", "seed": 0, "preset": "paper",
             "max_train": None, "step": 500, "epoch": 2.1, "accuracy": 0.1, "nll": 2.3, "ece": 0.0}
    results("cnf/fm/curve.jsonl", [point])
    _, table = pt.cnf_table_iii({"fashion-mnist": "cnf/fm"})
    assert all(r[3] == pt.NOT_RUN for r in table)
    results("cnf/fm/images.jsonl", [_image("sgp", "none", 0.87)])
    _, table = pt.cnf_table_iii({"fashion-mnist": "cnf/fm"})
    assert [r[3] for r in table if r[1] == "sgp"] == ["87.00 (1)"]
