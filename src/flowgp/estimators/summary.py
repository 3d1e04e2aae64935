"""What a fitted estimator learned, in the data's units: `est.summary()` (a table) and `est.summary(as_dict=True)`.

The models train on standardised data: inputs x̃_d = (x_d - mean_d) / std_d, targets ỹ = (y - shift) / scale
(`Estimator.fit_input_scaling`, the regressors' `y_shift_` / `y_scale_`). A parameter is reported in the units
of what it measures, undoing that standardisation:

- a lengthscale or period of a kernel on the inputs: ℓ_d · std_d, in the units of input d (a periodic kernel's
  lengthscale divides sin(π r / p) and has no units);
- a kernel variance or noise variance of a GP whose values are the standardised targets: σ² · scale², in the
  units of y squared; of a latent GP (a TGP's f₀, a classifier's latent, a v-WGP's z = T(ỹ), a hidden layer),
  as the model has it, named as such;
- a flow's parameters as the flow has them, with the map between its output and y stated beside them.

The training section gives the inducing points, the epochs run and the training bound per point in the units of
y (the robust fits' full-data bound, otherwise the last epoch's mean of the minibatch bounds). The latent deep
GP's objective="per-slot" is not a bound and is named as what it is.

Rows are `Entry(section, name, value, units)`; a value per input is a dict {feature name: value}, the names
being `feature_names_in_` (or the streamed fit's `feature_names_`) when the estimator has them, else x0, x1, ...
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..flows import Compose, Flow
from ..flows.conditional import input_dependent_flows, static_flow
from ..gp.kernels import Kernel, Linear, Periodic
from ..models import SVGP, TGP, DeepGP, WarpedGP
from ..models.amogp.model import AMOGP
from ..models.latent import LatentDeepGP

__all__ = ["Entry", "FitSummary", "summarize", "fitted_entries"]

_Y2 = "y's units²"
_LATENT = "latent f₀ (dimensionless)"


@dataclass(frozen=True)
class Entry:
    """One row of a summary: `value` is a number, a string, or a dict {input name: number} (then `units` is a
    dict {input name: units} too)."""

    section: str
    name: str
    value: Any
    units: str = ""


class FitSummary:
    """A fitted estimator's summary: `str()` / `repr()` is the table, `to_dict()` the nested dict
    {section: {name: value}, ..., "units": {section: {name: units}}} with "estimator" the class name."""

    def __init__(self, estimator: str, entries: list, headline: str = ""):
        self.estimator, self.entries, self.headline = estimator, list(entries), headline

    def to_dict(self) -> dict:
        out: dict = {"estimator": self.estimator}
        units: dict = {}
        for e in self.entries:
            out.setdefault(e.section, {})[e.name] = e.value
            if e.units:
                units.setdefault(e.section, {})[e.name] = e.units
        out["units"] = units
        return out

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(section, parameter, value, units) as text, a value per input spread over one row per input."""
        rows = []
        for e in self.entries:
            if isinstance(e.value, dict):
                for key, v in e.value.items():
                    units = e.units.get(key, "") if isinstance(e.units, dict) else e.units
                    rows.append((e.section, f"{e.name}[{key}]", _fmt(v), units))
            else:
                rows.append((e.section, e.name, _fmt(e.value), e.units))
        return rows

    def __str__(self) -> str:
        rows = self.rows()
        header = ("section", "parameter", "value", "units")
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
        lines = [f"{self.estimator}, fitted" + (f" ({self.headline})" if self.headline else "")]
        lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
        lines.append("  ".join("-" * w for w in widths))
        previous = None
        for row in rows:
            section = row[0] if row[0] != previous else ""
            previous = row[0]
            lines.append("  ".join(c.ljust(w) for c, w in zip((section, *row[1:]), widths)).rstrip())
        return "\n".join(lines)

    __repr__ = __str__


def _fmt(value) -> str:
    if isinstance(value, (bool, np.bool_)) or isinstance(value, str):
        return str(value)
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return f"{float(value):.6g}"


def _number(t):
    """A tensor as a float (one element) or a list of floats."""
    values = torch.as_tensor(t).detach().cpu().double().reshape(-1).tolist()
    return values[0] if len(values) == 1 else values


# ----- the inputs ---------------------------------------------------------------------------------------------
def input_names(est) -> list[str]:
    """The estimator's input names: feature_names_in_, a streamed fit's feature_names_, else x0, x1, ..."""
    for attribute in ("feature_names_in_", "feature_names_"):
        names = getattr(est, attribute, None)
        if names is not None and len(names) == est.n_features_in_:
            return [str(n) for n in names]
    return [f"x{i}" for i in range(est.n_features_in_)]


