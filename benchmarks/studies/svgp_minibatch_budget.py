"""How far does an SVGP get on energy split 0 (M = 100) with Adam or natural gradients (γ = 1, 0.1), in
minibatches of 512 or full batch, after the same number of steps (the robust TGP fit's SVGP stage under the
bench's quick preset gets half of its 1 500 steps)?

Answer (2026-11-25, bound per point): half the steps cost about 0.6 per point whatever the optimiser (Adam in
minibatches -1.977 at 750 steps, -1.383 at 1 500); natural gradients with γ = 1 on minibatch estimates are worse
than Adam at 1 500 steps (-1.675), γ = 0.1 on par (-1.392); full batch γ = 1 is best (-1.223). So the robust
fit's minibatch SVGP stage uses γ = 0.1.

Run from the repository root: `python -m benchmarks.studies.svgp_minibatch_budget`; prints steps/2 (minibatch
epochs), γ, batch size, bound per point.
"""
import flowgp
from flowgp.data.tables import uci_split


def main() -> int:
    d = uci_split("energy", 0)
    x, y = d.x_train, d.y_train
    n = len(y)
    for epochs in (375, 750):
        for ng in (None, 1.0, 0.1):
            for bs in (512, None):
                est = flowgp.SVGPRegressor(num_inducing=100, epochs=epochs if bs else 2 * epochs, batch_size=bs,
                                           seed=0, verbose=False, kmeans_restarts=3, natural_gradient=ng).fit(x, y)
                print(epochs, ng, bs, round(est.elbo(x, y) / n, 3), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
