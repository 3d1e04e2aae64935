"""Adam training of any model with `elbo(x, y, num_data)`: minibatches, progress bar, noise schedule, resume.

The fixed-noise schedule (TGP appendix B.5) freezes the likelihood noise for the first
`fix_noise_fraction` of the iterations, which keeps models from explaining the data as noise early on.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .checkpoint import atomic_save, safe_load

__all__ = ["train"]


def _noise_parameters(model):
    likelihood = getattr(model, "likelihood", None)
    return [p for n, p in likelihood.named_parameters() if "noise" in n] if likelihood is not None else []


def train(
    model,
    x: torch.Tensor,
    y: torch.Tensor,
    epochs: int = 1000,
    batch_size: int | None = None,
    lr: float = 0.01,
    fix_noise_fraction: float = 0.0,
    seed: int = 0,
    verbose: bool = True,
    checkpoint_path: str | Path | None = None,
    checkpoint_every: int = 100,
    desc: str = "training",
) -> list[float]:
    """Maximise model.elbo with Adam; returns the mean negative-ELBO-per-point history (one value per epoch).

    With `checkpoint_path`, the model, optimiser, shuffling RNG and history are saved atomically every
    `checkpoint_every` epochs (and on interruption); a later call with the same path resumes from there.
    """
    if not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be a non-negative integer, got {epochs!r}")
    if not 0.0 <= fix_noise_fraction <= 1.0:
        raise ValueError(f"fix_noise_fraction must lie in [0, 1], got {fix_noise_fraction}")
    n = x.shape[0]
    batch = n if batch_size is None else int(batch_size)
    if batch < 1:
        raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
    batch = min(batch, n)
    steps_per_epoch = math.ceil(n / batch)
    total_steps = epochs * steps_per_epoch
    frozen_steps = int(round(fix_noise_fraction * total_steps))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=lr)
    generator = torch.Generator().manual_seed(int(seed))
    history: list[float] = []
    start_epoch = 0
    if checkpoint_path is not None and Path(checkpoint_path).exists():
        state = safe_load(checkpoint_path, map_location=x.device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        history = list(state["history"])
        start_epoch = int(state["epoch"])

    def save(epoch):
        if checkpoint_path is not None:
            atomic_save(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "generator": generator.get_state(), "history": history, "epoch": epoch},
                checkpoint_path,
            )

    noise_params = _noise_parameters(model)
    model.train()
    bar = tqdm(range(start_epoch, epochs), desc=desc, disable=not verbose, leave=False)
    epoch = start_epoch
    try:
        for epoch in bar:
            order = torch.randperm(n, generator=generator).to(x.device) if batch < n else None
            total = 0.0
            for i in range(steps_per_epoch):
                step = epoch * steps_per_epoch + i
                frozen = step < frozen_steps
                for p in noise_params:
                    p.requires_grad_(not frozen)
                if order is None:
                    xb, yb = x, y
                else:
                    idx = order[i * batch:(i + 1) * batch]
                    xb, yb = x[idx], y[idx]
                optimizer.zero_grad(set_to_none=True)
                loss = -model.elbo(xb, yb, num_data=n)
                if not torch.isfinite(loss):
                    raise FloatingPointError(
                        f"the ELBO became {loss.item()} at epoch {epoch}; lower lr or use float64"
                    )
                loss.backward()
                optimizer.step()
                total += loss.item()
            history.append(total / steps_per_epoch / n)
            if verbose:
                bar.set_postfix(neg_elbo_per_point=f"{history[-1]:.4f}")
            if checkpoint_path is not None and (epoch + 1) % checkpoint_every == 0:
                save(epoch + 1)
    except KeyboardInterrupt:
        save(epoch)
        raise
    finally:
        for p in noise_params:
            p.requires_grad_(True)
        bar.close()
    save(epochs)
    model.eval()
    return history
