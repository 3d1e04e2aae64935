"""The named model configurations of the CLI and the bench, registered in `flowgp.registry.MODELS` (one place).

Each entry is a `NamedModel`: calling it returns an unfitted estimator,

    from flowgp.registry import MODELS
    est = MODELS.create("cnf-dgp3", task="regression", num_inducing=100, epochs=500, seed=0)
    MODELS.get("ldgp2-dreg").parameters("regression")   # the keyword arguments it accepts

Factory signature: ``entry(task="regression", **params) -> estimator``. `params` are constructor arguments
of the estimator class (`entry.estimator_class(task)`); the settings that define the name (`entry.fixed`,
e.g. layers=3 for "dgp3") cannot be overridden (TypeError), the name's defaults (`entry.defaults`) can.
A task the entry does not handle, or an argument its estimator does not take, is a ValueError / TypeError
naming the alternatives. A user registers their own with `MODELS.register("mine", NamedModel(...))`.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field

from ..registry import MODELS
from .classification import SVGPClassifier, TGPClassifier
from .deep import DeepGPClassifier, DeepGPRegressor
from .latent import LatentDeepGPRegressor
from .multioutput import AlignedMultiOutputGPRegressor
from .regression import SVGPRegressor, TGPRegressor, WarpedGPRegressor

__all__ = ["NamedModel", "TASKS"]

TASKS = ("regression", "classification")


@dataclass(frozen=True)
class NamedModel:
    """A named estimator configuration: the estimator class per task, the settings that define the name
    (`fixed`) and overridable defaults (`defaults`), each a dict per task or shared by all tasks."""

    name: str
    regressor: type | None = None
    classifier: type | None = None
    fixed: dict = field(default_factory=dict)
    defaults: dict = field(default_factory=dict)
    classifier_fixed: dict | None = None
    classifier_defaults: dict | None = None
    description: str = ""

    @property
    def tasks(self) -> tuple[str, ...]:
        """The tasks this entry builds estimators for."""
        return tuple(t for t, cls in zip(TASKS, (self.regressor, self.classifier)) if cls is not None)

    def estimator_class(self, task: str = "regression") -> type:
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        cls = self.regressor if task == "regression" else self.classifier
        if cls is None:
            raise ValueError(f"model {self.name!r} does not handle {task}; it handles {', '.join(self.tasks)}")
        return cls

    def _settings(self, task: str) -> tuple[dict, dict]:
        if task == "classification":
            fixed = self.fixed if self.classifier_fixed is None else self.classifier_fixed
            defaults = self.defaults if self.classifier_defaults is None else self.classifier_defaults
            return dict(fixed), dict(defaults)
        return dict(self.fixed), dict(self.defaults)

    def parameters(self, task: str = "regression") -> tuple[str, ...]:
        """Constructor arguments a caller may pass for `task` (those fixed by the name left out)."""
        cls = self.estimator_class(task)
        fixed, _ = self._settings(task)
        names = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        return tuple(p for p in names if p not in fixed)

    def __call__(self, task: str = "regression", **params):
        cls = self.estimator_class(task)
        fixed, defaults = self._settings(task)
        clash = sorted(k for k in params if k in fixed and params[k] != fixed[k])
        if clash:
            raise TypeError(f"model {self.name!r} fixes {', '.join(f'{k}={fixed[k]!r}' for k in clash)}; "
                            "choose another name for other values")
        allowed = set(self.parameters(task)) | set(fixed)
        unknown = sorted(set(params) - allowed)
        if unknown:
            raise TypeError(f"model {self.name!r} ({cls.__name__}) takes no options {unknown}; "
                            f"valid: {', '.join(self.parameters(task))}")
        return cls(**{**defaults, **params, **fixed})


# Issue 5 (TGP appendix B.6): PE-TGP and BA-TGP share the architecture and the training (standard dropout,
# one W draw per step, weight decay λ = 1e-5); PE predicts with one deterministic pass, BA with 100
# MC-dropout draws (eq. 20). Only the sinh-arcsinh of the SAL flow is input-dependent.
_INPUT_DEPENDENT = dict(flow="sal", flow_init="identity", hidden=(50,), activation="relu", dropout=0.25,
                        mc_samples_train=1, mc_samples_predict=100, prior_precision=1e-5)


def _register_all() -> None:
    entries = [
        NamedModel("svgp", SVGPRegressor, SVGPClassifier, description="sparse variational GP (Hensman et al.)"),
        NamedModel("tgp", TGPRegressor, TGPClassifier, defaults=dict(flow="sal", flow_init="identity"),
                   description="transformed GP with a marginal flow (TGP paper §3-4)"),
        NamedModel("wgp", WarpedGPRegressor, defaults=dict(flow="sal", flow_init="identity"),
                   description="variational warped GP, v-WGP (TGP paper §4.3)"),
        NamedModel("pe-tgp", TGPRegressor, fixed=dict(input_dependent=True, bayesian="point"),
                   defaults=_INPUT_DEPENDENT, description="point-estimate input-dependent TGP (§4.4)"),
        NamedModel("ba-tgp", TGPRegressor, fixed=dict(input_dependent=True, bayesian="mc_dropout"),
                   defaults=_INPUT_DEPENDENT, description="Bayesian (MC dropout) input-dependent TGP (§4.4)"),
        NamedModel("vb-tgp", TGPRegressor, fixed=dict(input_dependent=True, bayesian="vb"),
                   defaults={**_INPUT_DEPENDENT, "dropout": 0.0, "prior_precision": None},
                   description="input-dependent TGP with mean-field q(W) (appendix B.6.3)"),
        NamedModel("dgp", DeepGPRegressor, DeepGPClassifier, description="deep GP, any depth and posterior"),
        *[NamedModel(f"dgp{n}", DeepGPRegressor, DeepGPClassifier, fixed=dict(layers=n, posterior="gaussian"),
                     description=f"{n}-layer DSVI deep GP") for n in range(2, 6)],
        *[NamedModel(f"cnf-dgp{n}", DeepGPRegressor, DeepGPClassifier, fixed=dict(layers=n, posterior="cnf"),
                     description=f"{n}-layer deep GP with the CNF posterior") for n in range(2, 6)],
        NamedModel("ldgp", LatentDeepGPRegressor, description="latent-variable deep GP (IWVI)"),
        *[NamedModel(f"ldgp{n}-{g}", LatentDeepGPRegressor, fixed=dict(layers=n, gradient=g),
                     defaults=dict(num_importance=5, num_samples_predict=1000, noise=0.01),
                     description=f"{n}-layer latent deep GP, {g.upper()} q(z) gradient")
          for n in range(1, 5) for g in ("reg", "dreg")],
        NamedModel("amogp", AlignedMultiOutputGPRegressor, fixed=dict(alignment="gp", warping="gp"),
                   description="aligned warped multi-output GP (Kaiser et al. 2018)"),
        NamedModel("amogp-aligned", AlignedMultiOutputGPRegressor, fixed=dict(alignment="gp", warping="identity"),
                   description="AMO-GP without the warping layer"),
        NamedModel("amogp-warped", AlignedMultiOutputGPRegressor, fixed=dict(alignment="identity", warping="gp"),
                   description="AMO-GP without the alignment layer"),
        NamedModel("mogp", AlignedMultiOutputGPRegressor, fixed=dict(alignment="identity", warping="identity"),
                   description="multi-output GP with the convolution-process kernel alone"),
    ]
    for entry in entries:
        if entry.name not in MODELS:
            MODELS.register(entry.name, entry)


_register_all()
