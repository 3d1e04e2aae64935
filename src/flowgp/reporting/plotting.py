"""Every figure flowgp draws, with matplotlib's object API.

Figures are built as `matplotlib.figure.Figure` objects and written with `fig.savefig(path)`; the global
state interface and the backend switch are never used, so nothing touches matplotlib's global backend or
figure registry (a caller's interactive session, backend choice and open figures stay as they were, and no
figure stays open and holds memory).

This module is a leaf utility: it imports matplotlib and numpy only, never a flowgp model, so every layer
may call it. Callers compute the numbers (predictions, curves, tables) and pass arrays; each function draws
them, saves a PNG to `path` when given, and returns the Figure.

Figures:
- `demo_figure`: SVGP / TGP / v-WGP predictive intervals on the tanh-sine data (TGP paper, Fig. 4);
- `benchmark_figure`, `application_figure`: `flowgp bench report` (TGP paper, Figs. 7-9/12);
- `snr_figure`: SNR of the q(z) gradient estimators vs K (DGP-IWVI/DREG supplement, Fig. 3);
- `amogp_layers_figure`, `amogp_alignments_figure`, `pm25_holdout_figure`: AMO-GP;
- `plot_warping_curves`: input-dependent warpings (TGP appendix, Fig. 9);
- `latent_demo_figure`: latent-variable vs DSVI deep GP on the bimodal demo set;
- `learning_curve_figure`: test accuracy (and NLL) vs training steps, with published values as reference lines
  (`flowgp bench images-curve`, CNF-DGP Table III).
"""
from __future__ import annotations

import math

import numpy as np
from matplotlib import rcParams
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

__all__ = ["demo_figure", "interval_label", "benchmark_figure", "application_figure", "snr_figure", "amogp_layers_figure",
           "amogp_alignments_figure", "pm25_holdout_figure", "plot_warping_curves", "latent_demo_figure",
           "learning_curve_figure"]

_MARKERS = "osD^v<>Pp*hX"


def _array(a) -> np.ndarray:
    """A NumPy array from an array, list or (duck-typed, so torch is not imported here) tensor."""
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    return np.asarray(a)


def _save(fig: Figure, path, dpi: int) -> Figure:
    if path is not None:
        fig.savefig(path, dpi=dpi)
    return fig


def _panel_row(figsize, count: int):
    """A figure with one row of `count` panels sharing the y axis."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(1, count, sharey=True, squeeze=False)[0]


def _finish_row(fig: Figure, axes, path, dpi: int, **legend) -> Figure:
    """Label the shared y axis and put the legend on the first panel of a `_panel_row` figure; save it."""
    axes[0].set_ylabel("y")
    axes[0].legend(**legend)
    fig.tight_layout()
    return _save(fig, path, dpi)


def _colours() -> list:
    """The colour cycle of the current style (read only)."""
    return rcParams["axes.prop_cycle"].by_key()["color"]


# ----- flowgp demo ------------------------------------------------------------------------------------------
def interval_label(level: float, of: str = "y") -> str:
    """The legend text of a central interval: what it holds and of which quantity, e.g. "95 % predictive
    interval of y" (a new observation, noise included) or "95 % credible interval of f" (the latent function)."""
    kind = {"y": "predictive interval of y", "f": "credible interval of f"}.get(of)
    if kind is None:
        raise ValueError(f"interval_of must be 'y' (a new observation) or 'f' (the latent function), got {of!r}")
    return f"{100 * level:g} % {kind}"


def _metrics_text(metrics) -> str:
    """A panel's scores on one line ("test NLL 0.123 · RMSE 0.045")."""
    return " · ".join(f"{name} {value:.3f}" if isinstance(value, (int, float, np.floating)) else f"{name} {value}"
                      for name, value in metrics.items())


