"""Tiny smoke benchmark (what CI runs): every bench subcommand end to end on synthetic data, in-process."""
import json

import pytest

from bench_fixtures import make_data_dir
from flowgp.bench import applications as A
from flowgp.bench.models import make_estimator, model_names
from flowgp.bench.presets import get_application_preset, get_preset
from flowgp.cli import main

pytestmark = pytest.mark.usefixtures("bench_state_in_tmp")


@pytest.fixture
def data_dir(tmp_path):
    return make_data_dir(tmp_path / "data")


def _rows(path):
    return [json.loads(s) for s in path.read_text().splitlines()]


def test_smoke_uci_applications_timing_report(data_dir, tmp_path, capsys):
    out = tmp_path / "res"
    common = ["--preset", "tiny", "--data-dir", str(data_dir), "--out", str(out), "--quiet"]
    assert main(["bench", "uci", "--datasets", "toy", "--models", "svgp,tgp,wgp", "--splits", "0-1",
                 "--inducing", "3,5", *common]) == 0
    rows = _rows(out / "uci.jsonl")
    assert len(rows) == 12
    need = {"dataset", "model", "num_inducing", "split", "nll", "rmse", "coverage95", "train_seconds",
            "predict_seconds", "epochs", "seed"}
    assert all(need <= r.keys() for r in rows)
    assert {r["seed"] for r in rows} == {0, 1}
    # rerun: nothing new
    assert main(["bench", "uci", "--datasets", "toy", "--models", "svgp,tgp,wgp", "--splits", "0-1",
                 "--inducing", "3,5", *common]) == 0
    assert len(_rows(out / "uci.jsonl")) == 12
    assert main(["bench", "uci", "--datasets", "banknote", "--models", "svgp,tgp", "--splits", "0", "--inducing", "4",
                 *common]) == 0
    cls = [r for r in _rows(out / "uci.jsonl") if r["dataset"] == "banknote"]
    assert len(cls) == 2 and all(0 <= r["accuracy"] <= 1 and r["nll"] > 0 for r in cls)
    assert main(["bench", "airquality", "--models", "svgp,tgp,wgp", "--seeds", "0", "--folds", "0",
                 "--inducing-fractions", "0.1", "--noise-schemes", "0.6", *common]) == 0
    app = _rows(out / "airquality.jsonl")
    assert {r["model"] for r in app} == {"svgp", "tgp", "wgp"}
    assert [r["warp"] for r in app if r["model"] == "wgp"] == ["log+sal"]
    assert main(["bench", "rainfall", "--models", "svgp", "--protocol", "official", "--seeds", "0",
                 "--noise-schemes", "0", *common]) == 0
    assert _rows(out / "rainfall.jsonl")[0]["n_train"] == 10
    # --epochs overrides the preset's budget and is part of the row's preset label
    assert main(["bench", "rainfall", "--models", "svgp", "--protocol", "official", "--seeds", "0",
                 "--noise-schemes", "0", "--epochs", "2", *common]) == 0
    assert [(r["preset"], r["epochs"]) for r in _rows(out / "rainfall.jsonl")] == [("tiny", 3), ("tiny-e2", 2)]
    assert main(["bench", "uci", "--datasets", "toy", "--models", "svgp", "--splits", "0", "--inducing", "3",
                 "--epochs", "2", *common]) == 0
    assert _rows(out / "uci.jsonl")[-1]["preset"] == "tiny-e2" and _rows(out / "uci.jsonl")[-1]["epochs"] == 2
    assert main(["bench", "timing", "--dataset", "toy", "--epochs", "2", "--repeats", "2", "--inducing", "4",
                 "--data-dir", str(data_dir), "--out", str(out), "--quiet"]) == 0
    assert len(_rows(out / "timing.jsonl")) == 4
    assert main(["bench", "report", str(out), "--no-figures"]) == 0
    text = (out / "report.md").read_text()
    assert "Regression benchmark (preset `tiny`)" in text and "Application: airquality" in text
    assert "Timing: toy" in text
    assert "Classification benchmark (preset `tiny`)" in text


def test_bad_input_gives_exit_code_2(data_dir, tmp_path, capsys):
    common = ["--data-dir", str(data_dir), "--out", str(tmp_path / "o"), "--quiet"]
    assert main(["bench", "uci", "--datasets", "nosuch", *common]) == 2
    assert "unknown dataset 'nosuch'" in capsys.readouterr().err
    assert main(["bench", "uci", "--datasets", "toy", "--models", "svgp,foo", *common]) == 2
    assert main(["bench", "uci", "--datasets", "toy", "--preset", "huge", *common]) == 2
    assert main(["bench", "uci", "--datasets", "banknote", "--models", "wgp", *common]) == 2
    assert "do not handle classification" in capsys.readouterr().err
    assert main(["bench", "airquality", "--flows", "sal:data", *common]) == 2
    assert "end in softplus" in capsys.readouterr().err


