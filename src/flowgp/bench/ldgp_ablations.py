"""What the DREG authors' runs do differently from flowgp's latent deep GP, as switches for measuring each
difference (the studies `benchmarks/studies/ldgp_*.py` use them; flowgp's own fits never do).

- The hidden layer's draw over the K importance samples. flowgp draws a hidden layer's K values at one point
  jointly, f = mean + chol(Σ) ε, Σ = K_HH - AᵀA + (RᵀA)ᵀ(RᵀA) (`flowgp.models.latent.model.joint_gp_sample`),
  which makes the importance-weighted bound a bound (supplement eq. C.12). The authors' code draws each slot
  from its own marginal (`per_slot_hidden_sample`); the pathwise map f = mean + AᵀR ε_v + chol(K_HH - AᵀA) ε
  (`pathwise_hidden_sample`) draws the same law as the joint draw through other noise. `use_hidden_draw` gives
  one model instance another draw; `per_point_terms` evaluates the bound's per-point terms under either draw;
  `estimator_with` gives an estimator's fit a trained state and / or the per-slot draw.
- GPflow 1's natural-gradient step, which the authors train the last layer's q(u) with, adds 10⁻⁶ I to S after
  every step; `flowgp.training.natural_gradients.NaturalGradient` adds nothing. In the conjugate case the step is,
  per eigen-direction of the optimum S* (eigenvalue s*; ε I commutes with everything, so the basis stays),

      p' = (1 - γ)/s + γ/s*,   θ₁' = (1 - γ) m/s + γ m*/s*,   m' = θ₁'/p',   s' = 1/p' + ε,

  with fixed point s = [(s* + ε) + √((s* + ε)² + 4(1 - γ) ε s*/γ)]/2, about √(ε s*/γ) when s* ≪ ε/γ
  (`jittered_natgrad`, `jittered_natgrad_fixed_point`, `jittered_state`).
"""
from __future__ import annotations

import contextlib
import types

import numpy as np
import torch


def per_slot_hidden_sample(model, layer, h, generator=None, batch_rows=None, parts=None):
    """The DREG authors' hidden-layer draw over the K importance samples: each slot from its own marginal.

    Their hidden `G5` layer (`SharedMixedMok` with `MixedKernelSharedMof`) goes through
    `multisample_sample_conditional` in `dgps_with_iwvi/temp_workaround.py`, whose mixed-kernel branch calls the
    conditional with `full_cov=False` whatever `propagate` asked for, so the `full_cov=True` over the K axis
    reaches only their last layer (of which they use the diagonal). The K values of one function are drawn as if
    independent, so the bound is not a bound. REG only (DREG needs the joint draw's pieces), one process; the
    signature is `LatentDeepGP.joint_hidden_sample`'s."""
    whole = batch_rows is None or (batch_rows[0] == 0 and batch_rows[1] == h.shape[-3])
    if parts is not None or not whole:
        raise ValueError("per-slot draws: REG on one process only (parts and a split batch are not supported)")
    return layer(h, generator=generator)[0]


def pathwise_hidden_sample(model, layer, h, generator=None, batch_rows=None, parts=None):
    """The hidden layer's joint draw over the K axis of h [..., K, D] through the pathwise map
    f = mean + AᵀR ε_v + chol(K_HH - AᵀA) ε (one ε_v ~ N(0, I_M) per point and output, shared by the K slots): the
    law of `joint_gp_sample`, without a per-output K × K matrix of the posterior. A plain GP hidden layer; REG
    only, one process."""
    if parts is not None or batch_rows is not None or hasattr(layer, "joint_sample"):
        raise ValueError("the pathwise map here is for REG on a GP hidden layer, one process")
    gp = layer.gp
    lead, k, d = h.shape[:-2], h.shape[-2], h.shape[-1]
    groups = h.reshape(-1, k, d)
    g, num_out = groups.shape[0], gp.num_outputs
    at, _ = gp.projection(groups.reshape(g * k, d), transposed=True)  # [Lb, G·K, M]
    lb, m = at.shape[0], at.shape[-1]
    at = at.reshape(lb, g, k, m)
    prior = gp.kernel(groups.unsqueeze(-3)).movedim(-3, 0) - at @ at.mT  # K_HH - AᵀA, [Lb, G, K, K]
    prior = 0.5 * (prior + prior.mT) + 1e-8 * torch.eye(k, dtype=h.dtype)
    eps_v = torch.randn(num_out, m, g, dtype=h.dtype, generator=generator)
    eps = torch.randn(num_out, g, k, 1, dtype=h.dtype, generator=generator)
    rv = (gp.q_sqrt_tril() @ eps_v).mT.unsqueeze(-1)  # R ε_v, [L, G, M, 1]
    mean = at @ gp.q_mu[:, None, :, None]  # Aᵀm, [L, G, K, 1]
    out = (mean + at @ rv + torch.linalg.cholesky(prior) @ eps).squeeze(-1).permute(1, 2, 0)  # [G, K, L]
    if gp.mean_function is not None:
        out = out + gp.mean_function(groups)
    return out.reshape(lead + (k, num_out))


