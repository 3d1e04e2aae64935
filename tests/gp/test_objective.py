"""The one minibatch objective (flowgp.gp.objective): (N / B) Σ data terms - Σ global terms, unbiased over a
partition of the data, and N checked before any work."""
import pytest
import torch

from flowgp.gp.objective import minibatch_bound, resolve_num_data


def test_the_bound_is_the_rescaled_data_sum_minus_every_global_term():
    data = torch.tensor([[1.0, 2.0], [3.0, -0.5]], dtype=torch.float64)  # B = 2 points, 2 outputs
    kl = [torch.tensor(0.25, dtype=torch.float64), torch.tensor([0.5, 0.125], dtype=torch.float64), 1.0]
    assert minibatch_bound(data, kl, 10, 2).item() == pytest.approx(10 / 2 * 5.5 - 1.875, abs=1e-12)
    assert minibatch_bound(data, torch.tensor([0.5, 0.25]), None, 2).item() == pytest.approx(5.5 - 0.75)
    assert minibatch_bound(data, [], None, 2).item() == pytest.approx(5.5)  # no global terms


def test_the_average_over_a_partition_is_the_full_data_bound():
    g = torch.Generator().manual_seed(0)
    terms = torch.randn(12, 3, generator=g, dtype=torch.float64)
    kl = torch.tensor(2.5, dtype=torch.float64)
    full = minibatch_bound(terms, kl, None, 12)
    parts = [minibatch_bound(terms[i:i + 4], kl, 12, 4) for i in range(0, 12, 4)]
    torch.testing.assert_close(sum(parts) / 3, full, rtol=1e-12, atol=0)


def test_the_gradient_reaches_data_and_global_terms():
    data = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    kl = torch.tensor(0.5, requires_grad=True)
    minibatch_bound(data, [kl], 30, 3).backward()
    torch.testing.assert_close(data.grad, torch.full((3,), 10.0))
    assert kl.grad.item() == -1.0


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_num_data_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="num_data must be a positive integer"):
        resolve_num_data(bad, 4)
    with pytest.raises(ValueError, match="num_data"):
        minibatch_bound(torch.ones(4), [], bad, 4)


def test_num_data_defaults_to_the_batch():
    assert resolve_num_data(None, 7) == 7 and resolve_num_data(100, 7) == 100 and resolve_num_data(100.0, 7) == 100
