"""The compiled training objective (flowgp.training.compiled) against the eager one: same bound, same gradients."""
from __future__ import annotations

import warnings

import pytest
import torch

from flowgp import SVGP, TGP, GaussianLikelihood, make_flow, make_kernel
from flowgp.training.compiled import CompiledObjective, CompileFallbackWarning, compile_unavailable_reason
from flowgp.numerics.linalg import CholeskyJitterWarning
from flowgp.training.loop import train

N, D, M, B = 96, 2, 8, 32


def _data(dtype=torch.float64):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(N, D, generator=g, dtype=dtype)
    y = torch.sin(2.0 * x[:, :1]) + 0.1 * torch.randn(N, 1, generator=g, dtype=dtype)
    return x, y


def _svgp(x, dtype=torch.float64):
    model = SVGP(make_kernel("rbf", D), x[:M].clone(), GaussianLikelihood(0.1)).to(dtype=dtype)
    with torch.no_grad():  # away from the prior, so every gradient is non-trivial
        g = torch.Generator().manual_seed(5)
        model.gp.q_mu.copy_(torch.randn(model.gp.q_mu.shape, generator=g, dtype=dtype))
        model.gp.q_sqrt.mul_(30.0).add_(0.05 * torch.randn(model.gp.q_sqrt.shape, generator=g, dtype=dtype))
    return model


def _negative_bound(model):
    """The training objective of `model` on a minibatch (-ELBO scaled to N rows) and its trainable parameters."""
    def objective(xb, yb):
        return -model.elbo(xb, yb, num_data=N)
    return objective, [p for p in model.parameters() if p.requires_grad]


def _loss_and_grads(objective, params, *args):
    value = objective(*args)
    grads = torch.autograd.grad(value, params)
    return value.detach(), [g.detach() for g in grads]


def _assert_same(objective, compiled, params, *args):
    loss_e, grads_e = _loss_and_grads(objective, params, *args)
    loss_c, grads_c = _loss_and_grads(compiled, params, *args)
    torch.testing.assert_close(loss_c, loss_e, rtol=1e-6, atol=1e-6)
    for ge, gc in zip(grads_e, grads_c):
        torch.testing.assert_close(gc, ge, rtol=1e-6, atol=1e-6)


needs_compiler = pytest.mark.skipif(compile_unavailable_reason("cpu") is not None,
                                    reason=f"torch.compile unavailable: {compile_unavailable_reason('cpu')}")


@needs_compiler
def test_compiled_svgp_step_matches_eager_float64():
    x, y = _data()
    model = _svgp(x)
    objective, params = _negative_bound(model)
    compiled = CompiledObjective(objective, params)
    for start in (0, B, 2 * B):  # three batches: the graph is reused, not rebuilt
        _assert_same(objective, compiled, params, x[start:start + B], y[start:start + B])
    assert compiled.failure is None and compiled.eager_calls == 0 and compiled.compile_seconds > 0


def test_traced_tgp_step_matches_eager_float64():
    # the warped likelihood's quadrature (nodes as graph constants) traced forward and backward
    x, y = _data()
    model = TGP(make_kernel("rbf", D), x[:M].clone(), make_flow("sal+softplus"), GaussianLikelihood(0.1),
                quadrature_points=12).to(dtype=torch.float64)
    objective, params = _negative_bound(model)
    compiled = CompiledObjective(objective, params, backend="aot_eager")
    _assert_same(objective, compiled, params, x[:B], y[:B])
    assert compiled.eager_calls == 0


def test_failed_cholesky_reruns_eagerly_with_the_jitter_policy():
    x, y = _data()
    model = SVGP(make_kernel("rbf", D), x[:M].clone(), GaussianLikelihood(0.1), jitter=0.0).to(dtype=torch.float64)
    objective, params = _negative_bound(model)
    compiled = CompiledObjective(objective, params, backend="aot_eager")
    compiled(x[:B], y[:B])  # compiled while K_ZZ is healthy
    assert compiled.eager_calls == 0
    with torch.no_grad():
        model.gp.inducing_points[1] = model.gp.inducing_points[0]  # duplicated: K_ZZ singular from now on
    with pytest.warns(CholeskyJitterWarning):
        value = compiled(x[:B], y[:B])  # the graph's single attempt fails (NaN): rerun eagerly, with retries
    assert torch.isfinite(value) and compiled.eager_calls == 1
    assert model.gp.jitter_memory.level is not None  # the retry's level was remembered
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CholeskyJitterWarning)
        torch.testing.assert_close(value, objective(x[:B], y[:B]))


