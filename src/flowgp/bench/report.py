"""`flowgp bench report DIR`: Markdown tables, rankings and PNG figures from the JSON lines in DIR.

Reads every `*.jsonl` in DIR (not `*.errors.jsonl`) and recognises three row shapes:
- benchmark rows (`dataset, model, num_inducing, split` + metrics): mean ± standard error over splits per
  dataset × model × M, best in bold (lowest NLL/RMSE, highest accuracy, coverage closest to 0.95), the
  average rank of each model across datasets, and figures in the style of the paper's Figs. 7-9/12 (one
  panel per dataset, one marker per model and M, error bars = standard error; last panel: ranking);
- application rows (`fold, inducing_fraction, fix_noise_fraction`): RMSE/NLL mean ± std over flows, folds
  and seeds (appendix B.5) per model × inducing fraction × noise scheme, per-flow breakdown, and a
  comparison with the paper's Table 2/4 values;
- timing rows (`repeat`): medians and ratios (paper Fig. 11).
Rows that repeat an earlier row's identity (the key fields its subcommand resumes on, see `row_identity`) are
dropped before any statistic - e.g. two runs that wrote the same output - and the report says how many.
Writes DIR/report.md, DIR/summary.json and DIR/*.png.
"""
from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from ..registry import MODELS
from .results import read_rows

NAME = "report"
HELP = "Markdown tables, rankings and PNG figures from bench result folders"

# metric -> (label, direction): "min" lower is better, "max" higher is better, a number = closest to it.
METRICS = {"nll": ("NLL", "min"), "rmse": ("RMSE", "min"), "coverage95": ("95% coverage", 0.95),
           "accuracy": ("accuracy", "max")}
#: the figures' axis labels: what each metric measures, in which units, which way is better
AXIS_LABELS = {"nll": "test NLL, nats per test point\n(in the target's units; lower is better)",
               "rmse": "test RMSE, in the data set's\ntarget units (lower is better)",
               "coverage95": "share of test points inside the\n95 % predictive interval of y (nominal 0.95)",
               "accuracy": "test accuracy, share classified\ncorrectly (higher is better)"}
#: the targets' units of the applications (their data's SOURCES.md), for the figures' axes
TARGET_UNITS = {"airquality": "PM2.5, µg/m³", "rainfall": "rainfall, 1/10 mm"}

# Table 4 (left), airquality RMSE per inducing fraction: (mean, std) of svgp, tgp and wgp (flows sal+softplus:data).
_AIRQUALITY_TABLE4 = {0.05: ((5.491, 1.02), (4.851, 0.786), (6.451, 1.207)),
                      0.1: ((4.335, 1.115), (4.299, 1.269), (4.505, 0.986)),
                      1.0: ((3.345, 1.036), (2.833, 0.923), (4.151, 1.702))}
# Rainfall RMSE at M = N: svgp, then (mean, std) of tgp and wgp per flow (Table 4, right) and over all flows
# (Table 2, flow None).
_RAINFALL_SVGP = (50.892, 5.441)
_RAINFALL_TGP_WGP = {"softplus:identity": ((50.858, 5.395), (50.893, 5.356), "Table 4 (right)"),
                     "sal+softplus:data": ((73.057, 8.465), (48.85, 5.404), "Table 4 (right)"),
                     None: ((74.306, 15.225), (49.764, 5.369), "Table 2 (all flows)")}
# Appendix B.6.3, UCI with M = 100: (NLL, RMSE) of SVGP and the input-dependent TGP with a point estimate
# ("pe-tgp") or MC dropout ("ba-tgp"), in the appendix's order.
_UCI_B63 = (("concrete", "svgp", 3.17, 5.79), ("concrete", "pe-tgp", 3.24, 5.55), ("boston", "svgp", 2.38, 2.66),
            ("boston", "pe-tgp", 2.26, 2.38), ("concrete", "ba-tgp", 3.02, 5.57), ("boston", "ba-tgp", 2.24, 2.33))

