"""Input-dependent flows G_{θ(x)} with θ(x) = NN(x, W) (TGP paper §3.2-3.3; appendix A.3, B.4).

`InputDependentFlow(base, input_dim, ...)` wraps any flow of the library. The network outputs one
unconstrained value per scalar parameter of `base` (its raw parameters, nested as in `base.params()`),
and each goes through that parameter's own constraint (`base.constrain`). Only `params(x)` differs
from the plain flow: the maths (`_forward`, `_inverse`, `_log_det`) is the base's, applied with
per-point parameters of shape [S, ..., N, k] that broadcast against f [..., S, ..., N, L].

How many weight samples S the network draws is an argument of every call: `flow(f, x,
sampling=WeightSampling(S, stochastic, generator))`, passed down through compositions: training averages S
draws of W (MC dropout or reparameterised VB draws); PE-TGP predicts with one deterministic pass
(`stochastic=False`, no sample dimension). Without it, one stochastic pass in training mode and the
deterministic one in eval mode. The mode is an argument, never state set on the flow. All draws - initial
weights included - come from the given torch.Generator, never from the global RNG when one is given.
`base`'s own parameters hold the non-input-dependent values θ̂ that `init_input_dependent` (appendix
B.4) teaches the network; they are not used by the input-dependent flow itself.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from .networks import BayesianMLP
from .base import Compose, Flow, FlowOfFlows
from .combination import LinearCombination
from .sampling import WeightSampling

__all__ = ["InputDependentFlow", "make_input_dependent", "static_flow", "input_dependent_flows",
           "WeightSampling", "raw_parameter_tree", "warping_curves"]


def raw_parameter_tree(flow: Flow) -> dict:
    """The raw (unconstrained) parameters of `flow`, nested exactly like `flow.params()`."""
    if isinstance(flow, InputDependentFlow):
        raise ValueError("an input-dependent flow has no fixed raw parameters; use its .base")
    if isinstance(flow, FlowOfFlows):
        tree = {str(i): raw_parameter_tree(f) for i, f in enumerate(flow.flows)}
        if isinstance(flow, LinearCombination) and flow.coefficients is not None:
            tree.update({f"coef{i}": raw_parameter_tree(c) for i, c in enumerate(flow.coefficients)})
        return tree
    return flow.raw_parameters()


def _leaves(tree: dict, prefix=()) -> list:
    out = []
    for key in sorted(tree):
        value = tree[key]
        if isinstance(value, dict):
            out.extend(_leaves(value, prefix + (key,)))
        else:
            out.append((prefix + (key,), value))
    return out


def _set(tree: dict, path: tuple, value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


class InputDependentFlow(Flow):
    """G_{θ(x, W)}(f): `base` with every raw parameter given per input by a network (paper §3.2).

    Args:
        base: any non-input-dependent Flow with param_shape () or (L,).
        input_dim: D, the number of input features the network reads.
        hidden, activation, dropout, bayesian, prior_precision: passed to `flowgp.flows.networks.BayesianMLP`.
        network: a ready BayesianMLP to use instead (its out_features must equal `num_raw`).
        generator: torch.Generator for the network's initial weights (None: torch's global generator).
        parameters: names of the parameters of a plain (not composed) `base` that the network gives; the others
            keep `base`'s own shared values (e.g. ("a", "b") of a `SAL`: appendix B.6's input-dependent
            sinh-arcsinh with a shared affine map). None: every parameter.

    The network is built in the dtype and on the device of `base`.

    See Also:
        :func:`flowgp.flows.make_input_dependent` (wraps the right stages of a flow), :class:`flowgp.TGPRegressor`
        (``input_dependent=True``).
    """

    name = "input_dependent"

    def __init__(self, base: Flow, input_dim: int, hidden=(50,), activation: str = "relu", dropout: float = 0.25,
                 bayesian: str = "mc_dropout", prior_precision: Optional[float] = None,
                 network: Optional[BayesianMLP] = None, generator: Optional[torch.Generator] = None,
                 parameters=None):
        if not isinstance(base, Flow):
            raise TypeError(f"base must be a flowgp Flow, got {type(base).__name__}")
        if any(isinstance(m, InputDependentFlow) for m in base.modules()):
            raise ValueError("base is already (partly) input-dependent; wrap the plain flow instead")
        leaves = _leaves(raw_parameter_tree(base))
        if parameters is not None:
            if isinstance(base, FlowOfFlows):
                raise ValueError("parameters= selects parameters of a plain flow; wrap the stages of a composed "
                                 "flow one by one (make_input_dependent) instead")
            parameters = tuple(str(name) for name in ([parameters] if isinstance(parameters, str) else parameters))
            valid = [s.name for s in base.param_specs]
            unknown = [name for name in parameters if name not in valid]
            if unknown or not parameters:
                raise ValueError(f"parameters must name some of the '{base.spec}' flow's parameters {valid}, "
                                 f"got {list(parameters)}")
            leaves = [(path, raw) for path, raw in leaves if path[0] in parameters]
        super().__init__()
        self.base = base
        self.param_shape = base.param_shape
        self.parameters_from_network = parameters
        self._paths = []
        self._sizes = []
        for path, raw in leaves:
            if raw.dim() > 1:
                raise ValueError(f"input-dependent flows support parameters of shape () or (L,), got "
                                 f"{tuple(raw.shape)} for {'.'.join(path)} of '{base.spec}'")
            self._paths.append(path)
            self._sizes.append(tuple(raw.shape))
        if not self._paths:
            raise ValueError(f"the '{base.spec}' flow has no parameters to make input-dependent")
        self.num_raw = sum(math.prod(s) for s in self._sizes)
        if network is None:
            network = BayesianMLP(input_dim, self.num_raw, hidden, activation, dropout, bayesian, prior_precision,
                                  generator=generator).to(dtype=base.dtype, device=base.device)
        elif not isinstance(network, BayesianMLP) or network.out_features != self.num_raw \
                or network.in_features != input_dim:
            raise ValueError(f"network must be a BayesianMLP with in_features={input_dim} and "
                             f"out_features={self.num_raw}")
        self.network = network

    def constructor_arguments(self) -> tuple[list, dict]:
        # The network itself (its architecture and mode as they are now), not the options that built it.
        if type(self).__init__ is InputDependentFlow.__init__:
            kwargs = {"network": self.network}
            if self.parameters_from_network is not None:
                kwargs["parameters"] = list(self.parameters_from_network)
            return [self.base, self.input_dim], kwargs
        return super().constructor_arguments()

    # ------------------------------------------------------------------ description
    @property
    def domain(self) -> str:
        return self.base.domain

    @property
    def codomain(self) -> str:
        return self.base.codomain

    @property
    def _needs_input_check(self) -> bool:
        return self.base._needs_input_check

    @property
    def spec(self) -> str:
        return self.base.spec

    @property
    def input_dim(self) -> int:
        return self.network.in_features

    def extra_repr(self) -> str:
        return f"base={self.base.spec!r}, num_raw={getattr(self, 'num_raw', None)}"

    # ------------------------------------------------------------------ files of earlier versions
    @property
    def legacy_stages(self) -> int:
        # make_input_dependent of a "sal" was [input-dependent sinh-arcsinh, shared affine] before SAL existed
        return self.base.legacy_stages if self.parameters_from_network is not None else 1

    def merge_legacy_stages(self, source, old_prefixes, target, prefix):
        if len(old_prefixes) == 1:
            return super().merge_legacy_stages(source, old_prefixes, target, prefix)
        first, *rest = old_prefixes  # the input-dependent first stage: its network, and its base's entries
        for key in [k for k in source if k.startswith(first + "network.")]:
            target[prefix + key[len(first):]] = source.pop(key)
        self.base.merge_legacy_stages(source, [first + "base."] + rest, target, prefix + "base.")

    # ------------------------------------------------------------------ parameters
    def raw_target(self) -> Tensor:
        """The base's raw parameters flattened in network-output order: the θ̂ of appendix B.4, [num_raw]."""
        tree = raw_parameter_tree(self.base)
        flat = []
        for path in self._paths:
            value = tree
            for key in path:
                value = value[key]
            flat.append(value.detach().reshape(-1))
        return torch.cat(flat)

    def sampling_mode(self, sampling: Optional[WeightSampling] = None) -> WeightSampling:
        """The sampling in effect: `sampling` when given, else one stochastic pass in training mode and the
        deterministic pass in eval mode."""
        if sampling is not None:
            if not isinstance(sampling, WeightSampling):
                raise TypeError(f"sampling must be a flowgp.flows.WeightSampling, got {type(sampling).__name__}")
            return sampling
        return WeightSampling(1, self.training)

    def raw_params(self, x: Tensor, sampling: Optional[WeightSampling] = None) -> Tensor:
        """Network outputs for x [..., N, D]: [S, ..., N, num_raw] when sampling, else [..., N, num_raw]."""
        if x is None:
            raise ValueError(f"the input-dependent '{self.spec}' flow needs the inputs x: call flow(f, x)")
        if x.dim() < 2 or x.shape[-1] != self.input_dim:
            raise ValueError(f"x must be [..., N, {self.input_dim}] for this input-dependent flow, "
                             f"got shape {tuple(x.shape)}")
        mode = self.sampling_mode(sampling)
        return self.network(x, num_samples=mode.num_samples, sample=mode.stochastic, generator=mode.generator,
                            rows_share_masks=mode.rows_share_draws, batch_rows=mode.batch_rows)

    def params(self, x: Optional[Tensor] = None, *, sampling: Optional[WeightSampling] = None) -> dict:
        """Constrained parameters per input: each leaf [S, ..., N, k] (k = L or 1) or [..., N, k]."""
        out = self.raw_params(x, sampling)
        # parameters the network does not give: the base's own (shared) values, broadcasting against the rest
        tree = {} if self.parameters_from_network is None else self.base.raw_parameters()
        start = 0
        for path, shape in zip(self._paths, self._sizes):
            size = math.prod(shape)
            leaf = out[..., start:start + size]
            start += size
            _set(tree, path, leaf)  # [..., N, L] broadcasts over outputs; [..., N, 1] for shared scalars
        return self.base.constrain(tree)

    def constrain(self, raw: dict) -> dict:
        return self.base.constrain(raw)

    # ------------------------------------------------------------------ maths: the base's
    def _forward(self, f, p):
        return self.base._forward(f, p)

    def _inverse(self, y, p):
        return self.base._inverse(y, p)

    def _log_det(self, f, p):
        return self.base._log_det(f, p)

    def _forward_and_log_det(self, f, p):
        return self.base._forward_and_log_det(f, p)

    def _affine(self, p):
        return self.base._affine(p)

    def _bounds(self, p):
        return self.base._bounds(p)

    def _image(self, low, high, p):
        return self.base._image(low, high, p)

    def domain_interval(self):
        return self.base.domain_interval()

    def _check_input(self, f, p):
        self.base._check_input(f, p)


