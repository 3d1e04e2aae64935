"""A Flow subclass written in the user's own module works end to end, across processes.

Process 1 imports the user's module, fits TGPRegressor and WarpedGPRegressor with the flow object, uses it in
a composition, saves the estimators and writes their predictions; process 2 (a fresh interpreter that only
has the user's module on its path) loads the files with weights_only=True and must predict the same numbers.
"""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

USER_MODULE = '''
import torch
from flowgp.numerics.constraints import Positive
from flowgp.flows import Flow, ParamSpec


class Cubic(Flow):
    """G(f) = a + f + c f^3 with c > 0 (no closed-form inverse: flowgp's guarded numerical one is used)."""

    name = "sal"  # borrows a built-in name on purpose: it must stay the user's class
    param_specs = (ParamSpec("a", None, 0.0), ParamSpec("c", Positive(), 0.05))

    def _forward(self, f, p):
        return p["a"] + f + p["c"] * f ** 3

    def _log_det(self, f, p):
        return torch.log1p(3.0 * p["c"] * f * f)
'''

FIT = '''
import json, sys
import numpy as np
import flowgp
from flowgp import TGPRegressor, WarpedGPRegressor, make_flow
from my_flows import Cubic

rng = np.random.default_rng(0)
X = rng.uniform(-2, 2, (60, 1)); y = np.sinh(X[:, 0]) + 0.1 * rng.standard_normal(60)
kw = dict(num_inducing=8, epochs=30, verbose=False, kmeans_restarts=1)
out = {}
for name, est in {"tgp": TGPRegressor(flow=Cubic(), flow_init="none", **kw),
                  "tgp_composed": TGPRegressor(flow=Cubic() >> make_flow("affine"), flow_init="none", **kw),
                  "wgp": WarpedGPRegressor(flow=Cubic(), flow_init="none", **kw)}.items():
    est.fit(X, y)
    flow = est.model_.flow
    assert "Cubic" in repr(flow), repr(flow)
    est.save(sys.argv[1] + "/" + name + ".pt")
    mean, std = est.predict(X[:7], return_std=True)
    out[name] = {"mean": mean.tolist(), "std": std.tolist(),
                 "q": est.predict_quantiles(X[:7], [0.1, 0.9]).tolist()}
json.dump(out, open(sys.argv[1] + "/expected.json", "w"))
'''

LOAD = '''
import json, sys
import numpy as np
import torch
import flowgp

expected = json.load(open(sys.argv[1] + "/expected.json"))
rng = np.random.default_rng(0)
X = rng.uniform(-2, 2, (60, 1))
for name, values in expected.items():
    path = sys.argv[1] + "/" + name + ".pt"
    torch.load(path, weights_only=True)  # the file itself is weights_only-safe
    est = flowgp.load(path)
    assert type(est.model_.flow).__name__ in ("Cubic", "Compose"), type(est.model_.flow)
    mean, std = est.predict(X[:7], return_std=True)
    np.testing.assert_allclose(mean, values["mean"], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(std, values["std"], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(est.predict_quantiles(X[:7], [0.1, 0.9]), values["q"], rtol=1e-8, atol=1e-10)
print("ok")
'''


def _run(code, tmp_path, *args):
    env = {"PYTHONPATH": f"{tmp_path}:{SRC}", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_user_flow_class_fits_saves_and_loads_in_a_fresh_process(tmp_path):
    (tmp_path / "my_flows.py").write_text(USER_MODULE)
    fit = _run(FIT, tmp_path, str(tmp_path))
    assert fit.returncode == 0, fit.stderr[-3000:]
    load = _run(LOAD, tmp_path, str(tmp_path))
    assert load.returncode == 0, load.stderr[-3000:]
    assert load.stdout.strip() == "ok"
    assert set(json.loads((tmp_path / "expected.json").read_text())) == {"tgp", "tgp_composed", "wgp"}
    assert np.isfinite(np.array(json.loads((tmp_path / "expected.json").read_text())["tgp"]["mean"])).all()
