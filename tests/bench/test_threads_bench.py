"""`flowgp bench ... --threads`: parsed as the estimators take it and handed to the estimators the bench builds."""
import pytest

from flowgp.bench.models import make_estimator
from flowgp.bench.presets import get_preset
from flowgp.cli import main


@pytest.mark.parametrize("threads", [3, "auto"])
def test_make_estimator_hands_threads_to_the_estimator(threads):
    est = make_estimator("svgp", get_preset("quick"), 10, 0, 100, threads=threads)
    assert est.get_params()["threads"] == threads
    assert make_estimator("tgp", get_preset("quick"), 10, 0, 100).threads == "auto"


@pytest.mark.parametrize("subcommand", ["timing", "uci", "airquality", "rainfall"])
def test_bench_threads_parse_and_bad_values_are_the_usage_error(subcommand, capsys):
    with pytest.raises(SystemExit) as help_exit:
        main(["bench", subcommand, "--help"])
    assert help_exit.value.code == 0 and "--threads N|auto" in capsys.readouterr().out
    for bad in ("0", "-2", "many"):
        with pytest.raises(SystemExit) as exit_:
            main(["bench", subcommand, "--threads", bad, "--out", "unused"])
        assert exit_.value.code == 2 and "--threads" in capsys.readouterr().err


def test_uci_jobs_carry_threads_outside_the_row_key(tmp_path):
    import argparse

    from flowgp.bench import uci

    parser = argparse.ArgumentParser()
    uci.add_arguments(parser)
    csv = tmp_path / "d.csv"
    csv.write_text("a,b,y\n" + "\n".join(f"{i},{i % 3},{i * 0.5}" for i in range(30)) + "\n")
    args = parser.parse_args(["--datasets", f"csv:{csv}:y", "--splits", "0", "--models", "svgp", "--threads", "2"])
    jobs = uci.build_jobs(args)
    assert jobs and all(job["threads"] == 2 for job in jobs)
    assert "threads" not in uci.KEY_FIELDS  # a row's result does not depend on it: resumed runs keep their rows