# ---------------------------------------------------------------------- helpers over whole flows
def input_dependent_flows(flow: Flow) -> list:
    """Every InputDependentFlow inside `flow` (itself included).

    Args:
        flow: any Flow.

    See Also:
        :func:`flowgp.flows.make_input_dependent`, :func:`flowgp.flows.static_flow`.
    """
    return [m for m in flow.modules() if isinstance(m, InputDependentFlow)]


def make_input_dependent(flow: Flow, input_dim: int, which: str = "nonlinear",
                         generator: Optional[torch.Generator] = None, **network_kwargs) -> Flow:
    """Make the stages of `flow` input-dependent, sharing their modules (so `static_flow` recovers `flow`).

    which="nonlinear": only stages that are not affine, and of a stage with an output affine map
    (`Flow.output_affine`) only the other parameters (appendix B.6: for SAL, the sinh-arcsinh carries the
    dependency and the affine map stays shared); which="all": every parameter of every stage.
    generator: torch.Generator for the networks' initial weights (drawn in stage order).
    network_kwargs: hidden, activation, dropout, bayesian, prior_precision.

    Args:
        flow: a plain Flow or a :class:`flowgp.flows.Compose` of plain flows.
        input_dim: D, the number of input features the networks read.
        which: "nonlinear" (default) or "all", as above.
        generator: as above.
        **network_kwargs: hidden, activation, dropout, bayesian, prior_precision of every network
            (:class:`flowgp.flows.InputDependentFlow`).

    Examples:
        >>> from flowgp import make_flow
        >>> from flowgp.flows import make_input_dependent, input_dependent_flows
        >>> g = make_input_dependent(make_flow("sal+softplus"), input_dim=3, hidden=(8,))
        >>> len(input_dependent_flows(g))  # the SAL's (a, b) follow x, softplus has no parameters
        1
    """
    if which not in ("nonlinear", "all"):
        raise ValueError(f"which must be 'nonlinear' or 'all', got {which!r}")
    if not isinstance(flow, Flow):
        raise TypeError(f"flow must be a flowgp Flow, got {type(flow).__name__}")
    stages = list(flow.flows) if isinstance(flow, Compose) else [flow]

    def wrap(stage):
        if not any(True for _ in stage.parameters()):
            return stage
        selected = None
        if which == "nonlinear":
            with torch.no_grad():
                if stage.affine_coefficients() is not None:
                    return stage
            if stage.output_affine is not None and not isinstance(stage, FlowOfFlows):
                # e.g. a SAL: the inner map's parameters follow x, its final shift and scale stay shared
                selected = [s.name for s in stage.param_specs if s.name not in stage.output_affine]
                if not selected:
                    return stage
        return InputDependentFlow(stage, input_dim, generator=generator, parameters=selected, **network_kwargs)

    wrapped = [wrap(s) for s in stages]
    if not any(isinstance(s, InputDependentFlow) for s in wrapped):
        raise ValueError(f"the '{flow.spec}' flow has no {'non-affine ' if which == 'nonlinear' else ''}stage "
                         "with parameters to make input-dependent; choose e.g. flow='sal' or which='all'")
    return wrapped[0] if len(wrapped) == 1 else Compose(wrapped)


