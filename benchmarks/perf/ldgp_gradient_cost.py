"""Cost of one gradient of the latent deep GP's importance-weighted bound: REG, DREG (unbiased, joint draws) and
DREG with eq. D.23 as written, on a 512-row batch of wine-red in the reference configuration, and each one's ratio
to REG's.

    FLOWGP_DATA=../shared/data OMP_NUM_THREADS=1 python -m benchmarks.perf.ldgp_gradient_cost [--repeats 5]

Prints the median milliseconds of bound + gradient for each estimator, and, for DREG's K vector-Jacobian
products of log w with respect to z, how one such product splits between the last layer (log w -> the hidden
layer's joint draw h) and the hidden layer (h -> z): the part a cheaper DREG would have to avoid.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from flowgp.bench.models import make_estimator
from flowgp.bench.presets import get_preset
from flowgp.bench.uci import reference_split
from flowgp.build import build
from flowgp.models.latent.model import LatentDeepGP


def median_ms(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(1e3 * statistics.median(times), 1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataset", default="wine-red")
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    split = reference_split(args.dataset, 0)
    est = make_estimator("ldgp2-dreg", get_preset("reference", epochs=1), 128, 0, len(split.y_train))
    x, y = np.asarray(split.x_train), np.asarray(split.y_train).ravel()
    xt = est.fit_input_scaling(x)
    yt = est.tensor((y - y.mean()) / y.std())[:, None]
    # the estimator's model at its initialisation (no training needed to time a step)
    model = build(est.config(), xt, yt, dtype=est.torch_dtype(), device=est.device,
                  generator=est.generator(device="cpu"))
    rows = torch.randperm(xt.shape[0], generator=torch.Generator().manual_seed(0))[:args.batch]
    xb, yb = xt[rows], yt[rows]
    params = [q for q in model.parameters() if q.requires_grad]

    def gradient(mode):
        loss = -model.elbo(xb, yb, num_data=xt.shape[0], indices=rows, gradient=mode,
                           generator=torch.Generator().manual_seed(5))
        torch.autograd.grad(loss, params, allow_unused=True)

    costs = {mode: median_ms(lambda: gradient(mode), args.repeats) for mode in ("reg", "dreg-d23", "dreg-eps", "dreg")}
    print("bound + gradient, ms:", costs)
    print("ratio to REG:", {mode: round(ms / costs["reg"], 2) for mode, ms in costs.items()})

    # one of DREG's K products, split at the hidden layer's joint draw h (the last layer's input)
    captured = {}
    original = LatentDeepGP.joint_last_layer_marginals

    def capture(self, h, generator=None, batch_rows=None, parts=None):
        for layer in self.layers[:-1]:
            h = self.joint_hidden_sample(layer, h, generator, batch_rows)
        captured["h"] = h
        return self.layers[-1].marginals(h)

    LatentDeepGP.joint_last_layer_marginals = capture
    try:
        log_w, z = model.log_weights(xb, yb, model.num_importance, 1, rows, None, True,
                                     torch.Generator().manual_seed(5))
    finally:
        LatentDeepGP.joint_last_layer_marginals = original
    h = captured["h"]
    upstream = torch.autograd.grad(log_w.sum(), h, retain_graph=True)[0]
    split_ms = {
        "log_w -> z (one full product)": median_ms(
            lambda: torch.autograd.grad(log_w[:, 0].sum(), z, retain_graph=True), args.repeats),
        "log_w -> h (last layer)": median_ms(
            lambda: torch.autograd.grad(log_w.sum(), h, retain_graph=True), args.repeats),
        "h -> z (hidden layer)": median_ms(
            lambda: torch.autograd.grad((h[:, :, 0] * upstream[:, :, 0]).sum(), z, retain_graph=True), args.repeats)}
    print("one vector-Jacobian product, ms:", split_ms)


if __name__ == "__main__":
    main()
