"""Initial inducing inputs come from one function (`flowgp.gp.inducing.initial_inducing_inputs`): every builder
(sparse, deep, latent) gives the k-means centres of the same seed, and nothing else in the library runs k-means."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch

from flowgp.build import DeepGPConfig, LatentDeepGPConfig, SparseGPConfig, build
from flowgp.gp.inducing import initial_inducing_inputs, kmeans_inducing_points
from flowgp.models.deep_gp import build_deep_gp
from flowgp.models.latent.model import build_latent_deep_gp

SRC = Path(__file__).resolve().parents[2] / "src" / "flowgp"


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.uniform(-2.0, 2.0, (50, 2)))
    return x, torch.sin(2.0 * x[:, :1])


def test_kmeans_runs_in_one_place():
    callers = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in (
                    "kmeans_inducing_points", "KMeans"):
                callers.append(path.relative_to(SRC).as_posix())
    assert sorted(set(callers)) == ["gp/inducing.py"]


def test_initial_inducing_inputs_are_the_seeded_kmeans_centres(data):
    x, _ = data
    z = initial_inducing_inputs(x, 7, restarts=3, seed=4)
    assert z.dtype == torch.float64 and z.shape == (7, 2)
    assert np.array_equal(z.numpy(), kmeans_inducing_points(x, 7, 3, 4))
    given = initial_inducing_inputs(x, 7, inducing_points=np.zeros((3, 2)), dtype=torch.float32)
    assert given.dtype == torch.float32 and torch.equal(given, torch.zeros(3, 2))
    with pytest.raises(ValueError, match=r"inducing_points must have shape \[M, 2\]"):
        initial_inducing_inputs(x, 7, inducing_points=np.zeros((3, 5)))


def test_every_builder_starts_from_the_same_centres(data):
    x, y = data
    expected = kmeans_inducing_points(x, 6, 2, 3)
    gen = lambda: torch.Generator().manual_seed(3)  # noqa: E731 - k-means reads the generator's seed
    sparse = build(SparseGPConfig(num_inducing=6, kmeans_restarts=2), x, y, generator=gen())
    deep = build(DeepGPConfig(layers=2, num_inducing=6, kmeans_restarts=2), x, y, generator=gen())
    direct = build_deep_gp(x, 1, 2, num_inducing=6, kmeans_restarts=2, seed=3)
    latent = build(LatentDeepGPConfig(layers=2, num_inducing=6, kmeans_restarts=2), x, y, generator=gen())
    latent_direct = build_latent_deep_gp(x, y, 2, num_inducing=6, kmeans_restarts=2, seed=3)
    assert np.array_equal(sparse.gp.inducing_points.detach().numpy(), expected)
    z_deep = deep.layers[0].gp.inducing_points.detach().numpy()
    assert np.array_equal(z_deep, expected)
    assert np.array_equal(direct.layers[0].gp.inducing_points.detach().numpy(), expected)
    z_latent = latent.layers[0].gp.inducing_points.detach().numpy()
    assert np.array_equal(z_latent[:, :2], expected)
    # the same seeds give the same model, bit for bit, through `build` or the model's own builder
    for a, b in ((deep, direct), (latent, latent_direct)):
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