def test_a_singular_start_takes_the_jitter_policy_before_compiling():
    x, y = _data()
    z = x[:M].clone()
    z[1] = z[0]  # a duplicated inducing point: K_ZZ is singular, the first Cholesky attempt fails
    model = SVGP(make_kernel("rbf", D), z, GaussianLikelihood(0.1), jitter=0.0).to(dtype=torch.float64)
    objective, params = _negative_bound(model)
    compiled = CompiledObjective(objective, params, backend="aot_eager")
    with pytest.warns(CholeskyJitterWarning):  # the eager evaluation before compiling retries and warns
        value = compiled(x[:B], y[:B])
    assert torch.isfinite(value) and model.gp.jitter_memory.level is not None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CholeskyJitterWarning)
        torch.testing.assert_close(value, objective(x[:B], y[:B]))


@pytest.mark.slow
def test_each_compiled_objective_has_its_own_graph_cache():
    # one inner objective function for many models (as the training loop builds them): each CompiledObjective
    # compiles a code object of its own, so ten models do not run into dynamo's recompile limit (8)
    x, y = _data()
    models = [_svgp(x) for _ in range(10)]

    compiled = [CompiledObjective(_negative_bound(m)[0], list(m.parameters()), backend="aot_eager") for m in models]
    for c in compiled:
        c(x[:B], y[:B])
    codes = {c._compiled._torchdynamo_orig_callable.__code__ for c in compiled}
    assert len(codes) == len(compiled) and all(c.eager_calls == 0 for c in compiled)


def test_bad_data_raises_the_eager_error_and_other_shapes_run_eagerly():
    x, y = _data()
    model = _svgp(x)
    objective, _ = _negative_bound(model)
    compiled = CompiledObjective(objective, list(model.parameters()), backend="aot_eager")
    compiled(x[:B], y[:B])
    bad = y[:B].clone()
    bad[3] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        compiled(x[:B], bad)
    smaller = compiled(x[:B - 5], y[:B - 5])  # a second signature: eager (max_signatures=1)
    torch.testing.assert_close(smaller, objective(x[:B - 5], y[:B - 5]))
    assert compiled.eager_calls == 2


def test_unavailable_compiler_falls_back_with_one_warning(monkeypatch):
    import flowgp.training.compiled as compiled_module

    monkeypatch.setattr(compiled_module, "compile_unavailable_reason", lambda device: "no C++ compiler (test)")
    x, y = _data()
    model = _svgp(x)
    objective, _ = _negative_bound(model)
    compiled = CompiledObjective(objective, list(model.parameters()))
    with pytest.warns(CompileFallbackWarning, match="no C\\+\\+ compiler"):
        first = compiled(x[:B], y[:B])
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileFallbackWarning)
        compiled(x[:B], y[:B])
    torch.testing.assert_close(first, objective(x[:B], y[:B]))
    assert not compiled.active and compiled.eager_calls == 2


def test_bad_arguments_are_refused():
    with pytest.raises(TypeError, match="objective must be callable"):
        CompiledObjective(3, [])
    with pytest.raises(ValueError, match="max_signatures"):
        CompiledObjective(lambda: None, [], max_signatures=-1)
    x, y = _data()
    with pytest.raises(ValueError, match="compile='yes' is not a torch.compile mode; use True, False, 'auto' or one"):
        train(_svgp(x), x, y, epochs=1, batch_size=B, verbose=False, compile="yes")
    with pytest.raises(TypeError, match="compile must be True, False, 'auto' or a torch.compile mode name"):
        train(_svgp(x), x, y, epochs=1, batch_size=B, verbose=False, compile=1)