# Published numbers (TGP appendix), one row each:
# (dataset, model, flow (None = any / averaged), inducing_fraction or num_inducing, metric, mean, std, source).
# Applications: RMSE mean and std over 5 folds x 2 seeds. UCI: means only (std None).
PAPER_REFERENCE = [
    *[("airquality", model, flow, fraction, "rmse", mean, std, "Table 4 (left)")
      for fraction, results in _AIRQUALITY_TABLE4.items()
      for (model, flow), (mean, std) in zip((("svgp", None), ("tgp", "sal+softplus:data"),
                                             ("wgp", "sal+softplus:data")), results)],
    ("rainfall", "svgp", None, 1.0, "rmse", *_RAINFALL_SVGP, "Table 4 (right)"),
    *[("rainfall", model, flow, 1.0, "rmse", mean, std, source)
      for flow, (tgp, wgp, source) in _RAINFALL_TGP_WGP.items() for model, (mean, std) in (("tgp", tgp), ("wgp", wgp))],
    *[(dataset, model, None, 100, metric, value, None, "B.6.3")
      for dataset, model, nll, rmse in _UCI_B63 for metric, value in (("nll", nll), ("rmse", rmse))],
]
PAPER_RUNS = {"airquality": 10, "rainfall": 10}  # 5 folds x 2 seeds

# CNF-DGP paper, Table I: mean training ELBO on boston over 10 runs, {layers: (NF, IPVI)}; flowgp's `cnf-dgpL`
# is the NF column and `dgpL` (DSVI) stands in for IPVI, which flowgp does not implement.
CNF_TABLE_I = {2: (-836.48, -846.65), 3: (-814.13, -846.45), 4: (-762.54, -776.93), 5: (-734.23, -758.42)}


def add_arguments(parser) -> None:
    parser.add_argument("dirs", nargs="+", help="result folders holding *.jsonl files (all are merged)")
    parser.add_argument("--out", default=None, help="where to write report.md and figures (default: first DIR)")
    parser.add_argument("--no-figures", action="store_true")
    parser.add_argument("--cmdline", default=None, help="the command line that produced the rows (quoted in the report)")


