"""`flowgp bench timing` (flowgp.bench.timing): medians per model and ratios to the first model in closed form,
models in the order asked, and bad budgets refused before any data is read."""
import argparse

import pytest

from flowgp.bench import timing


def _row(model, train, predict, epochs=10):
    return {"model": model, "train_seconds": train, "predict_seconds": predict, "epochs": epochs}


def test_medians_and_ratios_against_the_first_model():
    rows = [_row("svgp", 1.0, 0.1), _row("tgp", 3.0, 0.5), _row("svgp", 2.0, 0.3), _row("tgp", 5.0, 0.7),
            _row("svgp", 9.0, 0.2), _row("tgp", 4.0, 0.6)]
    svgp, tgp = timing.summarise(rows, ["svgp", "tgp"])
    assert (svgp["repeats"], svgp["train_median_s"], svgp["predict_median_s"]) == (3, 2.0, 0.2)
    assert svgp["train_s_per_epoch"] == pytest.approx(0.2) and svgp["train_ratio"] == svgp["predict_ratio"] == 1.0
    assert tgp["train_ratio"] == pytest.approx(4.0 / 2.0) and tgp["predict_ratio"] == pytest.approx(0.6 / 0.2)
    # the order asked decides the reference; a model without rows is left out
    tgp_first = timing.summarise(rows, ["tgp", "dgp", "svgp"])
    assert [s["model"] for s in tgp_first] == ["tgp", "svgp"] and tgp_first[1]["train_ratio"] == pytest.approx(0.5)
    assert [s["model"] for s in timing.summarise(rows)] == ["svgp", "tgp"]  # default: the rows' order
    assert timing.summarise([]) == []


@pytest.mark.parametrize("bad", [dict(repeats=0), dict(epochs=0)])
def test_a_run_without_repeats_or_epochs_is_refused(bad):
    parser = argparse.ArgumentParser()
    timing.add_arguments(parser)
    args = parser.parse_args(["--data-dir", "/nonexistent"])
    for k, v in bad.items():
        setattr(args, k, v)
    with pytest.raises(ValueError, match="--repeats and --epochs must be >= 1"):
        timing.run(args)
