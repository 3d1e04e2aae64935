"""
A bounded target: a saturating response
=======================================

A dose-response curve: the response rises from one plateau to another, and stays inside :math:`[0, 1]`.
A TGP with a tanh flow, :math:`\\mathbb{G}(f_0) = a \\tanh(b (f_0 + c)) + d` (TGP appendix, Table 1), has a
*bounded* latent function whose plateaus come for free; a GP has to bend a smooth function flat. The flow
bounds the latent function only: the Gaussian noise is added after it, so the interval of *y* still
reaches a little past the bounds.
"""

import matplotlib.pyplot as plt
import numpy as np

from flowgp import SVGPRegressor, TGPRegressor
from flowgp.reporting.metrics import coverage, mean_nll, rmse

rng = np.random.default_rng(0)


def response(x):
    return 1.0 / (1.0 + np.exp(-6.0 * (x - 1.0))) * (x < 2.5) + 0.2 * (x >= 2.5)


x = np.sort(rng.uniform(0.0, 4.0, 120))[:, None]
y = np.clip(response(x[:, 0]) + 0.04 * rng.standard_normal(120), 0.0, 1.0)
x_test = rng.uniform(0.0, 4.0, 400)[:, None]
y_test = np.clip(response(x_test[:, 0]) + 0.04 * rng.standard_normal(400), 0.0, 1.0)

shared = dict(num_inducing=25, epochs=600, verbose=False)
models = {"SVGP": SVGPRegressor(**shared), "TGP, tanh flow": TGPRegressor(flow="tanh", flow_init="data", **shared)}
for name, model in models.items():
    model.fit(x, y)
    lower, upper = model.predict_interval(x_test, 0.95)
    mean = model.predict(x_test)
    print(f"{name:<16} NLL {mean_nll(model.log_predictive_density(x_test, y_test)):7.3f}  "
          f"RMSE {rmse(y_test, mean):.4f}  95% coverage {coverage(y_test, lower, upper):.3f}  "
          f"mean outside [0, 1]: {np.mean((mean < 0) | (mean > 1)):.1%}")

# %%
grid = np.linspace(0.0, 4.0, 400)[:, None]
fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), sharey=True)
for ax, (name, model) in zip(axes, models.items()):
    lower, upper = model.predict_interval(grid, 0.95)
    ax.fill_between(grid[:, 0], lower, upper, alpha=0.25, label="95 % interval of y")
    ax.plot(grid[:, 0], model.predict(grid), label="predictive mean")
    ax.plot(grid[:, 0], response(grid[:, 0]), "k--", lw=1, label="true response")
    ax.plot(x[:, 0], y, ".", color="C1", ms=3, label="training points")
    ax.axhspan(0.0, 1.0, color="grey", alpha=0.08)
    ax.set_title(name, fontsize=9)
    ax.set_xlabel("dose")
axes[0].set_ylabel("response")
axes[0].legend(fontsize=7)
fig.tight_layout()