@dataclass(frozen=True)
class _Inputs:
    """What a kernel's input columns are: the first len(names) are the estimator's inputs (scaled by `scales`),
    the rest `other` columns (a latent input or a hidden layer's outputs, named other0, other1, ...)."""

    names: tuple = ()
    scales: tuple = ()
    other: str = "h"
    other_units: str = "hidden layer's units"

    def columns(self, count: int):
        """(name, scale, units) of `count` input columns."""
        out = []
        for d in range(count):
            if d < len(self.names):
                out.append((self.names[d], float(self.scales[d]), f"{self.names[d]}'s units"))
            else:
                out.append((f"{self.other}{d - len(self.names)}", 1.0, self.other_units))
        return out


def _observed(est) -> _Inputs:
    return _Inputs(tuple(input_names(est)), tuple(np.asarray(est.x_std_, dtype=float)))


# ----- kernels ------------------------------------------------------------------------------------------------
def _kernel_parts(kernel: Kernel):
    """(label, module, [its own positive parameters]) of every part of `kernel` that has some. A Scale and its
    base are one part; labels are the parts' spec names, numbered where two parts share one (rbf+rbf)."""
    parts = []
    for module in kernel.modules():
        if isinstance(module, Kernel):
            own = {name for name, _ in module.named_parameters(recurse=False)}
            names = [p for p in ("lengthscale", "period", "variance") if f"raw_{p}" in own]
            if names:
                parts.append((module, names))
    owner = {id(m.base): m for m, _ in parts if isinstance(getattr(m, "base", None), Kernel)}
    components = [owner.get(id(m), m) for m, _ in parts]
    distinct: dict = {}
    for c in components:
        distinct.setdefault(c.spec, [])
        if not any(c is seen for seen in distinct[c.spec]):
            distinct[c.spec].append(c)
    out = []
    for (module, names), c in zip(parts, components):
        same = distinct[c.spec]
        label = c.spec if len(same) == 1 else f"{c.spec}#{next(i for i, s in enumerate(same) if s is c) + 1}"
        out.append((label, module, names))
    return out


def kernel_entries(kernel: Kernel, section: str, inputs: _Inputs, variance_scale: float, variance_units: str,
                   batch_index=None) -> list[Entry]:
    """The kernel's lengthscales and periods per input (in the inputs' units) and variances (times
    `variance_scale`, in `variance_units`); `batch_index`: which GP of a batch of GPs (None: a single one)."""
    parts = _kernel_parts(kernel)
    several = len({label for label, _, _ in parts}) > 1
    out = []
    for label, module, names in parts:
        for name in names:
            value = getattr(module, name).detach().double().cpu()
            if batch_index is not None:
                value = value[batch_index]
            key = f"{label} {name}" if several else name
            if name == "variance":
                scale, units = (1.0, "per standardised input²") if isinstance(module, Linear) else \
                    (variance_scale, variance_units)
                out.append(Entry(section, key, _number(value) * scale if value.numel() == 1 else
                                 [v * scale for v in value.reshape(-1).tolist()], units))
                continue
            columns = value.reshape(-1).tolist()
            count = module.input_dim if module.input_dim is not None else len(columns)
            columns = columns * count if len(columns) == 1 else columns
            unitless = isinstance(module, Periodic) and name == "lengthscale"
            values, units = {}, {}
            for (column, scale, unit), v in zip(inputs.columns(count), columns):
                values[column] = v if unitless else v * scale
                units[column] = "dimensionless" if unitless else unit
            out.append(Entry(section, key, values, units))
    return out


# ----- flows --------------------------------------------------------------------------------------------------
def flow_entries(flow: Flow, section: str = "flow") -> list[Entry]:
    """The flow's spec and its parameters (as the flow has them); for input-dependent stages, their networks."""
    out = [Entry(section, "spec", flow.spec)]
    dependent = input_dependent_flows(flow)
    if dependent:
        weights = sum(p.numel() for stage in dependent for p in stage.parameters())
        out.append(Entry(section, "input-dependent stages", ", ".join(s.spec for s in dependent)))
        out.append(Entry(section, "parameters (networks and shared)", int(weights)))
        return out
    stages = list(flow.flows) if isinstance(flow, Compose) else [flow]
    params = flow.params()
    labels = [s.spec for s in stages]
    for i, stage in enumerate(stages):
        values = params[str(i)] if isinstance(flow, Compose) else params
        label = labels[i] if labels.count(labels[i]) == 1 else f"{labels[i]}#{i + 1}"
        prefix = f"{label}." if len(stages) > 1 else ""
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                out.append(Entry(section, prefix + name, _number(value)))
    return out


def _static(flow: Flow) -> Flow:
    return flow if input_dependent_flows(flow) else static_flow(flow)


