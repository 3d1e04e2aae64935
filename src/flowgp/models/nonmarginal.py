"""TGP with non-marginal flows: the Monte Carlo ELBO of TGP appendix A.2.6.

A non-marginal flow maps (f₀,n, u₀) jointly, so the inducing outputs can no longer be integrated out
analytically. The ELL is estimated by the generative process of appendix eq. 16:
    u₀,s ~ q(u₀),   f₀,n,s ~ p(f₀,n | u₀,s),   f_K,n,s = G(f₀,n,s, u₀,s),
    ELL ≈ Σ_n (1/S) Σ_s log p(y_n | f_K,n,s),
with both draws reparameterised (whitened: u₀ = Lz v, v = m + R ε). The KL term is unchanged,
KL[q(u₀) || p(u₀)]: the flow acts on u₀ by a map that does not depend on f, so its Jacobian cancels as
in the marginal case. Cost O(S·B·M + M³) per step; minibatching works as for the SVGP.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..flows import Flow, make_flow
from ..numerics.quadrature import gh_points
from .svgp import SVGP

__all__ = ["NonMarginalFlow", "MarginalFlowAdapter", "InducingModulatedFlow", "NonMarginalTGP"]


class NonMarginalFlow(nn.Module):
    """Base class: f_K,n = G(f₀,n ; u₀), strictly increasing in f₀,n for every fixed u₀.

    `forward(f, u, cond_mean, x)` receives f [S, N, L] (base draws), u [S, L, M] (inducing outputs u₀),
    cond_mean [S, N, L] = E[f₀,n | u₀] (the per-point summary of u₀ the GP conditional provides) and the
    inputs x [N, D]; it returns f_K [S, N, L]. The map on u₀ itself is left implicit because appendix
    eq. 16 discards u_K.

    See Also:
        :class:`flowgp.models.NonMarginalTGP`, :class:`flowgp.models.InducingModulatedFlow`.
    """

    def forward(self, f, u, cond_mean, x=None):
        raise NotImplementedError

    def inverse(self, y, u, cond_mean, x=None):
        raise NotImplementedError


class MarginalFlowAdapter(NonMarginalFlow):
    """A marginal flow seen as a non-marginal one that ignores u₀ (for checks against the analytic TGP).

    Args:
        flow: a Flow or spec string (on the real line).
        num_outputs: L, the flow's parameters get shape (L,) when built from a spec string.

    See Also:
        :class:`flowgp.models.NonMarginalTGP`.
    """

    def __init__(self, flow: Flow | str, num_outputs: int = 1):
        super().__init__()
        flow = make_flow(flow, param_shape=(num_outputs,)) if isinstance(flow, str) else flow
        if not isinstance(flow, Flow):
            raise TypeError(f"flow must be a flowgp Flow or a spec string, got {type(flow).__name__}")
        self.flow = flow

    def forward(self, f, u, cond_mean, x=None):
        return self.flow(f, x, validate=False)

    def inverse(self, y, u, cond_mean, x=None):
        return self.flow.inverse(y, x)


class InducingModulatedFlow(NonMarginalFlow):
    """G(f₀,n ; u₀) = H(a·tanh(μ_n(u₀)) + exp(b·tanh(μ_n(u₀)))·f₀,n), μ_n(u₀) = E[f₀,n | u₀] = K_nZ K_ZZ⁻¹ u₀.

    A per-point affine map whose shift and log-scale depend on the inducing outputs through the GP
    interpolant μ_n(u₀), followed by a marginal flow H (e.g. "sal"). Strictly increasing in f₀,n for
    fixed u₀ (scale exp(·) > 0), with inverse H⁻¹ then the affine inverse. With gains a = b = 0 it is
    exactly the marginal flow H (the reduction the tests check). Gains are per output, shape [L].

    Args:
        base: the marginal flow H, a Flow or spec string defined on all reals.
        num_outputs: L.
        shift_gain: initial a (every output).
        log_scale_gain: initial b (every output).

    See Also:
        :class:`flowgp.models.NonMarginalTGP`.
    """

    def __init__(self, base: Flow | str = "identity", num_outputs: int = 1, shift_gain: float = 0.0,
                 log_scale_gain: float = 0.0):
        super().__init__()
        base = make_flow(base, param_shape=(num_outputs,)) if isinstance(base, str) else base
        if not isinstance(base, Flow):
            raise TypeError(f"base must be a flowgp Flow or a spec string, got {type(base).__name__}")
        if base.domain != "real":
            raise ValueError(f"base flow '{base.spec}' needs positive inputs; choose one defined on all reals")
        self.base = base
        # float64 (`model.to(dtype)` afterwards is exact), or the dtype of the base flow's parameters
        dtype = next((p.dtype for p in base.parameters()), torch.float64)
        self.shift_gain = nn.Parameter(torch.full((num_outputs,), float(shift_gain), dtype=dtype))
        self.log_scale_gain = nn.Parameter(torch.full((num_outputs,), float(log_scale_gain), dtype=dtype))

    def _affine(self, cond_mean):
        t = torch.tanh(cond_mean)
        return self.shift_gain * t, self.log_scale_gain * t

    def forward(self, f, u, cond_mean, x=None):
        shift, log_scale = self._affine(cond_mean)
        return self.base(shift + log_scale.exp() * f, x, validate=False)

    def inverse(self, y, u, cond_mean, x=None):
        shift, log_scale = self._affine(cond_mean)
        return (self.base.inverse(y, x) - shift) * torch.exp(-log_scale)


class NonMarginalTGP(SVGP):
    """Sparse GP prior warped by a non-marginal flow G(f₀,n ; u₀), trained by the MC ELBO of appendix A.2.6.

    Args (beyond SVGP's):
        kernel, inducing_points: as in :class:`flowgp.SVGP`.
        flow: a NonMarginalFlow; a marginal Flow or spec string is wrapped in MarginalFlowAdapter.
        mc_samples: S joint draws (u₀, f₀,n) per ELBO evaluation.
        predict_samples: draws of u₀ for predictions; each is integrated over f₀,n | u₀ by quadrature.
        *args, **kw: SVGP's other arguments.

    See Also:
        :class:`flowgp.models.InducingModulatedFlow`, :class:`flowgp.models.MarginalFlowAdapter`.
    """

    def __init__(self, kernel, inducing_points, flow: NonMarginalFlow | Flow | str = "identity", *args,
                 mc_samples: int = 10, predict_samples: int = 100, **kw):
        super().__init__(kernel, inducing_points, *args, **kw)
        if isinstance(flow, (str, Flow)):
            flow = MarginalFlowAdapter(flow, self.num_outputs)
        if not isinstance(flow, NonMarginalFlow):
            raise TypeError(f"flow must be a NonMarginalFlow, a Flow or a spec string, got {type(flow).__name__}")
        for name, value in (("mc_samples", mc_samples), ("predict_samples", predict_samples)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.flow = flow
        self.mc_samples = mc_samples
        self.predict_samples = predict_samples

    def conditional_draws(self, x, num_samples: int, generator=None):
        """u₀,s ~ q(u₀) and the moments of p(f₀,n | u₀,s): (u [S, L, M], mean [S, N, L], var [N, L]).

        Whitened draws v = m + R ε (`sample_whitened`), u₀ = Lz v, and the shared conditional
        p(f₀ | u₀) = N(Aᵀ v, K_nn - Q_nn) of the variational core (`SparseVariationalGP.conditional`).
        """
        gp = self.gp
        v = gp.sample_whitened(num_samples, generator)  # [S, L, M]
        u = (gp.kzz_cholesky() @ v.unsqueeze(-1)).squeeze(-1)  # u₀ = Lz v
        mean, var = gp.conditional(x, v)  # [S, N, L], [N, L]
        return u, mean, var.expand(mean.shape[-2:])

    def sample_transformed(self, x, num_samples: int, generator=None):
        """Draws f_K,n,s by appendix eq. 16, [S, N, L] (marginally per point, jointly with u₀,s)."""
        u, mean, var = self.conditional_draws(x, num_samples, generator)
        eps = torch.randn(mean.shape, dtype=mean.dtype, device=mean.device, generator=generator)
        f0 = mean + var.sqrt() * eps
        return self.flow(f0, u, mean, x)

    def expected_log_likelihood(self, x, y, generator=None, batch_rows=None):  # SVGP.elbo assembles the bound
        """Per-point (1/S) Σ_s log p(y_n | G(f₀,n,s ; u₀,s)), [N, L] (appendix A.2.6). `batch_rows` (SVGP's
        signature) is not used yet: this model's per-row draws are made for its own rows, so under data
        parallelism they depend on how the batch is split."""
        f_k = self.sample_transformed(x, self.mc_samples, generator)
        return self.likelihood.log_prob(y, f_k).mean(0)

    def _quadrature(self, x, num_samples, generator=None):
        """Quadrature nodes G(f₀ ; u₀,s) at f₀ ~ p(f₀ | u₀,s): values [Q, S, N, L] and weights [Q, 1, 1, 1]."""
        u, mean, var = self.conditional_draws(x, num_samples, generator)
        f, w = gh_points(mean, var.expand_as(mean), self.predict_quadrature_points)
        return self.flow(f, u, mean, x), w

    def log_predictive_density(self, x, y, generator=None):
        """log (1/S) Σ_s ∫ p(y* | G(f₀ ; u₀,s)) p(f₀ | u₀,s) df₀ (appendix A.4 with eq. 16), [N, L].

        generator: the draws of u₀; by default a fresh torch.Generator seeded 0, so that repeated calls agree.
        """
        x, y = self.validate(x, y)
        if generator is None:
            generator = torch.Generator(device=x.device).manual_seed(0)
        g, w = self._quadrature(x, self.predict_samples, generator)
        inner = torch.logsumexp(w.log() + self.likelihood.log_prob(y, g), dim=0)  # [S, N, L]
        return torch.logsumexp(inner, dim=0) - math.log(inner.shape[0])

    def predict(self, x, generator=None):
        """Predictive mean and variance of y* from the (u₀-sample × quadrature) mixture, each [N, L].

        generator: the draws of u₀; by default a fresh torch.Generator seeded 0, so that repeated calls agree.
        """
        x = self.validate(x)
        if generator is None:
            generator = torch.Generator(device=x.device).manual_seed(0)
        g, w = self._quadrature(x, self.predict_samples, generator)
        cond_mean, cond_var = self.likelihood.conditional_moments(g)
        mean = (w * cond_mean).sum(0).mean(0)
        second = (w * (cond_var + cond_mean.square())).sum(0).mean(0)
        return mean, (second - mean.square()).clamp_min(0)

    def predict_quantiles(self, x, probs):
        raise NotImplementedError("NonMarginalTGP does not provide quantiles; use sample_f and empirical quantiles")

    def sample_f(self, x, num_samples: int = 1, full_cov: bool = False, generator=None):
        """Posterior draws of f_K(x*) per point, [S, N, L] (full_cov is not supported: marginal draws only)."""
        if full_cov:
            raise ValueError("NonMarginalTGP.sample_f draws each point given u₀ independently; use full_cov=False")
        return self.sample_transformed(self.validate(x), num_samples, generator)
