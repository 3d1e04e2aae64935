"""Report builder on synthetic rows: mean ± standard error, bold best, ranking, applications, paper gaps."""
import json
import math

import numpy as np
import pytest

from flowgp.bench import report as R

pytestmark = pytest.mark.usefixtures("bench_state_in_tmp")


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _bench_rows():
    rows = []
    # svgp is best on d1 (lower NLL), tgp best on d2; known values so mean/se are checkable
    for split, (a, b) in enumerate([(1.0, 2.0), (3.0, 2.5)]):
        rows.append(dict(dataset="d1", model="svgp", num_inducing=100, split=split, preset="quick", nll=a,
                         rmse=a, coverage95=0.95, task="regression"))
        rows.append(dict(dataset="d1", model="tgp", num_inducing=100, split=split, preset="quick", nll=b + 1,
                         rmse=b + 1, coverage95=0.80, task="regression"))
        rows.append(dict(dataset="d2", model="svgp", num_inducing=100, split=split, preset="quick", nll=5.0,
                         rmse=5.0, coverage95=0.99, task="regression"))
        rows.append(dict(dataset="d2", model="tgp", num_inducing=100, split=split, preset="quick", nll=4.0,
                         rmse=4.0, coverage95=0.94, task="regression"))
    rows.append(dict(dataset="cls", model="svgp", num_inducing=10, split=0, preset="quick", accuracy=0.9, nll=0.3,
                     task="classification"))
    rows.append(dict(dataset="cls", model="tgp", num_inducing=10, split=0, preset="quick", accuracy=0.95, nll=0.2,
                     task="classification"))
    return rows


def test_mean_se():
    m, se, n = R.mean_se([1.0, 3.0, float("nan")])
    assert (m, n) == (2.0, 2) and se == pytest.approx(math.sqrt(2) / math.sqrt(2))
    assert R.mean_se([2.0])[1] == 0.0
    assert np.isnan(R.mean_se([])[0])


def test_benchmark_tables_and_ranking(tmp_path):
    _write(tmp_path / "uci.jsonl", _bench_rows())
    path = R.build_report(tmp_path, figures=True, command="flowgp bench uci ...")
    text = path.read_text()
    # d1: svgp mean 2.0 ± 1.0 (se of [1, 3]) is best and bold; tgp 3.25 ± 0.25
    assert "| d1 | 100 | 2 | **2.000 ± 1.000** | 3.250 ± 0.250 |" in text
    assert "| d2 | 100 | 2 | 5.000 ± 0.000 | **4.000 ± 0.000** |" in text
    # coverage: closest to 0.95 wins (svgp 0.95 on d1, tgp 0.94 on d2)
    assert "| d1 | 100 | 2 | **0.950 ± 0.000** | 0.800 ± 0.000 |" in text
    assert "| d2 | 100 | 2 | 0.990 ± 0.000 | **0.940 ± 0.000** |" in text
    # ranks: one win each -> both 1.5
    table = R.benchmark_summary([r for r in _bench_rows() if r["task"] == "regression"])[("quick", "regression")]
    assert R.rankings(table, "nll") == {100: {"svgp": (1.5, 2), "tgp": (1.5, 2)}}
    # classification: accuracy higher is better, bold on tgp
    assert "| cls | 10 | 1 | 0.900 ± 0.000 | **0.950 ± 0.000** |" in text
    assert "flowgp bench uci ..." in text
    for name in ("regression_quick_nll.png", "regression_quick_rmse.png", "classification_quick_accuracy.png"):
        assert (tmp_path / name).stat().st_size > 1000
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert {r["dataset"] for r in summary["benchmark"]["quick/regression"]} == {"d1", "d2"}


def test_applications_and_paper_comparison(tmp_path):
    rows = []
    for seed in (0, 1):
        for fold in range(5):
            for model, flow, init, rmse in [("svgp", "none", "none", 5.491), ("tgp", "sal+softplus", "data", 4.0)]:
                rows.append(dict(dataset="airquality", model=model, flow=flow, flow_init=init, inducing_fraction=0.05,
                                 fix_noise_fraction=0.6, seed=seed, fold=fold, protocol="cv", preset="quick",
                                 rmse=rmse + 0.1 * (fold - 2), nll=3.0, coverage95=0.9))
    _write(tmp_path / "airquality.jsonl", rows)
    _write(tmp_path / "airquality.errors.jsonl", [{"junk": 1}])  # ignored
    text = R.build_report(tmp_path, figures=False).read_text()
    std = float(np.std([0.1 * (f - 2) for f in range(5)] * 2, ddof=1))
    assert f"| 0.05 | 0.6 | 10 | 5.491 ± {std:.3f} | **4.000 ± {std:.3f}** |" in text
    comp = {(c["model"], c["size"]): c for c in R.paper_comparison(rows)}
    # svgp equals the paper's mean -> gap 0; tgp is below the paper's 4.851 -> negative gap
    assert comp[("svgp", 0.05)]["gap_in_se"] == pytest.approx(0.0, abs=1e-9)
    se = std / math.sqrt(10)
    assert comp[("tgp", 0.05)]["gap_in_se"] == pytest.approx((4.0 - 4.851) / math.sqrt(se**2 + (0.786 / math.sqrt(10))**2))
    assert "Against the paper" in text


def test_timing_rows(tmp_path):
    rows = [dict(dataset="energy", model=m, num_inducing=100, epochs=10, batch_size=691, repeat=r, split=0, tag="",
                 train_seconds=t * (r + 1), predict_seconds=0.1 * t) for r in range(3) for m, t in (("svgp", 1.0), ("tgp", 2.0))]
    _write(tmp_path / "timing.jsonl", rows)
    text = R.build_report(tmp_path, figures=False).read_text()
    assert "| svgp | 3 | 2.000 | 1.00 |" in text and "| tgp | 3 | 4.000 | 2.00 |" in text


def test_empty_folder_errors(tmp_path):
    with pytest.raises(ValueError, match="no result rows"):
        R.build_report(tmp_path)
    with pytest.raises(FileNotFoundError):
        R.build_report(tmp_path / "missing")


def test_training_elbo_table_standardises_and_quotes_table_one(tmp_path):
    # y in units of scale s: the standardised ELBO is elbo_y + n·log s; two splits give mean ± se
    rows = [dict(dataset="boston", model="cnf-dgp3", num_inducing=100, split=k, preset="quick", nll=2.5, rmse=2.0,
                 coverage95=0.95, task="regression", n_train=455, train_elbo=-1300.0 + 10 * k, y_scale=math.e)
            for k in range(2)]
    rows.append(dict(dataset="boston", model="svgp", num_inducing=100, split=0, preset="quick", nll=2.4, rmse=2.5,
                     coverage95=0.95, task="regression", n_train=455))  # no train_elbo: left out of the table
    assert R.standardised_elbo(rows[0]) == pytest.approx(-1300.0 + 455.0)
    assert R.standardised_elbo(rows[-1]) is None
    assert R._deep_depth("cnf-dgp3") == 3 and R._deep_depth("dgp12") == 12
    assert R._deep_depth("svgp") is None and R._deep_depth("dgpx") is None
    _write(tmp_path / "uci.jsonl", rows)
    text = R.build_report(tmp_path, figures=False).read_text()
    assert "| quick | boston | cnf-dgp3 | 2 | -840.0 ± 5.0 | -1.846 | -814.13 / -846.45 |" in text
    assert "| quick | boston | svgp |" not in text
