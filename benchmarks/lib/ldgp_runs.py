"""What the latent-DGP studies that start from a fitted checkpoint share: their command-line arguments, the
reference-preset estimator of a given budget, the staircase step-size schedule, and loading a checkpoint's state
into an estimator without training."""
from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path

import torch

from flowgp.bench.models import make_estimator
from flowgp.bench.presets import get_preset
from flowgp.bench.uci import load_split
from flowgp.training.checkpoint import atomic_save, safe_load


def reference_estimator(n: int, split: int, batch_size: int, iterations: int, **params):
    """The `reference`-preset ldgp2-reg estimator for n training rows whose budget covers `iterations` at
    `batch_size` (whole epochs), with `params` set; returns (estimator, iterations per epoch, epochs)."""
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
    torch.set_num_threads(1)
    split = load_split(args.dataset, args.split, args.data_dir, protocol="reference", row_order=args.row_order)
    return split, len(split.y_train), safe_load(Path(args.checkpoint))


def decayed(value: float, step: int, decay: float = 0.98, every: int = 1000) -> float:
    """A step size of `value` at step 0 after the staircase schedule of supplement E.2 has run to `step`."""
    return value * decay ** (int(step) // every)


def fit_from_state(est, state: dict, split) -> None:
    """Give `est` the trained state of a checkpoint's saved dict without training: a copy marked finished is
    written to a temporary file and resumed (the fit loads it and returns). `est` must match the run that wrote it
    (budget, batch, K, seed), as for any resume."""
    with tempfile.TemporaryDirectory() as tmp:
        est.set_params(checkpoint=atomic_save(dict(state, finished=True), Path(tmp) / "state.ckpt"),
                       extend_checkpoint=False)
        est.fit(split.x_train, split.y_train)
