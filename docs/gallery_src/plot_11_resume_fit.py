"""
Resuming an interrupted fit
===========================

Long fits write their state to a checkpoint file and continue from it when they are started again: the
optimiser's moments, the random generators and the position in the epoch are saved with the parameters, so an
interrupted and resumed fit ends with exactly the parameters of an uninterrupted one. Files are written
atomically and checksummed; a checkpoint from a different data set, batch size or budget is refused.

Below, a fit of :func:`flowgp.training.train` is interrupted in its 125th of 300 epochs (a callback raises an
exception, as a crash or Ctrl-C would) and then resumed from its checkpoint. (A callback that *returns* True
ends the fit on purpose, like early stopping: that fit is finished, and a rerun loads it without training.)
"""

import tempfile
from pathlib import Path

import numpy as np
import torch

from flowgp import TGP, GaussianLikelihood, SVGPRegressor, make_flow, make_kernel
from flowgp.training import train

folder = Path(tempfile.mkdtemp())
gen = torch.Generator().manual_seed(0)
x = torch.rand(500, 2, dtype=torch.float64, generator=gen)
y = torch.sin(6 * x[:, :1]).exp() + 0.05 * torch.randn(500, 1, dtype=torch.float64, generator=gen)


def new_model():
    return TGP(make_kernel("matern52", 2), x[:30].clone(), make_flow("sal+softplus"), GaussianLikelihood(0.05))


class Interrupted(Exception):
    pass


def crash_in_epoch_125(step, loss, model):
    if step + 1 >= 125 * 2:  # two minibatches of 256 rows per epoch
        raise Interrupted


try:
    train(new_model(), x, y, epochs=300, batch_size=256, checkpoint_path=folder / "run.pt", checkpoint_every=20,
          callback=crash_in_epoch_125, verbose=False)
except Interrupted:
    print("interrupted; checkpoint on disk:", (folder / "run.pt").exists())

resumed = new_model()  # e.g. in a new process after a crash
train(resumed, x, y, epochs=300, batch_size=256, checkpoint_path=folder / "run.pt", checkpoint_every=20,
      verbose=False)

straight = new_model()
train(straight, x, y, epochs=300, batch_size=256, verbose=False)
same = all(torch.equal(a, b) for a, b in zip(resumed.state_dict().values(), straight.state_dict().values()))
print("resumed fit identical to an uninterrupted one:", same)

# %%
# The estimators take the same file as ``checkpoint=``: a fit that finds a finished checkpoint loads it
# instead of training again, and one that finds an unfinished checkpoint continues it.
est = SVGPRegressor(num_inducing=20, epochs=200, checkpoint=str(folder / "svgp.ckpt"), verbose=False)
est.fit(x.numpy(), y.numpy()[:, 0])
again = SVGPRegressor(num_inducing=20, epochs=200, checkpoint=str(folder / "svgp.ckpt"), verbose=False)
again.fit(x.numpy(), y.numpy()[:, 0])
print("second fit reused the checkpoint:", np.allclose(est.predict(x.numpy()), again.predict(x.numpy())))
