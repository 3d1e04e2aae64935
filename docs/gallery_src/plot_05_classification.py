"""
Classification with a warped latent function
============================================

:class:`~flowgp.TGPClassifier` puts the flow on the latent function of a GP classifier: the class
probability is :math:`p(y = 1 \\mid f_0) = \\Phi(\\mathbb{G}(f_0))` (TGP paper §5.2, Fig. 13; appendix Fig. 8),
trained with the same bound as the regressor (appendix eq. 14). A monotone flow keeps the decision boundary
of the GP's latent function but reshapes how fast the probability moves from 0 to 1 across it.
"""

import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import make_moons
from sklearn.model_selection import train_test_split

from flowgp import SVGPClassifier, TGPClassifier

X, y = make_moons(600, noise=0.25, random_state=0)
X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.5, random_state=0)

shared = dict(num_inducing=30, epochs=300, verbose=False)
models = {"SVGP classifier": SVGPClassifier(**shared), "TGP classifier, SAL flow": TGPClassifier(flow="sal", **shared)}
for name, model in models.items():
    model.fit(X_train, y_train)
    nll = -np.mean(model.log_predictive_density(X_test, y_test))
    print(f"{name:<26} accuracy {model.score(X_test, y_test):.3f}  test NLL {nll:.3f}")

# %%
xx, yy = np.meshgrid(np.linspace(-1.6, 2.6, 120), np.linspace(-1.2, 1.7, 90))
grid = np.column_stack([xx.ravel(), yy.ravel()])
fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
for ax, (name, model) in zip(axes, models.items()):
    p = model.predict_proba(grid)[:, 1].reshape(xx.shape)
    cs = ax.contourf(xx, yy, p, levels=np.linspace(0, 1, 11), cmap="RdBu_r", alpha=0.8)
    ax.contour(xx, yy, p, levels=[0.5], colors="k", linewidths=1)
    ax.scatter(X_test[:, 0], X_test[:, 1], c=y_test, cmap="RdBu_r", edgecolors="k", s=10, linewidths=0.4)
    ax.set_title(name, fontsize=9)
fig.colorbar(cs, ax=axes, label="P(class 1)")
