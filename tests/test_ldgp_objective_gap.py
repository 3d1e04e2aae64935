"""benchmarks/ldgp_objective_gap.py: the per-slot term against the joint-draw bound on a fitted model."""
import pytest
import torch

from flowgp.models.latent.model import build_latent_deep_gp


@pytest.fixture(scope="module")
def gap(benchmark_script):
    return benchmark_script("ldgp_objective_gap")


@pytest.fixture
def model_and_data(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))  # its sibling import
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(12, 2, dtype=torch.float64, generator=gen)
    y = torch.sin(2 * x[:, :1])
    model = build_latent_deep_gp(x, y, 2, num_inducing=6, kmeans_restarts=1, seed=0, noise=0.1)
    with torch.no_grad():  # a hidden q(u) with spread, so the two draws differ
        gp = model.layers[0].gp
        gp.q_sqrt.copy_(0.7 * torch.eye(gp.q_sqrt.shape[-1], dtype=torch.float64).expand_as(gp.q_sqrt))
    return model, x, y


def test_the_joint_term_is_the_models_own_and_the_model_keeps_its_joint_draw(gap, model_and_data):
    model, x, y = model_and_data
    joint = gap.per_point_terms(model, x, y, 5, False, 3, torch.Generator().manual_seed(4), chunk=5)
    g = torch.Generator().manual_seed(4)  # one stream through the chunks, as per_point_terms draws them
    with torch.no_grad():
        own = torch.cat([model.iw_terms(x[i:i + 5], y[i:i + 5], 5, "reg", 3, generator=g).mean(0)
                         for i in range(0, 12, 5)])
    torch.testing.assert_close(joint, own)
    gap.per_point_terms(model, x, y, 5, True, 3, torch.Generator().manual_seed(4))
    assert "joint_hidden_sample" not in vars(model)  # the per-slot draw was on this call only


def test_per_slot_and_joint_agree_at_k1_and_the_per_slot_term_exceeds_the_bound_at_larger_k(gap, model_and_data):
    """K = 1: one slot, so both draws have the same law (the plain ELBO's term). K = 20: the per-slot term
    averages over function draws inside the log, and sits above the joint-draw bound at every point."""
    model, x, y = model_and_data
    g = torch.Generator().manual_seed(1)
    one_joint = gap.per_point_terms(model, x, y, 1, False, 4000, g)
    one_slot = gap.per_point_terms(model, x, y, 1, True, 4000, g)
    assert (one_slot - one_joint).abs().mean() < 0.06
    many_joint = gap.per_point_terms(model, x, y, 20, False, 400, g)
    many_slot = gap.per_point_terms(model, x, y, 20, True, 400, g)
    assert (many_slot - many_joint).mean() > 0.15
    assert (many_slot > many_joint).all()
