"""flowgp.models.latent.diagnostics: gradient samples of the q(z) estimators and the SNR procedure of supplement E.3."""
import json

import pytest
import torch

from flowgp.models.latent.diagnostics import gradient_snr, latent_gradient_samples
from flowgp.models.latent.model import build_latent_deep_gp
from flowgp.data.synthetic import make_multimodal_demo
from flowgp.training.loop import step_lr, train


def _model(amortized=True, layers=1, steps=60):
    x, y, _ = make_multimodal_demo(80, seed=2)
    x = torch.tensor((x - x.mean()) / x.std())
    y = torch.tensor((y - y.mean()) / y.std())[:, None]
    model = build_latent_deep_gp(x, y, layers, num_inducing=8, amortized=amortized, num_importance=5,
                                 kmeans_restarts=1)
    train(model, x, y, steps=steps, lr=0.02, schedule=step_lr(1000, 0.98), verbose=False)
    return model, x, y


@pytest.mark.parametrize("amortized", [True, False])
def test_snr_is_mean_over_points_of_mean_over_parameters(float64_default, amortized):
    model, x, y = _model(amortized)
    snr, details = gradient_snr(model, x, y, 5, "dreg", repeats=50, points=4, seed=3, return_details=True)
    idx = torch.tensor(details["indices"])
    assert len(idx) == 4 and len(set(details["indices"])) == 4
    g = latent_gradient_samples(model, x, y, idx, 5, "dreg", repeats=50, seed=3)  # same draws
    per_param = g.mean(0).abs() / g.std(0)  # [points, P]
    expected = per_param.nan_to_num(0.0).mean(-1).mean()
    assert snr == pytest.approx(expected.item(), rel=1e-9)
    assert details["num_parameters"] == (2 if not amortized else sum(p.numel() for p in model.qz.parameters()))
    assert snr > 0 and snr == gradient_snr(model, x, y, 5, "dreg", repeats=50, points=4, seed=3)  # reproducible


def test_dreg_snr_exceeds_reg_snr_at_large_k_on_fitted_free_model(float64_default):
    # q(z) fitted for 300 steps: Tucker et al.'s regime, where REG's SNR decays with K and DREG's does not
    model, x, y = _model(amortized=False, steps=300)
    reg = [gradient_snr(model, x, y, k, "reg", repeats=300, points=6, seed=1) for k in (1, 30)]
    dreg = [gradient_snr(model, x, y, k, "dreg", repeats=300, points=6, seed=1) for k in (1, 30)]
    assert dreg[1] > 2 * reg[1], (reg, dreg)
    assert reg[1] < reg[0] and dreg[1] > dreg[0], (reg, dreg)


def test_bad_input(float64_default):
    model, x, y = _model(steps=0)
    with pytest.raises(ValueError, match="num_importance"):
        gradient_snr(model, x, y, 0, "reg", repeats=10)
    with pytest.raises(ValueError, match="gradient"):
        gradient_snr(model, x, y, 2, "score", repeats=10)
    with pytest.raises(ValueError, match="repeats"):
        gradient_snr(model, x, y, 2, "reg", repeats=1)
    with pytest.raises(ValueError, match="points"):
        gradient_snr(model, x, y, 2, "reg", repeats=10, points=0)
    with pytest.raises(TypeError, match="LatentDeepGP"):
        gradient_snr(torch.nn.Linear(1, 1), x, y, 2, "reg", repeats=10)


def test_bench_snr_writes_rows_and_figure_and_resumes(tmp_path):
    from flowgp.bench.cli import main

    argv = ["snr", "--layers", "1", "--num-importance", "1,4", "--gradient", "reg,dreg", "--out", str(tmp_path),
            "--repeats", "20", "--points", "2", "--num-data", "60", "--num-inducing", "6",
            "--train-iterations", "10", "--batch-size", "30", "--quiet"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (tmp_path / "snr.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    assert {(r["num_importance"], r["gradient"]) for r in rows} == {(1, "reg"), (1, "dreg"), (4, "reg"), (4, "dreg")}
    assert all(r["dataset"] == "demo" and r["layers"] == 1 and r["snr"] > 0 for r in rows)
    assert (tmp_path / "snr.png").stat().st_size > 0
    assert main(argv) == 0  # rerun: every row is done, nothing appended
    assert len((tmp_path / "snr.jsonl").read_text().splitlines()) == 4
    assert main(argv[:-1] + ["--dataset", "wine", "--quiet"]) == 2  # unknown data set: clear error, exit 2


def test_fitted_estimator_measures_gradient_snr_in_its_own_units():
    from flowgp import LatentDeepGPRegressor

    x, y, _ = make_multimodal_demo(50, seed=0)
    est = LatentDeepGPRegressor(layers=1, num_importance=2, num_inducing=6, epochs=3, kmeans_restarts=1,
                                verbose=False).fit(x, y)
    direct = gradient_snr(est.model_, est.scaled_inputs(x), est.scaled_targets(y, 50), 3, "reg", repeats=20, points=3)
    assert est.gradient_snr(x, y, 3, "reg", repeats=20, points=3) == pytest.approx(direct)
