import json

import numpy as np

from flowgp.cli import main


def test_demo_writes_json_rows_and_a_figure(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--json", "--epochs", "40"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [r["model"] for r in lines] == ["SVGP", "TGP (tanh)", "v-WGP (sal)"]
    for row in lines:
        assert {"model", "nll", "rmse", "coverage95", "train_seconds"} <= set(row)
        assert np.isfinite(row["nll"]) and 0 <= row["coverage95"] <= 1
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "results.json").read_text()) == lines


def _sine_csv(path, n, seed):
    """A CSV with features u, v and target = sin(u) + noise."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, size=(n, 2))
    y = np.sin(x[:, 0]) + 0.1 * rng.standard_normal(n)
    path.write_text("u,v,target\n" + "\n".join(f"{a},{b},{t}" for (a, b), t in zip(x, y)) + "\n")
    return path


def test_fit_then_predict_on_a_csv(tmp_path, capsys):
    csv = _sine_csv(tmp_path / "train.csv", 60, 0)
    model = tmp_path / "m.pt"
    assert main(["fit", "--csv", str(csv), "--target", "target", "--model", "tgp", "--flow", "sal",
                 "--epochs", "30", "--num-inducing", "8", "--quiet", "--out", str(model)]) == 0
    out = tmp_path / "pred.csv"
    assert main(["predict", "--model", str(model), "--csv", str(csv), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert '"rmse"' in printed
    rows = out.read_text().strip().splitlines()
    assert rows[0] == "mean,std,lower,upper" and len(rows) == 61
    # features-only file (no target column)
    feats = tmp_path / "feats.csv"
    feats.write_text("u,v\n0.1,0.2\n1.0,-1.0\n")
    assert main(["predict", "--model", str(model), "--csv", str(feats), "--out", str(out)]) == 0
    assert len(out.read_text().strip().splitlines()) == 3


def test_cli_reports_bad_input_without_a_traceback(tmp_path, capsys):
    csv = tmp_path / "d.csv"
    csv.write_text("a,b\n1,2\n3,4\n")
    assert main(["fit", "--csv", str(csv), "--target", "nope", "--out", str(tmp_path / "m.pt")]) == 2
    assert "target column 'nope'" in capsys.readouterr().err


def test_fit_takes_deep_models_and_their_options(tmp_path, capsys):
    import flowgp

    csv = _sine_csv(tmp_path / "train.csv", 50, 1)
    cases = [
        (["--model", "dgp", "--layers", "3", "--posterior", "cnf"], flowgp.DeepGPRegressor,
         {"layers": 3, "posterior": "cnf"}),
        (["--model", "ldgp", "--layers", "2", "--num-importance", "3", "--gradient", "reg"],
         flowgp.LatentDeepGPRegressor, {"layers": 2, "num_importance": 3, "gradient": "reg"}),
    ]
    for extra, cls, params in cases:
        model = tmp_path / f"{extra[1]}.pt"
        assert main(["fit", "--csv", str(csv), "--target", "target", *extra, "--epochs", "3", "--num-inducing", "6",
                     "--quiet", "--out", str(model)]) == 0
        est = flowgp.load(model)
        assert isinstance(est, cls) and all(getattr(est, k) == v for k, v in params.items())
        out = tmp_path / "pred.csv"
        assert main(["predict", "--model", str(model), "--csv", str(csv), "--out", str(out)]) == 0
        assert len(out.read_text().strip().splitlines()) == 51
