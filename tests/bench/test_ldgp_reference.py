"""The `reference` protocol (DGP-IWVI/DREG Table 1): the E.2 latent deep GP (concat hidden layers, natural gradients, fixed
hidden variances), the authors' seeded splits and the bench preset."""
import math

import numpy as np
import pytest
import torch

from flowgp.bench.models import make_estimator
from flowgp.bench.presets import get_preset
from flowgp.bench.uci import reference_split
from flowgp.models.latent.model import ConcatProjectionLayer, build_latent_deep_gp


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _data(n=80, d=3, seed=0):
    g = _gen(seed)
    x = torch.randn(n, d, dtype=torch.float64, generator=g)
    y = torch.sin(2 * x[:, :1]) + 0.1 * torch.randn(n, 1, dtype=torch.float64, generator=g)
    return x, y


def test_concat_layer_structure_and_marginals_match_its_samples():
    x, y = _data()
    model = build_latent_deep_gp(x, y, 3, num_inducing=12, hidden_layer="concat", hidden_q_var_init=1e-10,
                                 q_var_init=1.0, learn_hidden_variance=False, kmeans_restarts=1)
    first, second, last = model.layers
    assert isinstance(first, ConcatProjectionLayer) and isinstance(second, ConcatProjectionLayer)
    assert (first.input_dim, first.output_dim, second.input_dim, last.input_dim) == (4, 3, 3, 3)
    # the observed inputs pass through, the latent column is dropped; W holds orthonormal principal directions
    torch.testing.assert_close(first.passthrough, torch.eye(4, 3, dtype=torch.float64))
    w = first.mixing[:3]
    torch.testing.assert_close(w @ w.mT, torch.eye(3, dtype=torch.float64))
    assert torch.all(first.mixing[3:] == 0)  # 5 GPs, 3 data dimensions: the extra GPs get no weight
    # hidden S = 1e-10 I, last S = I; hidden kernel variances fixed, lengthscales trained
    s_hidden = first.gp.q_sqrt_tril() @ first.gp.q_sqrt_tril().mT
    torch.testing.assert_close(s_hidden, 1e-10 * torch.eye(12, dtype=torch.float64).expand(5, 12, 12))
    torch.testing.assert_close(last.gp.q_sqrt_tril(), torch.eye(12, dtype=torch.float64).expand(1, 12, 12))
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {"layers.0.gp.kernel.kernels.0.raw_variance", "layers.0.gp.kernel.kernels.1.raw_variance",
                      "layers.1.gp.kernel.kernels.0.raw_variance", "layers.1.gp.kernel.kernels.1.raw_variance"}
    # marginals agree with the moments of many forward draws (a visible q(v) so the GP part matters)
    with torch.no_grad():
        first.gp.q_sqrt.mul_(1e4)
        h = torch.cat([x[:4], torch.randn(4, 1, dtype=torch.float64, generator=_gen(1))], 1)
        mean, var = first.marginals(h)
        draws, _, _ = first(h.expand(20000, 4, 4), generator=_gen(2))
    sd = var.sqrt()
    assert torch.all((draws.mean(0) - mean).abs() < 5 * sd / math.sqrt(20000) + 1e-12)
    assert torch.all((draws.var(0) / var - 1).abs() < 0.1)


@pytest.mark.parametrize("split", [0, 7])
def test_reference_split_follows_the_seeded_permutation_rule(split):
    from flowgp.data.tables import load_uci

    x, y = load_uci("wine-red")
    s = reference_split("wine-red", split)
    n = len(y)
    assert len(s.y_train) == int(0.9 * n) and len(s.y_train) + len(s.y_test) == n
    # the authors' rule: np.random.seed(split); np.random.shuffle(arange(N)); first 90 % train
    order = np.arange(n)
    np.random.RandomState(split).shuffle(order)
    np.testing.assert_array_equal(s.x_train, x[order[:int(0.9 * n)]])
    np.testing.assert_array_equal(s.y_test, y[order[int(0.9 * n):]])
    other = reference_split("wine-red", split + 1)
    assert not np.array_equal(other.y_test, s.y_test)
    with pytest.raises(ValueError, match="split"):
        reference_split("wine-red", -1)


def test_reference_split_of_a_file_in_another_row_order_holds_the_same_points():
    from flowgp.data.tables import load_uci

    x, y = load_uci("wine-red")
    n = len(y)
    # the authors' download as a permutation of our rows: their row i is our row perm[i]
    perm = np.random.RandomState(3).permutation(n)
    theirs = (x[perm], y[perm])
    s = reference_split("wine-red", 5, row_order=perm)
    order = np.arange(n)
    np.random.RandomState(5).shuffle(order)
    np.testing.assert_array_equal(s.x_test, theirs[0][order[int(0.9 * n):]])
    np.testing.assert_array_equal(s.y_train, theirs[1][order[:int(0.9 * n)]])
    assert not np.array_equal(s.y_test, reference_split("wine-red", 5).y_test)
    np.testing.assert_array_equal(reference_split("wine-red", 5, row_order=np.arange(n)).y_test,
                                  reference_split("wine-red", 5).y_test)
    for bad in (perm[:-1], np.zeros(n, dtype=int)):
        with pytest.raises(ValueError, match="row_order must be a permutation"):
            reference_split("wine-red", 0, row_order=bad)


