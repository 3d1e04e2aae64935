"""The one CSV reader of flowgp, on pyarrow.csv: `load_csv`, the benchmark data loaders, the tables `fit`,
`fit_stream` and `predict_to_file` stream, and `flowgp fit` / `flowgp predict` all read CSV files through it.

- A UTF-8 byte-order mark (Excel's "CSV UTF-8") is skipped, CRLF and LF line ends are read alike, fields may be
  quoted (a quoted field may hold the delimiter or a line break), blank lines are skipped, and column names and
  numbers may carry spaces around them. `.tsv` files are tab-separated, the others comma-separated.
- Numeric columns are converted to float64 by pyarrow; text in a numeric column, a missing value (an empty
  cell or a marker such as NA, NaN, null, #N/A: pyarrow's defaults) and a row with the wrong number of cells are
  each a ValueError naming the file, the row and the column. Rows are counted as a spreadsheet shows them: the
  header is row 1, the first data row row 2 (blank lines are not counted).
- `csv_blocks` reads the file in blocks of about `BLOCK_BYTES` (pyarrow's streaming reader), so memory follows
  the block, not the file; `read_csv` gathers the blocks. Only the columns asked for are converted.

Errors are found in the fast, typed pass; only then is the file read again with every chosen column as text to
locate the first bad cell (`_first_problem`), so correct files pay nothing for the messages.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np

__all__ = ["csv_columns", "csv_blocks", "read_csv", "BLOCK_BYTES", "MISSING"]

#: bytes of the file converted at once (pyarrow's block size): the memory a streamed read holds
BLOCK_BYTES = 1 << 20

#: what a missing value does: "error" (a ValueError naming it), "drop" (the row is left out), "nan" (NaN in a
#: numeric column, "" in a text column)
MISSING = ("error", "drop", "nan")


def _label(path, label) -> str:
    return label if label is not None else os.fspath(path)


def _parse_options(path, handler=None):
    import pyarrow.csv as pc

    delimiter = "\t" if str(path).lower().endswith(".tsv") else ","
    return pc.ParseOptions(delimiter=delimiter, invalid_row_handler=handler)


def _unreadable(label: str, err: Exception) -> ValueError:
    return ValueError(f"{label}: not a readable CSV file ({str(err).strip().splitlines()[0]})")


def csv_columns(path, *, header: bool = True, label: Optional[str] = None) -> list[str]:
    """The column names of the CSV file `path` (spaces around them stripped); without a header "0", "1", ...
    FileNotFoundError for a missing file, ValueError naming `label` (default: the path) for an empty or
    unreadable one."""
    import pyarrow as pa
    import pyarrow.csv as pc

    label = _label(path, label)
    if not Path(path).is_file():
        raise FileNotFoundError(f"{label}: no such CSV file")
    try:
        reader = pc.open_csv(os.fspath(path), read_options=pc.ReadOptions(autogenerate_column_names=not header,
                                                                          block_size=BLOCK_BYTES),
                             parse_options=_parse_options(path))
    except pa.ArrowInvalid as err:
        if "Empty CSV file" in str(err):
            raise ValueError(f"{label} is empty; expected a header row naming the columns") from None
        message = _first_problem(path, None, (), (), header, label, "error")
        raise (ValueError(message) if message else _unreadable(label, err)) from None
    names = reader.schema.names
    reader.close()
    return [n.strip() for n in names] if header else [str(i) for i in range(len(names))]


def _reader(path, names, numeric, text, header, threads, handler=None):
    import pyarrow as pa
    import pyarrow.csv as pc

    types = {**{c: pa.float64() for c in numeric}, **{c: pa.string() for c in text}}
    if not threads:  # the locating pass: every chosen column as text
        types = {c: pa.string() for c in types}
    return pc.open_csv(
        os.fspath(path),
        read_options=pc.ReadOptions(column_names=list(names), skip_rows=1 if header else 0, use_threads=threads,
                                    block_size=BLOCK_BYTES),
        parse_options=_parse_options(path, handler),
        convert_options=pc.ConvertOptions(include_columns=list(types), column_types=types,
                                          strings_can_be_null=False))


def csv_blocks(path, numeric: Sequence[str], text: Sequence[str] = (), *, header: bool = True,
               label: Optional[str] = None, missing: str = "error",
               names: Optional[Sequence[str]] = None) -> Iterator[tuple]:
    """Blocks of rows of the CSV file `path`: (X [rows, len(numeric)] float64, [one array of str per column of
    `text`]), the columns in the order asked for. `names`: the file's column names when already read
    (`csv_columns`); `missing`: see `MISSING`. ValueError naming `label` (default: the path), the row and the
    column for text in a numeric column, a missing value (missing="error"), a row of the wrong width, or a file
    without data rows."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if missing not in MISSING:
        raise ValueError(f"missing must be one of {MISSING}, got {missing!r}")
    label = _label(path, label)
    names = csv_columns(path, header=header, label=label) if names is None else list(names)
    numeric, text = list(numeric), list(text)
    rows = 0
    try:
        reader = _reader(path, names, numeric, text, header, threads=True)
        for batch in reader:
            if not batch.num_rows:
                continue
            absent = np.zeros(batch.num_rows, dtype=bool)
            x = np.empty((batch.num_rows, len(numeric)), dtype=np.float64)
            for j, name in enumerate(numeric):
                column = batch.column(name)
                if column.null_count:
                    absent |= column.is_null().to_numpy(zero_copy_only=False)
                x[:, j] = column.to_numpy(zero_copy_only=False)  # a null becomes NaN
            texts = [np.asarray(pc.utf8_trim_whitespace(batch.column(name)).to_numpy(zero_copy_only=False),
                                dtype=object) for name in text]
            for t in texts:
                absent |= t == ""
            if absent.any():
                if missing == "error":
                    raise _Located
                if missing == "drop":
                    x, texts = x[~absent], [t[~absent] for t in texts]
            rows += batch.num_rows
            if len(x):
                yield x, texts
    except (_Located, pa.ArrowInvalid) as err:
        message = _first_problem(path, names, numeric, text, header, label, missing)
        if message is None:
            raise _unreadable(label, err) from None
        raise ValueError(message) from None
    if not rows:
        raise ValueError(f"{label} has {'a header but ' if header else ''}no data rows")


