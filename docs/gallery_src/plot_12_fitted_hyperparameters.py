"""
Reading what a fitted model learned
===================================

After ``fit``, ``est.summary()`` lists what the model learned in the units of the data: the training bound per
data point, the lengthscale of each input in that input's units, the noise variance of *y*, and the flow's
parameters with the map from the flow's output to *y*. The models train on standardised data; the summary
undoes that standardisation, so its numbers can be compared with the data directly.
"""

import matplotlib.pyplot as plt
import numpy as np
import torch

from flowgp import TGPRegressor

rng = np.random.default_rng(0)
X = np.column_stack([rng.uniform(0, 10, 300), rng.uniform(0, 1, 300), rng.normal(0, 100, 300)])
y = np.exp(np.sin(0.8 * X[:, 0]) + 2.0 * X[:, 1]) + 0.1 * rng.standard_normal(300)  # x2 is irrelevant
est = TGPRegressor(flow="sal+softplus", num_inducing=30, epochs=400, verbose=False).fit(X, y)

print(est.summary())

# %%
# ``summary(as_dict=True)`` gives the same numbers as a nested dict, for use in code. A lengthscale is in its
# input's units, so lengthscales of different inputs are compared through each input's spread: std / lengthscale
# is large for an input along which the latent function varies a lot. Here x0 (the sine) stands out; x1 and the
# irrelevant x2 come out alike, so a lengthscale alone does not tell them apart on these 300 points.
fitted = est.summary(as_dict=True)
lengthscales = fitted["kernel"]["lengthscale"]
for (name, ell), spread in zip(lengthscales.items(), X.std(0)):
    print(f"{name}: lengthscale {ell:8.3f}, relevance std / lengthscale = {spread / ell:.3f}")
print("noise variance of y:", round(fitted["likelihood"]["noise variance"], 4), fitted["units"]["likelihood"]["noise variance"])

# %%
# The robust fit's report: the bound per data point after each stage. The flow model starts from the
# fitted SVGP, so its bound never ends below the SVGP's.
for key, value in est.fit_report_.items():
    print(f"{key:<18} {value}")

# %%
# The learned flow, in the units of y (``fitted["flow"]["output map"]`` states the map from G to y).
model = est.model_
f0 = torch.linspace(-3, 3, 200, dtype=torch.float64)
with torch.no_grad():
    g = model.likelihood.flow(f0).numpy() * est.y_scale_ + est.y_shift_
fig, ax = plt.subplots(figsize=(5, 3.2))
ax.plot(f0.numpy(), g)
ax.set_xlabel("$f_0$ (standardised)")
ax.set_ylabel("$G(f_0)$ in units of y")
ax.set_title(f"the fitted flow sal+softplus: {fitted['flow']['output map']}", fontsize=9)
fig.tight_layout()
