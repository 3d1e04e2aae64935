"""`flowgp bench snr` (flowgp.bench.snr): its lists and budgets are checked before any work, and a rerun whose rows
are all in OUT/snr.jsonl fits nothing and only tabulates and plots them (resumable)."""
import argparse
import json

import pytest

from flowgp.bench import snr


def _args(out, *extra):
    parser = argparse.ArgumentParser()
    snr.add_arguments(parser)
    return parser.parse_args(["--out", str(out), "--quiet", *extra])


@pytest.mark.parametrize("extra, match", [
    (["--layers", "1,x"], "--layers must be a comma-separated list of integers"),
    (["--num-importance", "0,5"], "--num-importance needs positive integers"),
    (["--layers", ""], "--layers needs positive integers"),
    (["--dataset", "mnist"], "--dataset must be one of"),
    (["--repeats", "1"], "--repeats must be >= 2"),
    (["--gradient", "reg,sticky"], "gradient"),
])
def test_bad_arguments_are_refused_before_any_work(tmp_path, extra, match):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=match):
        snr.run(_args(out, *extra))
    assert not out.exists()


def test_a_finished_run_only_tabulates_its_rows(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    args = _args(out, "--layers", "1,2", "--num-importance", "1,5", "--gradient", "reg,dreg", "--repeats", "4",
                 "--points", "2")
    rows = [{"dataset": "demo", "layers": d, "num_importance": k, "gradient": g, "repeats": 4, "points": 2,
             "seed": 0, "snr": 0.125 * d * k * (2 if g == "dreg" else 1)}
            for d in (1, 2) for k in (1, 5) for g in ("reg", "dreg")]
    (out / "snr.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert snr.run(args) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["layers", "gradient", "K=1", "K=5"]
    assert table[1].split() == ["1", "dreg", "0.2500", "1.2500"] and table[4].split() == ["2", "reg", "0.2500",
                                                                                           "1.2500"]
    assert (out / "snr.png").stat().st_size > 0
    assert not list(out.glob("*.pt"))  # no depth was fitted: every row was there
