"""benchmarks/compiled_fit_time.py: one fit per fresh process, the variants it compares, its argument checks."""
import importlib.util
import json
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "compiled_fit_time.py"
_spec = importlib.util.spec_from_file_location("compiled_fit_time", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@pytest.mark.parametrize("model", ["svgp", "tgp"])
def test_a_child_fit_reports_its_time_and_loss(model):
    # compile="auto" on a tiny, short fit stays eager (no compiler needed): the row the table is made of
    row = bench.child(model, 4, "auto", steps=12, num_data=64, dim=2, batch=16, dtype="float64")
    assert row["model"] == model and row["variant"] == "auto" and row["steps"] == 12
    assert row["fit_s"] > 0 and row["final_loss"] == row["final_loss"]  # timed, and not NaN


def test_the_parent_runs_every_variant_in_a_fresh_process(tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert bench.main(["--inducing", "4", "--variants", "eager,auto", "--steps", "12", "--rounds", "1",
                       "--num-data", "64", "--dim", "2", "--batch", "16", "--dtype", "float64",
                       "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["round"], r["variant"]) for r in rows] == [(0, "eager"), (0, "auto")]
    # the same seed and budget: auto (eager here) ends where the eager fit ends
    assert len({r["final_loss"] for r in rows}) == 1
    assert "| svgp | 4 |" in capsys.readouterr().out


def test_rounds_rotate_which_variant_goes_first():
    variants = ["eager", "compiled", "auto"]
    assert [bench.round_order(variants, r) for r in range(4)] == [
        ["eager", "compiled", "auto"], ["compiled", "auto", "eager"], ["auto", "eager", "compiled"],
        ["eager", "compiled", "auto"]]


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        bench.main(["--models", "gpytorch"])
    with pytest.raises(SystemExit):
        bench.main(["--variants", "compiled"])  # no eager reference to divide by
