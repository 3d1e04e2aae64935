"""The checks of every estimator parameter, in one place, run by `fit` before any work.

A bad value raises `InvalidParameterError`, both a ValueError and a TypeError (as scikit-learn's own error of
the same name is: code that catches either, for a value out of range or of the wrong kind, catches it), and its
message names the parameter, what it accepts and what was given. `check_parameters(estimator)` applies
the rule of each of the estimator's parameters (`RULES`, by name; `CLASS_RULES` where a family accepts other
values than the rest); `resolve_seed` turns `seed` into the integer seed a fit uses (scikit-learn's
`random_state` convention); `check_device` is the device check of the estimators, `load(device=...)` and the
command line. Family checks that tie several parameters together (e.g. a deep GP's `base_gradient` and `draws`)
stay with the family and run right after these.

Numbers are accepted as Python or NumPy scalars (what scikit-learn's search tools hand over); booleans are
`True`/`False` (or NumPy's), never strings or 0/1; integers are never floats, even integral ones.
"""
from __future__ import annotations

import math
import os
from numbers import Integral, Real

import numpy as np
import torch

from ..flows.networks import ACTIVATIONS, BAYESIAN_MODES
from ..build import resolve_dtype
from ..models.latent.encoders import ENCODER_SKIPS
from ..models.classification import CLASSIFICATION_LIKELIHOODS
from ..models.cnf_posterior import ELEMENTWISE_SHAPES, FLOW_BASES
from ..models.deep_gp import BASE_GRADIENTS, DRAWS, POSTERIORS, SKIPS
from ..models.latent.model import GRADIENT_ESTIMATORS, HIDDEN_LAYERS, OBJECTIVES
from ..training.loop import COMPILE_MODES, EarlyStop
from .robust import RobustFit

__all__ = ["InvalidParameterError", "check_parameters", "check_device", "check_seed", "resolve_seed",
           "check_table_target", "rule_for", "SEED_MAX", "RULES", "CLASS_RULES", "FAMILY_CHECKED", "is_integer",
           "is_real", "is_bool"]

#: the largest integer seed (scikit-learn's `random_state`: an int in [0, 2**32 - 1])
SEED_MAX = 2 ** 32 - 1


class InvalidParameterError(ValueError, TypeError):
    """A parameter of an estimator holds a value it does not accept (the message names it and what it accepts)."""


def is_integer(value) -> bool:
    """An int or NumPy integer, not a bool."""
    return isinstance(value, Integral) and not isinstance(value, (bool, np.bool_))


def is_real(value) -> bool:
    """A real number (int, float or their NumPy kinds), not a bool."""
    return isinstance(value, Real) and not isinstance(value, (bool, np.bool_))


def is_bool(value) -> bool:
    return isinstance(value, (bool, np.bool_))


# ----- rules: callables (value, name) raising ValueError / TypeError ---------------------------------------------
def integer(minimum: int = 1, none: bool = False, also: tuple = ()):
    """An integer >= minimum (None and the strings in `also` allowed where said)."""
    extra = (["None"] if none else []) + [repr(a) for a in also]
    what = f"an integer >= {minimum}" + "".join(f" or {e}" for e in extra)

    def rule(value, name):
        if (none and value is None) or (isinstance(value, str) and value in also):
            return
        if isinstance(value, str) and also:
            raise InvalidParameterError(f"{name} must be {what}, got {value!r}")
        if not is_integer(value):
            raise InvalidParameterError(f"{name} must be {what}, got {value!r} ({type(value).__name__})")
        if value < minimum:
            raise InvalidParameterError(f"{name} must be {what}, got {value!r}")
    return rule