def test_presets_and_model_table():
    quick = get_preset("quick")
    assert quick.batch_for(300) == 300 and quick.epochs_for(300) == quick.steps
    assert quick.epochs_for(8611) == round(quick.steps / 17)  # 17 minibatches of 512 per epoch
    paper = get_preset("paper")
    assert (paper.epochs, paper.lr, paper.noise, paper.kmeans_restarts) == (15000, 0.01, 0.05, 10)
    assert get_preset("quick", epochs=7).epochs_for(10_000) == 7
    assert get_application_preset("airquality", "paper").epochs == 10000
    assert get_application_preset("rainfall", "paper").epochs == 20000
    assert get_application_preset("rainfall", "paper").lengthscale == 0.1
    aq = get_application_preset("airquality", "quick")
    assert (aq.epochs_for(595, 60), aq.epochs_for(595, 595)) == (1000, 200)  # large-M fits are capped
    assert get_application_preset("airquality", "quick", epochs=50).epochs_for(595, 595) == 50
    assert make_estimator("svgp", aq, 595, 0, 595).epochs == 200
    assert {"svgp", "tgp", "wgp"} <= set(model_names())
    est = make_estimator("tgp", quick, 50, 3, 300)
    assert (est.flow, est.num_inducing, est.seed, est.lengthscale) == ("sal", 50, 3, 2.0)
    with pytest.raises(ValueError, match="unknown model"):
        make_estimator("nope", quick, 5, 0, 10)
    with pytest.raises(TypeError, match="svgp takes no options"):
        make_estimator("svgp", quick, 5, 0, 10, flow="sal")
    assert A.wgp_warp("sal+sal+softplus") == "log+sal+sal"


def test_user_csv_dataset(tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.uniform(size=(30, 2))
    lines = ["a,b,target"] + [f"{u:.4f},{v:.4f},{u + v:.4f}" for u, v in x]
    path = tmp_path / "mine.csv"
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "o"
    assert main(["bench", "uci", "--datasets", f"csv:{path}:target", "--models", "svgp", "--splits", "0-1",
                 "--inducing", "4", "--preset", "tiny", "--out", str(out), "--quiet"]) == 0
    rows = _rows(out / "uci.jsonl")
    assert [(r["n_train"], r["n_test"]) for r in rows] == [(27, 3), (27, 3)]
    assert main(["bench", "uci", "--datasets", f"csv:{path}:nosuch", "--models", "svgp", "--preset", "tiny",
                 "--out", str(out), "--quiet"]) == 2
    assert main(["bench", "uci", "--datasets", f"csv:{path}", "--models", "svgp", "--preset", "tiny",
                 "--out", str(out), "--quiet"]) == 2


def test_scaling_is_fitted_on_the_training_split_only(data_dir):
    import numpy as np

    from flowgp.bench.runner import fit_and_score
    from flowgp.bench.uci import load_split

    split = load_split("toy", 0, data_dir)
    split.x_test = split.x_test * 100.0 + 50.0  # wildly different test inputs must not move the scaling
    est = make_estimator("svgp", get_preset("tiny"), 4, 0, len(split.y_train))
    row = fit_and_score(est, split)
    np.testing.assert_allclose(est.x_mean_, split.x_train.mean(0))
    np.testing.assert_allclose(est.y_shift_, split.y_train.mean())
    assert row["train_seconds"] > 0 and np.isfinite(row["nll"])
    # the final training ELBO in units of y, and the scale that converts it to standardised targets
    assert row["train_elbo"] == est.elbo(split.x_train, split.y_train)
    assert row["y_scale"] == est.y_scale_ > 0


def test_named_models_live_in_one_registry_table_that_bench_report_and_cli_read():
    from flowgp.bench.models import NamedModel, supports_task
    from flowgp.bench.report import _deep_depth, model_order
    from flowgp.cli.commands import _csv_models, _multi_output_models
    from flowgp.registry import MODELS

    assert model_order()[:5] == ("svgp", "tgp", "wgp", "pe-tgp", "ba-tgp")
    assert model_names() == [n for n in model_order() if n in model_names()]
    # the multi-output models are not UCI-bench models (they need outputs); the CLI takes them with --output
    assert "amogp" in MODELS and "amogp" not in model_names() and "amogp" in _multi_output_models()
    assert "svgp" not in _multi_output_models()
    tiny = get_preset("tiny")
    MODELS.register("my-dgp7", NamedModel("my-dgp7", "DeepGPRegressor", fixed={"layers": 7}))
    try:  # one registration reaches the bench, the report and the CLI
        assert "my-dgp7" in model_names() and "my-dgp7" in model_order() and "my-dgp7" in _csv_models()
        assert _deep_depth("my-dgp7") == 7 and _deep_depth("ldgp2-dreg") is None
        est = make_estimator("my-dgp7", tiny, 5, 4, 50)
        assert (est.layers, est.seed, est.epochs) == (7, 4, tiny.epochs_for(50))
        assert not supports_task("my-dgp7", "classification")
        with pytest.raises(TypeError, match="fixes layers=7"):
            MODELS.get("my-dgp7")(layers=3)
    finally:
        MODELS.unregister("my-dgp7")
    assert "my-dgp7" not in model_order()
