"""Two nodes on one machine: two `torchrun` agents (`--nnodes 2`, c10d rendezvous on 127.0.0.1, two processes
each, gloo on the CPU) train with `flowgp fit` from a Parquet folder, and the results are compared with one
process: an SVGP in exact mode (`--no-shard-reads`) to 1e-6, a TGP with sharded reads by the fit's quality (the
same sampler law, other draws), and the TGP's checkpoint of the 2-node run resumed by one process. About 2 minutes
on 2 busy cores (mostly the 4 processes' start-up): marked slow."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import flowgp  # noqa: E402
from flowgp import estimators  # noqa: E402
from flowgp.cli.commands import main  # noqa: E402

pytestmark = pytest.mark.slow

N = 256
FIT = ["--target", "y", "--epochs", "30", "--batch-size", "64", "--num-inducing", "8", "--lr", "0.05", "--seed", "0",
       "--quiet"]


def _folder(tmp_path) -> Path:
    """256 rows in two Parquet files of two row groups each."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (N, 2))
    y = np.sin(2 * x[:, 0]) + 0.3 * x[:, 1] ** 2 + 0.1 * rng.standard_normal(N)
    folder = tmp_path / "table"
    folder.mkdir()
    for f in range(2):
        rows = slice(f * N // 2, (f + 1) * N // 2)
        table = pa.table({"a": x[rows, 0], "b": x[rows, 1], "y": y[rows]})
        pq.write_table(table, str(folder / f"part{f}.parquet"), row_group_size=N // 4)
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_nodes(args, cwd):
    """Start two torchrun agents of two processes each (one per node) running `flowgp fit args`; wait for both."""
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(Path(flowgp.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]))
    endpoint, run_id = f"127.0.0.1:{_free_port()}", str(uuid.uuid4())
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id, "--max-restarts", "0",
               "-m", "flowgp", "fit", *args]
    agents = [subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for _ in range(2)]
    outputs = [a.communicate(timeout=240)[0] for a in agents]
    for agent, out in zip(agents, outputs):
        assert agent.returncode == 0, out[-3000:]
    return outputs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    tmp = tmp_path_factory.mktemp("nodes")
    data = str(_folder(tmp))
    out = {name: str(tmp / f"{name}.pt") for name in ("svgp1", "tgp1", "svgp2-exact", "tgp2", "resumed")}
    base = ["--data", data, *FIT]
    _two_nodes(["--model", "svgp", *base, "--no-shard-reads", "--out", out["svgp2-exact"]], tmp)
    _two_nodes(["--model", "tgp", *base, "--checkpoint", str(tmp / "tgp2.ckpt"), "--out", out["tgp2"]], tmp)
    for model, name in (("svgp", "svgp1"), ("tgp", "tgp1")):
        assert main(["fit", "--model", model, *base, "--out", out[name]]) == 0
    # the 2-node run's (finished) checkpoint, resumed by one process on one node
    assert main(["fit", "--model", "tgp", *base, "--checkpoint", str(tmp / "tgp2.ckpt"), "--out", out["resumed"]]) == 0
    table = pq.read_table(data).to_pandas()
    x, y = table[["a", "b"]].to_numpy(), table["y"].to_numpy()
    return {name: estimators.load(path) for name, path in out.items()}, x, y


def _relative(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_exact_mode_on_two_nodes_equals_one_process(runs):
    models, x, _ = runs
    assert _relative(models["svgp2-exact"].predict(x), models["svgp1"].predict(x)) <= 1e-6
    single = models["svgp1"].model_.state_dict()
    for key, value in models["svgp2-exact"].model_.state_dict().items():
        assert _relative(value.numpy(), single[key].numpy()) <= 1e-6, key


def test_sharded_reads_on_two_nodes_fit_as_well_as_one_process(runs):
    """Same sampler law, other minibatches: the TGP fits differ, their quality does not (R² within 0.05)."""
    models, x, y = runs
    two, one = models["tgp2"], models["tgp1"]
    assert _relative(two.predict(x), one.predict(x)) > 1e-8  # other draws: not the exact-mode run
    assert one.score(x, y) > 0.8
    assert abs(two.score(x, y) - one.score(x, y)) < 0.05


def test_a_two_node_checkpoint_resumes_on_one_node(runs):
    """The fingerprint (data digest of the merged scan, parameters) does not depend on the number of processes, so
    one process resumes the finished 2-node run: its model is the 2-node model, not a fit of its own."""
    models, x, _ = runs
    assert _relative(models["resumed"].predict(x), models["tgp2"].predict(x)) <= 1e-12
    assert _relative(models["resumed"].predict(x), models["tgp1"].predict(x)) > 1e-8
