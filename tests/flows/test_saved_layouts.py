"""Flow parameters packed in one tensor, the SAL as one stage, and files saved before either (flowgp.flows.base,
`Flow.upgrade_state_dict`): earlier versions stored each flow parameter as its own `raw_<name>` tensor and built
"sal" as the two stages SinhArcsinh >> Affine; such files must load into today's flows and give the same maps."""
import re

import numpy as np
import pytest
import torch

from flow_testing import perturb
from flowgp.flows import (SAL, Affine, ArcsinhCombination, Compose, InputDependentFlow, LinearCombination,
                          SinhArcsinh, Softplus, Tanh, WeightSampling, make_flow, make_input_dependent)
from flowgp.flows.base import Flow

pytestmark = pytest.mark.usefixtures("float64_default")


def separate_parameters(module) -> dict:
    """`module`'s state dict as earlier versions wrote it: each flow parameter its own `raw_<name>` entry."""
    flows = {name: m for name, m in module.named_modules() if isinstance(m, Flow) and m.param_specs}
    out = {}
    for key, value in module.state_dict().items():
        owner = key[:-len(".raw")] if key.endswith(".raw") else ("" if key == "raw" else None)
        if owner in flows:
            for spec, row in zip(flows[owner].param_specs, value):
                out[(owner + "." if owner else "") + "raw_" + spec.name] = row.clone()
        else:
            out[key] = value.clone()
    return out


def two_stage_sal(module) -> dict:
    """`module`'s state dict as written when "sal" was SinhArcsinh >> Affine and parameters were separate: every
    SAL (or input-dependent SAL) becomes two stages, and the stages after it in its composition move up one."""
    state = separate_parameters(module)
    names = dict(module.named_modules())

    def is_sal(m):
        return isinstance(m, SAL) or (isinstance(m, InputDependentFlow) and isinstance(m.base, SAL)
                                      and m.parameters_from_network is not None)

    def split(prefix, m, first, second):  # the SAL under `prefix` -> stages `first` and `second`
        base = prefix + ("base." if isinstance(m, InputDependentFlow) else "")
        head = first + ("base." if isinstance(m, InputDependentFlow) else "")
        moved = {}
        for key in [k for k in state if k.startswith(prefix)]:
            rest = key[len(prefix):]
            value = state.pop(key)
            if key.startswith(base) and rest.endswith(("raw_a", "raw_b", "raw_c", "raw_d")):
                name = key[-1]
                moved[(head + "raw_" + name) if name in "ab" else (second + "raw_" + "ab"["cd".index(name)])] = value
            else:
                moved[first + rest] = value
        return moved

    for prefix_name, m in names.items():
        if not isinstance(m, Compose) or not any(is_sal(c) for c in m.flows):
            continue
        old = (prefix_name + "." if prefix_name else "") + "flows."
        moved, j = {}, 0
        for i, child in enumerate(m.flows):
            if is_sal(child):
                moved.update(split(f"{old}{i}.", child, f"{old}{j}.", f"{old}{j + 1}."))
                j += 2
            else:
                for key in [k for k in state if k.startswith(f"{old}{i}.")]:
                    moved[f"{old}{j}." + key[len(f"{old}{i}."):]] = state.pop(key)
                j += 1
        state.update(moved)
    def parent_flow(name):
        while "." in name:
            name = name.rsplit(".", 1)[0]
            if isinstance(names[name], Flow):
                return names[name]
        return names[""] if name else None

    for name, m in names.items():  # a SAL on its own (the whole flow, a term of a sum): it was a composition
        parent = parent_flow(name)
        if is_sal(m) and not isinstance(parent, Compose) and not (parent is not None and is_sal(parent)):
            prefix = name + "." if name else ""
            state.update(split(prefix, m, prefix + "flows.0.", prefix + "flows.1."))
    return state


