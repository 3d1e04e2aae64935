"""
Reading what a fitted model learned
===================================

After ``fit``, an estimator holds the fitted torch model in ``model_`` and the scaling it applied in
``x_mean_``, ``x_std_``, ``y_shift_`` and ``y_scale_``. The hyperparameters are stored in those standardised
units; below they are converted back into the units of the data: lengthscales per input, the noise variance
of *y*, the flow's parameters, and the training bound per data point (``fit_report_`` of the robust fit).
"""

import matplotlib.pyplot as plt
import numpy as np
import torch

from flowgp import TGPRegressor

rng = np.random.default_rng(0)
X = np.column_stack([rng.uniform(0, 10, 300), rng.uniform(0, 1, 300), rng.normal(0, 100, 300)])
y = np.exp(np.sin(0.8 * X[:, 0]) + 2.0 * X[:, 1]) + 0.1 * rng.standard_normal(300)  # x3 is irrelevant
est = TGPRegressor(flow="sal+softplus", num_inducing=30, epochs=400, verbose=False).fit(X, y)

model = est.model_
kernel = model.gp.kernel
with torch.no_grad():
    lengthscales = kernel.base.lengthscale.reshape(-1).numpy() * est.x_std_  # back to the units of X
    signal_variance = float(kernel.variance.reshape(-1)[0])  # of f0, in the GP's standardised units
    noise_variance = float(model.likelihood.base.noise.reshape(-1)[0]) * est.y_scale_**2
print("lengthscale per input (units of X):", np.round(lengthscales, 3))
print("relevance 1 / lengthscale in units of each input's std:", np.round(est.x_std_ / lengthscales, 3))
print(f"signal variance of f0 (standardised): {signal_variance:.3f}")
print(f"noise variance of y (units of y squared): {noise_variance:.4f}")

# %%
# The flow: one SAL stage then a softplus. ``params`` gives a stage's constrained parameters.
for stage in model.likelihood.flow.flows:
    with torch.no_grad():
        params = {k: np.round(v.numpy(), 3).tolist() for k, v in stage.params().items()} if stage.param_specs else {}
    print(f"{stage.spec:<10} {params}")

# %%
# The robust fit's report: the bound per data point after each stage. The flow model starts from the
# fitted SVGP, so its bound never ends below the SVGP's.
for key, value in est.fit_report_.items():
    print(f"{key:<18} {value}")

# %%
# The learned flow, in the units of y.
f0 = torch.linspace(-3, 3, 200, dtype=torch.float64)
with torch.no_grad():
    g = model.likelihood.flow(f0).numpy() * est.y_scale_ + est.y_shift_
fig, ax = plt.subplots(figsize=(5, 3.2))
ax.plot(f0.numpy(), g)
ax.set_xlabel("$f_0$ (standardised)")
ax.set_ylabel("$G(f_0)$ in units of y")
ax.set_title("the fitted flow sal+softplus", fontsize=9)
fig.tight_layout()