def read_csv(path, numeric: Sequence[str], text: Sequence[str] = (), *, header: bool = True,
             label: Optional[str] = None, missing: str = "error", names: Optional[Sequence[str]] = None):
    """The whole file as `csv_blocks` reads it: (X [N, len(numeric)], [one array of str per `text` column])."""
    label = _label(path, label)
    xs, texts = [], [[] for _ in text]
    for x, t in csv_blocks(path, numeric, text, header=header, label=label, missing=missing, names=names):
        xs.append(x)
        for store, part in zip(texts, t):
            store.append(part)
    if not xs:  # every row had a missing value (missing="drop")
        raise ValueError(f"{label}: every row has a missing value")
    return np.concatenate(xs), [np.concatenate(t) for t in texts]


class _Located(Exception):
    """A block held a missing value: the locating pass names it."""


def _first_unparseable(values) -> Optional[int]:
    """Index of the first string of `values` (a pyarrow array) that is not a number, by bisection on casts."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def parses(part) -> bool:
        try:
            pc.cast(part, pa.float64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return False
        return True

    if parses(values):
        return None
    lo, hi = 0, len(values)
    while hi - lo > 1:  # the first failure lies in [lo, hi)
        mid = (lo + hi) // 2
        if parses(values.slice(lo, mid - lo)):
            lo = mid
        else:
            hi = mid
    return lo


def _block_problem(batch, numeric, text, missing):
    """(index, column, kind) of the first bad cell of a block read as text, kind "missing" or "text"; or None."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as csv

    nulls = pa.array(csv.ConvertOptions().null_values)
    trimmed = {name: pc.utf8_trim_whitespace(batch.column(name)) for name in numeric + text}
    absent = {name: pc.is_in(trimmed[name], value_set=nulls).to_numpy(zero_copy_only=False) for name in numeric}
    absent.update({name: pc.equal(trimmed[name], "").to_numpy(zero_copy_only=False) for name in text})
    dropped = np.logical_or.reduce(list(absent.values())) if missing == "drop" and absent else None
    found = []
    for name in numeric + text:
        miss = absent[name] if dropped is None else np.zeros_like(absent[name])
        if missing == "error" and miss.any():
            found.append((int(np.argmax(miss)), name, "missing"))
        if name in numeric:
            keep = np.flatnonzero(~absent[name] if dropped is None else ~dropped)
            bad = _first_unparseable(trimmed[name].take(pa.array(keep, type=pa.int64())))
            if bad is not None:
                found.append((int(keep[bad]), name, "text"))
    return min(found) if found else None


def _first_problem(path, names, numeric, text, header, label, missing) -> Optional[str]:
    """The message for the first bad row or cell of the file (read again, every chosen column as text and in
    one thread, which numbers the rows); None when nothing is found (the caller reports pyarrow's error)."""
    import pyarrow as pa

    ragged = []

    def handler(row):
        ragged.append(row)
        return "error"

    first = 2 if header else 1
    try:
        if names is None:  # the header itself could not be read: only a ragged row can be named
            import pyarrow.csv as pc

            pc.read_csv(os.fspath(path), read_options=pc.ReadOptions(use_threads=False,
                                                                     autogenerate_column_names=not header),
                        parse_options=_parse_options(path, handler))
            return None
        for batch in _reader(path, names, numeric, text, header, threads=False, handler=handler):
            problem = _block_problem(batch, numeric, text, missing)
            if problem is not None:
                index, name, kind = problem
                raw = batch.column(name)[index].as_py()
                where = f"{label}, row {first + index}, column '{name}'"
                note = " (the header is row 1)" if header else ""
                if kind == "text":
                    return (f"{where}: '{raw}' is not a number{note}; correct that cell, or leave the column out "
                            "of the features")
                what = "is empty" if not raw.strip() else f"holds '{raw}', a missing value"
                return f"{where} {what}{note}; drop or fill in the rows with missing values"
            first += batch.num_rows
    except pa.ArrowInvalid:
        if ragged:
            row = ragged[0]
            number = f"row {row.number}" if row.number is not None and row.number >= 0 else "a row"
            cells = f"{row.actual_columns} cell{'s' if row.actual_columns != 1 else ''}"
            return (f"{label}, {number} has {cells} but the "
                    f"{'header' if header else 'first row'} has {row.expected_columns}: {row.text[:80]!r}")
        return None
    return None
