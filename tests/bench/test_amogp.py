"""`flowgp bench amogp` on the training engine: --nproc (rows record the world size, the fits equal one process's),
rows written before device and world_size existed, and the table's rows per engine."""
import json

import pytest
import torch

from flowgp.bench import amogp
from flowgp.cli import main

pytestmark = pytest.mark.usefixtures("bench_state_in_tmp")


def _rows(path):
    return [json.loads(s) for s in path.read_text().splitlines()]


def _row(model, rmse, **engine):
    return {"experiment": "artificial", "model": model, "epochs": 1, "rmse": rmse, "test_ll": -rmse,
            "train_seconds": 1.0, **engine}


def test_the_table_keeps_the_rows_of_each_engine_apart():
    table = amogp._table([_row("amogp", 1.0), _row("amogp", 3.0), _row("amogp", 5.0, device="cpu", world_size=2),
                          _row("amogp", 7.0, device="cuda", world_size=1)])
    lines = [line for line in table.splitlines() if line.startswith("| amogp")]
    assert [line.split(" | ")[0] for line in lines] == ["| amogp", "| amogp (cpu, 2 processes)",
                                                        "| amogp (cuda, 1 processes)"]
    assert "| 2 | 2.000 ± 1.000 |" in lines[0]  # the two rows without engine fields: cpu, one process


@pytest.mark.slow
def test_amogp_nproc_2_writes_rows_of_world_size_2(tmp_path):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    out = tmp_path / "res"
    common = ["bench", "amogp", "--experiment", "artificial", "--epochs", "1", "--baseline-epochs", "1",
              "--out", str(out), "--quiet"]
    assert main(common + ["--nproc", "2"]) == 0
    path = out / "amogp.jsonl"
    assert [(r["model"], r["world_size"], r["device"]) for r in _rows(path)] == [
        ("amogp", 2, "cpu"), ("mogp", 2, "cpu"), ("svgp", 2, "cpu")]
    assert main(common) == 0  # one process: rows of their own, the same fits
    rows = _rows(path)
    assert [r["world_size"] for r in rows] == [2, 2, 2, 1, 1, 1]
    for two, one in zip(rows[:3], rows[3:]):
        assert abs(two["rmse"] - one["rmse"]) <= 1e-6 * one["rmse"], two["model"]
    # rows written before the engine fields existed are the cpu, one-process rows: nothing is fitted again
    old = [{k: v for k, v in r.items() if k not in ("device", "world_size")} if r["world_size"] == 1 else r
           for r in rows]
    path.write_text("".join(json.dumps(r) + "\n" for r in old))
    assert main(common) == 0
    assert len(_rows(path)) == 6
