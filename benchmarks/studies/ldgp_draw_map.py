"""REG's and DREG's q(z) gradients under two maps from noise to the same joint draw of a hidden layer (issue 25).

flowgp draws a hidden layer's K values at one point as f = mean + chol(Σ) ε, Σ = K_HH - AᵀA + (RᵀA)ᵀ(RᵀA)
(`flowgp.models.latent.model.joint_gp_sample`). The same law comes out of the pathwise map
f = mean + AᵀR ε_v + chol(K_HH - AᵀA) ε, with one ε_v ~ N(0, I_M) per point and output shared by the K slots. The
pathwise map costs less at large K, since it forms no per-output K × K matrix. The thirty-second session tried it
in the library and measured this script's result, so the library kept chol(Σ). REG differentiates through the
map, so its gradient's variance depends on it. `dreg` (the conditional DREG) depends only on the joint values
and Σ, so its law does not change.

On the unbiasedness test's model (tests/test_latent_deep_gp.py: two layers, PCA-mean hidden GP with q(u)
variance 0.3, a wide q(z)) the script draws R gradients of q(z)'s moments at four points with each map and
prints their mean and standard deviation per coordinate and the mean SNR |mean| / sd:

    OMP_NUM_THREADS=1 python benchmarks/ldgp_draw_map.py [--repeats 3000] [--k 2,20]
"""
import argparse
import types

import torch

from flowgp.models.latent.diagnostics import latent_gradient_samples
from flowgp.models.latent.model import build_latent_deep_gp
from flowgp.data.synthetic import make_multimodal_demo


def pathwise_hidden_sample(model, layer, h, generator=None, batch_rows=None, parts=None):
    """The hidden layer's joint draw over the K axis of h [..., K, D] through the pathwise map (a plain GP hidden
    layer; REG only, one process)."""
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3000)
    p.add_argument("--k", default="2,20")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    x, y, _ = make_multimodal_demo(60, seed=0)
    x = torch.tensor((x - x.mean()) / x.std(), dtype=torch.float64)
    y = torch.tensor((y - y.mean()) / y.std(), dtype=torch.float64)[:, None]
    model = build_latent_deep_gp(x, y, 2, num_inducing=8, amortized=False, num_importance=5, gradient="reg",
                                 kmeans_restarts=1, hidden_layer="pca", hidden_q_var_init=0.3, seed=0)
    with torch.no_grad():
        model.qz.raw_std.fill_(0.0)
    idx = torch.tensor([0, 5, 9, 20])
    print("map       estimator  K   sd of the μ-gradient at 4 points    mean SNR")
    for name in ("chol(Σ)", "pathwise"):
        if name == "pathwise":
            model.joint_hidden_sample = types.MethodType(pathwise_hidden_sample, model)
        for k in (int(v) for v in a.k.split(",")):
            for gradient in ("reg",) if name == "pathwise" else ("reg", "dreg"):
                draws = latent_gradient_samples(model, x, y, idx, k, gradient, repeats=a.repeats, seed=4,
                                                wrt="moments")  # [R, B, 2Q]: μ then σ
                mean, sd = draws.mean(0), draws.std(0)
                snr = (mean.abs() / sd).mean().item()
                print(f"{name:9s} {gradient:9s} {k:3d}   {' '.join(f'{v:6.3f}' for v in sd[:, 0].tolist())}"
                      f"          {snr:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