def demo_figure(grid, panels, x, y, path=None, *, truth=None, test=None, level: float = 0.95, interval_of="y",
                x_label: str = "x", y_label: str = "y", title: str | None = None) -> Figure:
    """One panel per model: its central predictive interval, predictive mean, the true function, the training
    and test points and the model's test scores (TGP paper, Fig. 4).

    grid: [G] inputs; panels: sequence of (title, mean [G], lower [G], upper [G]) or (title, mean, lower,
    upper, metrics), metrics a dict {name: value} written under the panel's title (e.g. {"test NLL": 0.12,
    "RMSE": 0.05, "95 % coverage": 0.95}); x [N], y [N]: training data; truth: the noise-free function at `grid` [G];
    test: (x_test [T], y_test [T]); level and interval_of: what the band holds ("y": a new observation, noise
    included; "f": the latent function), named in the legend; x_label, y_label: the axes (with units).
    """
    grid, x, y = _array(grid).reshape(-1), _array(x).reshape(-1), _array(y).reshape(-1)
    band = interval_label(level, interval_of)
    fig, axes = _panel_row((15, 4.6), len(panels))
    for ax, (name, mean, lower, upper, *scores) in zip(axes, panels):
        ax.fill_between(grid, _array(lower), _array(upper), alpha=0.3, label=band)
        ax.plot(grid, _array(mean), lw=2, label="predictive mean")
        if truth is not None:
            ax.plot(grid, _array(truth).reshape(-1), "k--", lw=1, label="true function")
        ax.scatter(x, y, s=8, c="k", label=f"training data (n = {len(x)})")
        if test is not None:
            xt, yt = (_array(a).reshape(-1) for a in test)
            ax.scatter(xt, yt, s=6, marker="x", c="tab:red", alpha=0.6, label=f"test data (n = {len(xt)})")
        # the scores under the model's name, where they hide no data
        ax.set_title(name + (f"\n{_metrics_text(scores[0])}" if scores and scores[0] else ""), fontsize=10)
        ax.set_xlabel(x_label)
    axes[0].set_ylabel(y_label)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return _save(fig, path, 110)


# ----- flowgp bench report ----------------------------------------------------------------------------------
def benchmark_figure(table, metric, models, path, title, metric_label, ranks=None, reference=None,
                     reference_label=None) -> Figure:
    """One panel per dataset, one marker per model and M with its standard error; last panel the average rank.

    table: {(dataset, M): {model: {metric: (mean, se, n)}}}; models: drawing order; ranks: optional
    {M: {model: (average rank, count)}} for the last panel; metric_label: the x-axis label (say the units and
    which way is better); reference: a value drawn as a dashed line in every panel (e.g. an interval's nominal
    coverage 0.95), named `reference_label` in the legend. The title says what the markers and bars are.
    """
    datasets = sorted({ds for ds, _ in table})
    sizes = sorted({m for _, m in table})
    panels = len(datasets) + (1 if ranks else 0)
    cols = min(4, panels)
    rows_n = math.ceil(panels / cols)
    fig = Figure(figsize=(3.6 * cols, 0.45 * len(models) * len(sizes) + 1.8 * rows_n))
    axes = fig.subplots(rows_n, cols, squeeze=False)
    colors = _colours()
    labels = [(mod, m) for m in sizes for mod in models]

    def style(mod):
        return _MARKERS[models.index(mod) % len(_MARKERS)], colors[models.index(mod) % len(colors)]

    for ax, ds in zip(axes.flat, datasets):
        for y, (mod, m) in enumerate(labels):
            cell = table.get((ds, m), {}).get(mod, {}).get(metric)
            if cell and np.isfinite(cell[0]):
                marker, colour = style(mod)
                ax.errorbar(cell[0], y, xerr=cell[1], fmt=marker, color=colour, capsize=3)
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels([f"{mod} M={m}" for mod, m in labels], fontsize=8)
        if reference is not None:
            ax.axvline(reference, color="0.4", ls="--", lw=1, label=reference_label or f"reference {reference:g}")
        ax.set_title(ds)
        ax.set_xlabel(metric_label)
        ax.ticklabel_format(axis="x", useOffset=False)  # an offset label would collide with the axis label
        ax.grid(axis="x", alpha=0.3)
        ax.set_ylim(len(labels) - 0.5, -0.5)  # first label on top, half a slot of margin
    if reference is not None and datasets:
        axes.flat[0].legend(fontsize=7, loc="best")
    if ranks:
        ax = axes.flat[len(datasets)]
        for y, (mod, m) in enumerate(labels):
            if mod in ranks.get(m, {}):
                marker, colour = style(mod)
                ax.plot(ranks[m][mod][0], y, marker, color=colour)
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels([f"{mod} M={m}" for mod, m in labels], fontsize=8)
        ax.set_title("average rank")
        ax.set_xlabel("rank over data sets (1 = best)")
        ax.set_ylim(len(labels) - 0.5, -0.5)
    for ax in list(axes.flat)[panels:]:
        ax.axis("off")
    fig.suptitle(f"{title}\nmarkers: mean over splits; bars: ± 1 standard error of the mean")
    fig.tight_layout()
    return _save(fig, path, 100)


