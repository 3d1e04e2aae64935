"""`flowgp bench timing` (flowgp.bench.timing): medians per model and ratios to the first model in closed form,
models in the order asked, and bad budgets refused before any data is read; on the training engine --nproc (rows
record the world size) and rows written before device and world_size existed."""
import argparse
import json

import pytest
import torch

from bench_fixtures import make_data_dir
from flowgp.bench import timing
from flowgp.cli import main


def _row(model, train, predict, epochs=10):
    return {"model": model, "train_seconds": train, "predict_seconds": predict, "epochs": epochs}


def test_medians_and_ratios_against_the_first_model():
    rows = [_row("svgp", 1.0, 0.1), _row("tgp", 3.0, 0.5), _row("svgp", 2.0, 0.3), _row("tgp", 5.0, 0.7),
            _row("svgp", 9.0, 0.2), _row("tgp", 4.0, 0.6)]
    svgp, tgp = timing.summarise(rows, ["svgp", "tgp"])
    assert (svgp["repeats"], svgp["train_median_s"], svgp["predict_median_s"]) == (3, 2.0, 0.2)
    assert svgp["train_s_per_epoch"] == pytest.approx(0.2) and svgp["train_ratio"] == svgp["predict_ratio"] == 1.0
    assert tgp["train_ratio"] == pytest.approx(4.0 / 2.0) and tgp["predict_ratio"] == pytest.approx(0.6 / 0.2)
    # the order asked decides the reference; a model without rows is left out
    tgp_first = timing.summarise(rows, ["tgp", "dgp", "svgp"])
    assert [s["model"] for s in tgp_first] == ["tgp", "svgp"] and tgp_first[1]["train_ratio"] == pytest.approx(0.5)
    assert [s["model"] for s in timing.summarise(rows)] == ["svgp", "tgp"]  # default: the rows' order
    assert timing.summarise([]) == []


@pytest.mark.parametrize("bad", [dict(repeats=0), dict(epochs=0)])
def test_a_run_without_repeats_or_epochs_is_refused(bad):
    parser = argparse.ArgumentParser()
    timing.add_arguments(parser)
    args = parser.parse_args(["--data-dir", "/nonexistent"])
    for k, v in bad.items():
        setattr(args, k, v)
    with pytest.raises(ValueError, match="--repeats and --epochs must be >= 1"):
        timing.run(args)


def _timing(tmp_path):
    data_dir = make_data_dir(tmp_path / "data")
    return ["bench", "timing", "--dataset", "toy", "--models", "svgp", "--epochs", "2", "--repeats", "1",
            "--inducing", "3", "--data-dir", str(data_dir), "--out", str(tmp_path / "res"), "--quiet"]


def _rows(path):
    return [json.loads(s) for s in path.read_text().splitlines()]


@pytest.mark.slow
def test_timing_nproc_2_writes_rows_of_world_size_2(tmp_path, monkeypatch):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    monkeypatch.chdir(tmp_path)
    common = _timing(tmp_path)
    assert main(common + ["--nproc", "2"]) == 0
    rows = _rows(tmp_path / "res" / "timing.jsonl")
    assert [(r["world_size"], r["device"]) for r in rows] == [(2, "cpu")]
    assert main(common) == 0  # one process: a row of its own, the same fit
    rows = _rows(tmp_path / "res" / "timing.jsonl")
    assert [r["world_size"] for r in rows] == [2, 1]
    assert abs(rows[0]["nll"] - rows[1]["nll"]) <= 1e-6 * abs(rows[1]["nll"])


def test_timing_rows_without_device_and_world_size_count_as_cpu_and_one_process(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    common = _timing(tmp_path)
    assert main(common) == 0
    path = tmp_path / "res" / "timing.jsonl"
    (row,) = _rows(path)
    assert row["device"] == "cpu" and row["world_size"] == 1
    del row["device"], row["world_size"]  # as written before the fields existed
    path.write_text(json.dumps(row) + "\n")
    capsys.readouterr()
    assert main(common) == 0
    assert len(_rows(path)) == 1  # resumed: the old row is this fit's, and the summary counts it
    assert "svgp" in capsys.readouterr().out


@pytest.mark.cuda
def test_timing_on_cuda_records_the_device(tmp_path, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    monkeypatch.chdir(tmp_path)
    assert main(_timing(tmp_path) + ["--device", "cuda"]) == 0
    (row,) = _rows(tmp_path / "res" / "timing.jsonl")
    assert row["device"] == "cuda" and row["world_size"] == 1 and row["nll"] == row["nll"]
