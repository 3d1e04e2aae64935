"""How much of AMO-GP's bound gradient is rounding: two exact evaluations of the CP layer's Ψ₂ contraction.

At the estimator's own state (the four London sites of `amogp_step_time.py`, after `--start-epochs` epochs of
its fit), the full-batch bound and its gradients are evaluated twice: with the contraction as a series of
products (`flowgp.models.amogp.psi_statistics`, the default where it applies) and with its exponentials
(`_BlockedExpContract._TAYLOR_MAX_TERMS = 0`). Both agree with eq. 25 to 1e-12 in the node's own outputs and
gradients (tests/test_psi_statistics.py), so where the model's gradients differ between them, the difference is
rounding amplified by the bound: tr(Φ_n W) with W = ααᵀ + C - K⁻¹ cancels |W| up to 1e8 to O(1).
Printed per parameter: the largest gradient entry of each evaluation and their largest difference relative to
it. A parameter whose difference is O(1) has a gradient that is rounding noise at that state, and a
deterministic full-batch fit's path there depends on the order of its floating-point operations.

    OMP_NUM_THREADS=1 python benchmarks/amogp_gradient_rounding.py --start-epochs 1
    OMP_NUM_THREADS=1 python benchmarks/amogp_gradient_rounding.py --start-epochs 300
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

import flowgp.models.amogp.psi_statistics as psi_statistics
from amogp_step_time import add_state_arguments, data, model_and_tensors


def gradients(model, xt, yt, ot):
    model.zero_grad()
    loss = -model.elbo(xt, yt, ot, num_data=xt.shape[0])
    loss.backward()
    return float(loss.detach()), {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_state_arguments(p, cp_grid="off")  # these study the trained inducing inputs' gradients
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    model, xt, yt, ot = model_and_tensors("gp", *data(args), args)
    contract = psi_statistics._BlockedExpContract
    loss_series, series = gradients(model, xt, yt, ot)
    saved = contract._TAYLOR_MAX_TERMS
    contract._TAYLOR_MAX_TERMS = 0  # the exponentials everywhere
    try:
        loss_exp, exps = gradients(model, xt, yt, ot)
    finally:
        contract._TAYLOR_MAX_TERMS = saved
    rows = []
    print(f"bound: series {loss_series:.12g}, exponentials {loss_exp:.12g} "
          f"(relative difference {abs(loss_series - loss_exp) / abs(loss_exp):.2g})")
    print(f"{'parameter':40s} {'largest |g| series':>18s} {'exponentials':>14s} {'largest diff / largest':>24s}")
    for name in series:
        a, b = series[name], exps[name]
        scale = float(b.abs().max())
        rel = float((a - b).abs().max()) / scale if scale > 0 else 0.0
        rows.append({"parameter": name, "series_max": float(a.abs().max()), "exp_max": scale, "relative": rel})
        print(f"{name:40s} {float(a.abs().max()):18.4g} {scale:14.4g} {rel:24.3g}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"setting": vars(args), "loss_series": loss_series,
                                               "loss_exponentials": loss_exp, "gradients": rows}, indent=1))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