def application_figure(summary, models_by_key, path, units=None) -> Figure:
    """RMSE mean ± std per model × inducing fraction × noise scheme, one panel per (dataset, preset, protocol).

    summary: {key: {(fraction, scheme): {model: {"rmse": (mean, std, n)}}}}; models_by_key: {key: [models]}
    (the drawing order of each panel); units: {dataset: the target's units} for the axis labels. A row label
    "svgp 10% fix0.6" is the model with 10 % of the training points as inducing points and the noise held
    fixed for the first 60 % of the iterations.
    """
    keys = sorted(summary)
    fig = Figure(figsize=(5 * len(keys), 4.5))
    axes = fig.subplots(1, len(keys), squeeze=False)
    colors = _colours()
    for ax, key in zip(axes.flat, keys):
        table = summary[key]
        models = list(models_by_key[key])
        labels = [(fs, m) for fs in sorted(table) for m in models]
        for y, ((frac, scheme), m) in enumerate(labels):
            cell = table[(frac, scheme)].get(m, {}).get("rmse")
            if cell and np.isfinite(cell[0]):
                ax.errorbar(cell[0], y, xerr=cell[1], fmt=_MARKERS[models.index(m) % len(_MARKERS)],
                            color=colors[models.index(m) % len(colors)], capsize=3)
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels([f"{m} {frac * 100:g}% fix{scheme:g}" for (frac, scheme), m in labels], fontsize=8)
        ax.set_ylim(len(labels) - 0.5, -0.5)  # first label on top, half a slot of margin
        unit = (units or {}).get(key[0])
        ax.set_xlabel(f"test RMSE{f' ({unit})' if unit else ''}\nmean ± std over folds and seeds; left is better")
        ax.set_title(f"{key[0]} ({key[1]}, {key[2]})")
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return _save(fig, path, 100)


