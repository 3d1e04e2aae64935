"""How far an SVGP gets on energy split 0 (M = 100) with Adam or natural gradients (γ = 1, 0.1), in minibatches
of 512 or full batch, after the same number of steps (issue 24: the robust TGP fit's SVGP stage under the bench's
quick preset). Run from the repository root: `python benchmarks/svgp_minibatch_budget.py`; prints
steps/2 (minibatch epochs), γ, batch size, bound per point.
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
