"""`flowgp fit/predict --threads N|auto`: the value reaches the estimator, a bad one is the usage error (exit 2)."""
import json

import numpy as np
import pytest
import torch

import flowgp
from flowgp.cli import main


def _csv(path, n=40):
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, size=(n, 2))
    y = np.sin(x[:, 0]) + 0.1 * rng.standard_normal(n)
    path.write_text("u,v,target\n" + "\n".join(f"{a},{b},{t}" for (a, b), t in zip(x, y)) + "\n")
    return path


def _fit_args(tmp_path, *extra):
    return ["fit", "--csv", str(_csv(tmp_path / "train.csv")), "--target", "target", "--model", "svgp",
            "--epochs", "2", "--num-inducing", "4", "--quiet", "--out", str(tmp_path / "m.pt"), *extra]


@pytest.mark.parametrize("value, expected", [("2", 2), ("1", 1), ("auto", "auto")])
def test_fit_threads_reach_the_estimator_and_torchs_count_is_restored(tmp_path, value, expected):
    before = torch.get_num_threads()
    assert main(_fit_args(tmp_path, "--threads", value)) == 0
    assert flowgp.load(tmp_path / "m.pt").threads == expected
    assert torch.get_num_threads() == before


def test_fit_threads_default_to_auto(tmp_path):
    assert main(_fit_args(tmp_path)) == 0
    assert flowgp.load(tmp_path / "m.pt").threads == "auto"


@pytest.mark.parametrize("bad", ["0", "-1", "many", "1.5", "", "True"])
@pytest.mark.parametrize("command", ["fit", "predict"])
def test_bad_threads_exit_with_the_usage_error(tmp_path, capsys, command, bad):
    args = (_fit_args(tmp_path) if command == "fit" else
            ["predict", "--model", str(tmp_path / "m.pt"), "--csv", str(tmp_path / "t.csv")])
    with pytest.raises(SystemExit) as exit_:
        main([*args, "--threads", bad])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--threads" in err and "positive integer or 'auto'" in err
    assert not (tmp_path / "m.pt").exists()


def test_predict_runs_with_the_threads_given(tmp_path, monkeypatch, capsys):
    assert main(_fit_args(tmp_path, "--threads", "1")) == 0
    calls = []
    set_num_threads = torch.set_num_threads

    def record(n):
        calls.append(n)
        set_num_threads(n)

    monkeypatch.setattr(torch, "set_num_threads", record)
    other = 2 if torch.get_num_threads() == 1 else 1
    before = torch.get_num_threads()
    out = tmp_path / "pred.csv"
    assert main(["predict", "--model", str(tmp_path / "m.pt"), "--csv", str(tmp_path / "train.csv"),
                 "--out", str(out), "--threads", str(other), "--quiet"]) == 0
    assert calls[:1] == [other] and calls[-1] == before and torch.get_num_threads() == before
    assert len(out.read_text().splitlines()) == 41
    assert "rmse" in json.loads(capsys.readouterr().out.splitlines()[-1])
