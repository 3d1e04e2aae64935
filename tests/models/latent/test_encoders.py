"""The variational distributions over latent inputs (flowgp.models.latent.encoders): free per-point q(z_n)
selected by row indices, the amortized encoder of supplement E.2 (σ above its floor, seeded Glorot weights, both
skip layouts), the Gaussian log-density, and clear errors."""
import math

import pytest
import torch

from flowgp.models.latent.encoders import STD_BIAS, STD_FLOOR, AmortizedLatentEncoder, FreeLatent, normal_log_prob


def test_free_latent_starts_narrow_and_selects_rows_by_index():
    q = FreeLatent(5, latent_dim=2)
    mean, std = q(torch.zeros(5, 1), torch.zeros(5, 1))
    assert mean.shape == std.shape == (5, 2) and (mean == 0).all()
    torch.testing.assert_close(std, torch.full((5, 2), math.log1p(math.exp(STD_BIAS)), dtype=torch.float64))
    with torch.no_grad():
        q.mean.copy_(torch.arange(10.0).reshape(5, 2))
    m, _ = q(torch.zeros(2, 1), torch.zeros(2, 1), indices=torch.tensor([4, 1]))
    torch.testing.assert_close(m, torch.tensor([[8.0, 9.0], [2.0, 3.0]], dtype=torch.float64))


@pytest.mark.parametrize("indices, match", [(None, "pass the batch's row indices"), ([0, 5], r"lie in \[0, 5\)"),
                                            ([-1, 0], r"lie in \[0, 5\)"), ([0, 1, 2], "shape")])
def test_free_latent_refuses_rows_it_does_not_hold(indices, match):
    with pytest.raises(ValueError, match=match):
        FreeLatent(5)(torch.zeros(2, 1), torch.zeros(2, 1), indices=indices)


def test_free_latent_std_never_drops_below_the_floor():
    q = FreeLatent(3)
    with torch.no_grad():
        q.raw_std.fill_(-100.0)
    assert (q(torch.zeros(3, 1), torch.zeros(3, 1))[1] >= STD_FLOOR).all()


@pytest.mark.parametrize("skips", ["dense", "residual"])
def test_the_amortized_encoder_is_seeded_and_gives_a_positive_std(skips):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(7, 3, generator=g, dtype=torch.float64), torch.randn(7, 2, generator=g, dtype=torch.float64)
    enc = AmortizedLatentEncoder(3, 2, latent_dim=4, generator=torch.Generator().manual_seed(1), skips=skips)
    mean, std = enc(x, y)
    assert mean.shape == std.shape == (7, 4) and mean.dtype == torch.float64 and (std >= STD_FLOOR).all()
    same = AmortizedLatentEncoder(3, 2, latent_dim=4, generator=torch.Generator().manual_seed(1), skips=skips)
    other = AmortizedLatentEncoder(3, 2, latent_dim=4, generator=torch.Generator().manual_seed(2), skips=skips)
    torch.testing.assert_close(same(x, y)[0], mean)
    assert not torch.allclose(other(x, y)[0], mean)
    assert all((lin.bias == 0).all() for lin in (enc.layer1, enc.layer2, enc.mean_head, enc.std_head))
    # with zero output weights the std head gives softplus(-3), the narrow starting point of supplement E.2
    with torch.no_grad():
        enc.std_head.weight.zero_()
    torch.testing.assert_close(enc(x, y)[1], torch.full((7, 4), math.log1p(math.exp(STD_BIAS)), dtype=torch.float64))


def test_the_dense_encoder_feeds_every_earlier_layer_forward():
    enc = AmortizedLatentEncoder(3, 1, latent_dim=2, hidden=5, skips="dense")
    assert enc.layer2.in_features == 4 + 5 and enc.mean_head.in_features == 4 + 2 * 5
    res = AmortizedLatentEncoder(3, 1, latent_dim=2, hidden=5, skips="residual")
    assert res.layer2.in_features == 5 and res.mean_head.in_features == 5


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(input_dim=0), ValueError, "input_dim"), (dict(latent_dim=True), TypeError, "latent_dim"),
    (dict(hidden=2.0), TypeError, "hidden"), (dict(skips="highway"), ValueError, "skips must be one of"),
])
def test_encoder_arguments_are_checked(kwargs, error, match):
    with pytest.raises(error, match=match):
        AmortizedLatentEncoder(**{"input_dim": 2, **kwargs})
    if "skips" not in kwargs and "hidden" not in kwargs:
        with pytest.raises(error, match="num_data|latent_dim"):
            FreeLatent(**{"num_data": 0 if "input_dim" in kwargs else 3, **{k: v for k, v in kwargs.items()
                                                                             if k == "latent_dim"}})


def test_normal_log_prob_is_the_sum_of_gaussian_log_densities():
    g = torch.Generator().manual_seed(0)
    z, mean = torch.randn(4, 3, generator=g, dtype=torch.float64), torch.randn(4, 3, generator=g, dtype=torch.float64)
    std = torch.rand(4, 3, generator=g, dtype=torch.float64) + 0.1
    torch.testing.assert_close(normal_log_prob(z, mean, std), torch.distributions.Normal(mean, std).log_prob(z).sum(-1))
    torch.testing.assert_close(normal_log_prob(z), torch.distributions.Normal(0.0, 1.0).log_prob(z).sum(-1))
