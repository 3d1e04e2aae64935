"""The one minibatch objective every flowgp model is trained with.

Every bound in the four papers has the same shape: a sum over data points of a per-point term (an expected
log-likelihood, TGP appendix eq. 14 / CNF-DGP eq. 3 / AMO-GP supplement eq. 22; or the log of an
importance-weighted average, DGP-IWVI eq. A.9) minus global KL (and penalty) terms that do not depend on the
data. On a minibatch of B of the N points the data term is rescaled by N / B, which keeps the estimate
unbiased (Hensman et al. 2013, eq. 4). `minibatch_bound` is the only place that rescaling is written.
"""
from __future__ import annotations

import torch

__all__ = ["minibatch_bound", "resolve_num_data"]


def resolve_num_data(num_data, batch_size: int) -> int:
    """N for the rescaling: `num_data` when given (training on minibatches), else the batch itself."""
    if num_data is None:
        return int(batch_size)
    if isinstance(num_data, bool) or int(num_data) != num_data or num_data < 1:
        raise ValueError(f"num_data must be a positive integer (the size of the full data set), got {num_data!r}")
    return int(num_data)


def minibatch_bound(data_terms: torch.Tensor, kl_terms, num_data: int | None, batch_size: int) -> torch.Tensor:
    """(N / B) Σ data_terms - Σ kl_terms: an unbiased minibatch estimate of the full-data bound.

    Args:
        data_terms: per-point terms of the B points in the batch, any shape (summed over every axis; average
            over Monte Carlo samples before calling, so that only data and output axes remain).
        kl_terms: a tensor or a sequence of tensors (KL divergences, network penalties), each summed.
        num_data: N, the size of the full data set (None: the batch is the whole data set).
        batch_size: B, the number of data points behind `data_terms`.
    """
    scale = resolve_num_data(num_data, batch_size) / int(batch_size)
    if isinstance(kl_terms, torch.Tensor):
        kl = kl_terms.sum()
    else:
        kl = sum((torch.as_tensor(k).sum() for k in kl_terms), data_terms.new_zeros(()))
    return data_terms.sum() * scale - kl
