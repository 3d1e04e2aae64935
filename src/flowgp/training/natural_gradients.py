"""Natural-gradient steps for whitened Gaussian q(v) = N(m, R Rᵀ), as a torch.optim.Optimizer.

Salimbeni, Eleftheriadis & Hensman (2018), "Natural gradients in practice: non-conjugate variational inference
in Gaussian process models", section 3; the DGP-IWVI supplement E.2 uses it for the last layer of a deep GP.

For a Gaussian q with mean m and covariance S take the natural parameters θ = (θ₁, θ₂) = (S⁻¹m, -½S⁻¹) and the
expectation parameters η = (η₁, η₂) = (m, S + mmᵀ). The Fisher information of θ is ∂η/∂θ, so the natural
gradient of a bound ℒ w.r.t. θ is the ordinary gradient w.r.t. η, and one ascent step reads

    θ ← θ + γ ∇_η ℒ                                                          (Salimbeni et al. 2018, eq. 8)

`NaturalGradient` takes it from the ordinary gradients that autograd leaves in `.grad` after
`loss.backward()`, where loss = -ℒ, of the stored parameters q_mu (m, [L, M]) and q_sqrt (R, [L, M, M], read
through a lower-triangular mask, so only its lower triangle matters; see flowgp.gp.variational.WhitenedGaussian):

1. G = ∂loss/∂S (symmetric) from P = ∇_R loss. With S = RRᵀ, dloss = tr(G dS) = 2 tr(Rᵀ G dR), so
   P = tril(2GR): only the lower triangle of 2GR is observed. Rᵀ P agrees with the symmetric K = 2RᵀGR on
   and below the diagonal (the unobserved strictly upper part U of 2GR adds RᵀU, strictly upper), hence with
   Φ = tril(Rᵀ P):  K = Φ + Φᵀ - diag Φ  and  G = ½ R⁻ᵀ K R⁻¹.
2. The loss as a function of η is loss(η₁, η₂ - η₁η₁ᵀ), so by the chain rule
   ∇_η₂ loss = G  and  ∇_η₁ loss = ∂loss/∂m - 2 G m.
3. The step on θ with ∇_η ℒ = -∇_η loss:  S⁻¹_new = S⁻¹ + 2γ G,  θ₁,new = S⁻¹m - γ (∂loss/∂m - 2 G m).
   In R's coordinates S⁻¹ + 2γ G = R⁻ᵀ A R⁻¹ with A = I + γ K, so with A = V Vᵀ, V *upper* triangular (the
   Cholesky factor of A with rows and columns reversed),

       S_new = R A⁻¹ Rᵀ = (R V⁻ᵀ)(R V⁻ᵀ)ᵀ,   R_new = R V⁻ᵀ  (lower times lower: lower triangular),
       m_new = S_new θ₁,new = m - γ S_new ∂loss/∂m   (the G m terms cancel),

   one Cholesky of an M x M matrix and one triangular solve: no inverse of R, no second Cholesky, and R's own
   conditioning never enters (S_new is PD exactly when A is). When A is not positive definite, γ is halved (up
   to 8 times; after that the step is skipped) for this pair only.

With γ = 1 on a conjugate model (Gaussian likelihood, the bound quadratic in (m, S) through η) one step lands
on the optimal q (tests/training/test_natural_gradients.py checks SVGP against the closed form of Titsias 2009).

Each pair (q_mu, q_sqrt) is one parameter group ({"params": [q_mu, q_sqrt], "lr": γ}), so learning-rate
schedulers (StepLR, ...) act on γ as on any optimiser's step size.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["NaturalGradient", "natural_gradient_step"]

#: how many times the step size is halved before a step that keeps the precision positive definite is given up
_MAX_HALVINGS = 8


def _whitened_gradient(r: Tensor, grad_r: Tensor) -> Tensor:
    """K = 2RᵀGR (symmetric, [L, M, M]) from ∂loss/∂R, where G = ∂loss/∂S (step 1 of the module doc)."""
    phi = (r.mT @ grad_r.tril()).tril()
    return phi + phi.mT - torch.diag_embed(torch.diagonal(phi, dim1=-2, dim2=-1))


def _upper_cholesky(a: Tensor):
    """(V, info) with A = V Vᵀ and V upper triangular: the lower Cholesky factor of A with its rows and columns
    reversed (flip both, factor, flip back), so that V⁻ᵀ is lower triangular."""
    lower, info = torch.linalg.cholesky_ex(a.flip(-2, -1))
    return lower.flip(-2, -1), info


@torch.no_grad()
def natural_gradient_step(q_mu: Tensor, q_sqrt: Tensor, grad_mu: Tensor, grad_sqrt: Tensor, lr: float):
    """One natural-gradient step of size `lr` on (m, R) from the loss gradients; returns (m_new, R_new, γ used).

    Implements θ ← θ + γ ∇_η ℒ (Salimbeni et al. 2018, eq. 8) in R's coordinates (step 3 of the module doc):
    R_new = R V⁻ᵀ with V Vᵀ = I + γ K, m_new = m - γ R_new R_newᵀ ∂loss/∂m. γ used is 0.0 (and m, R are
    returned unchanged) when no halving of `lr` keeps the new precision positive definite.

    Args:
        q_mu: m, the whitened means [L, M].
        q_sqrt: R [L, M, M], the lower-triangular factors of the covariances S = RRᵀ.
        grad_mu, grad_sqrt: the gradients of the loss -ℒ with respect to m and R.
        lr: γ, the step size on the natural parameters.

    See Also:
        :class:`flowgp.training.natural_gradients.NaturalGradient` (the optimiser that applies it).
    """
    r = q_sqrt.tril()
    k = _whitened_gradient(r, grad_sqrt)
    eye = torch.eye(r.shape[-1], dtype=r.dtype, device=r.device)
    gamma = float(lr)
    for _ in range(_MAX_HALVINGS):
        v, info = _upper_cholesky(eye + gamma * k)
        if not bool((info != 0).any()):
            break
        gamma *= 0.5
    else:
        return q_mu.clone(), q_sqrt.clone(), 0.0
    # R_new = R V⁻ᵀ, i.e. the X with X Vᵀ = R (Vᵀ lower triangular)
    new_r = torch.linalg.solve_triangular(v.mT, r, upper=False, left=False)
    step = (new_r @ (new_r.mT @ grad_mu.unsqueeze(-1))).squeeze(-1)
    return q_mu - gamma * step, new_r, gamma


class NaturalGradient(torch.optim.Optimizer):
    """Natural-gradient descent of loss = -ℒ on whitened Gaussians q(v) = N(m, RRᵀ) (see the module doc).

    Args:
        params: the Gaussians to update: modules with `natural_parameter_pair()` (e.g. a
            flowgp.gp.variational.WhitenedGaussian / SparseVariationalGP, or a deep-GP layer's `.gp`), (q_mu, q_sqrt)
            pairs, or parameter-group dicts {"params": [q_mu, q_sqrt], "lr": ...}.
        lr: γ, the step size on the natural parameters (1.0 solves a conjugate model in one step).
        anneal: start at γ_t = 1/(t + 1) and never go below `lr`: γ_t = max(lr, 1/(t + 1)) at the t-th step
            (t = 0, 1, ...). With minibatches the natural parameters are then the running average of the batches'
            optima until 1/(t + 1) reaches `lr` (the Robbins-Monro schedule of stochastic variational inference,
            Hoffman et al. 2013, with τ = 1, κ = 1, floored at `lr`): q(u) is near its optimum after the first
            step instead of after ~1/γ steps, while the hyperparameters' first Adam steps already see it.

    Use it next to another optimiser that excludes these parameters (flowgp.training.loop.train does that with
    `natural_gradient=`); call `step()` after `loss.backward()`. Parameters without a gradient are left alone.

    See Also:
        :func:`flowgp.training.train` (``natural_gradient=``), :func:`flowgp.training.natural_gradients.natural_gradient_step`.
    """

    def __init__(self, params, lr: float = 0.1, anneal: bool = False):
        if not (isinstance(lr, (int, float)) and lr > 0):
            raise ValueError(f"lr must be a positive step size, got {lr!r}")
        groups = []
        for item in params:
            if isinstance(item, dict):
                group = dict(item)
                group["params"] = list(group["params"])
            elif hasattr(item, "natural_parameter_pair"):
                group = {"params": list(item.natural_parameter_pair())}
            elif isinstance(item, (tuple, list)):
                group = {"params": list(item)}
            else:
                raise TypeError("NaturalGradient takes modules with natural_parameter_pair() (WhitenedGaussian), "
                                f"(q_mu, q_sqrt) pairs or parameter-group dicts, got {type(item).__name__}")
            mu, sqrt = (group["params"] + [None, None])[:2] if len(group["params"]) == 2 else (None, None)
            if mu is None or mu.dim() < 1 or sqrt.shape != mu.shape + mu.shape[-1:]:
                shapes = [tuple(p.shape) for p in group["params"]]
                raise ValueError(f"each natural-gradient group must be a pair (q_mu [L, M], q_sqrt [L, M, M]), "
                                 f"got shapes {shapes}")
            groups.append(group)
        if not groups:
            raise ValueError("NaturalGradient got no Gaussian to update")
        # the step counter lives in the groups, so an optimiser's state_dict (checkpoints) carries it
        super().__init__(groups, {"lr": float(lr), "anneal": bool(anneal), "steps_taken": 0})

    @torch.no_grad()
    def step(self, closure=None):
        """One natural-gradient step per pair, from the current `.grad` of q_mu and q_sqrt (those of loss = -ℒ)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            q_mu, q_sqrt = group["params"]
            if q_mu.grad is None and q_sqrt.grad is None:
                continue
            grad_mu = torch.zeros_like(q_mu) if q_mu.grad is None else q_mu.grad
            grad_sqrt = torch.zeros_like(q_sqrt) if q_sqrt.grad is None else q_sqrt.grad
            lr = group["lr"]
            if group.get("anneal", False):
                lr = max(lr, 1.0 / (group.get("steps_taken", 0) + 1))
            group["steps_taken"] = group.get("steps_taken", 0) + 1
            new_m, new_r, used = natural_gradient_step(q_mu, q_sqrt, grad_mu, grad_sqrt, lr)
            self.state[q_mu]["last_step_size"] = used
            if used > 0:
                q_mu.copy_(new_m)
                q_sqrt.copy_(new_r)
        return loss
