"""The auto-compile policy: compile when the probe says it pays off, go back to eager when it is not faster."""
import torch

from flowgp.training.compile_policy import AutoCompile
from flowgp.training.compiled import AUTO_PROBE_STEPS
from flowgp.training.distributed import World


def test_auto_compile_compiles_when_it_pays_off_and_goes_back_when_not_faster():
    tracked = [torch.zeros(1)]
    eager, compiled, reports = object(), object(), []
    policy = AutoCompile(True, 0, eager, tracked, None, World(), reports.append, 1000, lambda step: False,
                         compiler=lambda *a, **k: compiled, pays_off=lambda *a, **k: (True, "pays"))
    step = 0
    while policy.timing and step < AUTO_PROBE_STEPS:
        policy.record(1.0)
        step += 1
        switched = policy.after_step(step)
    assert switched is compiled and policy.timing  # now the compiled steps are timed
    for _ in range(AUTO_PROBE_STEPS):
        policy.record(2.0)  # slower than eager
        step += 1
        switched = policy.after_step(step)
    assert switched is eager and not policy.timing and reports[0] == "pays" and "back to eager" in reports[1]