def test_train_with_compile_follows_the_eager_fit(monkeypatch):
    import functools

    import flowgp.training.loop as training_module

    # the loop's hook, traced without building kernels (the compiled numerics are the test above's)
    monkeypatch.setattr(training_module, "CompiledObjective",
                        functools.partial(CompiledObjective, backend="aot_eager"))
    x, y = _data()
    eager_model, compiled_model = _svgp(x), _svgp(x)
    kwargs = dict(epochs=2, batch_size=B, lr=0.01, verbose=False, fix_noise_fraction=0.25)
    eager = train(eager_model, x, y, **kwargs)
    compiled = train(compiled_model, x, y, compile=True, **kwargs)
    torch.testing.assert_close(torch.tensor(compiled), torch.tensor(eager), rtol=1e-6, atol=1e-8)
    for pc, pe in zip(compiled_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(pc, pe, rtol=1e-6, atol=1e-8)


def test_traced_square_root_form_matches_eager_float64():
    # a minibatch smaller than 1.5 M takes the square-root form of the marginal terms (its own backward)
    x, y = _data()
    model = _svgp(x)
    objective, params = _negative_bound(model)
    compiled = CompiledObjective(objective, params, backend="aot_eager")
    _assert_same(objective, compiled, params, x[:M - 2], y[:M - 2])
    assert compiled.eager_calls == 0


def test_train_passes_a_compile_mode_to_torch_compile(monkeypatch):
    # compile="reduce-overhead" (CUDA graphs on a GPU) reaches torch.compile; True is its default mode
    import flowgp.training.loop as training_module

    modes = []

    def traced(*args, mode=None, **kwargs):
        modes.append(mode)
        return CompiledObjective(*args, backend="aot_eager", **kwargs)

    monkeypatch.setattr(training_module, "CompiledObjective", traced)
    x, y = _data()
    for compile in (True, "default", "reduce-overhead"):
        train(_svgp(x), x, y, epochs=1, batch_size=B, verbose=False, compile=compile)
    assert modes == [None, None, "reduce-overhead"]


@pytest.mark.parametrize("name, kwargs", [
    ("SVGPRegressor", dict(num_inducing=8)),
    ("DeepGPRegressor", dict(layers=2, num_inducing=8)),
    # DREG's gradient bookkeeping runs eagerly inside the compiled step; traced it had ended 1.6e-4 nats off
    ("LatentDeepGPRegressor", dict(layers=2, num_inducing=8, num_importance=3, gradient="dreg",
                                   num_samples_predict=200))])
def test_estimators_with_compile_follow_the_eager_fit(monkeypatch, name, kwargs):
    import numpy as np

    import flowgp.estimators as estimators
    import flowgp.training.loop as training_module

    calls = []

    def traced(*args, **kwargs):  # the loop's hook, traced without building kernels, counting its uses
        calls.append(1)
        return CompiledObjective(*args, backend="aot_eager", **kwargs)

    monkeypatch.setattr(training_module, "CompiledObjective", traced)
    x, y = _data()
    x, y = x.numpy(), y[:, 0].numpy()
    common = dict(epochs=3, batch_size=B, verbose=False, kmeans_restarts=1, **kwargs)
    eager = getattr(estimators, name)(**common).fit(x, y)
    assert not calls
    compiled = getattr(estimators, name)(compile=True, **common).fit(x, y)
    assert calls  # the estimator's fit went through the compiled objective
    np.testing.assert_allclose(compiled.history_, eager.history_, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(compiled.predict(x[:10]), eager.predict(x[:10]), rtol=1e-6, atol=1e-8)


def test_compile_pays_off_weighs_the_best_saving_against_the_compilation():
    from flowgp.training.compiled import (AUTO_COMPILE_SECONDS, AUTO_MAX_STEP_SAVING_SECONDS, AUTO_STEP_SAVING,
                                 compile_pays_off)

    # the measured cases of benchmarks/perf/compiled_fit_time.py on the project's CPU: 1 000-step SVGP fits at
    # M = 20 (1.2 ms a step) and M = 500 (16-20 ms) gain nothing from about 3.5 s of compilation
    assert not compile_pays_off(1.2e-3, 1000, "cpu")[0]
    assert not compile_pays_off(18e-3, 1000, "cpu")[0]
    assert compile_pays_off(1.2e-3, 10_000, "cpu")[0] and compile_pays_off(18e-3, 3000, "cpu")[0]
    # the rule at its edges: steps * min(share * step, most per step) against compilations * cost
    short = AUTO_COMPILE_SECONDS["cpu"] / AUTO_STEP_SAVING["cpu"] / 10_000  # short enough for the share to rule
    assert short * AUTO_STEP_SAVING["cpu"] < AUTO_MAX_STEP_SAVING_SECONDS["cpu"]
    assert compile_pays_off(1.01 * short, 10_000, "cpu")[0] and not compile_pays_off(0.99 * short, 10_000)[0]
    assert not compile_pays_off(1.5 * short, 10_000, "cpu", compilations=2)[0]
    steps = AUTO_COMPILE_SECONDS["cpu"] / AUTO_MAX_STEP_SAVING_SECONDS["cpu"]  # a long step saves at most the cap
    assert compile_pays_off(1.0, int(1.01 * steps), "cpu")[0] and not compile_pays_off(1.0, int(0.99 * steps))[0]
    assert not compile_pays_off(1.0, 0, "cpu")[0]
    worth, reason = compile_pays_off(18e-3, 990, "cpu")
    assert not worth and "990 steps of 18.00 ms" in reason and reason.endswith("staying eager")
    with pytest.raises(ValueError, match="eager_step_seconds"):
        compile_pays_off(float("nan"), 10)
    with pytest.raises(ValueError, match="remaining_steps"):
        compile_pays_off(1e-3, -1)


def _counting_hook(monkeypatch, modes):
    import flowgp.training.loop as training_module

    def traced(*args, mode=None, **kwargs):  # traced without building kernels, counting its uses
        modes.append(mode)
        return CompiledObjective(*args, backend="aot_eager", mode=mode, **kwargs)

    monkeypatch.setattr(training_module, "CompiledObjective", traced)
    return training_module


def test_auto_compile_leaves_a_short_fit_eager(monkeypatch):
    modes = []
    _counting_hook(monkeypatch, modes)
    x, y = _data()
    eager_model, auto_model = _svgp(x), _svgp(x)
    kwargs = dict(epochs=6, batch_size=B, lr=0.01, verbose=False)
    eager = train(eager_model, x, y, **kwargs)
    auto = train(auto_model, x, y, compile="auto", **kwargs)
    assert modes == []  # 18 steps of a tiny model: nothing to repay a compilation with
    assert auto == eager
    for pa, pe in zip(auto_model.parameters(), eager_model.parameters()):
        assert torch.equal(pa, pe)


def test_auto_compile_switches_after_the_probe_and_follows_the_eager_fit(monkeypatch):
    from flowgp.training.compiled import AUTO_PROBE_STEPS

    modes, decisions = [], []
    training_module = _counting_hook(monkeypatch, modes)

    def always(seconds, remaining, device, compilations=1):
        decisions.append((remaining, compilations))
        return True, "test: compile"

    monkeypatch.setattr(training_module, "compile_pays_off", always)
    x, y = _data()
    eager_model, auto_model = _svgp(x), _svgp(x)
    # 3 steps per epoch, 8 epochs; the noise frozen for the first 6 steps, i.e. inside the probe
    kwargs = dict(epochs=8, batch_size=B, lr=0.01, verbose=False, fix_noise_fraction=0.25)
    eager = train(eager_model, x, y, **kwargs)
    auto = train(auto_model, x, y, compile="auto", **kwargs)
    assert modes == [None]  # one compiled objective, torch.compile's default mode, built after the probe
    assert decisions == [(24 - AUTO_PROBE_STEPS, 1)]  # the noise was already unfrozen: one compilation
    torch.testing.assert_close(torch.tensor(auto), torch.tensor(eager), rtol=1e-6, atol=1e-8)
    for pa, pe in zip(auto_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(pa, pe, rtol=1e-6, atol=1e-8)
    # a later unfreezing of the noise is counted as a second compilation
    decisions.clear()
    train(_svgp(x), x, y, compile="auto", **dict(kwargs, fix_noise_fraction=0.75))
    assert decisions == [(24 - AUTO_PROBE_STEPS, 2)]


def test_auto_compile_goes_back_to_eager_when_the_compiled_steps_are_not_faster(monkeypatch):
    """compile="auto" times AUTO_PROBE_STEPS compiled steps after compiling; slower than the eager probe, the
    rest of the fit runs eagerly (here the compiled objective is made 20 ms slower per call)."""
    import time as time_module

    from flowgp.training.compiled import AUTO_PROBE_STEPS

    import flowgp.training.loop as training_module

    calls = []

    class Slow:
        def __init__(self, objective, *args, **kwargs):
            self.objective = objective

        def __call__(self, *args):
            calls.append(1)
            time_module.sleep(0.02)
            return self.objective(*args)

    monkeypatch.setattr(training_module, "CompiledObjective", Slow)
    monkeypatch.setattr(training_module, "compile_pays_off", lambda *a, **k: (True, "test: compile"))
    x, y = _data()
    eager_model, auto_model = _svgp(x), _svgp(x)
    kwargs = dict(epochs=12, batch_size=B, lr=0.01, verbose=False)  # 3 steps per epoch: 36 steps
    eager = train(eager_model, x, y, **kwargs)
    auto = train(auto_model, x, y, compile="auto", **kwargs)
    assert len(calls) == AUTO_PROBE_STEPS  # timed, found slower, dropped: the other 16 steps ran eagerly
    assert auto == eager  # the wrapper evaluates the eager objective: the same fit
    for pa, pe in zip(auto_model.parameters(), eager_model.parameters()):
        assert torch.equal(pa, pe)
