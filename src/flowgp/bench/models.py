"""The named models of the CLI and the bench, registered in the one table `flowgp.registry.MODELS`.

Every name the CLI (`flowgp fit --model`, `flowgp demo`), the benchmarks (`flowgp bench uci|timing|
airquality|rainfall|amogp`) and the report know is one `NamedModel` entry of `MODELS`: which estimator it
builds, the arguments the name fixes (`dgp3` fixes layers=3) and the options a caller may set with their
defaults. What the front ends need beyond that is derived from the entry (`budget_rule`, `deep_gp_depth`,
`is_multi_output`), never kept in a second list. Registration order is the report's column order.

    from flowgp.registry import MODELS
    MODELS.get("cnf-dgp3")(num_inducing=50, epochs=10)        # an unfitted DeepGPRegressor(layers=3, ...)
    make_estimator("tgp", get_preset("quick"), 100, 0, 500)   # the same with a bench preset's budget

To add a model, register one more `NamedModel` below (or from your own code: `MODELS.register(name,
NamedModel(...))`); the CLI, the bench and the report pick it up.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping

from ..registry import MODELS

__all__ = ["NamedModel", "make_estimator", "model_names", "supports_task", "budget_rule", "deep_gp_depth",
           "is_multi_output", "UCI_TGP_FLOW", "UCI_TGP_FLOW_INIT"]

# Appendix B.6 selects a flow per dataset on validation splits; the selected flows are not listed, so
# without that search the UCI default is one SAL flow (Table 1) initialised near identity (appendix B.3).
#: the flow of the bench's UCI `tgp` rows
UCI_TGP_FLOW = "sal"
#: how that flow is initialised (appendix B.3: near the identity)
UCI_TGP_FLOW_INIT = "identity"


@dataclass(frozen=True)
class NamedModel:
    """A named model configuration: the estimator it builds, with which fixed and default arguments.

    regressor / classifier: class names in `flowgp.estimators` for task "regression" / "classification"
    (None: the task is not handled); fixed: the arguments the name fixes (`dgp3`: layers=3); defaults: the
    model-specific arguments a caller may set, with their defaults; budget: the bench's rule turning a preset
    into the estimator's shared arguments, budget(preset, num_inducing, seed, num_data, task) -> dict (None:
    derived from the estimator class, see `budget_rule`); meta: anything else a front end needs (the AMO-GP
    bench's training protocol "minibatch").

    Args:
        name: the entry's name ("tgp", "dgp3", ...).
        regressor, classifier: as above.
        fixed, defaults, budget, meta: as above.
        description: one line for `flowgp bench --model` listings.

    See Also:
        :func:`flowgp.bench.models.make_estimator`, :data:`flowgp.registry.MODELS`.
    """

    name: str
    regressor: str | None
    classifier: str | None = None
    fixed: Mapping[str, Any] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    budget: Callable | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    def __post_init__(self):
        for name in ("fixed", "defaults", "meta"):  # read-only views: an entry cannot drift after registration
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(t for t, cls in (("regression", self.regressor), ("classification", self.classifier)) if cls)

    def estimator_class(self, task: str = "regression"):
        from .. import estimators

        name = {"regression": self.regressor, "classification": self.classifier}.get(task)
        if name is None:
            raise ValueError(f"model {self.name!r} does not handle {task}; it handles {', '.join(self.tasks)}")
        return name if isinstance(name, type) else getattr(estimators, name)

    def __call__(self, task: str = "regression", **kwargs):
        """The unfitted estimator: defaults, then `kwargs`, then the fixed arguments (which no caller may
        override: `dgp3` with layers=5 is an error, not a silent 5-layer model)."""
        clash = sorted(k for k in kwargs if k in self.fixed and kwargs[k] != self.fixed[k])
        if clash:
            raise TypeError(f"model {self.name!r} fixes {', '.join(f'{k}={self.fixed[k]!r}' for k in clash)}; "
                            f"choose another name for other values")
        return self.estimator_class(task)(**{**self.defaults, **kwargs, **self.fixed})


# ----- what the front ends read from an entry (any entry with regressor/classifier/fixed/defaults) ----------
def main_class(entry):
    """The estimator class of the entry's first task."""
    return entry.estimator_class(entry.tasks[0])


def is_multi_output(entry) -> bool:
    """Whether the entry's estimator needs an output index (fit(X, y, output)): not a CSV or UCI model.

    Args:
        entry: a :class:`flowgp.bench.models.NamedModel` (an entry of `flowgp.registry.MODELS`).

    See Also:
        :class:`flowgp.AlignedMultiOutputGPRegressor`.
    """
    return "output" in inspect.signature(main_class(entry).fit).parameters


def deep_gp_depth(entry) -> int | None:
    """The number of layers of a deep GP (DSVI or CNF posterior) whose name fixes it, else None.

    Args:
        entry: a :class:`flowgp.bench.models.NamedModel` (an entry of `flowgp.registry.MODELS`).

    See Also:
        :class:`flowgp.DeepGPRegressor` (``layers``).
    """
    from ..estimators import DeepGPClassifier, DeepGPRegressor

    return entry.fixed.get("layers") if issubclass(main_class(entry), (DeepGPRegressor, DeepGPClassifier)) else None


# ----- the bench's budget rules: preset -> the estimator's shared arguments ----------------------------------
def _common(preset, num_inducing, seed, num_data) -> dict:
    return dict(num_inducing=int(num_inducing), seed=int(seed), verbose=False,
                **preset.estimator_kwargs(num_data, int(num_inducing)))


def _classifier_kwargs(preset, num_inducing, seed, num_data) -> dict:
    # Appendix B.6: no noise; the variational covariance is held fixed for the first 2000 of 15000 epochs.
    kw = preset.estimator_kwargs(num_data, int(num_inducing))
    return dict(num_inducing=int(num_inducing), seed=int(seed), verbose=False, epochs=kw["epochs"],
                batch_size=kw["batch_size"], lr=kw["lr"], lengthscale=kw["lengthscale"],
                kmeans_restarts=kw["kmeans_restarts"], quadrature_points=kw["quadrature_points"],
                fix_variance_epochs=int(round(kw["epochs"] * 2000 / 15000)))


def _budget_shallow(preset, num_inducing, seed, num_data, task):
    if task == "classification":
        return _classifier_kwargs(preset, num_inducing, seed, num_data)
    return _common(preset, num_inducing, seed, num_data)


def _budget_input_dependent(preset, num_inducing, seed, num_data, task):
    # (appendix B.6): the networks are fitted to the identity-initialised flow for 2000 epochs under
    # `paper`, fewer under cheaper presets.
    common = _common(preset, num_inducing, seed, num_data)
    return {**common, "flow_init_epochs": 2000 if preset.name == "paper" else max(1, min(100, common["epochs"]))}


def _budget_deep(preset, num_inducing, seed, num_data, task):
    if task == "classification":
        common = _classifier_kwargs(preset, num_inducing, seed, num_data)
        common.pop("fix_variance_epochs")  # the deep-GP classifier trains everything from the start
        return common
    return _common(preset, num_inducing, seed, num_data)


def _budget_latent(preset, num_inducing, seed, num_data, task):
    # Supplement E.2 settings where the preset does not fix them: likelihood variance 0.01, PCA linear means,
    # hidden width 5; the preset gives the budget, minibatch, Adam step and k-means restarts.
    common = _common(preset, num_inducing, seed, num_data)
    keep = ("num_inducing", "seed", "verbose", "epochs", "batch_size", "lr", "kmeans_restarts")
    kwargs = {**{k: common[k] for k in keep}, "noise": 0.01}
    if preset.protocol == "reference":
        # supplement E.2 and the authors' run script (experiments/run_conditional_density_estimation.py
        # in hughsalimbeni/DGPs_with_IWVI): hidden layers = fixed projection of 5 GPs + the inputs, natural
        # gradients (0.01) on the last layer's q(u) whose S starts at I, hidden q_sqrt scaled by 1e-5 (S = 1e-10 I),
        # hidden kernel variances fixed at 1; Adam 0.005 and both steps x0.98 per 1000 iterations
        kwargs.update(hidden_layer="concat", natgrad=True, natgrad_lr=0.01, lr_decay=0.98, q_var_init=1.0,
                      hidden_q_var_init=1e-10, learn_hidden_variance=False)
    if preset.num_importance is not None:
        kwargs["num_importance"] = preset.num_importance
    return kwargs


def budget_rule(entry):
    """The bench's budget rule of an entry: its own `budget`, else the rule of its estimator class (None:
    not a `flowgp bench uci` model).

    Args:
        entry: a :class:`flowgp.bench.models.NamedModel` (an entry of `flowgp.registry.MODELS`).

    See Also:
        :func:`flowgp.bench.models.make_estimator`.
    """
    from ..estimators import DeepGPClassifier, DeepGPRegressor, LatentDeepGPRegressor

    own = getattr(entry, "budget", None)
    if own is not None or is_multi_output(entry):
        return own
    cls = main_class(entry)
    if issubclass(cls, LatentDeepGPRegressor):
        return _budget_latent
    if issubclass(cls, (DeepGPRegressor, DeepGPClassifier)):
        return _budget_deep
    if entry.fixed.get("input_dependent"):
        return _budget_input_dependent
    return _budget_shallow


# ----- registrations (registration order = the report's column order) --------------------------------------
_FLOW_OPTIONS = {"flow": UCI_TGP_FLOW, "flow_init": UCI_TGP_FLOW_INIT}
_DEEP_OPTIONS = {"num_samples_train": 1, "num_samples_predict": 100}
# (appendix B.6): PE-TGP and BA-TGP share the architecture and the training (standard dropout, one
# W draw per step, weight decay λ = 1e-5); PE predicts with one deterministic pass, BA with 100 MC-dropout
# draws (eq. 20). The appendix searched {1, 2} hidden layers x {25, 50} units x dropout {0.25, 0.5, 0.75} x
# ReLU/tanh on validation splits without listing the choices; the defaults are the (50,), ReLU, 0.25.
# Only the sinh-arcsinh of the SAL flow is input-dependent.
_INPUT_DEPENDENT_OPTIONS = {**_FLOW_OPTIONS, "hidden": (50,), "activation": "relu", "dropout": 0.25,
                            "mc_samples_train": 1, "mc_samples_predict": 100, "prior_precision": 1e-5,
                            "flow_init_epochs": 100}


def _builtins() -> list:
    entries = [
        NamedModel("svgp", "SVGPRegressor", "SVGPClassifier", description="sparse variational GP"),
        NamedModel("tgp", "TGPRegressor", "TGPClassifier", defaults=_FLOW_OPTIONS,
                   description="transformed GP (marginal flow on f)"),
        NamedModel("wgp", "WarpedGPRegressor", defaults=_FLOW_OPTIONS, description="variational warped GP (flow on y)"),
        *[NamedModel(name, "TGPRegressor", fixed={"input_dependent": True, "bayesian": bayesian},
                     defaults=_INPUT_DEPENDENT_OPTIONS, description=f"input-dependent TGP ({bayesian} network weights)")
          for name, bayesian in (("pe-tgp", "point"), ("ba-tgp", "mc_dropout"))],
        # DSVI deep GPs and CNF-DGPs with 2-5 layers
        *[NamedModel(f"{prefix}{n}", "DeepGPRegressor", "DeepGPClassifier", fixed={"layers": n, "posterior": posterior},
                     defaults=_DEEP_OPTIONS, description=f"{n}-layer deep GP, {posterior} q(U)")
          for prefix, posterior in (("dgp", "gaussian"), ("cnf-dgp", "cnf")) for n in range(2, 6)],
        # cnf-dgpL is the Gaussian-base flow (per-point draws); the paper's exact design (diagonal base
        # from φ(Z), one shared draw of U) is cnf-paper-dgpL (the cnf-dgpL rows of results earlier)
        *[NamedModel(f"cnf-paper-dgp{n}", "DeepGPRegressor", "DeepGPClassifier",
                     fixed={"layers": n, "posterior": "cnf-paper"}, defaults=_DEEP_OPTIONS,
                     description=f"{n}-layer deep GP, the CNF paper's q(U) (shared draws)") for n in range(2, 6)],
        # latent-variable deep GPs with 1-4 layers, REG or DREG q(z) gradients (names in sorted order);
        # "dreg-d23", the supplement's eq. D.23 taken literally (an ablation: cross terms weighted as own);
        # since 2026-11-28 "dreg" is D.23's form through each slot's conditional (unbiased with joint draws) and the
        # former "dreg" (the joint draw's ε held fixed, cross terms kept) is "dreg-eps"
        *[NamedModel(f"ldgp{n}-{g}", "LatentDeepGPRegressor", fixed={"layers": n, "gradient": g},
                     defaults={"num_importance": 5, "num_samples_predict": 10000},
                     description=f"{n}-layer latent-variable deep GP, IWVI with {g}")
          for n in range(1, 5) for g in ("dreg", "dreg-d23", "dreg-eps", "reg")],
        # the DREG authors' published training objective (their Table 1): hidden layers drawn per slot, NOT a bound
        # (flowgp.models.latent.model); its rows record `train_objective`, never `train_elbo`. Every DREG name is
        # eq. D.23 exactly under per-slot draws, so only "dreg" and "reg"; a one-layer model has no hidden layer
        *[NamedModel(f"ldgp{n}-{g}-per-slot", "LatentDeepGPRegressor",
                     fixed={"layers": n, "gradient": g, "objective": "per-slot"},
                     defaults={"num_importance": 5, "num_samples_predict": 10000},
                     description=f"{n}-layer latent-variable deep GP, {g}, the DREG authors' per-slot objective "
                                 "(not a bound)")
          for n in range(2, 5) for g in ("dreg", "reg")],
        # the CLI's deep models, depth and q(U) family / q(z) gradient as options (`flowgp fit --model dgp --layers 3`)
        NamedModel("dgp", "DeepGPRegressor", "DeepGPClassifier",
                   defaults={"layers": 2, "posterior": "gaussian", **_DEEP_OPTIONS},
                   description="deep GP, depth and q(U) family as options"),
        NamedModel("ldgp", "LatentDeepGPRegressor",
                   defaults={"layers": 2, "num_importance": 5, "gradient": "dreg", "objective": "bound",
                             "num_samples_predict": 10000},
                   description="latent-variable deep GP, depth as an option"),
    ]
    # AMO-GP and its ablations (alignment / warping layers); the bench trains "minibatch" models in
    # minibatches for its --epochs, the others full batch for --baseline-epochs
    for name, alignment, warping, minibatch in (
            ("amogp", "gp", "gp", True), ("amogp-aligned", "gp", "identity", True),
            ("amogp-warped", "identity", "gp", True), ("mogp-minibatch", "identity", "identity", True),
            ("amogp-fullbatch", "gp", "gp", False), ("mogp", "identity", "identity", False)):
        entries.append(NamedModel(name, "AlignedMultiOutputGPRegressor",
                                  fixed={"alignment": alignment, "warping": warping}, meta={"minibatch": minibatch},
                                  description=f"aligned multi-output GP (alignment {alignment}, warping {warping})"))
    return entries


for _entry in _builtins():
    if _entry.name not in MODELS:  # importing this module again (importlib.reload) registers nothing twice
        MODELS.register(_entry.name, _entry)


# ----- the bench's view of the table --------------------------------------------------------------------------
def model_names() -> list[str]:
    """Names `make_estimator` builds (entries with a bench budget rule), in registration order.

    See Also:
        :func:`flowgp.bench.models.make_estimator`.
    """
    return [n for n in MODELS.names() if budget_rule(MODELS.get(n)) is not None]


def supports_task(name: str, task: str) -> bool:
    """Whether the bench model `name` handles `task` ("regression" or "classification").

    Args:
        name: a bench model's name.
        task: "regression" or "classification".

    See Also:
        :func:`flowgp.bench.models.model_names`.
    """
    return name in model_names() and task in MODELS.get(name).tasks


def make_estimator(name: str, preset, num_inducing: int, seed: int, num_data: int, task: str = "regression",
                   threads=None, **options):
    """Build the unfitted estimator `name` with the budget of `preset` for a training set of `num_data` points.

    `options` are the entry's model-specific options (e.g. `flow`, `flow_init` for tgp); any other keyword is
    a TypeError naming the ones it takes.

    Args:
        name: a name of :func:`flowgp.bench.models.model_names`.
        preset: a :class:`flowgp.bench.presets.Preset`.
        num_inducing: M.
        seed: the estimator's seed.
        num_data: N, the size of the training set.
        task: "regression" (default) or "classification".
        threads: the estimator's `threads` (the bench's --threads; None: the estimator's default).
        **options: as above.

    Examples:
        >>> from flowgp.bench.models import make_estimator
        >>> from flowgp.bench.presets import get_preset
        >>> est = make_estimator("tgp", get_preset("tiny"), num_inducing=10, seed=0, num_data=100)
        >>> type(est).__name__, est.num_inducing
        ('TGPRegressor', 10)
    """
    if name not in model_names():
        raise ValueError(f"unknown model '{name}'; choose from {', '.join(model_names())}")
    if int(num_inducing) < 1:
        raise ValueError(f"num_inducing must be >= 1, got {num_inducing}")
    if not supports_task(name, task):
        raise ValueError(f"model '{name}' does not handle {task}; models that do: "
                         f"{', '.join(m for m in model_names() if supports_task(m, task))}")
    entry = MODELS.get(name)
    unknown = sorted(set(options) - set(entry.defaults))
    if unknown:
        takes = f"only the options {', '.join(entry.defaults)}" if entry.defaults else "no options"
        raise TypeError(f"{name} takes {takes}, got {unknown}")
    extra = {} if threads is None else {"threads": threads}
    return entry(task, **{**budget_rule(entry)(preset, num_inducing, seed, num_data, task), **options, **extra})
