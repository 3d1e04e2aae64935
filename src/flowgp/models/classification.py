"""GP classification with transformed GPs (TGP paper §5.2, appendix B.6).

C latent sparse GPs f₀,c, each warped by its own marginal flow G_c (per-latent parameters, or
input-dependent ones through the flow's `params(x)` hook), then a classification likelihood:
    binary (C = 2): one latent, p(y = 1 | f) = Φ(G(f₀)) (probit);
    multiclass: C latents, p(y = c | f) = softmax(G(f₀))_c, or the robust max.
ELBO (appendix eq. 14): Σ_n E_{q(f₀,n)}[log p(y_n | G(f₀,n))] - KL[q(u₀) || p(u₀)], the expectation by
Gauss-Hermite quadrature for the binary case and by reparameterised Monte Carlo over the C independent
latents (S samples, batched) for the softmax. flow="identity" gives the SVGP classifier of Hensman et al. (2015).

Input-dependent flows G_{θ(x, W)} (paper §3.2-3.3, §4.4; `flowgp.flows.conditional`) also average over
draws of W (appendix A.3): in training `mc_samples_train` draws per ELBO evaluation, and the ELBO subtracts
the networks' penalty; predictions average probabilities over `mc_samples_predict` draws (appendix eq. 20,
BA-TGP) or use one deterministic pass ("point" networks, PE-TGP). For the softmax each W draw is paired
with one latent draw, so one batched tensor [S, N, C] carries both integrals.

Why this model keeps its own warping code rather than `flowgp.gp.likelihoods.WarpedLikelihood`: the multiclass
likelihood reads all C warped latents at once (softmax / robust max over the last axis), so its
expectation is a C-dimensional integral done by Monte Carlo with each W draw paired with one joint latent
draw, where the WarpedLikelihood integrates one latent at a time by Gauss-Hermite quadrature. The binary
case is that one-dimensional integral and computes the same quantity as WarpedLikelihood(flow, Bernoulli).
The bound itself is assembled by the shared `flowgp.gp.objective.minibatch_bound`.
"""
from __future__ import annotations

import torch
from torch import nn

from ..gp.defaults import DEFAULTS
from ..flows import Flow, make_flow
from ..flows import WeightSampling, input_dependent_flows
from ..gp.likelihoods import BernoulliLikelihood, Likelihood, RobustMaxLikelihood, SoftmaxLikelihood
from ..gp.objective import minibatch_bound
from ..registry import LIKELIHOODS
from ..numerics.quadrature import gauss_hermite, gh_points
from ..numerics.row_draws import draw_rows
from ..gp.variational import Marginals, SparseVariationalGP
from ._checks import as_inputs
from .protocol import TrainsItsBound

__all__ = ["TGPClassification", "CLASSIFICATION_LIKELIHOODS"]

#: Multiclass likelihood names accepted by TGPClassification (binary problems always use the probit).
CLASSIFICATION_LIKELIHOODS = ("softmax", "robustmax")

#: lower end of the standardised argument of log Φ in the warped robust max: Φ(-1000) = exp(-500 007) is 0 in
#: float32 and float64 alike, so a factor there or below makes its product exactly 0 either way (value and
#: gradient), while torch's log_ndtr gradient breaks down further out (wrong beyond about -1e7, inf at -4.5e9:
#: a steep warp of one latent then turned a training step into NaN)
_LOG_CDF_FLOOR = -1e3


def _is_identity(flow: Flow) -> bool:
    return bool(getattr(flow, "is_identity", False))


