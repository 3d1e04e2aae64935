"""benchmarks/dgp_uci_table.py: the deep-GP UCI tables average only over splits every model finished."""
import importlib.util
import math
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "dgp_uci_table.py"
_spec = importlib.util.spec_from_file_location("dgp_uci_table", _PATH)
table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(table)


def _row(dataset, model, split, nll, elbo=-100.0):
    return {"dataset": dataset, "model": model, "split": split, "nll": nll, "train_elbo": elbo,
            "y_scale": 1.0, "n_train": 10}


def test_ranges_compresses_runs():
    assert table._ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert table._ranges([3]) == "3"
    assert table._ranges([]) == ""


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