# ----- the training -------------------------------------------------------------------------------------------
def training_entries(est, num_inducing, y_scale: float | None = None, bound_name: str = "bound per point",
                     bound_units: str = "nats, y's units") -> list[Entry]:
    """Inducing points, epochs run and the training bound per point (in y's units when `y_scale` is given)."""
    out = [Entry("training", "inducing points", num_inducing)]
    history = list(getattr(est, "history_", []) or [])
    report = getattr(est, "fit_report_", None) or {}
    if "svgp_epochs" in report:
        out.append(Entry("training", "epochs run (SVGP stage)", int(report["svgp_epochs"])))
        out.append(Entry("training", "epochs run (flow model)", len(history)))
    else:
        out.append(Entry("training", "epochs run", len(history)))
    if "bound" in report:
        out.append(Entry("training", bound_name, float(report["bound"]), bound_units + " (full-data bound)"))
    elif history and math.isfinite(history[-1]):
        value = -float(history[-1]) - (math.log(y_scale) if y_scale else 0.0)
        out.append(Entry("training", bound_name, value, bound_units + " (last epoch's mean)"))
    return out


def _noise(likelihood):
    """The Gaussian noise variance of a likelihood (a warped likelihood's base), None where there is none."""
    base = getattr(likelihood, "base", likelihood)
    noise = getattr(base, "noise", None)
    return None if noise is None else _number(noise)


# ----- one function per model family ----------------------------------------------------------------------------
def _sparse_entries(est) -> list[Entry]:
    """SVGP, TGP and v-WGP regressors, and the sparse GP classifiers (one GP on the inputs, maybe a flow)."""
    model = est.model_
    y_scale = getattr(est, "y_scale_", None)
    gp = model.gp
    if isinstance(model, TGP):
        variance, noise_units = (1.0, _LATENT), _Y2
    elif isinstance(model, WarpedGP):
        variance = (1.0, "z = T(ỹ) (warped, dimensionless)")
        noise_units = variance[1]
    elif isinstance(model, SVGP):
        variance, noise_units = (y_scale ** 2, _Y2), _Y2
    else:  # a classifier's latent
        variance, noise_units = (1.0, "latent (dimensionless)"), None
    out = training_entries(est, int(gp.inducing_points.shape[-2]), y_scale,
                           bound_units="nats, y's units" if y_scale is not None else "nats")
    for l in range(int(gp.q_mu.shape[0])) if gp.q_mu.shape[0] > 1 and gp.kernel.batch_shape else [None]:
        section = "kernel" if l is None else f"kernel (latent {l})"
        out += kernel_entries(gp.kernel, section, _observed(est), *variance, batch_index=l)
    noise = _noise(getattr(model, "likelihood", None))
    if noise is not None and noise_units is not None:
        scale = y_scale ** 2 if noise_units == _Y2 else 1.0
        out.append(Entry("likelihood", "noise variance", noise * scale if not isinstance(noise, list)
                         else [v * scale for v in noise], noise_units))
    flow = getattr(model, "flow", None)
    if isinstance(flow, Flow) and not flow.is_identity:
        out += flow_entries(_static(flow))
        if isinstance(model, WarpedGP):
            out.append(Entry("flow", "acts on", f"ỹ = (y - {est.y_shift_:.6g}) / {y_scale:.6g}: z = T(ỹ)"))
        elif y_scale is not None:
            out.append(Entry("flow", "output map", f"y = {est.y_shift_:.6g} + {y_scale:.6g} · G(f₀)"))
    return out


def _layer_entries(est, layers, last_variance: tuple, first_inputs: _Inputs) -> list[Entry]:
    out = []
    for i, layer in enumerate(layers):
        gp = getattr(layer, "gp", None)
        if gp is None:
            continue
        inputs = first_inputs if i == 0 else _Inputs()
        last = i == len(layers) - 1
        variance = last_variance if last else (1.0, f"layer {i + 1}'s outputs (hidden units)")
        width = int(gp.q_mu.shape[0])
        for l in range(width) if width > 1 and gp.kernel.batch_shape else [None]:
            section = f"layer {i + 1}" + ("" if l is None else f", GP {l + 1}")
            out += kernel_entries(gp.kernel, section, inputs, *variance, batch_index=l)
    return out