def number(low=None, high=None, *, low_open=True, high_open=False, none=False):
    """A finite real number in the interval (low, high] (closed or open ends as said; None: unbounded)."""
    left = "(" if low_open else "["
    right = ")" if high_open or high is None else "]"
    span = f"{left}{'-inf' if low is None else low}, {'inf' if high is None else high}{right}"
    what = f"a finite number in {span}" + (" or None" if none else "")

    def rule(value, name):
        if none and value is None:
            return
        if not is_real(value):
            raise InvalidParameterError(f"{name} must be {what}, got {value!r} ({type(value).__name__})")
        v = float(value)
        inside = math.isfinite(v) and (low is None or (v > low if low_open else v >= low)) and \
            (high is None or (v < high if high_open else v <= high))
        if not inside:
            raise InvalidParameterError(f"{name} must be {what}, got {value!r}")
    return rule


def positive_values(value, name):
    """A positive finite number, or a 1-D array of them (e.g. one lengthscale per input feature)."""
    if isinstance(value, (str, bytes, bool, np.bool_)) or value is None:
        raise InvalidParameterError(f"{name} must be a positive number or a 1-D array of them, got {value!r}")
    try:
        a = np.asarray(value.detach().cpu() if isinstance(value, torch.Tensor) else value, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidParameterError(f"{name} must be a positive number or a 1-D array of them, got {value!r}") from None
    if a.ndim > 1 or a.size == 0:
        raise InvalidParameterError(f"{name} must be a positive number or a non-empty 1-D array of them, got shape "
                                    f"{a.shape}")
    if not (np.isfinite(a).all() and (a > 0).all()):
        raise InvalidParameterError(f"{name} must be positive and finite, got {value!r}")


def boolean(none: bool = False):
    what = "None, True or False" if none else "True or False"

    def rule(value, name):
        if (none and value is None) or is_bool(value):
            return
        raise InvalidParameterError(f"{name} must be {what}, got {value!r} ({type(value).__name__})")
    return rule


def choice(options, none: bool = False):
    """One of `options` (strings), or None where said."""
    what = "one of " + ", ".join(repr(o) for o in options) + (" or None" if none else "")

    def rule(value, name):
        if none and value is None:
            return
        if not isinstance(value, str) or value not in options:
            raise InvalidParameterError(f"{name} must be {what}, got {value!r}")
    return rule


def step_or_auto(value, name):
    """A natural-gradient step size in (0, 1], "auto" (the library's choice for the fit) or None (Adam only)."""
    if isinstance(value, str) and value == "auto":
        return
    number(0, 1, none=True)(value, name)


def early_stop_rule(value, name):
    """ "auto" (the library's plateau rule), None (all epochs) or a flowgp.training.loop.EarlyStop."""
    if value is None or (isinstance(value, str) and value == "auto") or isinstance(value, EarlyStop):
        return
    raise InvalidParameterError(f"{name} must be 'auto' (stop on the bound's plateau), None (train all epochs) or a "
                                f"flowgp.training.loop.EarlyStop, got {value!r}")


def verbosity(value, name):
    """True, False or "auto" (progress only in an interactive terminal, never inside scikit-learn's tools)."""
    if is_bool(value) or value == "auto":
        return
    raise InvalidParameterError(f"{name} must be True, False or 'auto', got {value!r}")


def shard_reads_rule(value, name):
    """ "auto" (each process of a data-parallel run reads its share of a streamed table), True or False."""
    if is_bool(value) or (isinstance(value, str) and value == "auto"):
        return
    raise InvalidParameterError(f"{name} must be 'auto' (each process reads its share of a streamed table), True "
                                f"(the same) or False (every process reads the whole table: exact mode), got "
                                f"{value!r} ({type(value).__name__})")


def path_or_none(value, name):
    if value is not None and not isinstance(value, (str, os.PathLike)):
        raise InvalidParameterError(f"{name} must be a file path (str or Path) or None, got {type(value).__name__}")


def compile_mode(value, name):
    if is_bool(value) or (isinstance(value, str) and (value == "auto" or value in COMPILE_MODES)):
        return
    raise InvalidParameterError(
        f"{name} must be True, False, 'auto' or a torch.compile mode ({', '.join(map(repr, COMPILE_MODES))}), "
        f"got {value!r}")


def dtype_name(value, name):
    resolve_dtype(value)  # its message names dtype and the two choices


def hidden_sizes(value, name):
    """The hidden layer widths of a flow's networks: an int >= 1 or a sequence of them."""
    sizes = [value] if is_integer(value) else value
    if not isinstance(sizes, (list, tuple, np.ndarray)) or np.ndim(sizes) != 1 or not 1 <= len(sizes) <= 4 or \
            not all(is_integer(h) and h >= 1 for h in sizes):
        raise InvalidParameterError(f"{name} must list 1 to 4 positive layer widths such as (50,) or (25, 25), "
                                    f"got {value!r}")


def input_dependence(value, name):
    if value is None or is_bool(value) or (isinstance(value, str) and value in ("nonlinear", "all")):
        return
    raise InvalidParameterError(f"{name} must be False, True (= 'nonlinear') or 'all', got {value!r}")


def robust_option(value, name):
    if value is None or is_bool(value) or isinstance(value, RobustFit):
        return
    raise InvalidParameterError(f"{name} must be True (the default robust fit), False (a plain fit) or a "
                                f"flowgp.estimators.RobustFit, got {value!r}")


def image_shape(value, name):
    if value is None:
        return
    if not isinstance(value, (list, tuple, np.ndarray)) or np.ndim(value) != 1 or len(value) != 3 or \
            not all(is_integer(v) and v >= 1 for v in value):
        raise InvalidParameterError(f"{name} must be None or (channels, height, width) of positive integers, "
                                    f"got {value!r}")


def spec_or_object(kind: str):
    """A spec string or an object (a Kernel, a Flow): the family resolves it; only its kind is checked here."""
    def rule(value, name):
        if isinstance(value, (bytes, Real, np.bool_)) or value is None:
            raise InvalidParameterError(f"{name} must be a {kind} spec string or a {kind} object, got {value!r}")
    return rule


def flow_init(value, name, estimator=None):
    options = getattr(type(estimator), "_FLOW_INITS", ("identity", "data", "random", "none"))
    choice(options)(value, name)


def fraction_below_one(value, name):
    """A drop probability: a number in [0, 1)."""
    if not is_real(value) or not 0 <= float(value) < 1:
        raise InvalidParameterError(f"{name} must lie in [0, 1), got {value!r}")


def seed_rule(value, name):
    check_seed(value, name)


def device_rule(value, name):
    check_device(value, name)


#: the rule of every estimator parameter, by name (a name means the same in every family)
RULES = {
    # training
    "epochs": integer(1), "lr": number(0), "batch_size": integer(1, none=True), "seed": seed_rule,
    "dtype": dtype_name, "device": device_rule, "verbose": verbosity, "checkpoint": path_or_none,
    "compile": compile_mode, "threads": integer(1, also=("auto",)), "fix_noise_fraction": number(0, 1, low_open=False),
    "natural_gradient": number(0, 1, none=True), "extend_checkpoint": boolean(),
    "early_stop": early_stop_rule,
    "fix_variance_epochs": integer(0), "tol": number(0, low_open=False, none=True), "patience": integer(1),
    "full_batch_max": integer(1), "lr_decay": number(0), "natgrad_lr": number(0), "natgrad": boolean(),
    "shard_reads": shard_reads_rule,
    # the sparse GP
    "num_inducing": integer(1), "kernel": spec_or_object("kernel"), "noise": number(0),
    "lengthscale": positive_values, "period": positive_values, "kmeans_restarts": integer(1),
    "learn_inducing": boolean(), "quadrature_points": integer(1), "predict_quadrature_points": integer(1),
    # flows
    "flow": spec_or_object("flow"), "flow_init": flow_init, "robust": robust_option,
    "input_dependent": input_dependence, "hidden": hidden_sizes, "activation": choice(tuple(ACTIVATIONS)),
    "dropout": fraction_below_one, "bayesian": choice(BAYESIAN_MODES),
    "mc_samples_train": integer(1), "mc_samples_predict": integer(1), "prior_precision": number(0, none=True),
    "flow_init_epochs": integer(0),
    # classification
    "likelihood": choice(CLASSIFICATION_LIKELIHOODS), "mc_samples": integer(1), "predict_samples": integer(1),
    # deep GPs
    "layers": integer(1), "posterior": choice(POSTERIORS), "num_samples_train": integer(1),
    "num_samples_predict": integer(1), "hidden_width": integer(1, none=True), "flow_steps": integer(1),
    "flow_base": choice(FLOW_BASES), "flow_elementwise": choice(ELEMENTWISE_SHAPES),
    "dsvi_warmup": number(0, 1, low_open=False, high_open=True), "skip": choice(SKIPS), "image_shape": image_shape,
    "draws": choice(DRAWS, none=True), "base_gradient": choice(BASE_GRADIENTS, none=True),
    "flow_selection": boolean(), "flow_lr_scale": number(0, 1e3), "flow_rows": integer(1, none=True),
    # the latent-variable deep GP
    "latent_dim": integer(1), "num_importance": integer(1), "gradient": choice(GRADIENT_ESTIMATORS),
    "amortized": boolean(), "q_var_init": number(0), "hidden_q_var_init": number(0, none=True),
    "learn_hidden_variance": boolean(), "hidden_layer": choice(HIDDEN_LAYERS), "encoder_skips": choice(ENCODER_SKIPS), "objective": choice(OBJECTIVES),
    # the aligned multi-output GP
    "num_inducing_alignment": integer(1), "num_inducing_warping": integer(1), "latent_processes": integer(1),
    "alignment": choice(("gp", "identity")), "warping": choice(("gp", "identity")),
    "num_outputs": integer(1, none=True), "alignment_variance": number(0), "alignment_lengthscale": number(0),
    "warping_variance": number(0), "warping_lengthscale": number(0), "alignment_noise": number(0),
    "latent_noise": number(0), "num_samples": integer(1), "natural_gradient_layers": choice(("latent", "all")),
    "cp_inducing": choice(("latent", "output")), "start_from_mogp": boolean(), "cp_grid": boolean(none=True),
}

#: (class name, parameter) -> the rule where a family accepts other values than `RULES` says (subclasses
#: inherit their base's entries)
CLASS_RULES = {
    ("AlignedMultiOutputGPRegressor", "num_inducing"): integer(1, none=True),
    ("AlignedMultiOutputGPRegressor", "batch_size"): integer(1, none=True, also=("auto",)),
    ("AlignedMultiOutputGPRegressor", "lengthscale"): number(0),
    ("DeepGPClassifier", "likelihood"): choice(("robustmax", "softmax")),
    ("LatentDeepGPRegressor", "hidden_width"): integer(1),
    ("SVGPRegressor", "natural_gradient"): step_or_auto,
}

#: parameters whose rule above only checks the kind of value: the family resolves them at the start of `fit`
#: (a kernel or flow spec is parsed there, with the list of valid names)
FAMILY_CHECKED = ("kernel", "flow")

#: rules that also need the estimator (its class's accepted values)
_NEEDS_ESTIMATOR = {flow_init}


def rule_for(estimator, name):
    """The rule of `estimator`'s parameter `name` (None: none known)."""
    for klass in type(estimator).__mro__:
        found = CLASS_RULES.get((klass.__name__, name))
        if found is not None:
            return found
    return RULES.get(name)


def check_parameters(estimator) -> None:
    """Check every parameter of `estimator` against its rule; the first bad one raises (ValueError or TypeError
    naming it). Run by `fit` before any work."""
    for name, value in estimator.get_params(deep=False).items():
        rule = rule_for(estimator, name)
        if rule is None:
            continue
        if rule in _NEEDS_ESTIMATOR:
            rule(value, name, estimator)
        else:
            rule(value, name)


# ----- seed ------------------------------------------------------------------------------------------------------
def check_seed(seed, name: str = "seed") -> None:
    """scikit-learn's `random_state` convention: an int in [0, 2**32 - 1], None, or a NumPy Generator or
    RandomState; TypeError / ValueError naming `name` otherwise (a float or a string is never truncated or parsed)."""
    if seed is None or isinstance(seed, (np.random.Generator, np.random.RandomState)):
        return
    what = (f"an int in [0, 2**32 - 1] (e.g. {name}=0), None (a fresh seed for every fit) or a "
            "numpy.random.Generator / RandomState")
    if not is_integer(seed):
        raise InvalidParameterError(f"{name} must be {what}, got {seed!r} ({type(seed).__name__})")
    if not 0 <= int(seed) <= SEED_MAX:
        raise InvalidParameterError(f"{name} must be {what}, got {seed!r}")


def resolve_seed(seed, name: str = "seed") -> int:
    """The integer seed a fit uses: `seed` itself for an int; a fresh one from the operating system's entropy for
    None; the next draw of a NumPy Generator / RandomState (so successive fits differ, as in scikit-learn)."""
    check_seed(seed, name)
    if seed is None:
        return int(np.random.SeedSequence().generate_state(1)[0])
    if isinstance(seed, np.random.Generator):
        return int(seed.integers(0, SEED_MAX, endpoint=True))
    if isinstance(seed, np.random.RandomState):
        return int(seed.randint(0, SEED_MAX + 1, dtype=np.int64))
    return int(seed)


# ----- a table's target column ----------------------------------------------------------------------------------
def check_table_target(target, name: str = "y") -> None:
    """With a table (a path or an iterator of chunks) as X, `fit(X, y)` takes y as the name of the target column
    (its index for a .npy file), never as the targets themselves: TypeError naming the fix otherwise."""
    if target is None or target is False or isinstance(target, str) or is_integer(target):
        return
    raise TypeError(f"{name}: when X is a table (a file path or chunks), y names its target column, e.g. "
                    f"fit('data.csv', 'price') (a column index for .npy), not the targets themselves "
                    f"(got {type(target).__name__}); to pass the targets as values, read the table into arrays "
                    "and call fit(X, y) with both")


# ----- device ----------------------------------------------------------------------------------------------------
def check_device(device, name: str = "device") -> None:
    """ValueError (TypeError for a value that is no device name) before any work when `device` is not a device
    torch can use on this machine. `name` is the argument as the caller spells it ("device", "--device")."""
    flag = name.startswith("-")
    shown = f"{name} {device}" if flag else f"{name}={device!r}"
    use_cpu = f"use {name} cpu" if flag else f"use {name}='cpu'"
    if isinstance(device, torch.device):
        where = device
    elif isinstance(device, str):
        try:
            where = torch.device(device)
        except (RuntimeError, TypeError, ValueError):
            raise ValueError(f"{name} {device!r} is not a device; use cpu, cuda, cuda:N or mps") from None
    else:
        raise InvalidParameterError(f"{name} must be a device name such as 'cpu', 'cuda' or 'cuda:1' (or a "
                                    f"torch.device), got {device!r} ({type(device).__name__})")
    if where.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{shown}: CUDA is not available on this machine; {use_cpu}")
        count = torch.cuda.device_count()
        if where.index is not None and where.index >= count:
            raise ValueError(f"{shown}: this machine has {count} CUDA device(s) (cuda:0..cuda:{count - 1})")
    elif where.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"{shown}: MPS is not available on this machine; {use_cpu}")
    elif where.type != "cpu":
        raise ValueError(f"{shown}: flowgp fits on cpu, cuda or mps")
