"""Networks θ(x) = NN(x, W) for input-dependent flows, with three treatments of W (TGP paper §3.2-3.3, §4.4).

* "point": a point estimate of W trained with standard dropout (PE-TGP); deterministic at prediction.
* "mc_dropout": the same network and training, but predictions average S dropout masks (Gal & Ghahramani
  2016; BA-TGP, appendix A.4 eq. 20).
* "vb": mean-field Gaussian q(W) = Π N(w; μ, σ²) with reparameterised samples w = μ + σ·ε and the closed
  form KL[q(W) || p_λ(W)] for the prior p_λ(W) = N(0, λ⁻¹ I) (appendix A.3, B.6.3).

Randomness is explicit: the initial weights and every stochastic pass (dropout masks, q(W) draws) come from a
`torch.Generator` argument (None: torch's global generator, as in torch itself). Parameters are built in float64;
`.to(dtype)` gives another precision.

`penalty()` is the term the model subtracts from its ELBO: KL[q || p_λ] for "vb", and for the other two
-log p_λ(W) up to a constant, λ/2·||W||², which is the fixed weight decay λ of appendix B.6.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..numerics.constraints import inv_softplus, softplus_positive
from ..numerics.row_draws import draw_rows

__all__ = ["BayesianMLP", "BAYESIAN_MODES", "ACTIVATIONS", "gaussian_kl_to_prior", "default_prior_precision"]

BAYESIAN_MODES = ("point", "mc_dropout", "vb")
ACTIVATIONS = {"relu": torch.relu, "tanh": torch.tanh}

#: Weight decay of appendix B.6 for point / MC-dropout networks; standard normal prior of B.6.3 for VB.
_DEFAULT_PRECISION = {"point": 1e-5, "mc_dropout": 1e-5, "vb": 1.0}


def default_prior_precision(bayesian: str) -> float:
    """λ used when none is given: 1e-5 (weight decay, appendix B.6) or 1 for "vb" (N(0, 1), appendix B.6.3)."""
    _check_mode(bayesian)
    return _DEFAULT_PRECISION[bayesian]


def _check_mode(bayesian) -> None:
    if bayesian not in BAYESIAN_MODES:
        raise ValueError(f"bayesian must be one of {BAYESIAN_MODES}, got {bayesian!r}")


def gaussian_kl_to_prior(mean: Tensor, std: Tensor, prior_precision: float) -> Tensor:
    """Σ_i KL[N(μ_i, σ_i²) || N(0, 1/λ)] = Σ_i ½(λσ_i² + λμ_i² - 1 - log(λσ_i²))."""
    lam_var = prior_precision * std.square()
    return 0.5 * (lam_var + prior_precision * mean.square() - 1.0 - torch.log(lam_var)).sum()


def _dropout(h: Tensor, rate: float, generator, rows_share_masks: bool = False, batch_rows=None) -> Tensor:
    """Inverted dropout: h·m/(1 - rate), m ~ Bernoulli(1 - rate) element-wise (what F.dropout computes).

    F.dropout takes no generator, so with one the mask is drawn explicitly; without, F.dropout is kept (the
    same draws from torch's global generator as before). rows_share_masks: h is [S, ..., N, H] and one mask
    [S, 1, ..., 1, H] per sample is shared by every row (a sampled network). batch_rows (offset, B): h's rows
    (axis -2) are rows offset.. of a global batch of B; the masks are drawn for all B rows and sliced.
    """
    if rows_share_masks:
        shape = (h.shape[0],) + (1,) * (h.dim() - 2) + (h.shape[-1],)
        keep = h.new_empty(shape).bernoulli_(1.0 - rate, generator=generator)
        return h * keep / (1.0 - rate)
    if batch_rows is not None:
        keep = draw_rows(lambda s: h.new_empty(s).bernoulli_(1.0 - rate, generator=generator), h.shape, batch_rows)
        return h * keep / (1.0 - rate)
    if generator is None:
        return F.dropout(h, rate, training=True)
    keep = torch.empty_like(h).bernoulli_(1.0 - rate, generator=generator)
    return h * keep / (1.0 - rate)


def _check_hidden(hidden) -> tuple[int, ...]:
    if isinstance(hidden, int):
        hidden = (hidden,)
    try:
        hidden = tuple(hidden)
    except TypeError:
        raise TypeError(f"hidden must be an int or a sequence of ints such as (50,), got {hidden!r}") from None
    if not 1 <= len(hidden) <= 4 or any(int(h) != h or h < 1 for h in hidden):
        raise ValueError(f"hidden must list 1 to 4 positive layer widths such as (50,) or (25, 25), got {hidden!r}")
    return tuple(int(h) for h in hidden)


class BayesianMLP(nn.Module):
    """Fully connected network x [..., D] -> [..., P] with ReLU/tanh hidden layers and dropout after each.

    Args:
        in_features, out_features: D and P.
        hidden: widths of the hidden layers, e.g. (50,) or (25, 25).
        activation: "relu" or "tanh".
        dropout: drop probability in [0, 1) after every hidden activation ("vb" needs 0: appendix B.6.3
            removes the dropout layer).
        bayesian: "point", "mc_dropout" or "vb" (module docstring).
        prior_precision: λ of p_λ(W) = N(0, λ⁻¹ I); None takes `default_prior_precision(bayesian)`.
        init_std: initial σ of q(W) for "vb".
        generator: torch.Generator for the initial weights (nn.Linear's U(-1/√fan_in, 1/√fan_in)).

    Call `net(x, num_samples=S, sample=True, generator=g)` for S stochastic passes, output [S, ..., P] (fresh
    dropout masks per sample and per row, or one Gaussian weight draw per sample shared by all rows), or
    `sample=False` for the deterministic pass [..., P] (dropout off, or the mean weights μ).
    """

    def __init__(self, in_features: int, out_features: int, hidden: Sequence[int] = (50,), activation: str = "relu",
                 dropout: float = 0.25, bayesian: str = "mc_dropout", prior_precision: float | None = None,
                 init_std: float = 1e-3, generator: torch.Generator | None = None):
        super().__init__()
        _check_mode(bayesian)
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if int(value) != value or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        hidden = _check_hidden(hidden)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {tuple(ACTIVATIONS)}, got {activation!r}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout!r}")
        if bayesian == "vb" and dropout > 0:
            raise ValueError("bayesian='vb' uses no dropout (appendix B.6.3); pass dropout=0")
        if prior_precision is None:
            prior_precision = default_prior_precision(bayesian)
        if not (math.isfinite(prior_precision) and prior_precision > 0):
            raise ValueError(f"prior_precision (λ) must be a positive finite number, got {prior_precision!r}")
        if not init_std > 0:
            raise ValueError(f"init_std must be positive, got {init_std!r}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.hidden = hidden
        self.activation = activation
        self.dropout = float(dropout)
        self._bayesian = bayesian
        self.prior_precision = float(prior_precision)
        self.init_std = float(init_std)
        widths = (self.in_features,) + hidden + (self.out_features,)
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in zip(widths[:-1], widths[1:]):
            # nn.Linear's default scale U(-1/√fan_in, 1/√fan_in), stored as [in, out] for batched x @ W.
            bound = 1.0 / math.sqrt(fan_in)
            weight = torch.empty(fan_in, fan_out, dtype=torch.float64).uniform_(-bound, bound, generator=generator)
            bias = torch.empty(fan_out, dtype=torch.float64).uniform_(-bound, bound, generator=generator)
            self.weights.append(nn.Parameter(weight))
            self.biases.append(nn.Parameter(bias))
        if bayesian == "vb":
            raw = float(inv_softplus(torch.tensor(float(init_std), dtype=torch.float64)))
            self.weight_raw_std = nn.ParameterList(nn.Parameter(torch.full_like(w, raw)) for w in self.weights)
            self.bias_raw_std = nn.ParameterList(nn.Parameter(torch.full_like(b, raw)) for b in self.biases)

    # ------------------------------------------------------------------ mode
    @property
    def bayesian(self) -> str:
        return self._bayesian

    @bayesian.setter
    def bayesian(self, value: str) -> None:
        """Switch between "point" and "mc_dropout" (same parameters W; only prediction differs, appendix B.6.1)."""
        _check_mode(value)
        if (value == "vb") != (self._bayesian == "vb"):
            raise ValueError(f"cannot switch a '{self._bayesian}' network to '{value}': the parameters differ; "
                             "only 'point' <-> 'mc_dropout' share W")
        self._bayesian = value

    @property
    def stochastic_prediction(self) -> bool:
        """Whether predictions average over W samples (BA-TGP, VB) rather than one deterministic pass (PE-TGP)."""
        return self._bayesian != "point"

    # ------------------------------------------------------------------ forward
    def _stds(self):
        return ([softplus_positive(r) for r in self.weight_raw_std], [softplus_positive(r) for r in self.bias_raw_std])

    def constructor_arguments(self) -> tuple[list, dict]:
        """(args, kwargs) that rebuild this architecture (the weights come from the state dict)."""
        return [self.in_features, self.out_features], {
            "hidden": tuple(self.hidden), "activation": self.activation, "dropout": self.dropout,
            "bayesian": self._bayesian, "prior_precision": self.prior_precision, "init_std": self.init_std}

    def forward(self, x: Tensor, num_samples: int = 1, sample: bool = True,
                generator: torch.Generator | None = None, rows_share_masks: bool = False,
                batch_rows: tuple[int, int] | None = None) -> Tensor:
        """[S, ..., P] from S stochastic passes (sample=True) or the deterministic pass [..., P] (sample=False).

        generator: the torch.Generator of the dropout masks / weight draws (None: torch's global one).
        rows_share_masks: one dropout mask per sample for all rows (see flows.WeightSampling.rows_share_draws).
        batch_rows: (offset, B) of x's rows in a global batch split over processes (flows.WeightSampling).
        """
        if x.shape[-1] != self.in_features:
            raise ValueError(f"the network expects inputs [..., {self.in_features}], got shape {tuple(x.shape)}")
        if not sample:
            return self._pass(x, list(self.weights), list(self.biases), drop=False)
        if int(num_samples) != num_samples or num_samples < 1:
            raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
        num_samples = int(num_samples)
        batch = x.dim() - 1  # x [..., D] -> [S, ..., D]
        xs = x.unsqueeze(0).expand((num_samples,) + x.shape)
        if self._bayesian != "vb":
            return self._pass(xs, list(self.weights), list(self.biases), drop=self.dropout > 0, generator=generator,
                              rows_share_masks=rows_share_masks, batch_rows=batch_rows)
        # Reparameterised weight draws, one per sample, shared by all rows: [S, (1,)*batch, in, out].
        w_std, b_std = self._stds()
        weights, biases = [], []
        for mu, sd in zip(self.weights, w_std):
            eps = torch.randn((num_samples,) + mu.shape, dtype=mu.dtype, device=mu.device, generator=generator)
            weights.append((mu + sd * eps).reshape((num_samples,) + (1,) * (batch - 1) + mu.shape))
        for mu, sd in zip(self.biases, b_std):
            eps = torch.randn((num_samples,) + mu.shape, dtype=mu.dtype, device=mu.device, generator=generator)
            biases.append((mu + sd * eps).reshape((num_samples,) + (1,) * batch + mu.shape))
        return self._pass(xs, weights, biases, drop=False)

    def _pass(self, h: Tensor, weights, biases, drop: bool, generator=None, rows_share_masks=False,
              batch_rows=None) -> Tensor:
        act = ACTIVATIONS[self.activation]
        last = len(weights) - 1
        for i, (w, b) in enumerate(zip(weights, biases)):
            h = torch.matmul(h, w) + b
            if i < last:
                h = act(h)
                if drop:
                    h = _dropout(h, self.dropout, generator, rows_share_masks, batch_rows)
        return h

    # ------------------------------------------------------------------ regulariser
    def penalty(self) -> Tensor:
        """KL[q(W) || p_λ(W)] for "vb"; λ/2·||W||² (= -log p_λ(W) + const, weight decay) otherwise."""
        lam = self.prior_precision
        if self._bayesian == "vb":
            w_std, b_std = self._stds()
            return sum(gaussian_kl_to_prior(m, s, lam)
                       for m, s in zip(list(self.weights) + list(self.biases), w_std + b_std))
        return 0.5 * lam * sum(p.square().sum() for p in list(self.weights) + list(self.biases))

    def set_constant_(self, value: Tensor) -> "BayesianMLP":
        """Make the network output `value` [P] for every input: zero last-layer weights, bias = value.

        With "vb" the last layer's σ is set tiny too, so that samples stay at `value` to round-off.
        """
        value = torch.as_tensor(value).reshape(-1)
        if value.numel() != self.out_features:
            raise ValueError(f"value must have {self.out_features} entries, got {value.numel()}")
        with torch.no_grad():
            self.weights[-1].zero_()
            self.biases[-1].copy_(value.to(self.biases[-1]))
            if self._bayesian == "vb":
                tiny = inv_softplus(torch.tensor(1e-12, dtype=torch.float64)).item()
                self.weight_raw_std[-1].fill_(tiny)
                self.bias_raw_std[-1].fill_(tiny)
        return self

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, hidden={self.hidden}, "
                f"activation={self.activation!r}, dropout={self.dropout}, bayesian={self._bayesian!r}, "
                f"prior_precision={self.prior_precision:g}")
