"""flowgp.bench.ldgp_authors: the authors' Table 1 from their per-split scores, paired with ours by split."""
import json

from flowgp.bench import ldgp_authors as table1
from flowgp.bench.cli import main as bench


def _csv(path, scores):
    lines = ["dataset,estimator,split,mean_of_10,min_of_10,max_of_10"]
    lines += [f"power,{e},{s},{v},{v},{v}" for (e, s), v in scores.items()]
    path.write_text("\n".join(lines) + "\n")


def test_pairs_ours_by_split_only_in_the_authors_row_order_and_compares_encoders(tmp_path, capsys):
    _csv(tmp_path / "t.csv", {("reg", 0): 0.20, ("reg", 1): 0.30, ("dreg", 0): 0.25, ("dreg", 1): 0.35})
    rows = [{"model": "ldgp2-reg", "dataset": "power", "split": 0, "test_ll_std": 0.10, "row_order": "authors"},
            {"model": "ldgp2-reg", "dataset": "power", "split": 1, "test_ll_std": 0.20, "row_order": "authors"},
            {"model": "ldgp2-reg", "dataset": "power", "split": 0, "test_ll_std": 0.13, "row_order": "authors",
             "encoder_skips": "residual"},
            # the file's order: other test points, never paired with theirs
            {"model": "ldgp2-reg", "dataset": "power", "split": 1, "test_ll_std": 9.0, "row_order": "file"},
            {"model": "ldgp2-reg", "dataset": "power", "split": 1, "test_ll_std": 9.0},
            # the per-slot ablation (the learning-curve study's --draws per-slot): not flowgp's model, never paired
            {"model": "ldgp2-reg", "dataset": "power", "split": 0, "test_ll_std": 9.0, "row_order": "authors",
             "draws": "per-slot"}]
    (tmp_path / "ours.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    args = ["ldgp-authors", "--csv", str(tmp_path / "t.csv"), "--ours", str(tmp_path / "ours.jsonl")]
    assert bench(args) == 0
    out = capsys.readouterr().out
    assert "REG   mean +0.250" in out and "DREG - REG +0.050 ± 0.000, DREG ahead on 2 of 2" in out
    assert "ours ldgp2-reg on 2 of their splits: +0.150 against their +0.250; ours - theirs -0.100" in out
    assert bench(args + ["--encoder-skips", "residual"]) == 0
    out = capsys.readouterr().out
    assert "ours ldgp2-reg on 1 of their splits: +0.130 against their +0.200" in out
    assert "residual − dense encoder on 1 splits: +0.0300" in out


def test_outlying_rows_flags_a_planted_outlier_and_nothing_on_a_smooth_surface():
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, size=(400, 3))
    y = np.sin(x[:, 0]) + 0.5 * x[:, 1] + 0.05 * rng.standard_normal(400)
    mask, z = table1.outlying_rows(x, y, threshold=10)
    assert not mask.any() and np.abs(z).max() < 10  # Gaussian noise alone: no row 10 robust s.d. out
    y[17] -= 2.0  # 40 noise s.d. below the surface
    mask, z = table1.outlying_rows(x, y, threshold=10)
    assert mask.nonzero()[0].tolist() == [17] and z[17] < -10


def test_the_shipped_scores_reproduce_the_supplements_table_1_means(capsys):
    """Table 1 of the DREG supplement: REG / DREG 0.211 / 0.208 on power, 0.568 / 0.611 on wine-red."""
    table, spread = table1.read_authors()
    assert {d: len(table[d]["reg"]) for d in table} == {"power": 20, "wine-red": 20}
    assert all(v >= 0 for v in spread.values())
    assert bench(["ldgp-authors"]) == 0
    out = capsys.readouterr().out
    assert "REG   mean +0.211" in out and "DREG  mean +0.208" in out
    assert "REG   mean +0.568" in out and "DREG  mean +0.611" in out
