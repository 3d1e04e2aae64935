"""Flows as plain records: save any flow - a user's own class too - with `torch.save(..., weights_only=True)`.

`flow_to_record(flow)` gives {"class": "package.module.QualName", "args": [...], "kwargs": {...}, "state":
state_dict}; `flow_from_record(record)` imports the class by its path, checks that it is a `Flow`, calls it with
the arguments and loads the state dict. The constructor arguments are the ones `Flow` records automatically
on construction (`Flow.constructor_arguments()`), so a user's class needs nothing beyond the documented
contract; it only has to be importable (defined at module level) where the record is loaded. The record names
the class, never a registered name: a user's class whose `name` equals a built-in one stays the user's class.

Everything in a record is a str, int, float, bool, None, list, tuple, dict or tensor (what
`torch.load(weights_only=True)` accepts). Argument values are encoded as:
* plain values, lists, tuples and tensors as they are; dicts as {"__dict__": {...}} (str keys);
* a nested Flow (the stages of a Compose, the terms of a LinearCombination, the base of an InputDependentFlow)
  as {"__flow__": record}, and a `flowgp.flows.networks.BayesianMLP` as {"__module__": record};
* torch.dtype / torch.device as {"__dtype__": "float32"} / {"__device__": "cpu"};
* a torch.Generator as None: it only draws initial values, which the state dict replaces.
"""
from __future__ import annotations

import importlib
import numbers

import torch
from torch import Tensor

from ..compat import current_class_path

from .networks import BayesianMLP
from .base import Flow

__all__ = ["flow_to_record", "flow_from_record", "RECORD_KEYS"]

RECORD_KEYS = ("class", "args", "kwargs", "state")


def _class_path(obj) -> str:
    cls = type(obj)
    if "<locals>" in cls.__qualname__:
        raise TypeError(f"{cls.__qualname__} is defined inside a function, so it cannot be imported when the record "
                        "is loaded; define the class at module level")
    return f"{cls.__module__}.{cls.__qualname__}"


def _module_record(module, args, kwargs) -> dict:
    return {"class": _class_path(module), "args": [_encode(a, f"{type(module).__name__} argument") for a in args],
            "kwargs": {k: _encode(v, f"{type(module).__name__} argument {k!r}") for k, v in kwargs.items()},
            "state": {k: v.detach().clone() for k, v in module.state_dict().items()}}


def _encode(value, where: str):
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, Flow):
        return {"__flow__": flow_to_record(value)}
    if isinstance(value, BayesianMLP):
        args, kwargs = value.constructor_arguments()
        return {"__module__": _module_record(value, args, kwargs)}
    if isinstance(value, Tensor):
        return value.detach().clone()
    if isinstance(value, torch.Size):
        return tuple(int(v) for v in value)
    if isinstance(value, torch.dtype):
        return {"__dtype__": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"__device__": str(value)}
    if isinstance(value, torch.Generator):
        return None
    if isinstance(value, (list, tuple)):
        items = [_encode(v, where) for v in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"{where}: only dicts with str keys can be recorded, got keys {list(value)}")
        return {"__dict__": {k: _encode(v, where) for k, v in value.items()}}
    if isinstance(value, numbers.Integral):  # e.g. numpy integers
        return int(value)
    if isinstance(value, numbers.Real):  # e.g. numpy floats
        return float(value)
    raise TypeError(f"{where}: a {type(value).__name__} cannot be recorded safely (records hold only str, int, "
                    "float, bool, None, lists, tuples, dicts, tensors and flows); pass plain values to the "
                    "constructor or override constructor_arguments()")


def flow_to_record(flow: Flow) -> dict:
    """The weights_only-safe record {"class", "args", "kwargs", "state"} of `flow` (module docstring).

    Args:
        flow: a Flow built through its constructor (a user's subclass included).

    Examples:
        >>> from flowgp import make_flow
        >>> from flowgp.flows import flow_from_record, flow_to_record
        >>> flow_from_record(flow_to_record(make_flow("sal+softplus"))).spec
        'sal+softplus'
    """
    if not isinstance(flow, Flow):
        raise TypeError(f"flow must be a flowgp Flow, got {type(flow).__name__}")
    args, kwargs = flow.constructor_arguments()
    return _module_record(flow, args, kwargs)


def _import_class(path: str):
    if not isinstance(path, str) or "." not in path:
        raise ValueError(f"record['class'] must be a dotted path 'package.module.QualName', got {path!r}")
    parts = current_class_path(path).split(".")
    error = None
    for split in range(len(parts) - 1, 0, -1):  # the longest importable module prefix, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError as err:
            error = err
            continue
        for attr in parts[split:]:
            obj = getattr(obj, attr, None)
            if obj is None:
                break
        else:
            return obj
    raise ImportError(f"cannot import the class {path!r} of this record: make its module importable (e.g. on "
                      "PYTHONPATH) before loading") from error


def _decode(value):
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_decode(v) for v in value)
    if isinstance(value, dict):
        if set(value) == {"__flow__"}:
            return flow_from_record(value["__flow__"])
        if set(value) == {"__module__"}:
            return _build(value["__module__"], BayesianMLP)
        if set(value) == {"__dict__"}:
            return {k: _decode(v) for k, v in value["__dict__"].items()}
        if set(value) == {"__dtype__"}:
            dtype = getattr(torch, value["__dtype__"], None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"unknown dtype {value['__dtype__']!r} in record")
            return dtype
        if set(value) == {"__device__"}:
            return torch.device(value["__device__"])
        raise ValueError(f"malformed record value with keys {sorted(value)}")
    return value


def _build(record: dict, kind: type):
    if not isinstance(record, dict) or set(record) != set(RECORD_KEYS):
        raise ValueError(f"a flow record is a dict with keys {list(RECORD_KEYS)}, got "
                         f"{sorted(record) if isinstance(record, dict) else type(record).__name__}")
    cls = _import_class(record["class"])
    if not (isinstance(cls, type) and issubclass(cls, kind)):
        raise TypeError(f"record['class'] = {record['class']!r} is not a {kind.__module__}.{kind.__qualname__} "
                        "subclass; refusing to build it")
    args = _decode(list(record["args"]))
    kwargs = _decode({"__dict__": record["kwargs"]})
    # Constructors may draw random initial values (the state dict replaces them): keep the global RNG untouched.
    with torch.random.fork_rng(devices=[]):
        obj = cls(*args, **kwargs)
    state = record["state"]
    obj.load_state_dict(state)
    dtypes = {v.dtype for v in state.values() if isinstance(v, Tensor) and v.is_floating_point()}
    if len(dtypes) == 1:
        obj.to(dtype=dtypes.pop())  # the precision it was saved in (parameters are built in float64)
    return obj


def flow_from_record(record: dict) -> Flow:
    """The flow a `flow_to_record` record describes: its class imported by path, built from the recorded
    arguments, with its state dict loaded (and its floating dtype restored).

    Raises:
        TypeError: the class is not a flowgp Flow subclass (nothing else is ever built).
        ImportError: the class cannot be imported here.
        ValueError: the record is malformed.

    Args:
        record: a dict written by :func:`flowgp.flows.flow_to_record`.

    See Also:
        :func:`flowgp.flows.flow_to_record`.
    """
    return _build(record, Flow)
