"""benchmarks/ldgp_k_finetune.py: the per-slot hidden-layer draw of the DREG authors' code, as an ablation."""
import numpy as np
import pytest
import torch

from flowgp.estimators.latent import LatentDeepGPRegressor
from flowgp.models.latent.model import build_latent_deep_gp


@pytest.fixture(scope="module")
def probe(benchmark_script):
    return benchmark_script("ldgp_k_finetune")


def test_per_slot_draws_are_independent_over_k_where_the_joint_draw_is_one_function(probe):
    """Five slots at the same input (x, z): the joint draw gives five equal values (one function at one input),
    the per-slot draw five independent ones with the same marginal mean and variance."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(30, 2, dtype=torch.float64, generator=gen)
    model = build_latent_deep_gp(x, torch.sin(x[:, :1]), 2, num_inducing=8, kmeans_restarts=1, seed=0)
    with torch.no_grad():  # a q(u) of the hidden layer far from its 1e-10 start, so the draw has spread
        gp = model.layers[0].gp
        gp.q_sqrt.copy_(0.5 * torch.eye(gp.q_sqrt.shape[-1], dtype=torch.float64).expand_as(gp.q_sqrt))
    h = torch.cat([x[:1], torch.zeros(1, 1, dtype=torch.float64)], 1).expand(4000, 5, 3)  # [T, K, D + Q]
    layer = model.layers[0]
    with torch.no_grad():
        joint = model.joint_hidden_sample(layer, h, torch.Generator().manual_seed(1))
        per_slot = probe.per_slot_hidden_sample(model, layer, h, torch.Generator().manual_seed(1))
    # slot 0 against slot 3, first output
    corr_joint = np.corrcoef(joint[:, 0, 0].numpy(), joint[:, 3, 0].numpy())[0, 1]
    corr_slot = np.corrcoef(per_slot[:, 0, 0].numpy(), per_slot[:, 3, 0].numpy())[0, 1]
    assert corr_joint > 0.99
    assert abs(corr_slot) < 0.06
    assert torch.allclose(joint.mean(0), per_slot.mean(0), atol=0.06)
    assert torch.allclose(joint.var(0), per_slot.var(0), rtol=0.1)
    with pytest.raises(ValueError, match="per-slot draws"):
        probe.per_slot_hidden_sample(model, layer, h, batch_rows=(5, 10))


def test_estimator_with_changes_only_the_models_training_draw_and_loads_a_state(probe):
    x = np.random.default_rng(0).normal(size=(40, 2))
    y = np.sin(x[:, 0])
    est = LatentDeepGPRegressor(num_inducing=6, epochs=1, batch_size=20, num_samples_predict=50, seed=0,
                                gradient="reg")
    est.fit(x, y)
    altered = probe.estimator_with(est, state=est.model_.state_dict(), per_slot=True)
    assert isinstance(altered, LatentDeepGPRegressor) and altered.get_params() == est.get_params()
    altered.set_params(epochs=1, lr=1e-12, natgrad=False)  # a step that changes nothing: the loaded state stays
    altered.fit(x, y)
    for name, value in est.model_.state_dict().items():
        assert torch.allclose(altered.model_.state_dict()[name], value, atol=1e-9), name
    assert altered.model_.joint_hidden_sample.__func__ is probe.per_slot_hidden_sample
    assert "joint_hidden_sample" not in vars(est.model_)  # the original estimator's model is untouched
    np.testing.assert_allclose(altered.log_predictive_density(x[:5], y[:5]), est.log_predictive_density(x[:5], y[:5]),
                               rtol=1e-6)
    with pytest.raises(ValueError, match="per-slot draws: REG"):  # DREG needs the joint draw's pieces
        probe.estimator_with(est.set_params(gradient="dreg"), per_slot=True).fit(x, y)
