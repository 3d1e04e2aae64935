"""Transformed GP (Maroñas et al. 2021): f_K = G(f₀), f₀ ~ sparse GP, q(u_K) = q(u₀) J_{u_K}.

TGP = SVGP + `WarpedLikelihood(flow, base)`: the ELBO (TGP appendix eq. 14) is
Σ_n E_{q(f₀,n)}[log p(y_n | G(f₀,n))] - KL[q(u₀) || p(u₀)], the expectation by one-dimensional
Gauss-Hermite quadrature; no Jacobian or inverse of G is needed. Input-dependent flows G_{θ(x, W)} (paper
§3.2-3.3, §4.4; appendix A.3) average S draws of W and subtract the network's penalty; predictions are the
mixture of appendix eq. 20. All of that lives in the likelihood (`flowgp.gp.likelihoods.WarpedLikelihood`);
this class only builds it and keeps the TGP-specific names (`flow`, `flow_penalty`, ...).
"""
from __future__ import annotations

import torch

from ..compat import move_prefix
from ..flows import Flow
from ..gp.likelihoods import GaussianLikelihood, Likelihood, WarpedLikelihood
from .svgp import SVGP

__all__ = ["TGP"]


def _delegate(name: str, doc: str) -> property:
    """A property reading and writing the warped likelihood's attribute `name`."""
    def getter(self):
        return getattr(self.likelihood, name)

    def setter(self, value):
        setattr(self.likelihood, name, value)

    return property(getter, setter, doc=doc)


class TGP(SVGP):
    """SVGP whose prior (and posterior) is warped element-wise by a monotone flow G.

    Equivalent to `SVGP(kernel, z, WarpedLikelihood(flow, likelihood, ...), ...)`.

    Args (beyond SVGP's):
        kernel, inducing_points: as in :class:`flowgp.SVGP`.
        flow: a Flow or a spec string such as "sal+softplus"; its domain must be the real line.
        likelihood: the base likelihood p(y | f_K) (default GaussianLikelihood(num_outputs=L)).
        closed_form_affine: when G is affine, use the exact Gaussian expectations instead of quadrature
            (identical up to round-off, faster).
        mc_samples_train: S, draws of W per ELBO evaluation in training for input-dependent flows (default 1).
        mc_samples_predict: S for predictions and evaluation (default 100; appendix eq. 20). Networks in
            "point" mode (PE-TGP) predict with one deterministic pass instead.
        *args, **kw: SVGP's other arguments (num_outputs, mean_function, q_var_init, learn_inducing, jitter,
            quadrature_points, predict_quadrature_points).

    See Also:
        :class:`flowgp.TGPRegressor` (its estimator), :func:`flowgp.make_flow`.

    Examples:
        >>> import torch
        >>> from flowgp import TGP, make_kernel
        >>> x = torch.linspace(-3, 3, 50, dtype=torch.float64)[:, None]
        >>> model = TGP(make_kernel("rbf", input_dim=1), x[::5].clone(), flow="sal")
        >>> model.flow.spec
        'sal'
    """

    def __init__(self, kernel, inducing_points, flow: Flow | str = "identity", likelihood: Likelihood | None = None,
                 *args, closed_form_affine=True, mc_samples_train: int = 1, mc_samples_predict: int = 100, **kw):
        if isinstance(likelihood, WarpedLikelihood):
            raise TypeError("likelihood is the base likelihood of the TGP and is warped by `flow`; to pass a ready "
                            "WarpedLikelihood use SVGP(kernel, inducing_points, likelihood)")
        if likelihood is None:  # SVGP's default, built here because it is the base of the warped one
            z = inducing_points
            floating = isinstance(z, torch.Tensor) and z.is_floating_point()
            likelihood = GaussianLikelihood(num_outputs=args[0] if args else kw.get("num_outputs", 1),
                                            dtype=z.dtype if floating else torch.float64,
                                            device=z.device if floating else None)
        warped = WarpedLikelihood(flow, likelihood, closed_form_affine=closed_form_affine,
                                  mc_samples_train=mc_samples_train, mc_samples_predict=mc_samples_predict)
        super().__init__(kernel, inducing_points, warped, *args, **kw)

    # ------------------------------------------------------------------ the TGP's names for its likelihood's parts
    @property
    def flow(self) -> Flow:
        """The flow G (held by the likelihood)."""
        return self.likelihood.flow

    @property
    def input_dependent(self) -> bool:
        """Whether some stage of the flow takes its parameters from a network of x."""
        return self.likelihood.input_dependent

    def flow_penalty(self):
        """Σ over the flow's networks of KL[q(W)||p(W)] (VB) or λ/2·||W||² (point / MC dropout); 0 without."""
        terms = self.likelihood.kl_terms()
        return sum(terms) if terms else self.gp.q_mu.new_zeros(())

    closed_form_affine = _delegate("closed_form_affine", "Whether affine flows use the exact expectations.")
    mc_samples_train = _delegate("mc_samples_train", "Draws of W per ELBO evaluation (input-dependent flows).")
    mc_samples_predict = _delegate("mc_samples_predict", "Draws of W in predictions (input-dependent flows).")

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # TGP models saved before the flow moved into the likelihood stored it at "flow.": read it there
        move_prefix(state_dict, prefix + "flow.", prefix + "likelihood.flow.",
                    "this TGP was saved with its flow outside the likelihood (an earlier layout)")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

