"""benchmarks/ldgp_tail_pairs.py: a fit's score is the mean of its rows in the last window; only splits both
models finished are paired; a still-running fit is left out."""
import json
import sys
from pathlib import Path

import pytest


@pytest.fixture()
def pairs(benchmark_script, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))  # its sibling import
    yield benchmark_script("ldgp_tail_pairs")
    sys.modules.pop("ldgp_reg_vs_dreg", None)


def _row(model, split, it, ll):
    return {"model": model, "split": split, "iterations": it, "test_ll_std": ll}


def test_tail_mean_pairs_finished_splits_only(pairs):
    rows = [_row("reg", 0, 10000, -5.0), _row("reg", 0, 19000, 0.2), _row("reg", 0, 20000, 0.4),
            _row("reg", 0, 20010, 0.6), _row("reg", 0, 30000, 9.0),
            _row("dreg", 0, 19500, 0.1), _row("dreg", 0, 20000, 0.3),
            _row("reg", 1, 20000, 1.0), _row("dreg", 1, 19000, 2.0)]  # DREG split 1 has not reached 20 000
    scores = pairs.tail_scores(rows, 20000, 1000)
    assert scores[("reg", 0)] == [0.2, 0.4, 0.6]  # 10 000 and 30 000 lie outside the window
    assert ("dreg", 1) not in scores
    (only,) = pairs.paired_differences(scores, "reg", "dreg")
    assert only["split"] == 0 and only["n"] == (3, 2)
    assert only["reg"] == pytest.approx(0.4) and only["dreg"] == pytest.approx(0.2)
    assert only["difference"] == pytest.approx(-0.2) and only["reg_sd"] == pytest.approx(0.2)


def test_cli_reports_and_rejects_a_bad_window(pairs, tmp_path, capsys):
    path = tmp_path / "curve.jsonl"
    rows = [_row(m, s, 20000, ll) for m, s, ll in
            [("ldgp2-reg", 0, 0.5), ("ldgp2-dreg", 0, 0.7), ("ldgp2-reg", 1, 0.5), ("ldgp2-dreg", 1, 0.4)]]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert pairs.main([str(path), "--end", "20000"]) == 0
    out = capsys.readouterr().out
    assert "2 splits: ldgp2-dreg − ldgp2-reg +0.050 ± 0.150 (median +0.050)" in out and "positive 1/2" in out
    with pytest.raises(ValueError, match="--window"):
        pairs.main([str(path), "--end", "20000", "--window", "0"])
    assert pairs.main([str(path), "--end", "30000"]) == 1