# ----- flowgp bench snr -------------------------------------------------------------------------------------
def snr_figure(rows, path=None) -> Figure:
    """SNR vs K on log axes, one panel per depth, one line per estimator (DGP-IWVI/DREG supplement, Fig. 3).

    rows: dicts with "layers", "num_importance", "gradient" (an estimator of
    `flowgp.models.latent.model.GRADIENT_ESTIMATORS`) and "snr"; every estimator present gets a line.
    """
    depths = sorted({r["layers"] for r in rows})
    panels = max(1, len(depths))
    fig = Figure(figsize=(3.2 * panels, 3.0))
    axes = fig.subplots(1, panels, sharey=True, squeeze=False)
    known = ("reg", "dreg", "dreg-eps", "dreg-d23")
    present = sorted({r["gradient"] for r in rows}, key=lambda g: (known.index(g) if g in known else len(known), g))
    palette = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")
    for ax, depth in zip(axes[0], depths):
        for i, g in enumerate(present):
            pts = sorted((r["num_importance"], r["snr"]) for r in rows if r["layers"] == depth and r["gradient"] == g)
            if pts:
                k, s = np.array(pts).T
                ax.plot(k, s, "o-", color=palette[i % len(palette)], label=g.upper() if g in ("reg", "dreg") else g)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{depth} layer{'s' if depth > 1 else ''}")
        ax.set_xlabel("K (importance samples)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("SNR of q(z) gradient")
    if depths:
        axes[0][0].legend()
    fig.tight_layout()
    return _save(fig, path, 120)


# ----- AMO-GP -----------------------------------------------------------------------------------------------
def amogp_layers_figure(curves, path=None, data=None, true_functions=None, output_names=None) -> Figure:
    """The three layers per output (one row per output): alignment a_d(x), latent f_d(a) and warping
    g_d(f) + b_d with ±2 sd bands, and the propagated prediction of y with the data in a fourth column.

    curves: one dict per output with "alignment", "latent", "warping", "prediction", each (inputs, mean, var)
    arrays [G] (as from `flowgp.models.amogp.model.layer_curves`). data: optional (x [N], y [N], output [N]).
    true_functions: optional {d: {"a": callable, "f": callable, "g": callable}} to overlay (dashed).
    """
    d_count = len(curves)
    fig = Figure(figsize=(14, 2.8 * d_count))
    axes = fig.subplots(d_count, 4, squeeze=False)
    labels = (("alignment", "x", "a(x)", "alignment"), ("latent", "a", "f(a)", "latent (CP)"),
              ("warping", "f", "g(f) + b", "warping"), ("prediction", "x", "y", "prediction"))
    for d, layers in enumerate(curves):
        name = output_names[d] if output_names else f"output {d}"
        for j, (key, xl, yl, title) in enumerate(labels):
            ax = axes[d, j]
            xx, m, v = (_array(a).reshape(-1) for a in layers[key])
            s = np.sqrt(np.clip(v, 0.0, None))
            ax.plot(xx, m, color="C0", label="learned")
            ax.fill_between(xx, m - 2 * s, m + 2 * s, color="C0", alpha=0.25)
            truth = (true_functions or {}).get(d, {}).get("afg"[j]) if j < 3 else None
            if truth is not None:
                ax.plot(xx, truth(xx), "k--", label="true")
            ax.set_title(f"{name}: {title}", fontsize=9)
            ax.set_xlabel(xl)
            ax.set_ylabel(yl)
        if data is not None:
            xd, yd, od = (np.asarray(v) for v in data)
            sel = od == d
            axes[d, 3].scatter(xd[sel], yd[sel], s=4, color="k", alpha=0.5)
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path, 110)


def amogp_alignments_figure(grid, alignments, prediction, train, test, gap, path=None) -> Figure:
    """Left: learned alignments (mean ± 2 sd) against the true ones; right: the prediction of one output
    across its gap.

    grid [G]; alignments: per output (learned mean [G], learned sd [G], true [G]); prediction: (mean [G],
    sd [G]) of the gap output; train, test: (x [N], y [N]) of that output; gap: (start, end) shaded.
    """
    grid = _array(grid).reshape(-1)
    fig = Figure(figsize=(10, 3.5))
    ax = fig.subplots(1, 2)
    for d, (m, s, true) in enumerate(alignments):
        m, s = _array(m), _array(s)
        ax[0].plot(grid, m, color=f"C{d}", label=f"learned a_{d}")
        ax[0].fill_between(grid, m - 2 * s, m + 2 * s, color=f"C{d}", alpha=0.2)
        ax[0].plot(grid, _array(true), "--", color=f"C{d}", label=f"true a_{d}")
    ax[0].set_xlabel("t")
    ax[0].legend(fontsize=7)
    ax[0].set_title("alignments")
    mean, std = (_array(a) for a in prediction)
    ax[1].plot(grid, mean, label="AMO-GP")
    ax[1].fill_between(grid, mean - 2 * std, mean + 2 * std, alpha=0.2)
    ax[1].scatter(_array(train[0]), _array(train[1]), s=5, c="k", label="train")
    ax[1].scatter(_array(test[0]), _array(test[1]), s=5, c="r", label="gap (test)")
    ax[1].axvspan(*gap, color="0.9", zorder=0)
    ax[1].set_title("output 2")
    ax[1].legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path, 110)


