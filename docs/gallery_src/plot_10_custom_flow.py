"""
Writing your own flow
=====================

A flow is a small subclass of :class:`flowgp.flows.Flow`: declare its parameters with
:class:`~flowgp.flows.ParamSpec` (an optional constraint such as :class:`~flowgp.numerics.constraints.Positive`
and a starting value), and write the forward map and the log-derivative. Without an inverse, a guarded
numerical inverse is used where one is needed (v-WGP predictions, G-SP). The flow then works wherever a
built-in one does: in :class:`~flowgp.TGPRegressor` and :class:`~flowgp.WarpedGPRegressor`, in compositions
(``a >> b``) and in ``save`` / ``load``; registered in :data:`flowgp.registry.FLOWS` it is also usable by
name in spec strings, the command line and the bench.

The flow here is the cubic :math:`\\mathbb{G}(f) = a + f + c f^3` with :math:`c > 0`, so that
:math:`\\mathbb{G}'(f) = 1 + 3 c f^2 > 0`.
"""

import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch

from flowgp import TGPRegressor, make_flow
from flowgp.flows import Flow, ParamSpec
from flowgp.numerics.constraints import Positive
from flowgp.registry import FLOWS


class Cubic(Flow):
    """G(f) = a + f + c f³ with c > 0 (strictly increasing)."""

    name = "cubic"
    param_specs = (ParamSpec("a", None, 0.0), ParamSpec("c", Positive(), 0.1))

    def _forward(self, f, p):  # p holds the constrained parameters
        return p["a"] + f + p["c"] * f**3

    def _log_det(self, f, p):  # log |G'(f)|
        return torch.log1p(3.0 * p["c"] * f * f)


# %%
# Use it as an object, here composed with a softplus so that the latent function is positive ...
rng = np.random.default_rng(0)
x = rng.uniform(0.0, 1.0, (200, 1))
y = np.exp(2.0 * np.sin(6.0 * x[:, 0]) + 0.1 * rng.standard_normal(200))  # positive
model = TGPRegressor(flow=Cubic() >> make_flow("softplus"), num_inducing=20, epochs=300, verbose=False).fit(x, y)
print("fitted flow:", model.model_.likelihood.flow)

# %%
# ... or register it under a name, and spec strings, ``save`` and ``load`` know it.
if "cubic" not in FLOWS:
    FLOWS.register("cubic", Cubic)
by_name = TGPRegressor(flow="sal+cubic", num_inducing=20, epochs=300, verbose=False).fit(x, y)
path = Path(tempfile.mkdtemp()) / "cubic.pt"
by_name.save(path)
again = TGPRegressor.load(path)
print("loaded model predicts the same:", np.allclose(again.predict(x), by_name.predict(x)))

grid = np.linspace(-2.5, 2.5, 200)
with torch.no_grad():
    curve = Cubic()(torch.tensor(grid)).numpy()
fig, axes = plt.subplots(1, 2, figsize=(10, 3.3))
axes[0].plot(grid, curve)
axes[0].set_title("Cubic() at its starting parameters", fontsize=9)
axes[0].set_xlabel("$f_0$")
axes[0].set_ylabel("$G(f_0)$")
xs = np.linspace(0, 1, 200)[:, None]
lower, upper = model.predict_interval(xs, 0.95)
axes[1].fill_between(xs[:, 0], lower, upper, alpha=0.25, label="95 % interval of y")
axes[1].plot(xs[:, 0], model.predict(xs), label="TGP, cubic >> softplus")
axes[1].plot(x[:, 0], y, ".", ms=3, label="training points")
axes[1].legend(fontsize=7)
axes[1].set_xlabel("x")
fig.tight_layout()
