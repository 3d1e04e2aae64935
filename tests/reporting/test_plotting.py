"""flowgp.reporting.plotting: every figure through matplotlib's object API, no global matplotlib state touched."""
import ast
import subprocess
import sys
from pathlib import Path

import numpy as np

SRC = Path(__file__).resolve().parents[2] / "src"


def test_plotting_is_a_leaf_that_imports_only_matplotlib_and_numpy():
    tree = ast.parse((SRC / "flowgp" / "reporting" / "plotting.py").read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "plotting must not import flowgp modules"
            roots.add(node.module.split(".")[0])
    assert roots <= {"__future__", "math", "numpy", "matplotlib"}, roots


def test_no_module_of_flowgp_selects_a_backend_or_uses_the_global_figure_interface():
    offenders = [str(p) for p in (SRC / "flowgp").rglob("*.py")
                 if any(s in p.read_text() for s in ("matplotlib.use(", "pyplot"))]
    assert offenders == []


def test_figures_are_written_without_touching_the_backend_or_pyplot(tmp_path):
    # a fresh process: the backend chosen before any flowgp figure must still be the one afterwards, and
    # pyplot (the global figure registry) is never imported
    code = f"""
import sys, numpy as np, matplotlib
matplotlib.rcParams["backend"] = "svg"
from flowgp.reporting import plotting as P
out = {str(tmp_path)!r}
g = np.linspace(0, 1, 20)
P.demo_figure(g, [("a", g, g - 1, g + 1), ("b", g, g - 1, g + 1)], g, g, path=out + "/demo.png")
P.snr_figure([{{"layers": 1, "num_importance": k, "gradient": e, "snr": 1.0 / k}} for k in (1, 5)
              for e in ("reg", "dreg")], out + "/snr.png")
table = {{("d1", 10): {{"svgp": {{"nll": (1.0, 0.1, 3)}}, "tgp": {{"nll": (0.9, 0.1, 3)}}}}}}
P.benchmark_figure(table, "nll", ["svgp", "tgp"], out + "/bench.png", "t", "NLL",
                   ranks={{10: {{"svgp": (2.0, 1), "tgp": (1.0, 1)}}}})
P.application_figure({{("aq", "quick", "cv"): {{(0.1, 0.0): {{"svgp": {{"rmse": (1.0, 0.2, 4)}}}}}}}},
                     {{("aq", "quick", "cv"): ["svgp"]}}, out + "/apps.png")
curves = [{{k: (g, g, 0.01 + 0 * g) for k in ("alignment", "latent", "warping", "prediction")}}] * 2
P.amogp_layers_figure(curves, out + "/layers.png", data=(g, g, (g > 0.5).astype(int)),
                      true_functions={{0: {{"a": lambda t: t}}}})
P.amogp_alignments_figure(g, [(g, 0 * g + 0.1, g)] * 3, (g, 0 * g + 0.1), (g, g), (g, g), (0.2, 0.4),
                          path=out + "/align.png")
P.pm25_holdout_figure(g, {{"svgp": (g, 0 * g + 0.1)}}, (g, g), (g, g), "site", path=out + "/pm25.png")
P.plot_warping_curves(g, {{"point": np.c_[g, g], "mean": np.c_[g, g], "std": np.c_[g, g] * 0}},
                      path=out + "/warp.png")
P.latent_demo_figure(g, g, g, [("a", np.stack([g, g])), ("b", np.stack([g, g]))], path=out + "/ldgp.png")
assert matplotlib.rcParams["backend"] == "svg", matplotlib.rcParams["backend"]
assert "matplotlib.pyplot" not in sys.modules
"""
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin", "MPLBACKEND": ""}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    names = ("demo", "snr", "bench", "apps", "layers", "align", "pm25", "warp", "ldgp")
    for name in names:
        data = (tmp_path / f"{name}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000, name


def test_warping_curves_figure_draws_one_column_per_input_and_output_zero():
    from flowgp.reporting.plotting import plot_warping_curves

    g = np.linspace(-1, 1, 7)
    point = np.stack([np.c_[g, 10 * g], np.c_[2 * g, 10 * g], np.c_[3 * g, 10 * g]], axis=1)  # [G, P=3, K=2]
    fig = plot_warping_curves(g, {"point": point, "mean": point, "std": 0 * point}, labels=["a", "b", "c"])
    assert len(fig.axes) == 6 and [ax.get_title() for ax in fig.axes[:3]] == ["a", "b", "c"]
    np.testing.assert_allclose(fig.axes[1].lines[0].get_ydata(), 2 * g)  # output 0 of input 1


def test_learning_curve_figure_labels_axes_lines_and_the_published_values(tmp_path):
    from flowgp.reporting.plotting import learning_curve_figure

    lines = {"dgp4, skip conv": {"step": [100, 200], "accuracy": [80.0, 90.0], "nll": [0.6, 0.3]},
             "sgp": {"step": [100, 200], "accuracy": [75.0, 86.0], "nll": [0.7, 0.4]}}
    fig = learning_curve_figure(lines, tmp_path / "c.png", references={"Table III, DGP 4, NF": 92.03},
                                title="2000 test images, 5 samples", xlabel="training steps (batches of 256 images)")
    assert (tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")
    full, zoom, nll = fig.axes
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["dgp4, skip conv", "sgp", "Table III, DGP 4, NF: 92.03 %"]
    assert full.get_ylabel() == zoom.get_ylabel() == "test accuracy (%)" and nll.get_ylabel() == "test NLL (nats per image)"
    assert full.get_xlabel() == "training steps (batches of 256 images)" and fig.get_suptitle().startswith("2000")
    assert zoom.get_ylim() == (88.0, 93.03)  # from the best last point to the published value
    far = learning_curve_figure({"sgp": {"step": [1, 2], "accuracy": [20.0, 30.0]}}, references={"r": 92.0})
    assert far.axes[1].get_ylim() == (80.0, 93.0)  # at most 10 points below the published value
    assert [round(line.get_ydata()[0], 2) for line in full.lines[2:]] == [92.03]  # the reference line
    alone = learning_curve_figure({"sgp": {"step": [1, 2], "accuracy": [50.0, 60.0]}})
    assert len(alone.axes) == 1 and alone.axes[0].get_ylabel() == "test accuracy (%)"