# ----- statistics -----------------------------------------------------------------------------------------
def mean_std(values):
    """(mean, sample standard deviation, n) of the finite values; std is 0 for n = 1, both NaN for n = 0."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    if v.size == 0:
        return float("nan"), float("nan"), 0
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0, int(v.size)


def mean_se(values):
    """(mean, standard error, n) of finite values; se is 0 for n = 1, NaN mean for n = 0."""
    mean, std, n = mean_std(values)
    return mean, (float(std / math.sqrt(n)) if n > 1 else std), n


def _score(mean: float, direction) -> float:
    """Smaller is better after this transform."""
    if direction == "min":
        return mean
    if direction == "max":
        return -mean
    return abs(mean - float(direction))


def _best(means: dict, direction) -> set:
    finite = {k: _score(m, direction) for k, m in means.items() if np.isfinite(m)}
    if not finite:
        return set()
    top = min(finite.values())
    return {k for k, s in finite.items() if s == top}


def _fmt(mean, err, bold=False, digits=3) -> str:
    if not np.isfinite(mean):
        return "—"
    text = f"{mean:.{digits}f} ± {err:.{digits}f}"
    return f"**{text}**" if bold else text


# ----- row classification -----------------------------------------------------------------------------------
def load_rows(dirs) -> list[dict]:
    rows = []
    for d in dirs:
        d = Path(d)
        if d.exists() and not d.is_dir():
            raise ValueError(f"{d} is a file; `flowgp bench report` takes result folders (holding *.jsonl)")
        if not d.is_dir():
            raise FileNotFoundError(f"result folder {d} does not exist")
        for path in sorted(d.glob("*.jsonl")):
            if path.name.endswith(".errors.jsonl"):
                continue
            for r in read_rows(path):
                r.setdefault("_file", path.name)
                rows.append(r)
    return rows


_TIMING_KEYS = ("dataset", "model", "num_inducing", "epochs", "batch_size", "repeat", "train_seconds",
                "predict_seconds")
_APPLICATION_KEYS = ("dataset", "model", "fold", "inducing_fraction", "fix_noise_fraction")


def _is_timing(r):
    return all(k in r for k in _TIMING_KEYS)


def _is_application(r):
    return all(k in r for k in _APPLICATION_KEYS)


def _is_benchmark(r):
    return all(k in r for k in ("dataset", "model", "num_inducing", "split")) and not _is_timing(r)


def row_identity(row) -> tuple | None:
    """What identifies a result row: its kind and the key fields its subcommand resumes on (`KEY_FIELDS` of
    `flowgp bench uci` (+ task) / `airquality`, `rainfall` / `timing`); None for rows of other kinds (not
    summarised here, never dropped). A field a row lacks counts as its `KEY_DEFAULTS` value, else None."""
    from . import applications, timing, uci

    defaults = {}
    if _is_timing(row):
        kind, fields = "timing", timing.KEY_FIELDS
    elif _is_application(row):
        kind, fields, defaults = "application", applications.KEY_FIELDS, applications.KEY_DEFAULTS
    elif _is_benchmark(row):
        kind, fields, defaults = "benchmark", uci.KEY_FIELDS + ("task",), uci.KEY_DEFAULTS
    else:
        return None
    # JSON text, so 100 and 100.0 (or a list and a tuple) read alike, as in ResultStore's keys
    return (kind,) + tuple(json.dumps(row.get(f, defaults.get(f)), sort_keys=True) for f in fields)


def deduplicate(rows) -> tuple[list[dict], int]:
    """(rows without repeats of an earlier row's `row_identity`, number dropped); the first row is kept.

    Repeats come from two runs writing one output, or one folder given twice; counting them twice would
    shrink the standard errors."""
    seen, kept = set(), []
    for r in rows:
        key = row_identity(r)
        if key is not None:
            if key in seen:
                continue
            seen.add(key)
        kept.append(r)
    return kept, len(rows) - len(kept)


def _order(values, preferred=()):
    values = list(dict.fromkeys(values))
    return [v for v in preferred if v in values] + sorted(v for v in values if v not in preferred)


# ----- benchmark tables --------------------------------------------------------------------------------------
def _preset_label(row) -> str:
    """A benchmark row's preset, with the row order of its splits where that is not the data file's
    ("reference-authors-order"): split k of another row order tests other points, so such rows get a table of their
    own."""
    from .uci import KEY_DEFAULTS, row_order_of

    preset, order = row.get("preset", "?"), row_order_of(row)
    return preset if order == KEY_DEFAULTS["row_order"] else f"{preset}-{order}-order"


def benchmark_summary(rows):
    """{(preset, task): {(dataset, M): {model: {metric: (mean, se, n)}}}}"""
    groups = defaultdict(lambda: defaultdict(list))
    for r in rows:
        groups[(_preset_label(r), r.get("task", "regression"))][(r["dataset"], r["num_inducing"], r["model"])].append(r)
    out = {}
    for pt, g in groups.items():
        table = defaultdict(dict)
        for (ds, m, model), rs in g.items():
            table[(ds, m)][model] = {k: mean_se([x.get(k) for x in rs]) for k in METRICS if any(k in x for x in rs)}
        out[pt] = dict(table)
    return out


def rankings(table, metric):
    """Average rank (1 = best) of each model across datasets, per M; ties share the mean rank."""
    direction = METRICS[metric][1]
    per_m = defaultdict(lambda: defaultdict(list))
    for (ds, m), models in table.items():
        scores = {mod: _score(v[metric][0], direction) for mod, v in models.items()
                  if metric in v and np.isfinite(v[metric][0])}
        if len(scores) < 2:
            continue
        ordered = sorted(scores.values())
        for mod, s in scores.items():
            ranks = [i + 1 for i, x in enumerate(ordered) if x == s]
            per_m[m][mod].append(float(np.mean(ranks)))
    return {m: {mod: (float(np.mean(r)), len(r)) for mod, r in mods.items()} for m, mods in per_m.items()}


def _benchmark_markdown(summary, model_order) -> list[str]:
    lines = []
    for (preset, task), table in sorted(summary.items()):
        metrics = ["nll", "rmse", "coverage95"] if task == "regression" else ["accuracy", "nll"]
        models = _order([mod for v in table.values() for mod in v], model_order)
        lines += [f"## {task.capitalize()} benchmark (preset `{preset}`)", ""]
        for metric in metrics:
            label, direction = METRICS[metric]
            note = {"min": "lower is better", "max": "higher is better"}.get(direction, f"closest to {direction} is best")
            lines += [f"### {label} ({note}); mean ± standard error over splits", "",
                      "| dataset | M | n | " + " | ".join(models) + " |", "|---|---|---|" + "---|" * len(models)]
            for (ds, m) in sorted(table, key=lambda k: (k[0], k[1])):
                cells = table[(ds, m)]
                means = {mod: cells[mod][metric][0] for mod in models if mod in cells and metric in cells[mod]}
                best = _best(means, direction)
                n = max((cells[mod][metric][2] for mod in means), default=0)
                row = [_fmt(*cells[mod][metric][:2], bold=mod in best) if mod in means else "—" for mod in models]
                lines.append(f"| {ds} | {m} | {n} | " + " | ".join(row) + " |")
            lines.append("")
            ranks = rankings(table, metric)
            if ranks:
                lines += [f"Average {label} rank across datasets (1 = best):", "",
                          "| M | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
                for m in sorted(ranks):
                    best = _best({k: v[0] for k, v in ranks[m].items()}, "min")
                    lines.append(f"| {m} | " + " | ".join(
                        (f"**{ranks[m][mod][0]:.2f}**" if mod in best else f"{ranks[m][mod][0]:.2f}")
                        if mod in ranks[m] else "—" for mod in models) + " |")
                lines.append("")
    return lines


# ----- training ELBO (CNF-DGP Table I) ----------------------------------------------------------------------
def standardised_elbo(row) -> float | None:
    """The training ELBO for standardised targets: elbo_y + n_train·log(y_scale) (Jacobian of y ↦ y/scale)."""
    if row.get("train_elbo") is None or row.get("y_scale") is None or row.get("n_train") is None:
        return None
    return float(row["train_elbo"]) + float(row["n_train"]) * math.log(float(row["y_scale"]))


def _deep_depth(model: str) -> int | None:
    """The depth L of a deep GP of `flowgp.registry.MODELS` (dgpL / cnf-dgpL), else None.

    Names outside the registry (rows of models registered by a user's script that is not loaded here) are
    read as dgpL / cnf-dgpL."""
    from .models import deep_gp_depth  # (importing it registers the named models)

    if model in MODELS:
        return deep_gp_depth(MODELS.get(model))
    for prefix in ("cnf-dgp", "dgp"):
        if model.startswith(prefix) and model[len(prefix):].isdigit():
            return int(model[len(prefix):])
    return None


def _elbo_markdown(rows, model_order) -> list[str]:
    """Mean ± s.e. of the standardised training ELBO per dataset × model; boston's deep GPs against Table I."""
    groups = defaultdict(list)
    for r in rows:
        value = standardised_elbo(r)
        if value is not None:
            groups[(r.get("preset", "?"), r["dataset"], r["model"])].append(value)
    if not groups:
        return []
    lines = ["## Training ELBO (standardised targets, nats; higher is better)", "",
             "elbo + n_train·log(std y) at the end of training; mean ± standard error over splits.", "",
             "| preset | dataset | model | n | ELBO | per point | CNF paper Table I (NF / IPVI) |",
             "|---|---|---|---|---|---|---|"]
    n_train = {(r.get("preset", "?"), r["dataset"]): r["n_train"] for r in rows if "n_train" in r}
    def known_first(model):  # models in `model_order` by their position, then any others by name
        return (model_order.index(model) if model in model_order else len(model_order), model)

    for (preset, ds, model) in sorted(groups, key=lambda k: (k[0], k[1], known_first(k[2]))):
        mean, se, n = mean_se(groups[(preset, ds, model)])
        depth = _deep_depth(model)
        ref = "—"
        if ds == "boston" and depth in CNF_TABLE_I:
            nf, ipvi = CNF_TABLE_I[depth]
            ref = f"{nf:.2f} / {ipvi:.2f}"
        lines.append(f"| {preset} | {ds} | {model} | {n} | {_fmt(mean, se, digits=1)} | "
                     f"{mean / n_train[(preset, ds)]:.3f} | {ref} |")
    lines += ["", "The paper reports the ELBO rising with depth and NF above IPVI on boston (Table I); its "
              "normalisation is not stated, so compare orderings, not levels.", ""]
    return lines


# ----- applications ------------------------------------------------------------------------------------------
def application_summary(rows):
    """{(dataset, preset, protocol): {(fraction, scheme): {model: {metric: (mean, std, n)}}}} over flows/folds/seeds."""
    groups = defaultdict(lambda: defaultdict(list))
    for r in rows:
        groups[(r["dataset"], r.get("preset", "?"), r.get("protocol", "cv"))][
            (r["inducing_fraction"], r["fix_noise_fraction"], r["model"])].append(r)
    out = {}
    for key, g in groups.items():
        table = defaultdict(dict)
        for (frac, scheme, model), rs in g.items():
            table[(frac, scheme)][model] = {k: mean_std([x.get(k) for x in rs]) for k in ("rmse", "nll", "coverage95")}
        out[key] = dict(table)
    return out


def _flow_label(r):
    return "none" if r["model"] == "svgp" else f"{r.get('flow', '?')}:{r.get('flow_init', '?')}"


def _application_markdown(rows, model_order) -> list[str]:
    lines = []
    summary = application_summary(rows)
    for (ds, preset, protocol), table in sorted(summary.items()):
        models = _order([m for v in table.values() for m in v], model_order)
        lines += [f"## Application: {ds} (preset `{preset}`, protocol `{protocol}`)", "",
                  "RMSE mean ± std over flows, folds and seeds (appendix B.5); scheme = fraction of iterations "
                  "with the noise held fixed.", "",
                  "| inducing | scheme | n | " + " | ".join(models) + " |", "|---|---|---|" + "---|" * len(models)]
        for frac, scheme in sorted(table):
            cells = table[(frac, scheme)]
            means = {m: cells[m]["rmse"][0] for m in models if m in cells}
            best = _best(means, "min")
            n = max(cells[m]["rmse"][2] for m in means)
            lines.append(f"| {frac:g} | {scheme:g} | {n} | " + " | ".join(
                _fmt(*cells[m]["rmse"][:2], bold=m in best) if m in cells else "—" for m in models) + " |")
        lines.append("")
        # per-flow breakdown
        per = defaultdict(list)
        for r in rows:
            if r["dataset"] == ds and r.get("preset", "?") == preset and r.get("protocol", "cv") == protocol:
                per[(r["inducing_fraction"], r["fix_noise_fraction"], r["model"], _flow_label(r))].append(r)
        lines += ["Per flow (RMSE / NLL, mean ± std over folds and seeds):", "",
                  "| inducing | scheme | model | flow:init | n | RMSE | NLL | 95% coverage |", "|---|---|---|---|---|---|---|---|"]
        for (frac, scheme, model, flow), rs in sorted(per.items(), key=lambda kv: (kv[0][0], kv[0][1],
                                                                                 _order(models, model_order).index(kv[0][2]) if kv[0][2] in models else 99, kv[0][3])):
            rm, nl, cv = (mean_std([x.get(k) for x in rs]) for k in ("rmse", "nll", "coverage95"))
            lines.append(f"| {frac:g} | {scheme:g} | {model} | {flow} | {rm[2]} | {_fmt(*rm[:2])} | {_fmt(*nl[:2])} | "
                         f"{_fmt(*cv[:2])} |")
        lines.append("")
    return lines


def paper_comparison(rows) -> list[dict]:
    """Our numbers next to the paper's, with the gap in units of the combined standard error."""
    out = []
    apps = [r for r in rows if _is_application(r)]
    bench = [r for r in rows if _is_benchmark(r) and not _is_application(r)]
    for ds, model, flow, size, metric, p_mean, p_std, source in PAPER_REFERENCE:
        if ds in PAPER_RUNS:
            cand = [r for r in apps if r["dataset"] == ds and r["model"] == model and
                    math.isclose(r["inducing_fraction"], size) and (flow is None or _flow_label(r) == flow)]
            group_key = lambda r: (r.get("preset"), r.get("protocol", "cv"), r["fix_noise_fraction"])  # noqa: E731
        else:
            cand = [r for r in bench if r["dataset"] == ds and r["model"] == model and r["num_inducing"] == size]
            group_key = lambda r: (_preset_label(r), None, None)  # noqa: E731
        groups = defaultdict(list)
        for r in cand:
            groups[group_key(r)].append(r)
        for (preset, protocol, scheme), rs in sorted(groups.items(), key=lambda kv: str(kv[0])):
            mean, se, n = mean_se([r.get(metric) for r in rs])
            p_se = p_std / math.sqrt(PAPER_RUNS[ds]) if (p_std is not None and ds in PAPER_RUNS) else 0.0
            gap = (mean - p_mean) / math.sqrt(se ** 2 + p_se ** 2) if (se > 0 or p_se > 0) else float("nan")
            out.append({"dataset": ds, "model": model, "flow": flow or "any", "size": size, "metric": metric,
                        "scheme": scheme, "preset": preset, "protocol": protocol, "ours_mean": mean, "ours_se": se,
                        "n": n, "paper_mean": p_mean, "paper_std": p_std, "gap_in_se": gap, "source": source})
    return out


def _comparison_markdown(comp) -> list[str]:
    if not comp:
        return []
    lines = ["## Against the paper's published numbers", "",
             "gap = (ours − paper) / sqrt(se_ours² + se_paper²), se_paper = std/√10 for the applications "
             "(5 folds × 2 seeds); B.6.3 gives no spread, so there gap uses our se only.", "",
             "| dataset | model | flow | M or fraction | scheme | preset | metric | ours (mean ± se, n) | paper | gap/se | source |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in comp:
        paper = f"{c['paper_mean']:.3f}" + (f" ± {c['paper_std']:.3f} (std)" if c["paper_std"] is not None else "")
        gap = f"{c['gap_in_se']:+.1f}" if np.isfinite(c["gap_in_se"]) else "—"
        scheme = "—" if c["scheme"] is None else f"{c['scheme']:g}"
        lines.append(f"| {c['dataset']} | {c['model']} | {c['flow']} | {c['size']:g} | {scheme} | {c['preset']} | "
                     f"{c['metric']} | {c['ours_mean']:.3f} ± {c['ours_se']:.3f} ({c['n']}) | {paper} | {gap} | "
                     f"{c['source']} |")
    return lines + [""]


def _timing_markdown(rows) -> list[str]:
    from .timing import summarise

    groups = defaultdict(list)
    for r in rows:
        groups[(r["dataset"], r["num_inducing"], r["epochs"], r["batch_size"], r.get("tag", ""))].append(r)
    lines = []
    for (ds, m, epochs, batch, tag), rs in sorted(groups.items(), key=lambda kv: str(kv[0])):
        lines += [f"## Timing: {ds}, M = {m}, {epochs} epochs, batch {batch} {tag}".rstrip(), "",
                  "| model | repeats | train median (s) | ratio | s/epoch | predict median (s) | ratio |",
                  "|---|---|---|---|---|---|---|"]
        for s in summarise(rs):
            lines.append(f"| {s['model']} | {s['repeats']} | {s['train_median_s']:.3f} | {s['train_ratio']:.2f} | "
                         f"{s['train_s_per_epoch']:.4f} | {s['predict_median_s']:.4f} | {s['predict_ratio']:.2f} |")
        lines.append("")
    return lines


# ----- entry points ----------------------------------------------------------------------------------------------
def model_order() -> tuple[str, ...]:
    """The report's model order: the registration order of `flowgp.registry.MODELS` (models not in it follow
    by name)."""
    from . import models

    return tuple(MODELS.names())


def build_report(dirs, out=None, figures: bool = True, command: str | None = None) -> Path:
    """Write report.md, summary.json and PNGs for the rows in `dirs`; returns the report path."""
    from ..reporting.plotting import application_figure, benchmark_figure  # matplotlib only when a report is built

    dirs = [dirs] if isinstance(dirs, (str, Path)) else list(dirs)
    order = model_order()
    rows, dropped = deduplicate(load_rows(dirs))
    if not rows:
        raise ValueError(f"no result rows (*.jsonl) found in {', '.join(map(str, dirs))}")
    if dropped:
        print(f"flowgp bench report: dropped {dropped} duplicate row(s) (same dataset, model, split/fold, preset, "
              "seed, ... as an earlier row; the first is kept)", file=sys.stderr)
    out = Path(out or dirs[0])
    out.mkdir(parents=True, exist_ok=True)
    apps = [r for r in rows if _is_application(r)]
    timing = [r for r in rows if _is_timing(r)]
    bench = [r for r in rows if _is_benchmark(r) and not _is_application(r)]
    lines = ["# flowgp benchmark report", ""]
    if command:
        lines += ["Produced by:", "", "```", command, "```", ""]
    lines += [f"{len(rows)} rows from {', '.join(str(d) for d in dirs)}"
              + (f" ({dropped} duplicate rows dropped: same identity as an earlier row, the first kept)."
                 if dropped else "."), ""]
    summary = {"benchmark": {}, "applications": {}, "comparison": [], "timing": [], "duplicates_dropped": dropped}
    figs = []
    if bench:
        bsum = benchmark_summary(bench)
        lines += _benchmark_markdown(bsum, order)
        for (preset, task), table in bsum.items():
            summary["benchmark"][f"{preset}/{task}"] = [
                {"dataset": ds, "num_inducing": m, "model": mod, **{k: dict(zip(("mean", "se", "n"), v))
                                                                  for k, v in cells.items()}}
                for (ds, m), mods in sorted(table.items()) for mod, cells in mods.items()]
            if figures:
                models = _order([mod for v in table.values() for mod in v], order)
                for metric in (["nll", "rmse", "coverage95"] if task == "regression" else ["nll", "accuracy"]):
                    path = out / f"{task}_{preset}_{metric}.png"
                    nominal = METRICS[metric][1] if isinstance(METRICS[metric][1], float) else None
                    benchmark_figure(table, metric, models, path, f"{METRICS[metric][0]} ({task}, preset {preset})",
                                     AXIS_LABELS[metric], ranks=rankings(table, metric), reference=nominal,
                                     reference_label=None if nominal is None else f"nominal {nominal:g}")
                    figs.append(path.name)
    if apps:
        lines += _application_markdown(apps, order)
        asum = application_summary(apps)
        summary["applications"] = [
            {"dataset": k[0], "preset": k[1], "protocol": k[2], "inducing_fraction": f, "fix_noise_fraction": s,
             "model": mod, **{m: dict(zip(("mean", "std", "n"), v)) for m, v in cells.items()}}
            for k, table in sorted(asum.items()) for (f, s), mods in sorted(table.items()) for mod, cells in mods.items()]
        if figures:
            application_figure(asum, {key: _order([m for v in table.values() for m in v], order)
                                      for key, table in asum.items()}, out / "applications_rmse.png",
                               units=TARGET_UNITS)
            figs.append("applications_rmse.png")
    if bench:
        lines += _elbo_markdown(bench, order)
    comp = paper_comparison(rows)
    summary["comparison"] = comp
    lines += _comparison_markdown(comp)
    if timing:
        lines += _timing_markdown(timing)
    if figs:
        lines += ["## Figures", ""] + [f"![{f}]({f})" for f in figs] + [""]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float) + "\n")
    return path


def run(args) -> int:
    path = build_report(args.dirs, args.out, figures=not args.no_figures, command=args.cmdline)
    print(f"wrote {path}")
    return 0
