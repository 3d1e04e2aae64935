"""One CSV reader for the API and the command line: a file saved by Excel as "CSV UTF-8" (byte-order mark, CRLF
line ends, quoted fields) reads as the plain file does, and text or a missing value in a numeric column is one
ValueError naming the file, the row and the column - through `load_csv`, `fit(path)`, `predict_to_file` and
`flowgp fit`."""
import re

import numpy as np
import pytest

import flowgp
from flowgp.cli import main
from flowgp.data.tables import load_csv
from flowgp.data.sources import open_table


def _rows(n=40, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, size=(n, 2))
    return x, np.sin(x[:, 0]) + 0.1 * rng.standard_normal(n)


def _r(value) -> str:
    return repr(float(value))  # the shortest text that reads back as the same float


def _plain(path, x, y):
    path.write_text("u,v,target\n" + "".join(f"{_r(a)},{_r(b)},{_r(t)}\n" for (a, b), t in zip(x, y)))
    return path


def _excel(path, x, y):
    """What Excel's "CSV UTF-8" writes, at its most awkward: a byte-order mark, CRLF, quoted names and numbers,
    spaces around a name, and a blank line."""
    lines = ['"u"," v ","target"'] + [f'"{_r(a)}",{_r(b)},"{_r(t)}"' for (a, b), t in zip(x, y)]
    lines.insert(5, "")
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode() + b"\r\n")
    return path


def test_an_excel_csv_reads_as_the_plain_file_through_every_entry(tmp_path):
    x, y = _rows()
    plain, excel = _plain(tmp_path / "plain.csv", x, y), _excel(tmp_path / "excel.csv", x, y)
    tabs = tmp_path / "tabs.tsv"
    tabs.write_text(plain.read_text().replace(",", "\t"))
    for path in (plain, excel, tabs):
        got_x, got_y, names = load_csv(path, "target")
        assert names == ["u", "v"]
        np.testing.assert_array_equal(got_x, x)
        np.testing.assert_array_equal(got_y, y)
        source = open_table(path, "target")
        try:
            assert source.feature_names == ["u", "v"] and source.num_rows == 40
            np.testing.assert_array_equal(source.read(0, 40)[0], x)
        finally:
            source.close()
    kw = dict(num_inducing=4, epochs=3, verbose=False)
    a = flowgp.SVGPRegressor(**kw).fit(str(plain), "target")
    b = flowgp.SVGPRegressor(**kw).fit(str(excel), "target")
    np.testing.assert_array_equal(a.predict(x), b.predict(x))
    assert b.predict_to_file(excel, tmp_path / "p.csv", target="target", verbose=False)["rows"] == 40


def test_flowgp_fit_and_predict_take_an_excel_csv(tmp_path, capsys):
    x, y = _rows()
    plain, excel = _plain(tmp_path / "plain.csv", x, y), _excel(tmp_path / "excel.csv", x, y)
    common = ["--target", "target", "--model", "svgp", "--epochs", "3", "--num-inducing", "4", "--quiet"]
    for path in (plain, excel):
        assert main(["fit", "--data", str(path), *common, "--out", str(tmp_path / f"{path.stem}.pt")]) == 0
    assert main(["predict", "--model", str(tmp_path / "excel.pt"), "--data", str(excel),
                 "--out", str(tmp_path / "p.csv"), "--quiet"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    predicted = np.loadtxt(tmp_path / "p.csv", delimiter=",", skiprows=1)[:, 0]
    np.testing.assert_array_equal(predicted, flowgp.load(tmp_path / "plain.pt").predict(x))


BAD = [  # (cell written at the fourth data row (row 5: the header is row 1), what the message says)
    ("abc", "row 5, column 'v': 'abc' is not a number"),
    ("", "row 5, column 'v' is empty"),
    ("NA", "row 5, column 'v' holds 'NA', a missing value"),
    ('"1,5"', "row 5, column 'v': '1,5' is not a number"),
]


def _bad_file(path, cell, crlf=False):
    x, y = _rows(10)
    lines = ["u,v,target"] + [f"{a},{b},{t}" for (a, b), t in zip(x, y)]
    parts = lines[4].split(",")
    lines[4] = ",".join([parts[0], cell, parts[2]])
    path.write_bytes(("\r\n" if crlf else "\n").join(lines).encode() + b"\n")
    return path


@pytest.mark.parametrize("cell, message", BAD)
def test_text_or_a_missing_value_names_the_file_row_and_column(tmp_path, capsys, cell, message):
    path = _bad_file(tmp_path / "bad.csv", cell, crlf=True)
    with pytest.raises(ValueError, match=re.escape(message)):
        load_csv(path, "target")
    with pytest.raises(ValueError, match=re.escape(f"{path}, {message}")):
        flowgp.SVGPRegressor(epochs=1, num_inducing=2, verbose=False).fit(str(path), "target")
    assert main(["fit", "--data", str(path), "--target", "target", "--model", "svgp", "--epochs", "1", "--quiet",
                 "--out", str(tmp_path / "m.pt")]) == 2
    err = capsys.readouterr().err
    assert err == f"flowgp fit: error: --data {path}, {message}" + err[len(f"flowgp fit: error: --data {path}, "
                                                                         f"{message}"):]
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "m.pt").exists()


def test_a_bad_cell_far_down_a_streamed_file_is_named_by_its_row(tmp_path, capsys):
    # past the reader's first block (1 MiB): found while the file is streamed, still named by row and column
    n = 60000
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n, 2))
    lines = ["u,v,target"] + [f"{_r(a)},{_r(b)},{_r(a + b)}" for a, b in x]
    lines[n - 9] = lines[n - 9].split(",", 1)[0] + ",oops,0"  # data row n - 9: row n - 8 of the file
    path = tmp_path / "long.csv"
    path.write_text("\n".join(lines) + "\n")
    assert path.stat().st_size > 2 * 2 ** 20
    message = f"row {n - 8}, column 'v': 'oops' is not a number"
    with pytest.raises(ValueError, match=re.escape(message)):
        open_table(path, "target")
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("u,target\n1,2\n\n3,4,5\n")
    with pytest.raises(ValueError, match=re.escape("row 3 has 3 cells but the header has 2")):
        load_csv(ragged, "target")