def static_flow(flow: Flow) -> Flow:
    """`flow` with every input-dependent stage replaced by its base (modules shared, nothing copied).

    Args:
        flow: a Flow, input-dependent at its top level or in the stages of a composition.

    See Also:
        :func:`flowgp.flows.make_input_dependent` (the reverse).
    """
    if isinstance(flow, InputDependentFlow):
        return flow.base
    if isinstance(flow, Compose):
        return Compose([static_flow(s) for s in flow.flows])
    if input_dependent_flows(flow):
        raise ValueError(f"static_flow supports input-dependent stages at the top level or inside a "
                         f"composition, not inside {type(flow).__name__}")
    return flow


def warping_curves(flow: Flow, x: Tensor, f_grid: Tensor, num_samples: int = 100,
                   generator: Optional[torch.Generator] = None) -> dict:
    """The warping G_{θ(x_p, W)}(f) over `f_grid` [G] at each chosen input x_p ([P, D]) (appendix Fig. 9).

    Returns {"point": one deterministic pass (standard dropout, PE-TGP), "mean", "std": over `num_samples`
    stochastic draws of W (MC dropout or q(W), BA-TGP), drawn from `generator`}, each [G, P, K] (K = the
    flow's outputs, 1 if shared). Drawn by `flowgp.reporting.plotting.plot_warping_curves`.
    """
    if not input_dependent_flows(flow):
        raise ValueError("warping_curves needs a flow with an input-dependent stage")
    f = torch.as_tensor(f_grid, dtype=x.dtype, device=x.device).reshape(-1)
    if f.numel() < 2:
        raise ValueError("f_grid needs at least 2 points")
    with torch.no_grad():
        point = flow(f.view(-1, 1, 1), x, validate=False, sampling=WeightSampling(1, False))  # [G, P, K]
        draws = flow(f.view(-1, 1, 1, 1), x, validate=False,
                     sampling=WeightSampling(num_samples, True, generator))  # [G, S, P, K]
    std = draws.std(1) if num_samples > 1 else torch.zeros_like(point)
    return {"point": point, "mean": draws.mean(1), "std": std}