def test_power_reference_splits_hold_the_authors_rows_and_other_sets_keep_the_file_order():
    """The shipped permutation puts our power rows in the order of the authors' download (Folds5x2_pp.xlsx, first
    sheet, whose first rows are written in bench.uci): split k of the bench then tests the points theirs tests."""
    from flowgp.bench.uci import AUTHORS_ROW_ORDERS, authors_row_order, load_split, reference_row_order
    from flowgp.data.tables import load_uci

    x, y = load_uci("power")
    order = authors_row_order("power")
    np.testing.assert_array_equal(np.sort(order), np.arange(len(y)))
    np.testing.assert_allclose(np.column_stack([x, y])[order[:5]], AUTHORS_ROW_ORDERS["power"][1])
    s = load_split("power", 3, protocol="reference", row_order="authors")
    ind = np.arange(len(y))
    np.random.RandomState(3).shuffle(ind)
    np.testing.assert_array_equal(s.y_test, y[order][ind[int(0.9 * len(y)):]])
    assert not np.array_equal(s.y_test, load_split("power", 3, protocol="reference").y_test)
    assert (reference_row_order("power"), reference_row_order("wine-red")) == ("authors", "file")
    assert authors_row_order("wine-red") is None
    with pytest.raises(ValueError, match="row_order='authors' needs the reference protocol"):
        load_split("wine-red", 0, protocol="reference", row_order="authors")
    with pytest.raises(ValueError, match="row_order='authors' needs the reference protocol"):
        load_split("power", 0, row_order="authors")
    with pytest.raises(ValueError, match="row_order must be 'file' or 'authors'"):
        load_split("power", 0, protocol="reference", row_order="theirs")


def test_an_authors_order_split_reads_the_data_file_once(monkeypatch):
    import flowgp.data.tables
    from flowgp.bench.uci import load_split

    reads = []
    load = flowgp.data.tables.load_uci
    monkeypatch.setattr(flowgp.data.tables, "load_uci", lambda *a, **k: reads.append(a) or load(*a, **k))
    s = load_split("power", 3, protocol="reference", row_order="authors")
    assert len(reads) == 1 and len(s.y_test) == len(load("power")[1]) - int(0.9 * len(load("power")[1]))


def test_the_authors_power_order_is_not_applied_to_another_power_file(tmp_path):
    from flowgp.bench.uci import authors_row_order, reference_row_order

    folder = tmp_path / "uci" / "power"
    folder.mkdir(parents=True)
    np.savetxt(folder / "data.txt", np.random.default_rng(0).uniform(size=(30, 5)))
    with pytest.warns(RuntimeWarning, match="not the file flowgp's permutation"):
        assert authors_row_order("power", tmp_path) is None
    with pytest.warns(RuntimeWarning):
        assert reference_row_order("power", tmp_path) == "file"


def test_bench_jobs_record_the_row_order_of_their_splits():
    from types import SimpleNamespace

    from flowgp.bench.uci import build_jobs

    def jobs(preset):
        args = SimpleNamespace(preset=preset, datasets="power,wine-red", models="svgp", splits="0", inducing="5",
                               seed=0, data_dir=None, epochs=None)
        return {j["dataset"]: j["row_order"] for j in build_jobs(args)}

    assert jobs("reference") == {"power": "authors", "wine-red": "file"}
    assert jobs("quick") == {"power": "file", "wine-red": "file"}
    # how every reader takes a row's order: missing (older rows) or null (learning-curve rows) is the file's
    from flowgp.bench.uci import row_order_of

    assert [row_order_of(r) for r in ({}, {"row_order": None}, {"row_order": "authors"})] == ["file", "file",
                                                                                            "authors"]


def test_reference_preset_builds_the_e2_estimator_and_trains_with_natural_gradients():
    preset = get_preset("reference", epochs=3)
    assert (preset.lr, preset.batch_size, preset.noise, preset.steps) == (0.005, 512, 0.01, None)
    assert get_preset("reference").steps == 300_000
    est = make_estimator("ldgp2-dreg", preset, 10, 0, 60)
    params = est.get_params()
    assert params["hidden_layer"] == "concat" and params["natgrad"] and params["natgrad_lr"] == 0.01
    assert params["num_samples_predict"] == 10000 and params["num_importance"] == 5
    assert params["hidden_q_var_init"] == 1e-10 and params["q_var_init"] == 1.0
    assert not params["learn_hidden_variance"]
    x, y = _data(60)
    est.set_params(num_samples_predict=200)
    est.fit(x.numpy(), y[:, 0].numpy())
    assert len(est.history_) == 3 and all(np.isfinite(est.history_))
    lpd = est.log_predictive_density(x.numpy()[:5], y[:5, 0].numpy())
    assert lpd.shape == (5,) and np.all(np.isfinite(lpd))
    # the quick preset keeps its own structure but scores with 10 000 samples of z too
    quick = make_estimator("ldgp2-reg", get_preset("quick"), 10, 0, 60).get_params()
    assert quick["hidden_layer"] == "pca" and quick["num_samples_predict"] == 10000


def test_reference_k50_preset_is_the_reference_protocol_with_the_authors_table1_k_and_batch():
    # the DREG authors' Table 1 runs: K = 50 importance samples, minibatch 64, on the same splits and structure
    preset = get_preset("reference-k50")
    assert (preset.protocol, preset.num_importance, preset.batch_size, preset.steps) == ("reference", 50, 64, 300_000)
    ref = make_estimator("ldgp2-dreg", get_preset("reference", epochs=2), 10, 0, 200).get_params()
    k50 = make_estimator("ldgp2-dreg", get_preset("reference-k50", epochs=2), 10, 0, 200).get_params()
    assert (k50["num_importance"], k50["batch_size"]) == (50, 64)
    differ = {k for k in ref if ref[k] != k50[k]}
    assert differ == {"num_importance", "batch_size"}
    # models without importance samples take the preset's budget and ignore K
    svgp = make_estimator("svgp", get_preset("reference-k50", epochs=2), 10, 0, 200).get_params()
    assert svgp["batch_size"] == 64 and "num_importance" not in svgp