def _inputs(shape=(9, 2), seed=5):
    return 1.3 * torch.randn(shape, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------- SAL
@pytest.mark.parametrize("param_shape", [(), (2,)])
def test_sal_is_the_sinh_arcsinh_followed_by_the_affine_map(param_shape):
    """TGP eq. 2, one stage: d·sinh(b·arcsinh(f) - a) + c, with the gradients of the two-stage composition."""
    pair = perturb(SinhArcsinh(param_shape=param_shape) >> Affine(param_shape=param_shape), seed=3)
    sal = SAL(param_shape=param_shape)
    with torch.no_grad():
        sal.raw.copy_(torch.cat([pair.flows[0].raw, pair.flows[1].raw]))
    f = _inputs()
    torch.testing.assert_close(sal(f), pair(f), rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(sal.inverse(pair(f)), f, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(sal.log_abs_det_jacobian(f), pair.log_abs_det_jacobian(f), rtol=1e-12, atol=1e-12)
    (g_sal,) = torch.autograd.grad(sal(f).square().sum(), sal.raw)
    g_pair = torch.autograd.grad(pair(f).square().sum(), [pair.flows[0].raw, pair.flows[1].raw])
    torch.testing.assert_close(g_sal, torch.cat(g_pair), rtol=1e-12, atol=1e-12)
    assert sal.spec == "sal" and type(make_flow("sal")) is SAL and sal.output_affine == ("c", "d")
    assert make_flow("sal+softplus").spec == "sal+softplus"


def test_one_parameter_tensor_per_flow_and_its_accessors():
    flow = Tanh(param_shape=(2,), a=2.0, d=[0.5, -0.5])
    assert [name for name, _ in flow.named_parameters()] == ["raw"] and flow.raw.shape == (4, 2)
    torch.testing.assert_close(flow.params()["d"], torch.tensor([0.5, -0.5]))
    flow.set_params(a=3.0, c=[1.0, 2.0])
    p = flow.params()
    torch.testing.assert_close(p["a"], torch.tensor([3.0, 3.0]))
    torch.testing.assert_close(p["c"], torch.tensor([1.0, 2.0]))
    assert flow.raw_parameter("c").data_ptr() == flow.raw[2].data_ptr()  # a view of its row
    with pytest.raises(ValueError, match="has no parameter 'e'; valid: \\['a', 'b', 'c', 'd'\\]"):
        flow.set_params(e=1.0)
    with pytest.raises(ValueError, match="a must be > 0"):
        flow.set_params(a=-1.0)
    with pytest.raises(ValueError, match="does not broadcast"):
        flow.set_params(c=[1.0, 2.0, 3.0])
    assert not any(True for _ in Softplus().parameters())  # no parameters, no tensor


# ---------------------------------------------------------------------------------------------- old files
@pytest.mark.parametrize("param_shape", [(), (2,)])
@pytest.mark.parametrize("build", [lambda s: Tanh(param_shape=s), lambda s: ArcsinhCombination(3, param_shape=s),
                                   lambda s: LinearCombination([Tanh(param_shape=s), SinhArcsinh(param_shape=s)]),
                                   lambda s: make_flow("tukey+boxcox+l", param_shape=s)],
                         ids=["tanh", "lincomb3", "sum(tanh,sa)", "tukey+boxcox+l"])
def test_separate_parameters_of_earlier_files_load_into_one_tensor(build, param_shape):
    old = perturb(build(param_shape), seed=4)
    state = separate_parameters(old)
    assert any(re.search(r"raw_[a-z]+$", k) for k in state) and not any(k.endswith("raw") for k in state)
    new = build(param_shape)
    new.load_state_dict(state)  # strict
    for (name, a), b in zip(old.state_dict().items(), new.state_dict().values()):
        assert torch.equal(a, b), name


OLD_SAL_FLOWS = {  # today's spec: the same flow as earlier versions built it from that spec
    "sal": lambda s: Compose([SinhArcsinh(param_shape=s), Affine(param_shape=s)]),
    "sal+softplus": lambda s: Compose([SinhArcsinh(param_shape=s), Affine(param_shape=s), Softplus()]),
    "tanh+sal+sal+softplus": lambda s: Compose([Tanh(param_shape=s), SinhArcsinh(param_shape=s),
                                                Affine(param_shape=s), SinhArcsinh(param_shape=s),
                                                Affine(param_shape=s), Softplus()]),
    "sum(sal,tanh)": lambda s: LinearCombination([Compose([SinhArcsinh(param_shape=s), Affine(param_shape=s)]),
                                                  Tanh(param_shape=s)]),
}


@pytest.mark.parametrize("param_shape", [(), (2,)])
@pytest.mark.parametrize("spec", OLD_SAL_FLOWS)
def test_sal_saved_as_two_stages_loads_as_one(spec, param_shape):
    old = perturb(OLD_SAL_FLOWS[spec](param_shape), seed=6)
    new = make_flow(spec, param_shape=param_shape)
    state = separate_parameters(old)
    assert two_stage_sal(new).keys() == state.keys()  # the helper writes what earlier versions wrote
    new.load_state_dict(state)  # strict: every entry placed
    f = _inputs()
    torch.testing.assert_close(new(f), old(f), rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(new.log_abs_det_jacobian(f), old.log_abs_det_jacobian(f), rtol=1e-12, atol=1e-12)
    again = make_flow(spec, param_shape=param_shape)
    again.load_state_dict(new.state_dict())  # today's layout loads unchanged
    torch.testing.assert_close(again(f), new(f), rtol=0, atol=0)


@pytest.mark.parametrize("spec", ["sal", "sal+softplus"])
def test_input_dependent_sal_saved_as_two_stages_loads_as_one(spec):
    old = make_input_dependent(OLD_SAL_FLOWS[spec](()), 3, hidden=(4,), generator=torch.Generator().manual_seed(1))
    assert isinstance(old, Compose) and isinstance(old.flows[0], InputDependentFlow)  # the old structure
    perturb(old, seed=2)
    new = make_input_dependent(make_flow(spec), 3, hidden=(4,))
    state = separate_parameters(old)
    assert two_stage_sal(new).keys() == state.keys()
    new.load_state_dict(state)
    x, f = torch.randn(9, 3, generator=torch.Generator().manual_seed(3)), _inputs((9, 1))
    point = WeightSampling(1, False)
    torch.testing.assert_close(new(f, x, sampling=point), old(f, x, sampling=point), rtol=1e-13, atol=1e-13)


def test_partial_and_incomplete_state_dicts():
    flow = make_flow("sal+softplus")
    missing, unexpected = flow.load_state_dict({}, strict=False)  # e.g. an SVGP's state loaded into a TGP
    assert missing == ["flows.0.raw"] and unexpected == []
    old = separate_parameters(OLD_SAL_FLOWS["sal+softplus"](()))
    del old["flows.1.raw_b"]
    with pytest.raises(RuntimeError, match="flows.0.raw"):
        flow.load_state_dict(old)  # an incomplete old file is reported, not half loaded


def test_an_estimator_saved_before_the_change_loads(tmp_path):
    """A fitted TGPRegressor (flow "sal+softplus") written in the earlier layout predicts as it did."""
    import flowgp
    from flowgp.training.checkpoint import atomic_save, safe_load

    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, size=(40, 1))
    y = np.exp(np.sin(2 * x[:, 0])) + 0.1 * rng.standard_normal(40)
    est = flowgp.TGPRegressor(flow="sal+softplus", num_inducing=8, epochs=20, seed=0).fit(x, y)
    est.save(tmp_path / "now.pt")
    state = safe_load(tmp_path / "now.pt")
    state["model"] = two_stage_sal(est.model_)
    assert any(k.endswith("flows.1.raw_b") for k in state["model"])
    atomic_save(state, tmp_path / "before.pt")
    loaded = flowgp.TGPRegressor.load(tmp_path / "before.pt")
    np.testing.assert_allclose(loaded.predict(x), est.predict(x), rtol=1e-12, atol=1e-12)


def test_input_dependent_sal_keeps_its_affine_map_shared():
    """Appendix B.6: the network gives the sinh-arcsinh's (a, b) per input; (c, d) are the base's own values."""
    base = perturb(SAL(param_shape=(2,)), seed=7)
    flow = InputDependentFlow(base, input_dim=3, hidden=(4,), parameters=("a", "b"), dropout=0.0, bayesian="point")
    assert flow.num_raw == 4 and flow.parameters_from_network == ("a", "b")  # (a, b) for each of 2 outputs
    x, f = torch.randn(6, 3, generator=torch.Generator().manual_seed(1)), _inputs((6, 2))
    p = flow.params(x, sampling=WeightSampling(1, False))
    assert p["a"].shape == (6, 2) and p["c"].shape == (2,)
    torch.testing.assert_close(p["c"], base.params()["c"])
    torch.testing.assert_close(p["d"], base.params()["d"])
    plain = SAL(param_shape=(2,))
    with torch.no_grad():
        plain.raw.copy_(base.raw)
    for n in range(6):  # row n is the plain SAL with the network's (a, b) at x_n
        with torch.no_grad():
            plain.raw[0].copy_(p["a"][n])
            plain.raw[1].copy_(torch.log(torch.expm1(p["b"][n])))
        torch.testing.assert_close(flow(f, x, sampling=WeightSampling(1, False))[n], plain(f[n]), rtol=1e-12, atol=1e-12)
    (grad,) = torch.autograd.grad(flow(f, x, sampling=WeightSampling(1, False)).sum(), base.raw)
    assert bool(torch.all(grad[2:] != 0)) and bool(torch.all(grad[:2] == 0))  # only (c, d) of the base are used
    with pytest.raises(ValueError, match="parameters must name some of the 'sal' flow's parameters"):
        InputDependentFlow(SAL(), input_dim=3, parameters=("e",))
    with pytest.raises(ValueError, match="wrap the stages of a composed flow one by one"):
        InputDependentFlow(make_flow("sal+softplus"), input_dim=3, parameters=("a",))
