"""No output may be an input: `flowgp fit`, `flowgp predict`, `flowgp bench` and `predict_to_file` refuse, before
any work, an output path that names a file they read (the same path, a relative spelling of it, a symbolic or a
hard link), and `flowgp fit` never replaces a metadata file `OUT.json` it did not write."""
import json
import os
import re

import numpy as np
import pytest

from flowgp.cli import main
from flowgp.data.paths import check_distinct, is_metadata_file, same_file


def _sine_csv(path, n=30, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, size=(n, 2))
    y = np.sin(x[:, 0]) + 0.1 * rng.standard_normal(n)
    path.write_text("u,v,target\n" + "\n".join(f"{a},{b},{t}" for (a, b), t in zip(x, y)) + "\n")
    return path


FIT = ["--target", "target", "--model", "svgp", "--epochs", "2", "--num-inducing", "4", "--quiet"]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


@pytest.fixture
def fitted(tmp_path):
    csv = _sine_csv(tmp_path / "d.csv")
    model = tmp_path / "m.pt"
    assert main(["fit", "--data", str(csv), *FIT, "--out", str(model)]) == 0
    return csv, model


def test_same_file_sees_relative_paths_and_symbolic_and_hard_links(tmp_path, monkeypatch):
    real = tmp_path / "d.csv"
    real.write_text("a\n1\n")
    monkeypatch.chdir(tmp_path)
    assert same_file("d.csv", real) and same_file("./sub/../d.csv", real)
    (tmp_path / "soft.csv").symlink_to(real)
    os.link(real, tmp_path / "hard.csv")
    assert same_file(tmp_path / "soft.csv", real) and same_file("hard.csv", real)
    (tmp_path / "folder").symlink_to(tmp_path, target_is_directory=True)
    assert same_file(tmp_path / "folder" / "d.csv", real)
    assert not same_file(tmp_path / "other.csv", real) and not same_file(tmp_path / "new1", tmp_path / "new2")
    assert same_file(tmp_path / "new", "new")  # not there yet: the same path all the same
    with pytest.raises(ValueError, match=r"--out .*hard.csv is the same file as --data .*d.csv.*give --out another"):
        check_distinct({"--out": tmp_path / "hard.csv"}, {"--data": real})
    check_distinct({"--out": tmp_path / "p.csv"}, {"--data": real, "X": np.zeros(3)})  # distinct: no error


def test_predict_refuses_an_out_that_is_its_data_model_or_metadata(fitted, capsys, tmp_path):
    csv, model = fitted
    before = {p: p.read_bytes() for p in (csv, model, tmp_path / "m.pt.json")}
    (tmp_path / "link.csv").symlink_to(csv)
    capsys.readouterr()
    cases = [(csv, csv, "--out .*d.csv is the same file as --data"),
             (csv, tmp_path / "link.csv", "--out .*d.csv is the same file as --data .*link.csv"),
             (model, csv, "--out .*m.pt is the same file as --model"),
             (tmp_path / "m.pt.json", csv, "--out .*m.pt.json is the same file as --model's metadata file")]
    for out, data, message in cases:
        assert main(["predict", "--model", str(model), "--data", str(data), "--out", str(out), "--quiet"]) == 2
        err = _one_line(capsys)
        assert re.search(message, err), err
    assert {p: p.read_bytes() for p in before} == before  # every input as it was


def test_fit_refuses_an_out_or_checkpoint_that_is_its_data_or_each_other(tmp_path, capsys, monkeypatch):
    csv = _sine_csv(tmp_path / "d.csv")
    data = csv.read_bytes()
    monkeypatch.chdir(tmp_path)
    cases = [(["--out", "d.csv"], "--out d.csv is the same file as --data"),
             (["--out", "m.pt", "--checkpoint", str(csv)], "--checkpoint .*d.csv is the same file as --data"),
             (["--out", "m.pt", "--checkpoint", "./m.pt"], "--out m.pt is the same file as --checkpoint ./m.pt"),
             (["--out", "m", "--checkpoint", "m.json"], "--out's metadata file m.json is the same file as "
                                                         "--checkpoint m.json")]
    for extra, message in cases:
        assert main(["fit", "--data", str(csv), *FIT, *extra]) == 2, extra
        err = _one_line(capsys)
        assert re.search(message, err), err
    assert csv.read_bytes() == data and sorted(p.name for p in tmp_path.iterdir()) == ["d.csv"]


