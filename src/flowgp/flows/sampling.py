"""How input-dependent flows draw their network weights W (TGP paper §3.3, appendix A.3-A.4), as an argument.

`flow(f, x, sampling=WeightSampling(num_samples=S))` evaluates every input-dependent stage with S stochastic
draws of W (MC-dropout masks or reparameterised q(W) draws; a leading dimension S of the parameters), and
`WeightSampling(stochastic=False)` with the one deterministic pass (PE-TGP prediction). Plain flows ignore it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

__all__ = ["WeightSampling"]


@dataclass(frozen=True)
class WeightSampling:
    """Sampling mode of the networks θ(x, W) of input-dependent flows.

    Attributes:
        num_samples: S, the number of W draws (the parameters get a leading dimension S); must be 1 when
            `stochastic` is False.
        stochastic: draw W (dropout masks / q(W) samples) or use the deterministic network (no S dimension).
        generator: the torch.Generator every draw comes from (None: torch's global generator).
        rows_share_draws: one dropout mask per sample shared by every row (a sampled network, as in MC dropout
            read as sampling W) instead of a mask per sample and row. Each row's draws keep their distribution,
            and a row's prediction no longer depends on which other rows are predicted with it, so predictions
            use it; training keeps per-row masks (less gradient noise). q(W) draws are shared by rows anyway.
        batch_rows: (offset, B) when the rows are rows offset.. of a global batch of B split over processes:
            per-row dropout masks are drawn for all B rows and sliced, so a row's mask does not depend on the
            split (flowgp.training.distributed); None: the rows are the whole batch.

    See Also:
        :class:`flowgp.flows.InputDependentFlow` (its reader).
    """

    num_samples: int = 1
    stochastic: bool = True
    generator: Optional[torch.Generator] = None
    rows_share_draws: bool = False
    batch_rows: Optional[tuple] = None

    def __post_init__(self):
        if isinstance(self.num_samples, bool) or int(self.num_samples) != self.num_samples or self.num_samples < 1:
            raise ValueError(f"num_samples must be a positive integer, got {self.num_samples!r}")
        object.__setattr__(self, "num_samples", int(self.num_samples))
        if not isinstance(self.rows_share_draws, bool):
            raise TypeError(f"rows_share_draws must be True or False, got {self.rows_share_draws!r}")
        if not isinstance(self.stochastic, bool):
            raise TypeError(f"stochastic must be True or False, got {self.stochastic!r}")
        if not self.stochastic and self.num_samples != 1:
            raise ValueError("a deterministic pass (stochastic=False) has no sample dimension; pass num_samples=1")
        if self.batch_rows is not None:
            offset, rows = self.batch_rows
            if int(offset) != offset or int(rows) != rows or not 0 <= offset < rows:
                raise ValueError(f"batch_rows must be (offset, B) with 0 <= offset < B, got {self.batch_rows!r}")
            object.__setattr__(self, "batch_rows", (int(offset), int(rows)))
        if self.generator is not None and not isinstance(self.generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(self.generator).__name__}")
