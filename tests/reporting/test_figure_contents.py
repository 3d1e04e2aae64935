"""The figures say what they show: legends name what an interval bounds, axes their units, panels their scores
(checked on the Figure's artists, not its pixels)."""
import json

import numpy as np
import pytest

from flowgp.reporting.plotting import application_figure, benchmark_figure, demo_figure, interval_label


def _legend_texts(fig):
    return [t.get_text() for legend in fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
            for t in legend.get_texts()]


def test_demo_figure_has_truth_test_points_scores_and_says_what_the_band_bounds():
    g = np.linspace(0, 2, 50)
    truth = np.tanh(4 * np.sin(2 * np.pi * g))
    panels = [(name, truth, truth - 0.1, truth + 0.1, {"test NLL": nll, "RMSE": 0.05, "95 % coverage": 0.9})
              for name, nll in (("SVGP", 1.25), ("TGP", -0.5))]
    fig = demo_figure(g, panels, g[::5], truth[::5], truth=truth, test=(g[1::7], truth[1::7]),
                      x_label="x (dimensionless)", y_label="y (m)")
    legend = _legend_texts(fig)
    assert legend == ["95 % predictive interval of y", "predictive mean", "true function",
                      "training data (n = 10)", "test data (n = 7)"]
    for ax, (name, nll) in zip(fig.axes, (("SVGP", "1.250"), ("TGP", "-0.500"))):
        title = ax.get_title()
        assert title.startswith(name) and f"test NLL {nll}" in title and "RMSE 0.050" in title
        assert "95 % coverage 0.900" in title
        assert ax.get_xlabel() == "x (dimensionless)"
        np.testing.assert_allclose(ax.lines[1].get_ydata(), truth)  # the dashed true function
        assert len(ax.collections) == 3  # the band, the training and the test points
    assert fig.axes[0].get_ylabel() == "y (m)"


def test_interval_label_names_y_or_f_and_refuses_anything_else():
    assert interval_label(0.9, "f") == "90 % credible interval of f"
    assert interval_label(0.95) == "95 % predictive interval of y"
    with pytest.raises(ValueError, match="interval_of"):
        demo_figure([0, 1], [("a", [0, 1], [0, 1], [0, 1])], [0], [0], interval_of="z")


def test_demo_figure_without_the_extras_still_draws():
    g = np.linspace(0, 1, 5)
    fig = demo_figure(g, [("a", g, g - 1, g + 1)], g, g)
    assert _legend_texts(fig) == ["95 % predictive interval of y", "predictive mean", "training data (n = 5)"]
    assert fig.axes[0].get_title() == "a"


def test_benchmark_figure_says_units_bars_and_the_nominal_coverage():
    table = {("boston", 10): {"svgp": {"coverage95": (0.93, 0.01, 5)}, "tgp": {"coverage95": (0.95, 0.01, 5)}}}
    fig = benchmark_figure(table, "coverage95", ["svgp", "tgp"], None, "coverage", "share inside (nominal 0.95)",
                           reference=0.95, reference_label="nominal 0.95")
    assert "± 1 standard error" in fig._suptitle.get_text()
    ax = fig.axes[0]
    assert ax.get_xlabel() == "share inside (nominal 0.95)"
    assert "nominal 0.95" in _legend_texts(fig)
    assert any(np.allclose(line.get_xdata(), 0.95) for line in ax.lines)


def test_application_figure_axis_has_the_targets_units():
    summary = {("airquality", "quick", "cv"): {(0.1, 0.6): {"svgp": {"rmse": (4.0, 1.0, 5)}}}}
    fig = application_figure(summary, {("airquality", "quick", "cv"): ["svgp"]}, None,
                             units={"airquality": "PM2.5, µg/m³"})
    assert fig.axes[0].get_xlabel().startswith("test RMSE (PM2.5, µg/m³)\nmean ± std over folds and seeds")


def test_bench_report_figures_label_their_axes(tmp_path, monkeypatch):
    from flowgp.bench.report import build_report
    from flowgp.reporting import plotting

    drawn = {}

    def keep(table, metric, *args, **kwargs):
        drawn[metric] = original(table, metric, *args, **kwargs)
        return drawn[metric]

    original = plotting.benchmark_figure
    monkeypatch.setattr(plotting, "benchmark_figure", keep)
    rows = [{"dataset": "boston", "model": m, "num_inducing": 10, "split": s, "preset": "quick", "seed": 0,
             "task": "regression", "nll": 1.0 + s / 10, "rmse": 2.0, "coverage95": 0.94, "train_elbo": -1.0}
            for m in ("svgp", "tgp") for s in range(3)]
    (tmp_path / "uci.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    build_report([tmp_path], tmp_path / "out")
    assert sorted(drawn) == ["coverage95", "nll", "rmse"]
    labels = {metric: " ".join(fig.axes[0].get_xlabel().split()) for metric, fig in drawn.items()}
    assert "nats per test point" in labels["nll"] and "lower is better" in labels["nll"]
    assert "target units" in labels["rmse"]
    assert "95 % predictive interval of y" in labels["coverage95"]
    assert "nominal 0.95" in _legend_texts(drawn["coverage95"]) and not _legend_texts(drawn["nll"])
    assert all("standard error" in fig._suptitle.get_text() for fig in drawn.values())
    assert (tmp_path / "out" / "regression_quick_nll.png").exists()


def test_the_demo_draws_truth_test_points_and_each_models_test_scores(tmp_path, monkeypatch):
    from flowgp import cli
    from flowgp.reporting import plotting

    drawn = []

    def keep(*args, **kwargs):
        drawn.append(original(*args, **kwargs))
        return drawn[-1]

    original = plotting.demo_figure
    monkeypatch.setattr(plotting, "demo_figure", keep)
    rows = cli.demo(str(tmp_path / "demo"), epochs=3, periods=(1.0,), progress=None)
    (fig,) = drawn
    legend = _legend_texts(fig)
    assert legend[0] == "95 % predictive interval of y" and "true function" in legend
    assert "training data (n = 150)" in legend and "test data (n = 300)" in legend
    for ax, row in zip(fig.axes, rows):
        title = ax.get_title()
        assert title.startswith(row["model"]) and f"test NLL {row['nll']:.3f}" in title
        assert f"test RMSE {row['rmse']:.3f}" in title and f"95 % coverage {row['coverage95']:.3f}" in title
    assert (tmp_path / "demo" / "demo.png").exists()
