"""How far does AMO-GP's training move apart under a rounding-sized perturbation of its start?

Answer (2026-11-25, per-output CP sets, 20 Adam steps): to order one. A relative perturbation of 1e-15 gives a
largest relative parameter difference of 1.38 after one step and 0.3-1.0 after 20 (M = 10-50 per output; the CP
layer's K_uu has condition numbers 2e17-9e18). A jitter of 1e-4 on K_uu damps it 30x (0.011 after 10 steps) but
not to rounding level. So fitted AMO-GP numbers move with the order of the floating-point sums; the CP layer's
q(u) gradients at the start are rounding noise.

On the four London PM2.5 sites (the setting of benchmarks/perf/amogp_step_time.py: 2019-03-01 + 21 days hourly,
`AlignedMultiOutputGPRegressor(num_inducing=50)`'s model), the model is trained full batch with Adam for
`--steps` steps twice: once from its initial parameters and once from them multiplied by (1 + `--perturb`).
Printed: the largest relative parameter difference after 1, 5, 10, ... steps, and the condition number of the
CP layer's K_uu at the start. A difference that grows from 1e-15 to far above it says that rounding (the order
of a sum, another process count, a rewritten kernel) moves fitted numbers by that much.

    OMP_NUM_THREADS=1 python -m benchmarks.studies.amogp_sensitivity --steps 40
"""
from __future__ import annotations

import argparse

import torch

from benchmarks.lib.amogp_setting import add_state_arguments, data, model_and_tensors


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--perturb", type=float, default=1e-15)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--num-inducing", type=int, default=50, help="CP inducing inputs per output")
    p.add_argument("--lengthscale", type=float, default=0.3, help="initial CP lengthscale")
    p.add_argument("--jitter", type=float, default=None, help="jitter of the CP layer's K_uu (default: 1e-8)")
    p.add_argument("--cp-inducing", default="output", choices=["output", "latent"],
                   help="CP inducing sets per output (the supplement's) or on the latent process")
    a = p.parse_args(argv)
    state = argparse.ArgumentParser()
    add_state_arguments(state)
    args = state.parse_args(["--num-inducing", str(a.num_inducing), "--lengthscale", str(a.lengthscale),
                             "--cp-inducing", a.cp_inducing, "--cp-grid", "off"])  # trained inducing inputs
    torch.set_num_threads(1)
    X, y, o = data(args)

    def run(perturb):
        model, xt, yt, ot = model_and_tensors("gp", X, y, o, args)
        model.latent.jitter = a.jitter  # the model's own option (AMOGP(jitter=), AMOGPConfig.jitter)
        with torch.no_grad():
            for q in model.parameters():
                q.mul_(1 + perturb)
        opt = torch.optim.Adam(model.parameters(), lr=a.lr)
        snapshots = {}
        for step in range(1, a.steps + 1):
            opt.zero_grad()
            (-model.elbo(xt, yt, ot, num_data=xt.shape[0])).backward()
            opt.step()
            if step in (1, 5) or step % 10 == 0:
                snapshots[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return model, snapshots

    model, base = run(0.0)
    _, moved = run(a.perturb)
    with torch.no_grad():
        kuu = model.cp_kuu()
        print(f"M = {a.num_inducing} per {a.cp_inducing}, lengthscale {a.lengthscale}, jitter {a.jitter}: cond(K_uu) "
              f"of the CP layer after training {torch.linalg.cond(kuu).max().item():.3g}")
    for step in base:
        diff = max(((base[step][k] - moved[step][k]).abs().max() / base[step][k].abs().max().clamp_min(1e-12)).item()
                   for k in base[step])
        print(f"step {step:4d}: largest relative parameter difference {diff:.3g} (start perturbed by {a.perturb:g})")


if __name__ == "__main__":
    main()
