"""Small problems built to show one property of a model, shared by the tests and the studies."""
from __future__ import annotations

import math

import torch

from ..gp.likelihoods import BernoulliLikelihood
from ..models.cnf_posterior import GaussianConvolutionalFlowPosterior
from ..models.deep_gp import DeepGP, GPLayer


def skewed_step_toy(points_per_site: int = 10, sites: int = 6, variance: float = 100.0, lengthscale: float = 0.2,
                    dtype: torch.dtype = torch.float64):
    """A 2-layer deep GP of a step function seen through a probit likelihood (labels 1[x > 0]), `points_per_site`
    labels at each of `sites` inducing inputs in [-1, 1], where a flow posterior can beat DSVI.

    Layer 1 is close to the identity (linear mean, kernel variance 1e-4); layer 2 has a broad prior (variance 100)
    and a short lengthscale, so its whitened inducing values are nearly those of independent sites, each with
    posterior ∝ N(u; 0, σ²)·Φ(±u)^k: a one-sided, strongly skewed distribution that no Gaussian fits well. The
    kernel hyperparameters are frozen, so only the posterior families differ. Returns (x [N, 1], y [N, 1],
    make_model(flow: bool, num_samples: int = 4) -> DeepGP): DSVI's Gaussian q(U), or the Gaussian-base
    convolutional flow posterior (CNF-DGP §III) over it."""
    if points_per_site < 1 or sites < 2:
        raise ValueError(f"skewed_step_toy needs points_per_site >= 1 and sites >= 2, got {points_per_site}, {sites}")
    z = torch.linspace(-1, 1, sites, dtype=dtype)[:, None]
    x = z.repeat_interleave(points_per_site, 0)
    y = (x > 0).to(dtype)

    def make(flow: bool, num_samples: int = 4) -> DeepGP:
        first = GPLayer(z, 1, mean_weight=torch.eye(1, dtype=dtype), variance=1e-4, lengthscale=lengthscale,
                        learn_inducing=False)
        second = GPLayer(z, 1, variance=variance, lengthscale=lengthscale, learn_inducing=False)
        post = GaussianConvolutionalFlowPosterior([first, second]) if flow else None
        model = DeepGP([first, second], BernoulliLikelihood(), post, num_samples=num_samples)
        for name, p in model.named_parameters():  # hyperparameters fixed: only the posterior families differ
            if "kernel" in name:
                p.requires_grad_(False)
        return model

    return x, y, make


# ----- a latent deep GP small enough for a brute-force evidence -------------------------------------------
#: the three points of `tiny_latent_dgp` (1-D x, targets) and its noise variance
TINY_X = ((-1.0,), (0.0,), (1.0,))
TINY_Y = ((0.8,), (-0.6,), (1.1,))
TINY_NOISE = 0.05


def tiny_data() -> tuple[torch.Tensor, torch.Tensor]:
    """(x [3, 1], y [3, 1]) of `tiny_latent_dgp`, float64."""
    return torch.tensor(TINY_X, dtype=torch.float64), torch.tensor(TINY_Y, dtype=torch.float64)


def tiny_latent_dgp(num_importance: int = 5):
    """Two layers, 1-D x and z, 3 points: f1(x, z) (RBF, linear mean on x), f2(f1) (RBF), y = f2 + ε, with the
    kernels, the likelihood and p(z) fixed, so only the variational parameters train: the problem on which the
    importance-weighted bound (DGP-IWVI supplement eq. A.9) can be compared with log p(y) itself
    (`tiny_log_evidence`). q(z) starts at the prior's scale."""
    from ..gp.likelihoods import GaussianLikelihood
    from ..models.latent.encoders import FreeLatent
    from ..models.latent.model import LatentDeepGP

    gen = torch.Generator().manual_seed(5)
    z1 = torch.cat([torch.linspace(-1.5, 1.5, 4).repeat_interleave(3)[:, None],
                    torch.tensor([-1.5, 0.0, 1.5]).repeat(4)[:, None]], 1).to(torch.float64)
    weight = torch.tensor([[1.0], [0.0]], dtype=torch.float64)
    layer1 = GPLayer(z1, 1, mean_weight=weight, white_variance=1e-6, lengthscale=1.0, q_var_init=1e-2)
    z2 = torch.linspace(-3, 3, 12, dtype=torch.float64)[:, None]
    layer2 = GPLayer(z2, 1, lengthscale=1.0, q_var_init=1e-2)
    model = LatentDeepGP([layer1, layer2], FreeLatent(3, 1), GaussianLikelihood(TINY_NOISE), num_importance, "reg")
    for module in (layer1.gp.kernel, layer2.gp.kernel, model.likelihood):
        for p in module.parameters():
            p.requires_grad_(False)
    with torch.no_grad():
        model.qz.raw_std.fill_(0.5)
        model.qz.mean.copy_(0.1 * torch.randn(3, 1, dtype=torch.float64, generator=gen))
    return model


def tiny_log_evidence(model, draws: int = 1_000_000, seed: int = 7, chunk: int = 250_000) -> tuple[float, float]:
    """log p(y) = log E_{z, f1}[N(y; m2, K2(f1) + σ²I)] of `tiny_latent_dgp`'s data under `model`'s prior, with
    z ~ N(0, I), f1 ~ GP prior at (x_n, z_n) jointly and f2 integrated exactly at the 3 points: a Monte Carlo
    estimate over `draws` joint draws. Returns (estimate, relative standard error of the mean weight)."""
    x, y = tiny_data()
    gen = torch.Generator().manual_seed(seed)
    layer1, layer2 = model.layers[0].gp, model.layers[1].gp
    noise = model.likelihood.noise.detach()
    logs = []
    with torch.no_grad():
        for start in range(0, draws, chunk):
            t = min(chunk, draws - start)
            z = torch.randn(t, 3, 1, dtype=torch.float64, generator=gen)
            h = torch.cat([x.expand(t, 3, 1), z], -1)
            k1 = layer1.kernel(h).reshape(t, 3, 3)
            f1 = layer1.mean_function(h) + (torch.linalg.cholesky(k1) @ torch.randn(
                t, 3, 1, dtype=torch.float64, generator=gen))
            k2 = layer2.kernel(f1).reshape(t, 3, 3) + noise * torch.eye(3, dtype=torch.float64)
            dist = torch.distributions.MultivariateNormal(torch.zeros(3, dtype=torch.float64), k2)
            logs.append(dist.log_prob(y[:, 0]))
    logs = torch.cat(logs)
    est = torch.logsumexp(logs, 0) - math.log(draws)
    w = (logs - logs.max()).exp()
    return est.item(), (w.std() / (w.mean() * math.sqrt(draws))).item()


def fit_tiny_bound(model, steps: int = 400, eval_samples: int = 4000) -> tuple[float, float]:
    """Train `model`'s variational parameters on `tiny_data` (`flowgp.training.train`, full batch, Adam 0.03),
    then the mean and standard error of its bound L_K over `eval_samples` evaluations."""
    from ..training.loop import train

    x, y = tiny_data()
    train(model, x, y, steps=steps, lr=0.03, batch_size=3, seed=0, verbose=False)
    with torch.no_grad():
        terms = model.iw_terms(x, y, model.num_importance, num_samples=eval_samples,
                               generator=torch.Generator().manual_seed(9))  # [S, 3]
        values = terms.sum(-1) - model.kl_divergence()
    return values.mean().item(), (values.std() / math.sqrt(eval_samples)).item()
