"""Which inputs' gradients the running backward pass actually needs, for hand-written autograd Functions.

`ctx.needs_input_grad` records which inputs required grad when a Function ran forward. A backward pass restricted
to some tensors, `torch.autograd.grad(out, z)`, still calls the Function's backward with every such flag set,
though the engine will not run the nodes behind the inputs it does not need (pytorch/pytorch#174017, open). The
project's restricted passes are hot loops: the latent DGP's DREG takes K vector-Jacobian products of log w with
respect to z alone (`flowgp.models.latent.model`), and the flow posterior of a deep GP takes the flow change's
gradient for the flow parameters alone (`flowgp.models.deep_gp`). A hand-written backward that trusts the static
flags spends its [M, M] x [M, N] products there on gradients (of q(u)'s factor, of K_ZZ) that nobody reads.

`record_inputs` keeps each input's gradient edge at forward time; `needed_inputs` asks the engine, during the
backward, whether the node behind each edge will run. Whenever it cannot tell (a leaf's accumulator inside
`autograd.grad`, tracing by torch.compile, an engine without the query) the static flag stands, so the answer
is never "not needed" for a gradient that is.
"""
from __future__ import annotations

import torch
from torch.autograd.graph import get_gradient_edge

__all__ = ["record_inputs", "needed_inputs"]

# the engine's query for "will this node run in the current backward pass": no public equivalent exists (see the
# module docstring); torch.utils.checkpoint uses the same one. Looked up once; None if this torch lacks it.
_will_run = getattr(torch._C, "_will_engine_execute_node", None)


def record_inputs(ctx, *inputs) -> None:
    """Keep the gradient edges of a Function's `inputs` (in `forward`'s order) on `ctx` for `needed_inputs`.
    Nothing is kept while torch.compile traces (its backward is traced as a whole, with the static flags)."""
    if torch.compiler.is_compiling() or _will_run is None:
        ctx.input_edges = None
        return
    ctx.input_edges = tuple(get_gradient_edge(t) if isinstance(t, torch.Tensor) and t.requires_grad else None
                            for t in inputs)


def needed_inputs(ctx) -> tuple:
    """`ctx.needs_input_grad`, with False where the current backward pass will not run the node an input's
    gradient goes to (the input is not on the way to what is being differentiated)."""
    static = tuple(ctx.needs_input_grad)
    edges = getattr(ctx, "input_edges", None)
    if edges is None:
        return static
    out = []
    for need, edge in zip(static, edges):  # one edge per forward input, as recorded
        if need and edge is not None:
            try:
                need = bool(_will_run(edge.node))
            except RuntimeError:  # a leaf's accumulator during autograd.grad, or no engine running: keep the flag
                pass
        out.append(need)
    return tuple(out)