def pm25_holdout_figure(grid, predictions, train, test, title, path=None) -> Figure:
    """Predictions (mean ± 2 sd) of several models across a held-out block of one site.

    grid [G]; predictions: {model name: (mean [G], sd [G])}; train, test: (x [N], y [N]) of the site.
    """
    grid = _array(grid).reshape(-1)
    fig = Figure(figsize=(10, 3.5))
    ax = fig.subplots(1, 1)
    ax.scatter(_array(train[0]), _array(train[1]), s=5, c="k", label="train")
    ax.scatter(_array(test[0]), _array(test[1]), s=5, c="r", label="held out")
    for i, (name, (m, s)) in enumerate(predictions.items()):
        m, s = _array(m), _array(s)
        ax.plot(grid, m, color=f"C{i}", label=name)
        ax.fill_between(grid, m - 2 * s, m + 2 * s, color=f"C{i}", alpha=0.12)
    ax.set_xlabel("hours since window start")
    ax.set_ylabel("PM2.5 (µg/m³)")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path, 110)


# ----- input-dependent flows --------------------------------------------------------------------------------
def plot_warping_curves(f_grid, curves: dict, labels=None, path=None) -> Figure:
    """Figure in the style of TGP appendix Fig. 9: top row the point-estimate warping at each input, bottom
    row the posterior mean ± 2 std over W draws.

    `curves` as returned by `flowgp.flows.conditional.warping_curves` ([G, P, K]; output 0 is drawn) or by
    `TGPRegressor.warping_functions` ([G, P]).
    """
    f = _array(f_grid).reshape(-1)
    point, mean, std = (_array(curves[k]) for k in ("point", "mean", "std"))
    if point.ndim == 3:  # [G, P, K] from warping_curves: draw output 0
        point, mean, std = point[..., 0], mean[..., 0], std[..., 0]
    num = point.shape[1]
    labels = labels if labels is not None else [f"input {p}" for p in range(num)]
    fig = Figure(figsize=(3 * num, 5.5))
    axes = fig.subplots(2, num, squeeze=False, sharex=True)
    for p in range(num):
        axes[0, p].plot(f, point[:, p], color="C0")
        axes[0, p].set_title(str(labels[p]), fontsize=9)
        axes[1, p].plot(f, mean[:, p], color="C1")
        axes[1, p].fill_between(f, mean[:, p] - 2 * std[:, p], mean[:, p] + 2 * std[:, p], color="C1", alpha=0.3)
        axes[1, p].set_xlabel("f₀")
    axes[0, 0].set_ylabel("G(f₀), point estimate")
    axes[1, 0].set_ylabel("G(f₀), mean ± 2 std")
    fig.tight_layout()
    return _save(fig, path, 120)


# ----- latent-variable deep GP demo ---------------------------------------------------------------------------
def latent_demo_figure(x, y, grid, panels, path=None) -> Figure:
    """Training data and predictive draws per model on the bimodal demo set.

    x [N], y [N]: training data; grid [G]; panels: sequence of (title, draws [S, G]).
    """
    x, y, grid = _array(x).reshape(-1), _array(y).reshape(-1), _array(grid).reshape(-1)
    fig, axes = _panel_row((10, 3.8), len(panels))
    for ax, (title, draws) in zip(axes, panels):
        draws = _array(draws)
        ax.scatter(x, y, s=3, alpha=0.35, color="tab:blue", label="training data")
        ax.scatter(np.repeat(grid[None], draws.shape[0], 0).ravel(), draws.ravel(), s=2, alpha=0.35,
                   color="tab:orange", label="sample_y draws")
        ax.set_title(title)
        ax.set_xlabel("x")
    return _finish_row(fig, axes, path, 120, loc="upper center", markerscale=4)