def test_an_output_inside_a_folder_read_as_one_table_is_refused(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "table"
    folder.mkdir()
    rng = np.random.default_rng(0)
    pq.write_table(pa.table({"u": rng.normal(size=20), "v": rng.normal(size=20), "target": rng.normal(size=20)}),
                   folder / "part-0.parquet")
    assert main(["fit", "--data", str(folder), *FIT, "--out", str(folder / "m.pt")]) == 2
    assert "lies inside the folder --data" in _one_line(capsys)
    assert sorted(p.name for p in folder.iterdir()) == ["part-0.parquet"]


def test_fit_keeps_a_users_own_file_where_the_metadata_would_go(tmp_path, capsys):
    csv = _sine_csv(tmp_path / "d.csv")
    mine = tmp_path / "m.pt.json"
    mine.write_text('{"my": "notes"}\n')
    assert main(["fit", "--data", str(csv), *FIT, "--out", str(tmp_path / "m.pt")]) == 2
    assert "m.pt.json exists and was not written by flowgp fit" in _one_line(capsys)
    assert mine.read_text() == '{"my": "notes"}\n' and not (tmp_path / "m.pt").exists()
    # flowgp's own metadata file (marked as such) is replaced by a new fit, as is one of an earlier version
    mine.unlink()
    assert main(["fit", "--data", str(csv), *FIT, "--out", str(tmp_path / "m.pt")]) == 0
    meta = json.loads(mine.read_text())
    assert meta["written_by"] == "flowgp fit" and meta["features"] == ["u", "v"] and is_metadata_file(mine)
    mine.write_text(json.dumps({"features": ["u", "v"], "target": "target", "model": "svgp"}))
    assert is_metadata_file(mine)
    assert main(["fit", "--data", str(csv), *FIT, "--out", str(tmp_path / "m.pt")]) == 0
    assert json.loads(mine.read_text())["written_by"] == "flowgp fit"
    # and `predict` does not take a user's file of that name for the model's metadata
    mine.write_text('{"features": "not ours"}')
    capsys.readouterr()
    assert main(["predict", "--model", str(tmp_path / "m.pt"), "--data", str(csv), "--target", "target",
                 "--out", str(tmp_path / "p.csv"), "--quiet"]) == 0
    assert len((tmp_path / "p.csv").read_text().splitlines()) == 31


def test_predict_to_file_refuses_to_write_over_its_data(fitted, tmp_path):
    import flowgp

    csv, model = fitted
    est = flowgp.load(model)
    data = csv.read_bytes()
    with pytest.raises(ValueError, match=r"path .*d.csv is the same file as data .*d.csv"):
        est.predict_to_file(csv, csv, target="target", verbose=False)
    with pytest.raises(ValueError, match="the same file as data"):
        est.predict_to_file(str(csv), os.path.relpath(csv), target="target", verbose=False)
    assert csv.read_bytes() == data
    assert est.predict_to_file(csv, tmp_path / "p.csv", target="target", verbose=False)["rows"] == 30


def test_bench_refuses_an_out_that_is_an_input_file(tmp_path, capsys):
    csv = _sine_csv(tmp_path / "d.csv")
    data = csv.read_bytes()
    assert main(["bench", "uci", "--datasets", f"csv:{csv}:target", "--models", "svgp", "--preset", "tiny",
                 "--out", str(csv), "--quiet"]) == 2
    assert "--out" in (err := _one_line(capsys)) and "--datasets" in err and "same file" in err
    assert main(["bench", "amogp", "--data", str(csv), "--out", str(csv), "--quiet"]) == 2
    assert "is the same file as --data" in _one_line(capsys)
    assert csv.read_bytes() == data
