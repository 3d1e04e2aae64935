"""G-SP baseline (TGP paper §4.2, appendix A.5.1): a transformed prior with a *Gaussian* variational family.

Prior: f_K = G(f₀), u_K = G(u₀) with [f₀; u₀] a GP at [X; Z]. Posterior: q(f_K, u_K) = p_G(f_K | u_K) q(u_K)
with q(u_K) = N(m, S) and p_G the ordinary Gaussian conditional N(K_XZ K_ZZ⁻¹ u_K, C), C = K_XX - Q_XX
(appendix eq. 23). The conditional no longer cancels against the transformed prior, so (appendix eq. 24)
    L = E_q(f_K)[log p(Y | f_K)]
        + E_q[log N(f₀; K_XZ K_ZZ⁻¹ u₀, C) - log N(f_K; K_XZ K_ZZ⁻¹ u_K, C)]        (O(N³): C is N × N)
        + E_q[log N(u₀; 0, K_ZZ)] + H[q(u_K)] + E_q[log J_{f_K, u_K}],
with f₀ = G⁻¹(f_K), u₀ = G⁻¹(u_K) and log J = -Σ log G'(f₀) - Σ log G'(u₀). The first term is the SVGP
expected log-likelihood; the rest is estimated by reparameterised Monte Carlo over joint draws
(u_K, f_K). With G = I the Monte Carlo part is exactly -KL[q(u)||p(u)], i.e. the SVGP ELBO. Prediction
follows the SVGP (appendix eq. 25). Small data only: the Cholesky of C costs O(N³).
"""
from __future__ import annotations


import torch

from ..flows import Flow, make_flow
from ..numerics.linalg import robust_cholesky
from ..gp.objective import minibatch_bound
from .svgp import SVGP

__all__ = ["GSP"]


