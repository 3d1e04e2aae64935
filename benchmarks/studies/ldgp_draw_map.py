"""Does the pathwise map from noise to a hidden layer's joint draw (cheaper at large K) keep REG's and DREG's q(z)
gradients as quiet as the draw through chol(Σ)?

Answer (2026-11-30, 3 000 gradient draws at 4 points): no for REG. Under the pathwise map REG's standard deviation
is 2-5 x larger (mean SNR 0.117 / 0.128 at K = 2 / 20 against 0.254 / 0.165); DREG's law is unchanged. A cheaper
REG bought with a noisier q(z) gradient would tilt the REG-against-DREG comparison, so the library kept chol(Σ)
for every estimator (the pathwise map made a K = 50 step 2.3 x faster for REG).

flowgp draws a hidden layer's K values at one point as f = mean + chol(Σ) ε, Σ = K_HH - AᵀA + (RᵀA)ᵀ(RᵀA)
(`flowgp.models.latent.model.joint_gp_sample`). The same law comes out of the pathwise map
f = mean + AᵀR ε_v + chol(K_HH - AᵀA) ε, with one ε_v ~ N(0, I_M) per point and output shared by the K slots. The
pathwise map costs less at large K, since it forms no per-output K × K matrix. It was tried in the
library (`flowgp.bench.ldgp_ablations.pathwise_hidden_sample` keeps it for this study). REG differentiates through the
map, so its gradient's variance depends on it. `dreg` (the conditional DREG) depends only on the joint values
and Σ, so its law does not change.

On the unbiasedness test's model (tests/models/latent/test_model.py: two layers, PCA-mean hidden GP with q(u)
variance 0.3, a wide q(z)) the script draws R gradients of q(z)'s moments at four points with each map and
prints their mean and standard deviation per coordinate and the mean SNR |mean| / sd:

    OMP_NUM_THREADS=1 python -m benchmarks.studies.ldgp_draw_map [--repeats 3000] [--k 2,20]
"""
import argparse

import torch

from flowgp.bench.ldgp_ablations import pathwise_hidden_sample, use_hidden_draw
from flowgp.models.latent.diagnostics import latent_gradient_samples
from flowgp.models.latent.model import build_latent_deep_gp
from flowgp.data.synthetic import make_multimodal_demo


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
            use_hidden_draw(model, pathwise_hidden_sample)
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