# ----- flowgp bench images-curve ----------------------------------------------------------------------------
def learning_curve_figure(lines, path=None, *, references=None, title=None, xlabel="training steps",
                          dpi: int = 120) -> Figure:
    """Test accuracy (%) vs training steps, one line per fit, with published accuracies as labelled horizontal
    reference lines; with references a second panel zooms on them (the last points of a curve and the published
    values are often within a percent), and a last panel shows the test NLL where the lines have one.

    Args:
        lines: {label: {"step": [...], "accuracy": [...] (percent), optional "nll": [...] (nats per image)}}.
        path: where to save the PNG (None: not saved).
        references: {label: accuracy in percent}, e.g. {"Table III, DGP 4, NF": 92.03}, drawn dashed on the
            accuracy panels and named in the legend with their values.
        title: the figure's title (say what was evaluated: the test subset's size, the prediction samples).
        xlabel: the x axis's label.
        dpi: resolution of the saved PNG.

    See Also:
        :func:`flowgp.reporting.plotting.snr_figure` (another bench figure).
    """
    references = dict(references or {})
    with_nll = any(len(line.get("nll", ())) for line in lines.values())
    count = 1 + bool(references) + with_nll
    fig = Figure(figsize=(5.2 * count, 5.0))
    axes = list(fig.subplots(1, count, squeeze=False)[0])
    accuracy_axes = axes[:1 + bool(references)]
    colours = _colours()
    for i, (label, line) in enumerate(lines.items()):
        step = _array(line["step"])
        style = dict(color=colours[i % len(colours)], marker=_MARKERS[i % len(_MARKERS)], markersize=3.5,
                     linewidth=1.4)
        for k, ax in enumerate(accuracy_axes):
            ax.plot(step, _array(line["accuracy"]), label=label if k == 0 else None, **style)
        if with_nll and len(line.get("nll", ())):
            axes[-1].plot(step, _array(line["nll"]), **style)
    dashes = ("--", ":", "-.", (0, (5, 1, 1, 1)), (0, (1, 1)), (0, (3, 1, 1, 1, 1, 1)))
    for i, (label, value) in enumerate(references.items()):
        style = dict(color=colours[-1 - i % len(colours)], linestyle=dashes[i % len(dashes)], linewidth=1.2)
        for k, ax in enumerate(accuracy_axes):
            ax.axhline(value, label=f"{label}: {value:.2f} %" if k == 0 else None, **style)
    for ax in accuracy_axes:
        ax.set_ylabel("test accuracy (%)")
    if references:
        finals = [float(_array(line["accuracy"])[-1]) for line in lines.values() if len(line["accuracy"])]
        values = list(references.values())
        # down to the best last point, but at most 10 points below the lowest published value
        best = max(finals) if finals else min(values)
        low = max(min(min(values), best), min(values) - 10.0)
        accuracy_axes[1].set_ylim(low - 2.0, max(values + finals) + 1.0)
        accuracy_axes[1].set_title("near the published values", fontsize="medium")
    if with_nll:
        axes[-1].set_ylabel("test NLL (nats per image)")
    for ax in axes:
        ax.set_xlabel(xlabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    fig.legend(loc="lower center", ncol=min(3, max(1, len(lines) + len(references))), fontsize="small",
               frameon=False)
    if title:
        fig.suptitle(title, fontsize="medium")
    rows = math.ceil((len(lines) + len(references)) / 3)
    fig.tight_layout(rect=(0, min(0.45, 0.045 * rows + 0.02), 1, 1))
    return _save(fig, path, dpi)