class GSP(SVGP):
    """Gaussian-posterior sparse model over a flow-transformed GP prior (appendix A.5.1); one output.

    Args (beyond SVGP's):
        kernel, inducing_points: as in :class:`flowgp.SVGP`.
        flow: prior flow G (Flow or spec string); it must map the real line onto the real line, because
            Gaussian posterior draws are pushed through G⁻¹ (paper §4.2).
        mc_samples: joint draws (u_K, f_K) per ELBO evaluation.
        conditional_jitter: added to the diagonal of C = K_XX - Q_XX before its Cholesky.
        max_points: refuse data sets larger than this (the ELBO costs O(N³) time and O(N²) memory).
        *args, **kw: SVGP's other arguments.

    See Also:
        :class:`flowgp.TGP` (the same prior with the TGP's posterior).
    """

    def __init__(self, kernel, inducing_points, flow: Flow | str = "sal", *args, mc_samples: int = 10,
                 conditional_jitter: float = 1e-6, max_points: int = 2000, **kw):
        super().__init__(kernel, inducing_points, *args, **kw)
        if self.num_outputs != 1:
            raise ValueError(f"GSP supports a single output, got num_outputs={self.num_outputs}")
        if self.gp.mean_function is not None:
            raise ValueError("GSP supports a zero-mean GP prior only; pass mean_function=None")
        flow = make_flow(flow) if isinstance(flow, str) else flow
        if not isinstance(flow, Flow):
            raise TypeError(f"flow must be a flowgp Flow or a spec string, got {type(flow).__name__}")
        if flow.domain != "real" or flow.codomain != "real":
            raise ValueError(
                f"G-SP needs a flow from the real line onto the real line (Gaussian posterior draws go through "
                f"G⁻¹), but '{flow.spec}' has domain {flow.domain!r} and codomain {flow.codomain!r}; "
                "use e.g. 'sal', 'sinharcsinh', 'affine' or 'lincomb3'"
            )
        if isinstance(mc_samples, bool) or not isinstance(mc_samples, int) or mc_samples < 1:
            raise ValueError(f"mc_samples must be a positive integer, got {mc_samples!r}")
        if not conditional_jitter >= 0:
            raise ValueError(f"conditional_jitter must be >= 0, got {conditional_jitter}")
        self.flow = flow
        self.mc_samples = mc_samples
        self.conditional_jitter = float(conditional_jitter)
        self.max_points = int(max_points)

    def _check_size(self, n: int) -> None:
        if n > self.max_points:
            raise ValueError(
                f"G-SP needs the Cholesky of an N × N conditional covariance (O(N³)); N = {n} exceeds "
                f"max_points = {self.max_points}. Subsample the data, raise max_points knowingly, or use TGP, "
                "whose ELBO costs O(N M²)"
            )

    def prior_correction(self, x: torch.Tensor, generator=None) -> torch.Tensor:
        """MC estimate of every ELBO term but the ELL (appendix eq. 24, terms 2-4), a scalar.

        Per joint draw: -½(r₀ᵀ C⁻¹ r₀ - ξᵀξ) - ½‖Lz⁻¹u₀‖² + M/2 + log|R| + log J (plus a zero-mean
        control variate ½‖v‖² - ½(tr S + ‖m‖²)), where f_K = Aᵀv + L_C ξ,
        u_K = Lz v, v = m + R ε (whitened), r₀ = f₀ - Aᵀ Lz⁻¹ u₀; the log-determinants of C and of Lz cancel.
        """
        gp = self.gp
        n = x.shape[0]
        self._check_size(n)
        a, chol_z = gp.projection(x)  # A = Lz⁻¹ K_ZX, [1, M, N]
        a = a.reshape(a.shape[-2:])
        chol_z = chol_z.reshape(chol_z.shape[-2:])
        kxx = gp.kernel(x.unsqueeze(-3)).reshape(n, n)
        cond = kxx - a.mT @ a
        cond = 0.5 * (cond + cond.mT) + self.conditional_jitter * torch.eye(n, dtype=x.dtype, device=x.device)
        chol_c = robust_cholesky(cond)
        r = gp.q_sqrt_tril()[0]  # [M, M]
        q_mu = gp.q_mu[0]
        m = q_mu.shape[-1]
        s = self.mc_samples
        v = gp.sample_whitened(s, generator)[:, 0]  # v = m + R ε, [S, M]
        xi = torch.randn((s, n), dtype=x.dtype, device=x.device, generator=generator)
        u_k = v @ chol_z.mT  # u_K = Lz v
        f_k = v @ a + xi @ chol_c.mT  # f_K ~ N(Aᵀ v, C)
        f_0 = self.flow.inverse(f_k.unsqueeze(-1), validate=False)[..., 0]
        u_0 = self.flow.inverse(u_k.unsqueeze(-1), validate=False)[..., 0]
        w_0 = torch.linalg.solve_triangular(chol_z, u_0.unsqueeze(-1), upper=False)[..., 0]  # Lz⁻¹ u₀
        r_0 = f_0 - w_0 @ a
        white = torch.linalg.solve_triangular(chol_c, r_0.unsqueeze(-1), upper=False)[..., 0]  # L_C⁻¹ r₀
        conditional = -0.5 * (white.square().sum(-1) - xi.square().sum(-1))
        # control variate: ½‖v‖² has the known mean ½(tr S + ‖m‖²); adding their difference keeps the
        # estimate unbiased and makes it exact (zero variance) when G is the identity (u₀ = u_K, w₀ = v)
        control = 0.5 * v.square().sum(-1) - 0.5 * (r.square().sum() + q_mu.square().sum())
        prior_u = -0.5 * w_0.square().sum(-1) + control + 0.5 * m + torch.diagonal(r).abs().log().sum()
        log_jac = -(self.flow.log_abs_det_jacobian(f_0.unsqueeze(-1), validate=False).sum((-2, -1))
                    + self.flow.log_abs_det_jacobian(u_0.unsqueeze(-1), validate=False).sum((-2, -1)))
        return (conditional + prior_u + log_jac).mean()

    def elbo(self, x, y, num_data: int | None = None, generator=None, batch_rows=None, indices=None):
        """G-SP ELBO (appendix eq. 24) on the full data set; minibatches are refused (C couples all points).

        The SVGP expected log-likelihood under the Gaussian q(f_K) plus the Monte Carlo prior correction,
        which enters `minibatch_bound` as a (negated) global term with N = B. `batch_rows` and `indices`
        (flowgp.models.protocol.TrainableModel) are unused: the bound takes the whole data set.
        """
        x, y = self.validate(x, y)
        if num_data is not None and int(num_data) != x.shape[0]:
            raise ValueError(
                f"G-SP cannot be minibatched (its conditional term couples all N points): got a batch of "
                f"{x.shape[0]} with num_data={num_data}; train with batch_size=None"
            )
        self._check_size(x.shape[0])
        correction = self.prior_correction(x, generator)
        return minibatch_bound(self.expected_log_likelihood(x, y), [-correction], None, x.shape[0])

    def affine_expected_elbo(self, x, y) -> torch.Tensor:
        """Exact E[ELBO] when G(f) = α + β f (no Monte Carlo), for checks; raises if G is not affine.

        E[r₀ᵀC⁻¹r₀] = (N + α² cᵀC⁻¹c)/β² with c = 1 - K_XZ K_ZZ⁻¹ 1, E‖Lz⁻¹u₀‖² = (tr S + ‖m - α Lz⁻¹1‖²)/β².
        """
        x, y = self.validate(x, y)
        coefficients = self.flow.affine_coefficients()
        if coefficients is None:
            raise ValueError(f"flow '{self.flow.spec}' is not affine")
        alpha, beta = (torch.as_tensor(c, dtype=x.dtype, device=x.device).reshape(()) for c in coefficients)
        gp = self.gp
        n = x.shape[0]
        a, chol_z = gp.projection(x)
        a, chol_z = a.reshape(a.shape[-2:]), chol_z.reshape(chol_z.shape[-2:])
        m = a.shape[0]
        cond = gp.kernel(x.unsqueeze(-3)).reshape(n, n) - a.mT @ a
        cond = 0.5 * (cond + cond.mT) + self.conditional_jitter * torch.eye(n, dtype=x.dtype, device=x.device)
        chol_c = robust_cholesky(cond)
        ones_m = torch.ones(m, 1, dtype=x.dtype, device=x.device)
        lz_one = torch.linalg.solve_triangular(chol_z, ones_m, upper=False)  # Lz⁻¹ 1
        c = torch.ones(n, 1, dtype=x.dtype, device=x.device) - a.mT @ lz_one
        # r₀ = (L_C ξ - α c)/β: its mean part -α c/β enters the quadratic form
        offset = -alpha * c / beta
        white_c = torch.linalg.solve_triangular(chol_c, offset, upper=False)
        conditional = -0.5 * (n / beta**2 + white_c.square().sum() - n)
        r = gp.q_sqrt_tril()[0]
        q_mu = gp.q_mu[0]
        e_w = (r.square().sum() + (q_mu - alpha * lz_one[:, 0]).square().sum()) / beta**2
        prior_u = -0.5 * e_w + 0.5 * m + torch.diagonal(r).abs().log().sum()
        log_jac = -(n + m) * torch.log(beta.abs())
        return self.expected_log_likelihood(x, y).sum() + conditional + prior_u + log_jac
