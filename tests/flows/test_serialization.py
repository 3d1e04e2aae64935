"""Flow records (flowgp.flows.serialization): weights_only-safe save/load of every flow, user classes included."""
import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from flow_testing import perturb
from flow_user_classes import Cubic, Scale
from flowgp.flows import (FLOW_NAMES, ArcsinhCombination, Compose, Exp, InputDependentFlow, LinearCombination,
                          Tanh, WeightSampling, flow_from_record, flow_to_record, make_flow, make_input_dependent)

pytestmark = pytest.mark.usefixtures("float64_default")

SRC = Path(__file__).resolve().parents[2] / "src"

SPECS = list(FLOW_NAMES) + ["sal+softplus", "boxcox+l", "invboxcox+l", "lincomb5", "sum(sal,tanh)",
                            "add(arcsinh,tanh)", "log+tukey"]


def reload(record):
    """torch.save then torch.load(weights_only=True): the record must be made of safe types only."""
    buffer = io.BytesIO()
    torch.save(record, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def round_trip(flow):
    return flow_from_record(reload(flow_to_record(flow)))


def _inputs(flow, shape=(9, 2)):
    f = 1.3 * torch.randn(shape, generator=torch.Generator().manual_seed(5))
    return torch.exp(f) if flow.domain == "positive" else f


def assert_same_flow(a, b, x=None, sampling=None):
    assert type(a) is type(b) and a.spec == b.spec
    assert a.state_dict().keys() == b.state_dict().keys()
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key
    f = _inputs(a)
    for method in ("forward", "log_abs_det_jacobian"):
        torch.testing.assert_close(getattr(b, method)(f, x, sampling=sampling),
                                   getattr(a, method)(f, x, sampling=sampling), rtol=0, atol=0)


@pytest.mark.parametrize("param_shape", [(), (2,)])
@pytest.mark.parametrize("spec", SPECS)
def test_every_built_in_flow_round_trips(spec, param_shape):
    flow = perturb(make_flow(spec, param_shape=param_shape))
    assert_same_flow(flow, round_trip(flow))


def test_python_compositions_and_combinations_round_trip():
    flows = [
        Tanh(a=2.0) >> Exp() >> make_flow("sal"),
        Compose(s for s in [make_flow("sinharcsinh"), make_flow("affine")]),  # a one-shot generator argument
        LinearCombination([Tanh(), make_flow("sal")], coefficients=True),
        ArcsinhCombination(4, param_shape=(2,)),
        Cubic() >> Scale(shift=2.0) >> make_flow("softplus"),
        LinearCombination([Cubic(), Scale(shift=-1.0)]),
    ]
    for flow in flows:
        perturb(flow)
        assert_same_flow(flow, round_trip(flow))


@pytest.mark.parametrize("which", ["all", "nonlinear"])  # nonlinear: the SAL's (c, d) stay shared
@pytest.mark.parametrize("bayesian,dropout", [("mc_dropout", 0.3), ("point", 0.2), ("vb", 0.0)])
def test_input_dependent_flows_round_trip(bayesian, dropout, which):
    flow = make_input_dependent(perturb(make_flow("sal+tanh", param_shape=(2,))), 3, which=which, hidden=(5, 4),
                                dropout=dropout, bayesian=bayesian, generator=torch.Generator().manual_seed(1))
    perturb(flow)
    back = round_trip(flow)
    assert [s.parameters_from_network for s in back.flows] == [s.parameters_from_network for s in flow.flows]
    x = torch.randn(9, 3, generator=torch.Generator().manual_seed(2))
    assert all(isinstance(s, InputDependentFlow) for s in back.flows)
    assert_same_flow(flow, back, x, WeightSampling(stochastic=False))
    # Stochastic passes from equal generators are equal: the networks are the same, mode included.
    f = _inputs(flow)
    draws = [m(f, x, sampling=WeightSampling(4, generator=torch.Generator().manual_seed(7))) for m in (flow, back)]
    torch.testing.assert_close(draws[0], draws[1], rtol=0, atol=0)
    assert draws[0].shape == (4, 9, 2)


def test_dtype_is_restored_and_user_classes_are_kept():
    flow = perturb(Cubic() >> make_flow("sal")).float()
    back = round_trip(flow)
    assert back.dtype == torch.float32 and type(back.flows[0]) is Cubic  # Cubic.name == "sal" is irrelevant
    record = flow_to_record(Scale(shift=3.0, s=2.0))
    assert record["class"] == "flow_user_classes.Scale" and record["kwargs"] == {"shift": 3.0, "s": 2.0}
    assert round_trip(Scale(shift=3.0, s=2.0)).shift == 3.0


def test_records_refuse_what_is_not_a_flow():
    record = flow_to_record(make_flow("tanh"))
    for path in ("torch.nn.Linear", "os.system", "builtins.dict"):
        with pytest.raises(TypeError, match="not a flowgp.flows.base.Flow subclass"):
            flow_from_record(dict(record, **{"class": path}))
    with pytest.raises(ImportError, match="cannot import the class"):
        flow_from_record(dict(record, **{"class": "no_such_module_xyz.Flow"}))
    with pytest.raises(ValueError, match="keys"):
        flow_from_record({"class": "flowgp.flows.Tanh"})
    with pytest.raises(TypeError, match="must be a flowgp Flow"):
        flow_to_record(torch.nn.Linear(1, 1))

    class Local(Scale):
        pass

    with pytest.raises(TypeError, match="module level"):
        flow_to_record(Local())


USER_MODULE = '''
import torch
from flowgp.numerics.constraints import Positive
from flowgp.flows import Flow, ParamSpec


class Warp(Flow):
    """A user's flow: G(f) = sinh(f)·s + f, s > 0, registered nowhere, with a built-in's name."""

    name = "tanh"
    param_specs = (ParamSpec("s", Positive(), 0.5),)

    def __init__(self, offset, param_shape=()):
        super().__init__(param_shape=param_shape)
        self.offset = offset

    def _forward(self, f, p):
        return p["s"] * torch.sinh(f) + f + self.offset

    def _log_det(self, f, p):
        return torch.log(p["s"] * torch.cosh(f) + 1.0)
'''

LOADER = '''
import sys, torch
from flowgp.flows import flow_from_record
saved = torch.load(sys.argv[1], weights_only=True)
flow = flow_from_record(saved["flow"])
assert type(flow.flows[1]).__module__ == "user_flows_for_record", type(flow.flows[1])
assert flow.flows[1].offset == 0.25
y, log_det = flow.forward_and_log_det(saved["f"])
assert torch.equal(y, saved["y"]) and torch.equal(log_det, saved["log_det"])
assert torch.equal(flow.inverse(saved["y"]), flow.inverse(y))
print("ok", type(flow.flows[1]).__qualname__)
'''


def test_user_flow_survives_save_and_load_in_a_fresh_process(tmp_path, monkeypatch):
    (tmp_path / "user_flows_for_record.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    import user_flows_for_record

    flow = perturb(make_flow("sinharcsinh") >> user_flows_for_record.Warp(0.25, param_shape=(2,)) >> Tanh(a=30.0))
    f = torch.randn(5, 2, generator=torch.Generator().manual_seed(0))
    y, log_det = flow.forward_and_log_det(f)
    torch.save({"flow": flow_to_record(flow), "f": f, "y": y.detach(), "log_det": log_det.detach()},
               tmp_path / "flow.pt")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(SRC)]))
    done = subprocess.run([sys.executable, "-c", LOADER, str(tmp_path / "flow.pt")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", "Warp"]
