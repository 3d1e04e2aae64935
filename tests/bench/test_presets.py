"""The bench budgets (flowgp.bench.presets): a step budget turned into epochs per data set, minibatches capped at
the data, the paper's numbers (TGP appendix B.5-B.6), overrides that replace fields, and unknown names refused."""
import dataclasses

import pytest

from flowgp.bench.presets import PRESETS, get_application_preset, get_preset
from flowgp.gp.defaults import DEFAULTS


def test_a_step_budget_becomes_epochs_for_each_data_set():
    quick = get_preset("quick")  # 1 500 steps of minibatch 512
    assert quick.batch_for(300) == 300 and quick.batch_for(10_000) == 512
    assert quick.epochs_for(300) == 1500  # full batch: one step per epoch
    assert quick.epochs_for(10_000) == round(1500 / 20)  # ceil(10 000 / 512) = 20 steps per epoch
    assert quick.epochs_for(10 ** 7) == 1  # at least one epoch
    paper = get_preset("paper")
    assert paper.epochs_for(10 ** 6) == 15000 and paper.batch_for(50_000) == 10_000


def test_the_paper_budget_is_the_appendix_one():
    paper = PRESETS["paper"]
    assert (paper.epochs, paper.lr, paper.noise, paper.lengthscale, paper.kmeans_restarts) == (15000, 0.01, 0.05,
                                                                                              2.0, 10)
    assert paper.lr == DEFAULTS.lr and paper.noise == DEFAULTS.noise  # read from the one place defaults live
    air, rain = get_application_preset("airquality", "paper"), get_application_preset("rainfall", "paper")
    assert (air.epochs, rain.epochs, air.lengthscale, air.noise, air.batch_size) == (10000, 20000, 0.1, 1.0, None)


def test_the_estimator_arguments_follow_the_preset():
    kw = get_preset("tiny").estimator_kwargs(1000)
    assert kw["batch_size"] == 128 and kw["epochs"] == 1  # 5 steps, 8 per epoch: rounds to the one-epoch floor
    assert (kw["quadrature_points"], kw["predict_quadrature_points"], kw["kmeans_restarts"]) == (10, 20, 1)


def test_large_inducing_sets_train_for_their_own_epochs_unless_epochs_are_given():
    quick = get_application_preset("airquality", "quick")
    assert quick.epochs_for(500, num_inducing=60) == 1000 and quick.epochs_for(500, num_inducing=595) == 200
    fixed = get_application_preset("airquality", "quick", epochs=50)
    assert fixed.epochs_for(500, num_inducing=595) == 50  # an explicit count applies to every M


def test_overrides_replace_fields_and_epochs_clear_the_step_budget():
    p = get_preset("quick", epochs=7, lr=None, batch_size=64)
    assert (p.epochs, p.steps, p.batch_size, p.lr) == (7, None, 64, PRESETS["quick"].lr)  # None: keep the field
    assert p.epochs_for(10 ** 6) == 7 and PRESETS["quick"].steps == 1500  # the table itself is unchanged
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.epochs = 3


def test_unknown_names_are_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"unknown preset 'fast'; choose one of \['paper', 'quick'"):
        get_preset("fast")
    with pytest.raises(ValueError, match="unknown preset 'reference' for rainfall"):
        get_application_preset("rainfall", "reference")
    with pytest.raises(ValueError, match="unknown application 'weather'"):
        get_application_preset("weather", "quick")
