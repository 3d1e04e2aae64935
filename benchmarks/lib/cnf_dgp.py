"""The data and the warm start the flow-posterior deep-GP studies share."""
from __future__ import annotations

import numpy as np
import torch

from flowgp.data.tables import standardize, uci_split
from flowgp.models.deep_gp import build_deep_gp, warm_start_from_gaussian


def standardised_split(dataset, data_dir=None):
    """Training inputs and targets of split 0 of a UCI set, standardised, as float64 tensors (x [N, D], y [N, 1])."""
    split = uci_split(dataset, 0, data_dir)
    x = torch.as_tensor(standardize(split.x_train)[0])
    y = torch.as_tensor(standardize(np.asarray(split.y_train).reshape(-1, 1))[0])
    return x, y


def warm_started_flow(x, layers, draws, dsvi):
    """A `posterior="cnf"` deep GP (M = 100) with the given draws, started from the fitted DSVI model."""
    model = build_deep_gp(x, 1, layers, num_inducing=100, kmeans_restarts=3, posterior="cnf", draws=draws)
    return warm_start_from_gaussian(model, dsvi)
