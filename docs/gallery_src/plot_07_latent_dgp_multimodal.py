"""
Multimodal predictions with a latent-variable deep GP
=====================================================

For some inputs *y* has two likely values. A GP's predictive distribution has one mode. The latent-variable
deep GP adds a latent input :math:`z_n \\sim \\mathcal{N}(0, 1)` to the first layer and is trained with the
importance-weighted bound of the DGP-IWVI supplement (eq. A.9); its predictive distribution, sampled with
``sample_y``, can have several modes. ``gradient="dreg"`` uses the doubly reparameterised gradient for q(z)
(supplement eq. D.23), whose signal-to-noise ratio grows with the number K of importance samples.

The data are the supplement's demo set (eqs. E.25-E.28), 400 points here instead of 2 000, and a short fit.
"""

import matplotlib.pyplot as plt
import numpy as np

from flowgp import LatentDeepGPRegressor, SVGPRegressor
from flowgp.data.synthetic import make_multimodal_demo

x, y, mode = make_multimodal_demo(400, seed=0)
ldgp = LatentDeepGPRegressor(layers=2, num_importance=5, gradient="dreg", num_inducing=20, epochs=100,
                             batch_size=100, verbose=False).fit(x, y)
svgp = SVGPRegressor(num_inducing=30, epochs=300, verbose=False).fit(x, y)

x_new, y_new, _ = make_multimodal_demo(300, seed=1)
# the latent DGP's density is a Monte Carlo average over z (10 000 draws by default; 1 000 here)
lpd = ldgp.log_predictive_density(x_new, y_new, num_samples=1000)
print(f"test log density per point: latent DGP {np.mean(lpd):.3f}, "
      f"SVGP {np.mean(svgp.log_predictive_density(x_new, y_new)):.3f}")

# %%
# Each input on the grid gets 20 draws from the predictive distribution: the latent DGP's fall on both
# branches, the SVGP's form one band between them.
grid = np.linspace(-2.0, 2.0, 100)[:, None]
draws = ldgp.sample_y(grid, 20, random_state=0).T  # [20 draws, 100 grid points]
lower, upper = svgp.predict_interval(grid, 0.95)
fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
axes[0].plot(x[:, 0], y, ".", color="grey", ms=2, label="training points")
axes[0].plot(np.tile(grid[:, 0], 20), draws.ravel(), ".", color="C3", ms=2, alpha=0.5,
             label="latent DGP: draws of y")
axes[0].set_title("latent-variable deep GP (2 layers, K = 5, DREG)", fontsize=9)
axes[1].plot(x[:, 0], y, ".", color="grey", ms=2, label="training points")
axes[1].fill_between(grid[:, 0], lower, upper, alpha=0.3, label="SVGP 95 % interval of y")
axes[1].plot(grid[:, 0], svgp.predict(grid), label="SVGP mean")
axes[1].set_title("SVGP", fontsize=9)
for ax in axes:
    ax.set_xlabel("x")
    ax.legend(fontsize=7, loc="upper left")
axes[0].set_ylabel("y")
fig.tight_layout()
