"""Does a larger K (and the authors' minibatch) sharpen a fit that a smaller K has already trained? (issue 25)

The power gap to the DREG authors' Table 1 sits on the splits without an outlying test row, and their fits are
sharper per point; their runs used K = 50 importance samples and minibatch 64, our `reference` preset K = 5 and
512. A K = 50 curve from scratch costs about 10 h per split on one core. This probe asks the question for less:
it loads a checkpoint trained with the preset (K = 5, batch 512) and carries it on with `--num-importance` /
`--batch-size` for `--iterations` more iterations, every step size starting where the checkpoint's schedule had
decayed it (Adam 0.005 and natural-gradient γ 0.01, × 0.98 per 1 000 iterations, from the checkpoint's step on)
with fresh optimiser states, and scores the test set as `ldgp_learning_curve.py` does (10 000 z per point) at each
of `--at`. Run it twice, with the new K and batch and with the checkpoint's own, to separate the change of K
from the restart of the optimisers. Rows go to OUT/finetune.jsonl (not resumable: an interrupted run starts
again and appends its rows anew).

    FLOWGP_DATA=../shared/data python benchmarks/ldgp_k_finetune.py \\
        --checkpoint docs/results/ldgp-uci-reference/power-authors-splits/ldgp2-reg-power-8-rows-authors.ckpt \\
        --split 8 --row-order authors --num-importance 50 --batch-size 64 --iterations 10000 \\
        --out docs/results/ldgp-uci-reference/power-k-finetune
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
import types
from pathlib import Path

import torch


def per_slot_hidden_sample(model, layer, h, generator=None, batch_rows=None, parts=None):
    """The DREG authors' hidden-layer draw over the K importance samples: each slot from its own marginal.

    Their hidden `G5` layer (`SharedMixedMok` with `MixedKernelSharedMof`) goes through
    `multisample_sample_conditional` in `dgps_with_iwvi/temp_workaround.py`, whose mixed-kernel branch calls the
    conditional with `full_cov=False` whatever `propagate` asked for, so the `full_cov=True` over the K axis reaches
    only their last layer (of which they use the diagonal). This is the per-slot draw the issue removed from
    flowgp (the K values of one function drawn as if independent; not a bound); here only to measure what it does
    to the fit. REG only (DREG needs the joint draw's pieces)."""
    whole = batch_rows is None or (batch_rows[0] == 0 and batch_rows[1] == h.shape[-3])
    if parts is not None or not whole:
        raise ValueError("per-slot draws: REG on one process only (parts and a split batch are not supported)")
    return layer(h, generator=generator)[0]


def set_per_slot_draw(model):
    """Give this one latent DGP instance the per-slot hidden-layer draw (`per_slot_hidden_sample`) in place of its
    class's joint draw (`del model.joint_hidden_sample` gives it back); returns the model."""
    model.joint_hidden_sample = types.MethodType(per_slot_hidden_sample, model)
    return model


def estimator_with(est, state: dict | None = None, per_slot: bool = False):
    """A LatentDeepGPRegressor like `est` (same parameters) whose model, once built as usual, gets the trained
    `state` (a state dict) and/or the per-slot hidden-layer draw (`per_slot_hidden_sample`, this model only)."""

    class Altered(type(est)):
        def _build(self, x, y=None, **overrides):
            model = super()._build(x, y, **overrides)
            if state is not None:
                model.load_state_dict(state)
            if per_slot:  # prediction never uses the joint draw, so only training changes
                set_per_slot_draw(model)
            return model

    return Altered(**est.get_params())


def reference_estimator(n: int, split: int, batch_size: int, iterations: int, **params):
    """The `reference`-preset ldgp2-reg estimator for n training rows whose budget covers `iterations` at
    `batch_size` (whole epochs), with `params` set; returns (estimator, iterations per epoch, epochs)."""
    from flowgp.bench.models import make_estimator
    from flowgp.bench.presets import get_preset

    per_epoch = math.ceil(n / get_preset("reference", batch_size=batch_size).batch_for(n))
    epochs = math.ceil(iterations / per_epoch)
    est = make_estimator("ldgp2-reg", get_preset("reference", epochs=epochs, batch_size=batch_size), 128, split, n)
    return est.set_params(**params), per_epoch, epochs


def checkpoint_parser(description: str, checkpoint_help: str) -> argparse.ArgumentParser:
    """A parser with the arguments `split_and_checkpoint` reads: --checkpoint, --dataset, --split, --row-order and
    --data-dir (the scripts that start from a fitted checkpoint add their own)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--checkpoint", required=True, help=checkpoint_help)
    p.add_argument("--dataset", default="power")
    p.add_argument("--split", type=int, required=True)
    p.add_argument("--row-order", default="file", choices=("file", "authors"))
    p.add_argument("--data-dir", default=os.environ.get("FLOWGP_DATA"))
    return p


def split_and_checkpoint(args):
    """(the split, its training rows, the checkpoint's saved state) for a script's --dataset, --split, --row-order,
    --data-dir and --checkpoint; also keeps torch to one thread, as every fit on this machine."""
    from flowgp.bench.uci import load_split
    from flowgp.training.checkpoint import safe_load

    torch.set_num_threads(1)
    split = load_split(args.dataset, args.split, args.data_dir, protocol="reference", row_order=args.row_order)
    return split, len(split.y_train), safe_load(Path(args.checkpoint))


def decayed(value: float, step: int, decay: float = 0.98, every: int = 1000) -> float:
    """A step size of `value` at step 0 after the staircase schedule of supplement E.2 has run to `step`."""
    return value * decay ** (int(step) // every)


def main(argv=None) -> int:
    p = checkpoint_parser(__doc__.splitlines()[0], "an ldgp_learning_curve.py checkpoint of ldgp2-reg")
    p.add_argument("--out", required=True)
    p.add_argument("--num-importance", type=int, required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--iterations", type=int, default=10000, help="iterations carried on from the checkpoint")
    p.add_argument("--at", default="2000,5000,10000", help="comma-separated iterations (of this run) to score at")
    p.add_argument("--samples", type=int, default=10000)
    p.add_argument("--draws", default="joint", choices=("joint", "per-slot"),
                   help="the hidden layer's draw over the K slots in training: flowgp's joint draw, or the DREG "
                        "authors' per-slot marginals (per_slot_hidden_sample); scoring is the same for both")
    args = p.parse_args(argv)
    split, n, saved = split_and_checkpoint(args)
    start = int(saved["step"])
    est, per_epoch, epochs = reference_estimator(n, args.split, args.batch_size, args.iterations,
                                                 num_importance=args.num_importance,
                                                 num_samples_predict=args.samples, verbose=False)
    est.set_params(lr=decayed(est.lr, start), natgrad_lr=decayed(est.natgrad_lr, start))
    # the schedule counts from this run's step 0, so its decays fall up to 999 steps off the checkpoint's grid
    est = estimator_with(est, saved["model"], per_slot=args.draws == "per-slot")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    milestones = sorted({int(v) for v in args.at.split(",")} | {epochs * per_epoch})
    t0 = time.perf_counter()

    def score(step, loss, model):
        iterations = step + 1
        if iterations not in milestones:
            return False
        lpd = est.log_predictive_density(split.x_test, split.y_test)
        row = {"model": "ldgp2-reg", "dataset": args.dataset, "split": args.split, "row_order": args.row_order,
               "checkpoint": args.checkpoint, "checkpoint_step": start, "iterations": iterations,
               "num_importance": args.num_importance, "batch_size": args.batch_size, "draws": args.draws,
               "lr_start": est.lr, "natgrad_lr_start": est.natgrad_lr, "samples": args.samples,
               "test_ll_std": float(lpd.mean() + math.log(est.y_scale_)),
               "train_neg_bound_per_point": float(loss) / n, "elapsed_seconds": time.perf_counter() - t0}
        with (out / "finetune.jsonl").open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
        return False

    est.fit(split.x_train, split.y_train, callback=score)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