def use_hidden_draw(model, draw=None):
    """Give this one latent DGP instance `draw` (a function with the signature of `per_slot_hidden_sample`) in
    place of its class's joint hidden-layer draw; `draw=None` gives the class's draw back. Returns the model."""
    if draw is None:
        vars(model).pop("joint_hidden_sample", None)
    else:
        model.joint_hidden_sample = types.MethodType(draw, model)
    return model


@contextlib.contextmanager
def hidden_draw(model, draw):
    """`use_hidden_draw(model, draw)` for the body of a `with` block only."""
    use_hidden_draw(model, draw)
    try:
        yield model
    finally:
        use_hidden_draw(model, None)


def per_point_terms(model, x, y, num_importance: int, per_slot: bool, repeats: int, generator,
                    chunk: int = 250) -> torch.Tensor:
    """E[log (1/K) Σ_k w_k] per row of (x, y) (the model's scaled units), averaged over `repeats` draws, with the
    hidden layer drawn jointly over the K slots (flowgp's bound) or per slot (the authors' objective) on this
    model instance; the model keeps its own draw afterwards. The KL terms are left out (the same for both)."""
    swap = hidden_draw(model, per_slot_hidden_sample) if per_slot else contextlib.nullcontext()
    with swap, torch.no_grad():
        parts = [model.iw_terms(x[i:i + chunk], y[i:i + chunk], num_importance, "reg", repeats,
                                generator=generator).mean(0) for i in range(0, x.shape[0], chunk)]
    return torch.cat(parts)


def estimator_with(est, state: dict | None = None, per_slot: bool = False):
    """A LatentDeepGPRegressor like `est` (same parameters) whose model, once built as usual, gets the trained
    `state` (a state dict) and / or the per-slot hidden-layer draw (`per_slot_hidden_sample`, that model only)."""

    class Altered(type(est)):
        def _build(self, x, y=None, **overrides):
            model = super()._build(x, y, **overrides)
            if state is not None:
                model.load_state_dict(state)
            if per_slot:  # prediction never uses the joint draw, so only training changes
                use_hidden_draw(model, per_slot_hidden_sample)
            return model

    return Altered(**est.get_params())


def jittered_natgrad(s_star, steps: int, gamma: float = 0.01, decay: float = 0.98, every: int = 1000,
                     jitter: float = 1e-6, s0: float = 1.0):
    """(s, m/m*) after `steps` conjugate natural-gradient steps from S = s0 I, m = 0 towards (s*, m*) per direction,
    γ decayed by `decay` every `every` steps, with `jitter` added to s after each step as GPflow 1 does (module
    docstring); vectorised over s_star."""
    s_star = np.asarray(s_star, dtype=float)
    if np.any(s_star <= 0):
        raise ValueError("s_star must be positive (eigenvalues of a covariance); clamp them first")
    s = np.full_like(s_star, s0)
    ratio = np.zeros_like(s_star)  # m / m*, so that θ₁ = ratio m*/s and the target θ₁* = m*/s*
    for t in range(int(steps)):
        g = gamma * decay ** (t // every)
        p = (1.0 - g) / s + g / s_star
        ratio = ((1.0 - g) * ratio / s + g / s_star) / p
        s = 1.0 / p + jitter
    return s, ratio


def jittered_natgrad_fixed_point(s_star, gamma: float, jitter: float = 1e-6):
    """The jittered recursion's fixed point for a constant γ (module docstring)."""
    s_star = np.asarray(s_star, dtype=float)
    b = s_star + jitter
    return 0.5 * (b + np.sqrt(b * b + 4.0 * (1.0 - gamma) * jitter * s_star / gamma))


def jittered_state(model_state: dict, steps: int, layer: str = "layers.1.gp") -> tuple[dict, np.ndarray]:
    """A copy of a latent DGP's state dict with `layer`'s q(u) moved as `steps` jittered steps would hold it
    (its fitted S standing in for S*), and the ratio of new to old eigenvalues of its S."""
    state = dict(model_state)
    r, mu = state[f"{layer}.q_sqrt"].tril(), state[f"{layer}.q_mu"]
    cov = r @ r.mT
    evals, vecs = torch.linalg.eigh(cov)
    evals = evals.clamp_min(1e-12)
    s_new, ratio = jittered_natgrad(evals.flatten().numpy(), steps)
    s_new = torch.as_tensor(s_new, dtype=cov.dtype).reshape(evals.shape)
    ratio = torch.as_tensor(ratio, dtype=cov.dtype).reshape(evals.shape)
    state[f"{layer}.q_sqrt"] = torch.linalg.cholesky(vecs @ torch.diag_embed(s_new) @ vecs.mT)
    state[f"{layer}.q_mu"] = (vecs @ (ratio * (vecs.mT @ mu.unsqueeze(-1)).squeeze(-1)).unsqueeze(-1)).squeeze(-1)
    return state, (s_new / evals).flatten().numpy()
