"""torch's own deprecation notices stay inside flowgp where they are torch's internals (on every supported torch)."""
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

_SCRIPT = """
import warnings
import numpy as np
warnings.simplefilter("error", FutureWarning)
warnings.simplefilter("error", DeprecationWarning)
from flowgp import LatentDeepGPRegressor
rng = np.random.default_rng(0)
x = rng.uniform(-1, 1, (30, 1))
est = LatentDeepGPRegressor(layers=2, num_inducing=5, epochs=2, kmeans_restarts=1, num_samples_predict=20,
                            verbose=False).fit(x, np.sin(3 * x[:, 0]))
est.predict_interval(x[:3], 0.9)  # the hidden layer's input tangents: torch.func.jvp's first use
"""


def test_latent_deep_gp_intervals_raise_no_torch_jit_deprecation():
    """torch.func.jvp loads its decompositions through torch.jit.script on first use, which warns of its own
    deprecation (a DeprecationWarning up to torch 2.13, a FutureWarning in 2.14): not the user's concern. A
    fresh process, since the notice comes once per process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
