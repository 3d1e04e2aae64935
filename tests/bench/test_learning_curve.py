"""flowgp.bench.learning_curve: the curve recorder's evaluation leaves the training as it was; the curve file's
points after a resumed fit's step are dropped, a torn last line is cut; the stratified test subset; the option
checks. (The recorder inside `flowgp bench images`: tests/bench/test_images.py.)"""
import json

import numpy as np
import pytest
import torch

from flowgp.bench.learning_curve import (CurveRecorder, append_point, drop_points_after, positive_steps,
                                         stratified_subset)
from flowgp.bench.results import read_rows


def test_the_evaluation_runs_in_eval_mode_without_gradients_and_restores_the_global_random_states(tmp_path):
    model = torch.nn.Linear(2, 1)
    model.train()
    seen = []

    def evaluate():
        seen.append((model.training, torch.is_grad_enabled()))
        torch.rand(3), np.random.rand(3)  # draws from the global generators, which the recorder puts back
        return {"accuracy": 0.5}

    recorder = CurveRecorder(tmp_path / "c.jsonl", {"model": "m"}, evaluate, every=2, total=3, steps_per_epoch=1,
                             num_data=10)
    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()[1].copy()
    for step, loss in enumerate((30.0, 20.0, 10.0)):
        assert recorder(step, loss, model) is False  # never stops the fit
    assert seen == [(False, False), (False, False)] and model.training
    assert torch.equal(torch.get_rng_state(), torch_state) and np.array_equal(np.random.get_state()[1], numpy_state)
    points = read_rows(tmp_path / "c.jsonl")
    assert [(p["step"], p["epoch"], p["model"]) for p in points] == [(2, 2.0, "m"), (3, 3.0, "m")]
    # the training objective: the mean of -loss / N over the steps since the previous point
    assert [p["train_objective"] for p in points] == [pytest.approx(-2.5), pytest.approx(-1.0)]
    assert recorder.eval_seconds >= sum(p["eval_seconds"] for p in points) > 0


def test_a_point_cut_short_by_an_interruption_is_written_with_the_checkpoint(tmp_path):
    model = torch.nn.Linear(2, 1)
    calls = []

    def evaluate():
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt  # Ctrl-C during the point's evaluation
        return {"accuracy": 1.0}

    recorder = CurveRecorder(tmp_path / "c.jsonl", {"model": "m"}, evaluate, every=1, total=5, steps_per_epoch=1)
    with pytest.raises(KeyboardInterrupt):
        recorder(0, 1.0, model)
    assert model.training and not (tmp_path / "c.jsonl").exists()
    state = recorder.state_dict()  # what the training loop saves next, at the same step
    assert [p["step"] for p in read_rows(tmp_path / "c.jsonl")] == [1]
    resumed = CurveRecorder(tmp_path / "c.jsonl", {"model": "m"}, evaluate, every=1, total=5, steps_per_epoch=1)
    resumed.load_state_dict(state)
    assert resumed.train_seconds() >= state["train_seconds"] and resumed.eval_seconds == state["eval_seconds"]


def test_points_after_the_step_a_fit_continues_from_are_dropped(tmp_path):
    path = tmp_path / "curve.jsonl"
    for model in ("a", "b"):
        for step in (2, 4, 6):
            append_point(path, {"model": model, "seed": 0, "step": step})
    with path.open("a") as fh:
        fh.write('{"model": "a", "step": 8\n')  # a damaged line
    assert drop_points_after(path, {"model": "a", "seed": 0}, 3) == 2
    assert [(r["model"], r["step"]) for r in read_rows(path)] == [("a", 2), ("b", 2), ("b", 4), ("b", 6)]
    before = path.read_bytes()
    assert drop_points_after(path, {"model": "b", "seed": 0}, 6) == 0 and path.read_bytes() == before
    assert drop_points_after(tmp_path / "missing.jsonl", {"model": "a"}, 0) == 0


def test_an_append_cuts_a_torn_last_line(tmp_path):
    path = tmp_path / "curve.jsonl"
    append_point(path, {"step": 1})
    with path.open("a") as fh:
        fh.write('{"step": 2, "accur')  # a writer killed mid-line
    append_point(path, {"step": 3})
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 3]


def test_the_stratified_subset_keeps_each_class_share():
    labels = np.array([0] * 50 + [1] * 30 + [2] * 20)
    rows = stratified_subset(labels, 10, seed=3)
    assert np.bincount(labels[rows]).tolist() == [5, 3, 2] and np.all(np.diff(rows) > 0)
    assert np.array_equal(rows, stratified_subset(labels, 10, seed=3))
    assert not np.array_equal(rows, stratified_subset(labels, 10, seed=4))
    assert np.bincount(labels[stratified_subset(labels, 7)]).tolist() == [4, 2, 1]  # largest remainders
    assert np.array_equal(stratified_subset(labels, 500), np.arange(100))  # more than there are: all


@pytest.mark.parametrize("value", [-1, "-1", "2.5", "x", True, None])
def test_positive_steps_names_the_option(value):
    with pytest.raises(ValueError, match="--curve-every must be"):
        positive_steps(value, "--curve-every", allow_zero=True)


def test_positive_steps_takes_whole_numbers():
    assert positive_steps("0", "--curve-every", allow_zero=True) == 0 and positive_steps(" 25 ", "--x") == 25
    with pytest.raises(ValueError, match="--x must be a positive whole number, got 0"):
        positive_steps(0, "--x")
