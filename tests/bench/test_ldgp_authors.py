"""benchmarks/ldgp_authors_table1.py: the authors' Table 1 from their per-split scores, paired with ours by split."""
import importlib.util
import json
import sys
from pathlib import Path

import pytest

_DIR = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture()
def table1(monkeypatch):
    monkeypatch.syspath_prepend(str(_DIR))  # it imports ldgp_reg_vs_dreg as a sibling script
    spec = importlib.util.spec_from_file_location("ldgp_authors_table1", _DIR / "ldgp_authors_table1.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("ldgp_reg_vs_dreg", None)


def _csv(path, scores):
    lines = ["dataset,estimator,split,mean_of_10,min_of_10,max_of_10"]
    lines += [f"power,{e},{s},{v},{v},{v}" for (e, s), v in scores.items()]
    path.write_text("\n".join(lines) + "\n")


def test_pairs_ours_by_split_only_in_the_authors_row_order_and_compares_encoders(table1, tmp_path, capsys):
    _csv(tmp_path / "t.csv", {("reg", 0): 0.20, ("reg", 1): 0.30, ("dreg", 0): 0.25, ("dreg", 1): 0.35})
    rows = [{"model": "ldgp2-reg", "dataset": "power", "split": 0, "test_ll_std": 0.10, "row_order": "authors"},
            {"model": "ldgp2-reg", "dataset": "power", "split": 1, "test_ll_std": 0.20, "row_order": "authors"},
            {"model": "ldgp2-reg", "dataset": "power", "split": 0, "test_ll_std": 0.13, "row_order": "authors",
             "encoder_skips": "residual"},
            # the file's order: other test points, never paired with theirs
            {"model": "ldgp2-reg", "dataset": "power", "split": 1, "test_ll_std": 9.0, "row_order": "file"},
            {"model": "ldgp2-reg", "dataset": "power", "split": 1, "test_ll_std": 9.0},
            # the per-slot ablation (ldgp_learning_curve.py --draws per-slot): not flowgp's model, never paired
            {"model": "ldgp2-reg", "dataset": "power", "split": 0, "test_ll_std": 9.0, "row_order": "authors",
             "draws": "per-slot"}]
    (tmp_path / "ours.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    args = ["--csv", str(tmp_path / "t.csv"), "--ours", str(tmp_path / "ours.jsonl")]
    table1.main(args)
    out = capsys.readouterr().out
    assert "REG   mean +0.250" in out and "DREG - REG +0.050 ± 0.000, DREG ahead on 2 of 2" in out
    assert "ours ldgp2-reg on 2 of their splits: +0.150 against their +0.250; ours - theirs -0.100" in out
    table1.main(args + ["--encoder-skips", "residual"])
    out = capsys.readouterr().out
    assert "ours ldgp2-reg on 1 of their splits: +0.130 against their +0.200" in out
    assert "residual − dense encoder on 1 splits: +0.0300" in out


def test_outlying_rows_flags_a_planted_outlier_and_nothing_on_a_smooth_surface(table1):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, size=(400, 3))
    y = np.sin(x[:, 0]) + 0.5 * x[:, 1] + 0.05 * rng.standard_normal(400)
    mask, z = table1.outlying_rows(x, y, threshold=10)
    assert not mask.any() and np.abs(z).max() < 10  # Gaussian noise alone: no row 10 robust s.d. out
    y[17] -= 2.0  # 40 noise s.d. below the surface
    mask, z = table1.outlying_rows(x, y, threshold=10)
    assert mask.nonzero()[0].tolist() == [17] and z[17] < -10
