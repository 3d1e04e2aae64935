"""`flowgp bench uci` on the training engine: --nproc (rows record the world size), --device (cuda where there is
one), and rows written before those fields existed."""
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the bench fixtures
from bench_fixtures import make_data_dir  # noqa: E402
from flowgp.cli import main  # noqa: E402


def _rows(path):
    return [json.loads(s) for s in path.read_text().splitlines()]


@pytest.fixture
def common(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the fits' state folder, runs/bench/, lands in tmp_path
    data_dir = make_data_dir(tmp_path / "data")
    return ["bench", "uci", "--datasets", "toy", "--models", "svgp", "--splits", "0", "--inducing", "3",
            "--preset", "tiny", "--data-dir", str(data_dir), "--out", str(tmp_path / "res"), "--quiet"]


def test_uci_nproc_2_writes_rows_of_world_size_2(common, tmp_path):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    assert main(common + ["--nproc", "2"]) == 0
    rows = _rows(tmp_path / "res" / "uci.jsonl")
    assert [(r["world_size"], r["device"]) for r in rows] == [(2, "cpu")]
    assert main(common) == 0  # one process: a row of its own, the same fit
    rows = _rows(tmp_path / "res" / "uci.jsonl")
    assert [r["world_size"] for r in rows] == [2, 1]
    assert abs(rows[0]["nll"] - rows[1]["nll"]) <= 1e-6 * abs(rows[1]["nll"])


def test_rows_without_device_and_world_size_count_as_cpu_and_one_process(common, tmp_path):
    assert main(common) == 0
    path = tmp_path / "res" / "uci.jsonl"
    (row,) = _rows(path)
    assert row["device"] == "cpu" and row["world_size"] == 1
    del row["device"], row["world_size"]  # as written before the fields existed
    path.write_text(json.dumps(row) + "\n")
    assert main(common) == 0
    assert len(_rows(path)) == 1  # resumed: the old row is this fit's


def test_bad_engine_flags_are_refused_before_any_fit(common, tmp_path, capsys):
    assert main(common + ["--nproc", "0"]) == 2
    assert "--nproc must be a positive integer" in capsys.readouterr().err
    assert main(common + ["--nproc", "2", "--jobs", "2"]) == 2
    assert "--jobs and --nproc" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(common + ["--device", "cuda"]) == 2
        assert "CUDA is not available" in capsys.readouterr().err
    assert not (tmp_path / "res" / "uci.jsonl").exists()


@pytest.mark.cuda
def test_uci_on_cuda_records_the_device(common, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    assert main(common + ["--device", "cuda"]) == 0
    (row,) = _rows(tmp_path / "res" / "uci.jsonl")
    assert row["device"] == "cuda" and row["world_size"] == 1 and row["nll"] == row["nll"]
