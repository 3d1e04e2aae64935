"""`flowgp bench ldgp-demo` (DGP-IWVI/DREG supplement Fig. 7): the mode share it reports, a tiny run end to end, and
--nproc (the result records the device and the world size)."""
import json

import numpy as np
import pytest
import torch

from flowgp.bench.cli import main as bench
from flowgp.bench.latent_demo import mode_share


def test_mode_share_counts_the_draws_nearer_the_second_mode():
    x = np.linspace(-2, 2, 7)[:, None]
    shift = 0.2 * np.exp(0.5)
    f1, f2 = (np.sin(4 * x) / 3 + shift)[:, 0], (9 * x**2 / 30 + 1.5 + shift)[:, 0]
    assert mode_share(x, np.stack([f2, f2, f1])) == 2 / 3
    assert mode_share(x, f1[None]) == 0.0


def test_a_tiny_run_writes_both_models_scores_and_the_figure(tmp_path, capsys):
    out = tmp_path / "demo"
    args = ["ldgp-demo", "--iterations", "2", "--batch-size", "30", "--train-points", "60", "--test-points", "20",
            "--num-inducing", "5", "--test-samples", "8", "--out", str(out)]
    assert bench(args) == 0
    result = json.loads((out / "latent_dgp_demo.json").read_text())
    assert set(result["models"]) == {"latent_dgp2", "dsvi_dgp2"} and result["epochs"] == 1
    assert (result["device"], result["world_size"]) == ("cpu", 1)
    for scores in result["models"].values():
        assert np.isfinite(scores["test_log_likelihood"]) and 0.0 <= scores["mode2_share_of_draws"] <= 1.0
    assert (out / "latent_dgp_demo.png").stat().st_size > 0
    assert bench(args[:2] + ["0", "--out", str(tmp_path / "bad")]) == 2
    assert "--iterations" in capsys.readouterr().err


@pytest.mark.slow
def test_nproc_2_records_the_world_size(tmp_path):
    from flowgp.cli import main

    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    out = tmp_path / "demo"
    assert main(["bench", "ldgp-demo", "--iterations", "2", "--batch-size", "30", "--train-points", "60",
                 "--test-points", "20", "--num-inducing", "5", "--test-samples", "8", "--out", str(out),
                 "--nproc", "2"]) == 0
    result = json.loads((out / "latent_dgp_demo.json").read_text())
    assert (result["device"], result["world_size"]) == ("cpu", 2)
    assert set(result["models"]) == {"latent_dgp2", "dsvi_dgp2"}
    assert all(np.isfinite(s["test_log_likelihood"]) for s in result["models"].values())