class TGPClassification(TrainsItsBound, nn.Module):
    """Sparse variational (transformed) GP classifier over `num_classes` classes.

    Args:
        kernel: flowgp kernel; batch_shape () shares it across latents, (L,) gives each latent its own.
        inducing_points: initial Z, [M, D] or [L, M, D] (L = 1 for binary, C otherwise).
        num_classes: C >= 2.
        flow: a Flow or spec string ("identity", "sal", "sinharcsinh", ...); strings are built with one
            parameter per latent (param_shape (L,)). Its domain must be the real line.
        likelihood: "softmax" (default) or "robustmax" for C > 2 (ignored for C = 2: probit), or a Likelihood.
        quadrature_points: Gauss-Hermite points of the binary ELL.
        mc_samples: S, Monte Carlo samples of the multiclass ELL.
        predict_samples: Monte Carlo samples of the multiclass predictive probabilities.
        predict_quadrature_points: quadrature points of the binary predictive with a non-identity flow.
        mc_samples_train: draws of W per ELBO evaluation for input-dependent flows (binary; the softmax pairs
            each of its `mc_samples` latent draws with one W draw).
        mc_samples_predict: draws of W in binary predictions (softmax: `predict_samples` paired draws).
        mean_function, q_var_init, learn_inducing, jitter: passed to SparseVariationalGP.

    See Also:
        :class:`flowgp.TGPClassifier`, :class:`flowgp.SVGPClassifier` (its estimators).
    """

    def __init__(
        self,
        kernel: nn.Module,
        inducing_points: torch.Tensor,
        num_classes: int,
        flow: Flow | str = "identity",
        likelihood: str | Likelihood = "softmax",
        quadrature_points: int = DEFAULTS.quadrature_points,
        mc_samples: int = 20,
        predict_samples: int = 256,
        predict_quadrature_points: int = DEFAULTS.predict_quadrature_points,
        mc_samples_train: int = 1,
        mc_samples_predict: int = 100,
        mean_function: nn.Module | None = None,
        q_var_init: float = 1e-5,
        learn_inducing: bool = True,
        jitter: float | None = None,
    ):
        super().__init__()
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
        for name, value in (("quadrature_points", quadrature_points), ("mc_samples", mc_samples),
                            ("predict_samples", predict_samples),
                            ("predict_quadrature_points", predict_quadrature_points),
                            ("mc_samples_train", mc_samples_train), ("mc_samples_predict", mc_samples_predict)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.num_classes = num_classes
        num_latent = 1 if num_classes == 2 else num_classes
        self.gp = SparseVariationalGP(kernel, inducing_points, num_latent, mean_function, q_var_init,
                                      learn_inducing, jitter)
        if isinstance(flow, str):
            flow = make_flow(flow, param_shape=(num_latent,))
        if not isinstance(flow, Flow):
            raise TypeError(f"flow must be a flowgp Flow or a spec string, got {type(flow).__name__}")
        if flow.domain != "real":
            raise ValueError(f"flow '{flow.spec}' needs positive inputs but the latent GP takes every real value; "
                             "choose a flow defined on all reals such as 'sal'")
        self.flow = flow
        if num_classes == 2:
            likelihood = BernoulliLikelihood()
        elif isinstance(likelihood, str):
            if likelihood not in CLASSIFICATION_LIKELIHOODS:
                raise ValueError(f"likelihood must be one of {CLASSIFICATION_LIKELIHOODS} or a Likelihood, "
                                 f"got {likelihood!r}")
            likelihood = LIKELIHOODS.create(likelihood, num_classes)  # the one name-to-class table
        elif not isinstance(likelihood, Likelihood):
            raise TypeError(f"likelihood must be a name or a flowgp Likelihood, got {type(likelihood).__name__}")
        self.likelihood = likelihood
        self.quadrature_points = quadrature_points
        self.mc_samples = mc_samples
        self.predict_samples = predict_samples
        self.predict_quadrature_points = predict_quadrature_points
        self.mc_samples_train = mc_samples_train
        self.mc_samples_predict = mc_samples_predict

    # ------------------------------------------------------------------ helpers
    @property
    def num_latent(self) -> int:
        return self.gp.num_outputs

    @property
    def input_dim(self) -> int:
        return self.gp.inducing_points.shape[-1]

    def set_variance_trainable(self, trainable: bool) -> None:
        """Freeze or release the variational covariance S (appendix B.6 holds it fixed for the first epochs)."""
        self.gp.q_sqrt.requires_grad_(bool(trainable))

    def _labels(self, y, n: int) -> torch.Tensor:
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"y must be a torch.Tensor of class indices, got {type(y).__name__}")
        if y.dim() == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.dim() != 1 or y.shape[0] != n:
            raise ValueError(f"y must have shape [{n}] (class indices matching x), got {tuple(y.shape)}")
        if y.is_floating_point():
            if not torch.isfinite(y).all():
                raise ValueError("y contains NaN or inf; drop those rows first")
            if not torch.all(y == y.round()):
                raise ValueError("y must hold integer class indices 0..C-1, got non-integer values")
        y = y.long()
        if n and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
            raise ValueError(f"y must hold class indices in [0, {self.num_classes}), "
                             f"got range [{int(y.min())}, {int(y.max())}]")
        return y

    def _identity_flow(self) -> bool:
        return _is_identity(self.flow)

    @property
    def input_dependent(self) -> bool:
        """Whether some stage of the flow takes its parameters from a network of x."""
        return bool(input_dependent_flows(self.flow))

    def flow_penalty(self) -> torch.Tensor:
        """Σ over the flow's networks of KL[q(W)||p(W)] (VB) or λ/2·||W||² (point / MC dropout); 0 without."""
        stages = input_dependent_flows(self.flow)
        if not stages:
            return self.gp.q_mu.new_zeros(())
        return sum(s.network.penalty() for s in stages)

    def _sampling(self, num_samples: int, train: bool, generator=None, batch_rows=None):
        """`num_samples` stochastic W draws (or one deterministic PE pass); None without networks. batch_rows
        (offset, B): in training, the rows' place in a global batch split over processes (flows.WeightSampling)."""
        if not self.input_dependent:
            return None
        if train or all(s.network.stochastic_prediction for s in input_dependent_flows(self.flow)):
            # predictions: one network per sample for every row (row-order/subset invariant predictions)
            return WeightSampling(num_samples, True, generator, rows_share_draws=not train,
                                  batch_rows=batch_rows if train else None)
        return WeightSampling(1, False, generator)

    def _warp_nodes(self, f, x, num_samples: int, train: bool, generator=None, batch_rows=None):
        """G at quadrature nodes f [Q, N, L]: [Q, S_W, N, L] (S_W = 1 without input-dependent sampling)."""
        if self._identity_flow():
            return f.unsqueeze(1)
        sampling = self._sampling(num_samples, train, generator, batch_rows)
        return self.flow(f.unsqueeze(1), x, validate=False, sampling=sampling)

    def _warp_paired(self, f, x, train: bool, generator=None, batch_rows=None):
        """G at latent draws f [S, N, C], one W draw per latent draw when input-dependent: [S, N, C]."""
        if self._identity_flow():
            return f
        return self.flow(f, x, validate=False, sampling=self._sampling(f.shape[0], train, generator, batch_rows))

    def predict_f(self, x: torch.Tensor) -> Marginals:
        """q(f₀(x*)): marginal mean and variance [N, L] of the base latent GPs."""
        return self.gp.marginals(self.validate(x))

    # ------------------------------------------------------------------ ELBO
    def expected_log_likelihood(self, x: torch.Tensor, y: torch.Tensor, generator=None,
                                batch_rows: tuple[int, int] | None = None) -> torch.Tensor:
        """Per-point E_{q(f₀,n)}[log p(y_n | G(f₀,n))], [N] (appendix eq. 14; quadrature or MC).
        batch_rows (offset, B): these rows are rows offset.. of a global batch of B split over processes; every
        per-row draw (Monte Carlo latents, dropout masks) is made for all B rows and sliced."""
        mean, var = self.gp.marginals(x)  # [N, L]
        lik = self.likelihood
        if self.num_classes == 2:
            f, w = gh_points(mean, var, self.quadrature_points)  # [Q, N, 1]
            g = self._warp_nodes(f, x, self.mc_samples_train, self.training, generator, batch_rows)  # [Q, S_W, N, 1]
            log_p = lik.log_prob(y.to(mean.dtype).unsqueeze(-1), g)
            return (w.unsqueeze(1) * log_p).sum(0).mean(0)[:, 0]
        if isinstance(lik, RobustMaxLikelihood):
            if self._identity_flow():
                return lik.expected_log_prob(y, mean, var, self.quadrature_points)
            p = self.warped_argmax_probability(x, y, mean, var, self.training, generator, batch_rows)
            return lik.expected_log_prob_from_argmax_probability(p)
        eps = draw_rows(lambda s: torch.randn(s, dtype=mean.dtype, device=mean.device, generator=generator),
                        (self.mc_samples,) + mean.shape, batch_rows)
        f = mean + var.sqrt() * eps  # reparameterised samples of the C independent latents, [S, N, C]
        return lik.log_prob(y, self._warp_paired(f, x, self.training, generator, batch_rows)).mean(0)

    def warped_argmax_probability(self, x, y, mean, var, train: bool = False, generator=None,
                                  batch_rows=None) -> torch.Tensor:
        """P(argmax_c G_c(f₀,c) = y) under independent q(f₀,c) = N(μ_c, σ²_c), [N]: differentiable.

        Every G_c is increasing, so G_c(f_c) < G_y(t) exactly when f_c < G_c⁻¹(G_y(t)), and
            P = ∫ N(t; μ_y, σ²_y) Π_{c≠y} Φ((G_c⁻¹(G_y(t)) - μ_c) / σ_c) dt,
        a one-dimensional Gauss-Hermite integral over f_y (the robust max of Hernández-Lobato et al. 2011 with
        warped latents, TGP appendix eq. 14). Unlike Monte Carlo through the argmax it has a gradient. Where
        G_y(t) leaves G_c's range the factor is its limit (0 or 1). Input-dependent flows average S draws of W,
        the forward and inverse maps of one draw sharing its weights (the generator is replayed).
        """
        num_points = self.quadrature_points
        std = var.clamp_min(1e-12).sqrt()
        idx = y.view(-1, 1)  # [N, 1]
        mu_y, sd_y = torch.gather(mean, -1, idx), torch.gather(std, -1, idx)  # [N, 1]
        nodes, weights = gauss_hermite(num_points, mean.dtype, mean.device)
        t = (mu_y + sd_y * nodes.view(-1, 1, 1)).expand(-1, -1, self.num_classes)  # [Q, N, C]: f_y at each node
        sampling = self._sampling(self.mc_samples_train if train else self.mc_samples_predict, train, generator,
                                  batch_rows)
        if sampling is not None:
            t = t.unsqueeze(1)  # [Q, 1, N, C] against the W draws [S]
            if sampling.generator is None:
                sampling = WeightSampling(sampling.num_samples, sampling.stochastic,
                                          torch.Generator(device=mean.device).manual_seed(0),
                                          sampling.rows_share_draws, sampling.batch_rows)
            state = sampling.generator.get_state()
        g = self.flow(t, x, validate=False, sampling=sampling)  # G_c(f_y) in column c
        g_y = torch.gather(g, -1, idx.expand(g.shape[:-1] + (1,)) if sampling is None else
                           idx.view(1, 1, -1, 1).expand(g.shape[:-1] + (1,))).expand_as(g)
        # the range of each G_c only decides where the limit applies: no gradient (its ends are G(±inf))
        with torch.no_grad():
            if sampling is not None:
                sampling.generator.set_state(state)
            bounds = self.flow.codomain_bounds(x, sampling=sampling)
            if sampling is not None:
                sampling.generator.set_state(state)
        inside = g_y
        if bounds is not None:
            low, high = bounds
            tiny = torch.finfo(g.dtype).eps
            low_in = torch.where(torch.isfinite(low), low + tiny * (1 + low.abs()), low)
            high_in = torch.where(torch.isfinite(high), high - tiny * (1 + high.abs()), high)
            inside = torch.minimum(torch.maximum(g_y, low_in), high_in)
        back = self.flow.inverse(inside, x, validate=False, sampling=sampling)  # G_c⁻¹(G_y(f_y))
        log_cdf = torch.special.log_ndtr(((back - mean) / std).clamp_min(_LOG_CDF_FLOOR))  # [Q, (S,) N, C]
        if bounds is not None:
            # outside G_c's range the factor is its limit, set after log_ndtr so no gradient meets an infinity
            log_cdf = torch.where(g_y >= high, torch.zeros_like(log_cdf), log_cdf)
            log_cdf = torch.where(g_y <= low, torch.full_like(log_cdf, float("-inf")), log_cdf)
        own = torch.zeros_like(mean, dtype=torch.bool).scatter(-1, idx, True)
        log_cdf = log_cdf.masked_fill(own, 0.0)  # the class y itself does not enter the product
        p = log_cdf.sum(-1).exp()  # [Q, (S,) N]
        if sampling is not None:
            p = p.mean(1)
        return (weights.view(-1, 1) * p).sum(0)

    def validate(self, x, y=None):
        """x checked as [N, D] (and y as class indices in [0, C)); returns x, or (x, y) with y as int64 [N]."""
        x = as_inputs(x, self.input_dim)
        return x if y is None else (x, self._labels(y, x.shape[0]))

    def kl_terms(self) -> list:
        """KL[q(u₀) || p(u₀)] and, for input-dependent flows, the networks' penalties (appendix A.3)."""
        terms = [self.gp.kl_divergence()]
        if self.input_dependent:
            terms.append(self.flow_penalty())
        return terms

    def elbo(self, x: torch.Tensor, y: torch.Tensor, num_data: int | None = None, generator=None,
             batch_rows: tuple[int, int] | None = None, indices=None) -> torch.Tensor:
        """(N/B) Σ_batch ELL_n - KL[q(u₀) || p(u₀)] (- network penalty), an unbiased minibatch estimate.
        batch_rows: (offset, B) when x is part of a global batch split over processes (flowgp.training.distributed);
        indices: the rows' positions (flowgp.models.protocol.TrainableModel), unused."""
        x, y = self.validate(x, y)
        return minibatch_bound(self.expected_log_likelihood(x, y, generator, batch_rows), self.kl_terms(),
                               num_data, x.shape[0])

    # ------------------------------------------------------------------ prediction
    def predict(self, x: torch.Tensor, generator=None) -> torch.Tensor:
        """The model's predictions (flowgp.models.protocol.TrainableModel): `predict_proba`, [N, C]."""
        return self.predict_proba(x, generator)

    def predict_proba(self, x: torch.Tensor, generator=None) -> torch.Tensor:
        """p(y* = c | x*) = ∫ p(y* = c | G(f₀)) q(f₀) df₀ (appendix eq. 19), [N, C]; rows sum to one.

        Binary: Φ(μ/sqrt(1+σ²)) with the identity flow, else Gauss-Hermite quadrature. Softmax: Monte Carlo
        with `predict_samples` draws (fixed seed 0 unless a generator is given, so predictions repeat).
        """
        x = self.validate(x)
        mean, var = self.gp.marginals(x)
        lik = self.likelihood
        if self.num_classes == 2:
            if self._identity_flow():
                p1 = lik.predictive_prob(mean, var)[:, 0]
            else:
                f, w = gh_points(mean, var, self.predict_quadrature_points)
                g = self._warp_nodes(f, x, self.mc_samples_predict, False, generator)
                p1 = (w.unsqueeze(1) * torch.special.ndtr(g)).sum(0).mean(0)[:, 0]
            return torch.stack([1.0 - p1, p1], dim=-1)
        if isinstance(lik, RobustMaxLikelihood) and self._identity_flow():
            probs = lik.predictive_probs(mean, var, self.predict_quadrature_points)
            return probs / probs.sum(-1, keepdim=True)  # remove the quadrature's tiny normalisation error
        if generator is None:
            generator = torch.Generator(device=mean.device).manual_seed(0)
        # One set of S standard-normal draws shared by every row (common random numbers): a row's probabilities
        # then do not depend on which other rows are predicted with it, nor on their order or the chunking.
        eps = torch.randn((self.predict_samples, 1) + mean.shape[1:], dtype=mean.dtype, device=mean.device,
                          generator=generator)
        f = mean + var.sqrt() * eps
        g = self._warp_paired(f, x, False, generator)
        if isinstance(lik, SoftmaxLikelihood):
            return torch.softmax(g, dim=-1).mean(0)
        # any other likelihood: average p(y = c | g) over samples
        labels = torch.arange(self.num_classes, device=mean.device).view(1, -1, 1)  # [1, C, 1] against [S, 1, N]
        return lik.log_prob(labels, g.unsqueeze(1)).exp().mean(0).transpose(0, 1)

    def log_predictive_density(self, x: torch.Tensor, y: torch.Tensor, generator=None) -> torch.Tensor:
        """log p(y* | x*) per point, [N] (floored at the smallest positive float to stay finite).

        generator: for the Monte Carlo draws of `predict_proba` (default: a fresh one seeded 0).
        """
        x, y = self.validate(x, y)
        probs = self.predict_proba(x, generator)
        p = torch.gather(probs, -1, y.unsqueeze(-1)).squeeze(-1)
        return p.clamp_min(torch.finfo(p.dtype).tiny).log()
