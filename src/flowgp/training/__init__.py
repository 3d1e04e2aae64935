"""Training: the one loop (`train`), minibatches, checkpoints, compilation, data-parallel execution, natural
gradients for q(u) and the initialisers that use the loop (flow initialisation, the warm start from an SVGP).

`from flowgp.training import train` is the public entry point; the submodules hold the parts."""
from .loop import BestParameters, EarlyStop, default_optimizer, step_lr, train

__all__ = ["train", "default_optimizer", "EarlyStop", "BestParameters", "step_lr"]
