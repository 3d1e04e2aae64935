import pytest
import torch

from flowgp.numerics.linalg import CholeskyJitterWarning, lower_inverse, robust_cholesky


def test_cholesky_of_well_conditioned_matrix_is_silent():
    a = torch.randn(5, 5, dtype=torch.float64)
    k = a @ a.T + torch.eye(5, dtype=torch.float64)
    chol = robust_cholesky(k)
    torch.testing.assert_close(chol @ chol.T, k, rtol=1e-7, atol=1e-7)


def test_singular_matrix_retries_with_growing_jitter_and_warns():
    k = torch.ones(4, 4, dtype=torch.float64) - 1e-9 * torch.eye(4, dtype=torch.float64)  # eigenvalue -1e-9
    with pytest.warns(CholeskyJitterWarning, match="jitter"):
        chol = robust_cholesky(k, jitter=1e-12)
    assert torch.isfinite(chol).all()


def test_hopeless_matrix_raises():
    k = -torch.eye(3, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="Cholesky failed"):
        robust_cholesky(k, max_tries=3)


def test_lower_inverse_batched_and_unbatched():
    g = torch.Generator().manual_seed(0)
    b = torch.randn(3, 4, 4, generator=g, dtype=torch.float64)
    chol = torch.linalg.cholesky(b @ b.mT + 4 * torch.eye(4, dtype=torch.float64))
    inv = lower_inverse(chol)
    torch.testing.assert_close(inv @ chol, torch.eye(4, dtype=torch.float64).expand(3, 4, 4))
    assert torch.equal(inv, inv.tril())
    torch.testing.assert_close(lower_inverse(chol[0]), inv[0])


def test_gram_is_x_xt_with_its_gradients():
    from flowgp.numerics.linalg import gram
    x = torch.randn(3, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    torch.testing.assert_close(gram(x), x @ x.mT)
    assert torch.autograd.gradcheck(gram, (x,))
    assert torch.autograd.gradgradcheck(gram, (x,))


def test_shared_left_products_are_x_times_each_matrix_with_their_gradients():
    from flowgp.numerics.linalg import shared_left_products
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 4, dtype=torch.float64, generator=g, requires_grad=True)
    mats = torch.randn(3, 4, 5, dtype=torch.float64, generator=g, requires_grad=True)
    torch.testing.assert_close(shared_left_products(x, mats), x @ mats)
    assert torch.autograd.gradcheck(shared_left_products, (x, mats))
    with pytest.raises(ValueError, match=r"x must be \[N, M\] and mats \[L, M, P\]"):
        shared_left_products(x, mats.mT)
