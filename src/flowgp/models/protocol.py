"""The interface every flowgp model implements, and the one the training loop calls: `TrainableModel`.

`flowgp.training.loop.train(model, ...)` maximises `model.training_objective(x_b, y_b, num_data=N,
generator=..., batch_rows=..., indices=..., **rows)` on every minibatch, with the same keywords for every model;
a model takes them all, whether or not it uses them:

- `num_data`: N, the number of rows of the data set (the bound is rescaled by N / B);
- `generator`: the torch.Generator of the model's Monte Carlo draws (a closed-form bound ignores it);
- `batch_rows`: (offset, B) when x is this process's part of a global batch of B rows (flowgp.training.distributed),
  so that per-row draws are those of the whole global batch;
- `indices`: the rows' positions in the data set (the latent deep GP's per-row q(z));
- `**rows`: the named arrays of the same rows that the data carry (AMO-GP's `output`).

`elbo` is the variational lower bound; `training_objective` is what training maximises, the bound itself unless the
model's objective differs from it (the latent deep GP's per-slot objective): `TrainsItsBound` gives the former.
`predict(x, generator=None, **rows)` gives the model's predictions at x (predictive mean and variance of y* for
regression models, class probabilities for classification).
"""
from __future__ import annotations

from typing import Optional, Protocol, runtime_checkable

import torch

__all__ = ["TrainableModel", "TrainsItsBound"]


@runtime_checkable
class TrainableModel(Protocol):
    """A model `flowgp.training.loop.train` fits with its default objective (see the module doc).

    See Also:
        :func:`flowgp.training.train`, :class:`flowgp.models.TrainsItsBound`.
    """

    def elbo(self, x: torch.Tensor, y: torch.Tensor, *, num_data: Optional[int] = None,
             generator: Optional[torch.Generator] = None, batch_rows: Optional[tuple[int, int]] = None,
             indices: Optional[torch.Tensor] = None, **rows) -> torch.Tensor:
        """The minibatch estimate of the variational lower bound, rescaled to the data set."""

    def training_objective(self, x: torch.Tensor, y: torch.Tensor, *, num_data: Optional[int] = None,
                           generator: Optional[torch.Generator] = None,
                           batch_rows: Optional[tuple[int, int]] = None, indices: Optional[torch.Tensor] = None,
                           **rows) -> torch.Tensor:
        """What training maximises: `elbo`, unless the model trains another objective."""

    def predict(self, x: torch.Tensor, *, generator: Optional[torch.Generator] = None, **rows):
        """The model's predictions at x."""


class TrainsItsBound:
    """Mixin for a model whose training objective is its bound: `training_objective` is `elbo`.

    See Also:
        :class:`flowgp.models.TrainableModel`.
    """

    def training_objective(self, x: torch.Tensor, y: torch.Tensor, *, num_data: Optional[int] = None,
                           generator: Optional[torch.Generator] = None,
                           batch_rows: Optional[tuple[int, int]] = None, indices: Optional[torch.Tensor] = None,
                           **rows) -> torch.Tensor:
        """`elbo` with the same arguments."""
        return self.elbo(x, y, num_data=num_data, generator=generator, batch_rows=batch_rows, indices=indices,
                         **rows)
