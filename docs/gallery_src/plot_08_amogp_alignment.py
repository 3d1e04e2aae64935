"""
Aligning shifted series with AMO-GP
===================================

Sensors that see the same underlying signal at different times, or through different responses: AMO-GP
(aligned, warped multi-output GP) models output :math:`d` as :math:`y_d = g_d(f_d(a_d(t)))`: an alignment
GP :math:`a_d` per output, a shared convolution-process layer :math:`f` and an output warping :math:`g_d`
(AMO-GP supplement, eq. 9), trained with the nested variational bound of eq. 22. Here output 1 is output 0
delayed by a quarter period and output 2 has a gap: AMO-GP fills it from the other outputs.

Inputs come as one column of times with a second array saying which output each row belongs to.
"""

import matplotlib.pyplot as plt
import numpy as np

from flowgp import AlignedMultiOutputGPRegressor

rng = np.random.default_rng(0)


def signal(t):
    return np.sin(t) + 0.5 * np.sin(2.3 * t)


shifts = (0.0, 0.8, -0.5)
t, y, out = [], [], []
for d, shift in enumerate(shifts):
    td = np.sort(rng.uniform(0.0, 10.0, 80))
    if d == 2:
        td = td[(td < 4.0) | (td > 6.5)]  # output 2 is not observed on [4, 6.5]
    t.append(td)
    y.append(signal(td - shift) + 0.05 * rng.standard_normal(td.size))
    out.append(np.full(td.size, d))
t, y, out = np.concatenate(t)[:, None], np.concatenate(y), np.concatenate(out)

amo = AlignedMultiOutputGPRegressor(alignment="gp", warping="gp", epochs=300, seed=0, verbose=False)
amo.fit(t, y, output=out)

# %%
# Predictions per output (the gap of output 2 is shaded) and the learned alignments :math:`a_d(t) - t`,
# which should be about constant at minus the shift (up to a common offset: only relative shifts are
# identified).
grid = np.linspace(0.0, 10.0, 300)[:, None]
fig, axes = plt.subplots(1, 2, figsize=(12, 3.6))
gap_t = np.linspace(4.0, 6.5, 60)
for d, shift in enumerate(shifts):
    mean, std = amo.predict(grid, np.full(300, d), return_std=True)
    axes[0].plot(grid[:, 0], mean + 3 * d, color=f"C{d}", label=f"output {d} (+{3 * d})")
    axes[0].fill_between(grid[:, 0], mean - 2 * std + 3 * d, mean + 2 * std + 3 * d, color=f"C{d}", alpha=0.2)
    sel = out == d
    axes[0].plot(t[sel, 0], y[sel] + 3 * d, ".", color=f"C{d}", ms=3)
    align_mean, _ = amo.layers(grid[:, 0], d)["alignment"]
    axes[1].plot(grid[:, 0], align_mean.ravel() - grid[:, 0], color=f"C{d}", label=f"output {d}, true shift {shift}")
gap_mean = amo.predict(gap_t[:, None], np.full(gap_t.size, 2))
gap_rmse = np.sqrt(np.mean((gap_mean - signal(gap_t - shifts[2])) ** 2))
axes[0].axvspan(4.0, 6.5, color="grey", alpha=0.15)
axes[0].set_title(f"predictions with ±2 sd (RMSE in the gap of output 2: {gap_rmse:.3f})", fontsize=9)
axes[0].set_xlabel("t")
axes[0].legend(fontsize=7, loc="upper right")
axes[1].set_xlabel("t")
axes[1].set_ylabel("learned alignment $a_d(t) - t$")
axes[1].legend(fontsize=7)
fig.tight_layout()
print(f"RMSE of output 2 in its gap: {gap_rmse:.3f}")
