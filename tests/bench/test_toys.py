"""flowgp.bench.toys: the skewed step problem has the shape its docstring gives; its kernels and inducing inputs
are held, so only the variational families train."""
import pytest
import torch

from flowgp.bench.toys import skewed_step_toy
from flowgp.models.cnf_posterior import GaussianConvolutionalFlowPosterior


def test_skewed_step_toy_labels_the_step_and_freezes_the_kernels():
    x, y, make = skewed_step_toy(points_per_site=3, sites=4)
    assert x.shape == (12, 1) and y.shape == (12, 1)
    assert torch.equal(y, (x > 0).to(y.dtype)) and 0 < y.sum() < 12
    dsvi, flow = make(flow=False), make(flow=True)
    assert dsvi.posterior is None and isinstance(flow.posterior, GaussianConvolutionalFlowPosterior)
    for model in (dsvi, flow):
        trained = [n for n, p in model.named_parameters() if p.requires_grad]
        assert trained and not any("kernel" in n or "inducing_points" in n for n in trained)
        assert any("kernel" in n for n, _ in model.named_parameters())
        assert torch.isfinite(model.elbo(x, y, num_samples=2, generator=torch.Generator().manual_seed(0)))
    with pytest.raises(ValueError, match="sites"):
        skewed_step_toy(sites=1)


def test_tiny_latent_dgp_trains_only_its_variational_parameters_and_its_evidence_is_reproducible():
    from flowgp.bench.toys import tiny_data, tiny_latent_dgp, tiny_log_evidence

    x, y = tiny_data()
    model = tiny_latent_dgp(num_importance=3)
    assert x.shape == y.shape == (3, 1) and model.num_importance == 3
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and not any("kernel" in n or "likelihood" in n for n in trained)
    a, se = tiny_log_evidence(model, draws=20_000, chunk=5_000)
    assert a == tiny_log_evidence(model, draws=20_000, chunk=5_000)[0] and 0 < se < 0.2  # seeded
    assert abs(a - tiny_log_evidence(model, draws=20_000, seed=8)[0]) < 0.2  # another stream: the same value
