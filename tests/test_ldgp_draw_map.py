"""benchmarks/ldgp_draw_map.py: the pathwise map it compares against flowgp's draw through chol(Σ) draws the
same joint law, so the two maps' REG gradients are two estimators of one gradient."""
import math

import pytest
import torch

from flowgp.models.latent.model import build_latent_deep_gp


@pytest.fixture(scope="module")
def probe(benchmark_script):
    return benchmark_script("ldgp_draw_map")


def test_pathwise_map_draws_the_law_of_the_cholesky_draw(probe):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(30, 1, dtype=torch.float64, generator=gen)
    model = build_latent_deep_gp(x, torch.sin(x), 2, num_inducing=8, kmeans_restarts=1, hidden_layer="pca",
                                 hidden_q_var_init=0.3, seed=0)
    layer, draws, k = model.layers[0], 20000, 4
    z = torch.tensor([[-0.3], [-0.2], [0.4], [1.5]], dtype=torch.float64)
    h = torch.cat([x[:1].expand(k, 1), z], 1).expand(draws, k, 2)
    with torch.no_grad():
        ref = model.joint_hidden_sample(layer, h, torch.Generator().manual_seed(1))  # [T, K, L]
        path = probe.pathwise_hidden_sample(model, layer, h, torch.Generator().manual_seed(2))
    for out in range(ref.shape[-1]):
        a, b = ref[..., out], path[..., out]
        sd = a.std(0)
        assert torch.all((a.mean(0) - b.mean(0)).abs() < 5 * math.sqrt(2) * sd / math.sqrt(draws)), out
        cov_a, cov_b = torch.cov(a.T), torch.cov(b.T)
        se = ((sd[:, None] * sd[None]).square() + cov_a.square()).sqrt() * math.sqrt(2 / draws)
        assert torch.all((cov_a - cov_b).abs() < 5 * se), (out, cov_a - cov_b, se)
    assert (ref.std(0) > 0.1).all()  # a non-trivial spread, so the comparison can fail


def test_pathwise_map_refuses_what_it_does_not_draw(probe):
    x = torch.randn(20, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    model = build_latent_deep_gp(x, torch.sin(x), 2, num_inducing=6, kmeans_restarts=1, hidden_layer="pca", seed=0)
    h = torch.zeros(3, 4, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="REG"):
        probe.pathwise_hidden_sample(model, model.layers[0], h, parts={})