def _deep_entries(est) -> list[Entry]:
    """Deep GP regressor and classifier (DSVI, CNF posteriors) and the latent-variable deep GP."""
    model = est.model_
    y_scale = getattr(est, "y_scale_", None)
    per_slot = getattr(est, "objective", "bound") == "per-slot"
    out = training_entries(est, [int(layer.gp.inducing_points.shape[-2]) for layer in model.layers
                                 if getattr(layer, "gp", None) is not None], y_scale,
                           "objective per point (not a bound)" if per_slot else "bound per point",
                           "nats, y's units" if y_scale else "nats")
    out.insert(0, Entry("training", "layers", len(model.layers)))
    inputs = _observed(est)
    latent_dim = getattr(model, "latent_dim", None)
    if latent_dim:
        inputs = _Inputs(inputs.names, inputs.scales, "w", "latent input w ~ N(0, I) (dimensionless)")
    regression = y_scale is not None
    last = (y_scale ** 2, _Y2) if regression else (1.0, "latent (dimensionless)")
    out += _layer_entries(est, list(model.layers), last, inputs)
    noise = _noise(getattr(model, "likelihood", None))
    if noise is not None and regression:
        out.append(Entry("likelihood", "noise variance", noise * y_scale ** 2, _Y2))
    posterior = getattr(est, "posterior", None)
    if posterior is not None:
        out.append(Entry("posterior", "q(U) family", str(posterior)))
        selection = getattr(est, "flow_strength_", None)
        if isinstance(selection, dict) and "selected" in selection:
            out.append(Entry("posterior", "flow strength kept", float(selection["selected"]),
                             "0 = the Gaussian base, 1 = the trained flow"))
            out.append(Entry("posterior", "flow kept from", str(selection.get("source", "trained"))))
    return out


def _amogp_entries(est) -> list[Entry]:
    """AMO-GP: per output, the alignment GP (input's units), the CP layer's smoothing, the warping GP and the noise."""
    model = est.model_
    x_std = float(np.asarray(est.x_std_).reshape(-1)[0])
    y_std = np.asarray(est.y_std_, dtype=float).reshape(-1)
    out = training_entries(est, int(model.latent.z.shape[-2]), None, "bound per point",
                           "nats per point, standardised outputs")
    out.append(Entry("training", "outputs", int(model.num_outputs)))
    name = input_names(est)[0]
    cp_ls = model.kernel.lengthscale.detach().double()  # [D, R, 1]
    cp_var = model.kernel.variance.detach().double()  # [D, R]
    warped = "latent f (dimensionless)" if model.warping else "y_d's units²"
    for d in range(model.num_outputs):
        section = f"output {d}"
        out.append(Entry(section, "CP smoothing lengthscale", _number(cp_ls[d, :, 0] * x_std), f"{name}'s units"))
        out.append(Entry(section, "CP variance", _number(cp_var[d] * (1.0 if model.warping else y_std[d] ** 2)),
                         warped))
        if model.alignment:
            var, ls = (t.detach().double()[d] for t in _pair(model.align_kernel))
            out.append(Entry(section, "alignment lengthscale", float(ls) * x_std, f"{name}'s units"))
            out.append(Entry(section, "alignment variance", float(var) * x_std ** 2, f"{name}'s units²"))
            out.append(Entry(section, "alignment noise", float(model.alignment_noise.detach()[d]) * x_std ** 2,
                             f"{name}'s units²"))
        if model.warping:
            var, ls = (t.detach().double()[d] for t in _pair(model.warp_kernel))
            out.append(Entry(section, "warping lengthscale", float(ls), "latent f (dimensionless)"))
            out.append(Entry(section, "warping variance", float(var) * y_std[d] ** 2, "y_d's units²"))
        out.append(Entry(section, "noise variance", float(model.noise.detach()[d]) * y_std[d] ** 2, "y_d's units²"))
        out.append(Entry(section, "offset", float(model.offset.detach()[d]) * y_std[d], "y_d's units, from its mean"))
    return out


def _pair(kernel):
    """(variance [D], lengthscale [D]) of a batch of one-input SE kernels (Scale(RBF))."""
    return kernel.variance.reshape(-1), kernel.base.lengthscale.reshape(-1)


def fitted_entries(est) -> list[Entry]:
    """Every row of `est`'s summary (the estimator fitted)."""
    est.check_fitted()
    model = est.model_
    if isinstance(model, (DeepGP, LatentDeepGP)):
        return _deep_entries(est)
    if isinstance(model, AMOGP):
        return _amogp_entries(est)
    if hasattr(model, "gp"):
        return _sparse_entries(est)
    raise TypeError(f"no summary for a {type(model).__name__} model")


def summarize(est, as_dict: bool = False):
    """`est.summary()`: a FitSummary (printed as a table), or with `as_dict` its dict."""
    entries = fitted_entries(est)
    details = [f"{k} {v!r}" for k in ("flow", "kernel", "posterior") if isinstance(v := est.get_params().get(k), str)]
    summary = FitSummary(type(est).__name__, entries, ", ".join(details))
    return summary.to_dict() if as_dict else summary
