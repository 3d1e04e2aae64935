"""Tables of any size read in chunks: .npy (memory-mapped), Parquet and CSV (pyarrow), iterators of (X, y) chunks.

A *source* is what `flowgp.training.batches.BlockBatches` trains from and the estimators stream through: `num_rows`,
`feature_names`, `target_name`, `blocks` (row ranges it reads efficiently) and `read(start, stop) -> (X, y)`
float64 numpy arrays, plus `chunks(rows)` for one sequential pass. Nothing holds more than a block.

- `.npy`: `np.load(mmap_mode="r")`; a 2-D array whose column `target` (an index, default the last) is y.
- Parquet: pyarrow's dataset API for the files and the schema, row groups (`ParquetFile.read_row_group`) for
  reading; blocks are the row groups, so memory follows the file's row-group size.
- CSV and iterators of (X, y) chunks cannot be read at random: one pass (CSV: flowgp's one CSV reader,
  `flowgp.data.csv`, on pyarrow's streaming CSV reader) spools them to a raw float64 file in a temporary
  folder that is memory-mapped afterwards (disk: 8 bytes per value; deleted by `close()`).

`scan` makes the one streaming pass the estimators need before training: per-column mean and standard
deviation (chunks combined with Chan et al.'s pairwise update), the target's range, and a uniform reservoir
sample of bounded size (Vitter's algorithm R) for the k-means initialisation of the inducing inputs.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np

from .csv import csv_blocks, csv_columns
from .tables import select_columns

__all__ = ["check_table", "table_writer", "ArraySource", "ParquetSource", "open_table", "is_table", "scan", "TableStats", "BLOCK_ROWS",
           "PartialScan", "scan_blocks", "merge_scans",
           "write_table", "DataDigest", "data_digest"]

#: rows per block of a memory-mapped array (the unit of the two-level shuffle and of sequential passes)
BLOCK_ROWS = 65536

_PARQUET = (".parquet", ".pq")
_CSV = (".csv", ".txt", ".tsv")


def is_table(data) -> bool:
    """Whether `data` is a streamed table rather than an array: a path, a source, or an iterator of chunks."""
    if isinstance(data, (str, os.PathLike)):
        return True
    if all(hasattr(data, a) for a in ("num_rows", "blocks", "read")):
        return True
    return hasattr(data, "__next__") and not hasattr(data, "shape")


class ArraySource:
    """Rows of a 2-D float array (typically memory-mapped); column `target` is y (None: no target).

    `cleanup`: a folder deleted by `close()` (the spool of a CSV or iterator)."""

    def __init__(self, array: np.ndarray, target: Optional[int], feature_names: Sequence[str],
                 target_name: Optional[str], block_rows: int = BLOCK_ROWS, cleanup: Optional[str] = None):
        if array.ndim != 2:
            raise ValueError(f"a .npy table must be 2-D [rows, columns], got shape {array.shape}")
        self.array = array
        self.target = target
        cols = [c for c in range(array.shape[1]) if c != target]
        self.feature_columns = cols
        self.feature_names = list(feature_names)
        self.target_name = target_name
        self.num_rows = int(array.shape[0])
        self.blocks = [(a, min(a + block_rows, self.num_rows)) for a in range(0, self.num_rows, block_rows)]
        self.cleanup = cleanup
        self.contiguous_features = cols == list(range(cols[0], cols[-1] + 1)) if cols else True
        #: bytes and rows read so far by `read` (whole rows of the array: what a slice of the file touches)
        self.bytes_read = 0
        self.rows_read = 0

    def read(self, start: int, stop: int):
        block = self.array[start:stop]
        self.rows_read += block.shape[0]
        self.bytes_read += block.shape[0] * block.shape[1] * block.dtype.itemsize
        if self.contiguous_features and self.feature_columns:
            x = np.array(block[:, self.feature_columns[0]:self.feature_columns[-1] + 1], dtype=np.float64)
        else:
            x = np.array(block[:, self.feature_columns], dtype=np.float64)
        y = None if self.target is None else np.array(block[:, self.target], dtype=np.float64)
        return x, y

    def chunks(self, rows: int = BLOCK_ROWS) -> Iterator:
        for a in range(0, self.num_rows, rows):
            yield self.read(a, min(a + rows, self.num_rows))

    def close(self) -> None:
        self.array = None
        if self.cleanup is not None:
            shutil.rmtree(self.cleanup, ignore_errors=True)
            self.cleanup = None


def _numeric_columns(schema, columns, name, path):
    import pyarrow as pa

    for col in columns:
        t = schema.field(col).type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
                or pa.types.is_decimal(t)):
            raise ValueError(f"{name} {path}: column '{col}' holds {t} values, not numbers; drop it or choose the "
                             "numeric columns with --features")


def _select(all_columns, target, features, path, target_flag="target"):
    """The feature columns, checked by flowgp.data.tables.select_columns (the same messages as load_csv)."""
    return select_columns(all_columns, target, features, Path(str(path)).name, f"{target_flag}: ")


def _to_matrix(table, columns) -> np.ndarray:
    out = np.empty((table.num_rows, len(columns)), dtype=np.float64)
    for j, col in enumerate(columns):
        out[:, j] = table.column(col).to_numpy(zero_copy_only=False)
    return out


def _chunk_bytes(row_group, columns) -> int:
    """Compressed bytes of the column chunks of `columns` in a Parquet row group's metadata."""
    wanted = set(columns)
    return sum(row_group.column(j).total_compressed_size for j in range(row_group.num_columns)
               if row_group.column(j).path_in_schema in wanted)


class ParquetSource:
    """A Parquet file (or folder of files read as one dataset): row groups as blocks (see the module doc)."""

    def __init__(self, path, target: Optional[str], features: Optional[Sequence[str]] = None, name: str = "data",
                 target_flag: str = "target"):
        import pyarrow.dataset as ds
        import pyarrow.parquet as pq

        self.path = str(path)
        self.dataset = ds.dataset(self.path, format="parquet")
        schema = self.dataset.schema
        self.feature_names = _select(schema.names, target, features, path, target_flag)
        self.target_name = target
        _numeric_columns(schema, self.feature_names + ([target] if target is not None else []), name, path)
        self.files = [pq.ParquetFile(f) for f in self.dataset.files]
        self.blocks, self.groups = [], []
        offset = 0
        for fi, pf in enumerate(self.files):
            for gi in range(pf.metadata.num_row_groups):
                rows = pf.metadata.row_group(gi).num_rows
                if rows:
                    self.blocks.append((offset, offset + rows))
                    self.groups.append((fi, gi))
                    offset += rows
        self.num_rows = offset
        self.columns = self.feature_names + ([target] if target is not None else [])
        # the bytes of each row group's column chunks that `read` fetches (compressed, as stored in the file)
        self.group_bytes = [_chunk_bytes(self.files[fi].metadata.row_group(gi), self.columns)
                            for fi, gi in self.groups]
        #: bytes of column chunks and rows of row groups read so far by `read` (a row group is read whole)
        self.bytes_read = 0
        self.rows_read = 0

    def _split(self, table):
        m = _to_matrix(table, self.columns)
        d = len(self.feature_names)
        return (np.ascontiguousarray(m[:, :d]), None if self.target_name is None else m[:, d].copy())

    def read(self, start: int, stop: int):
        import pyarrow as pa

        parts = []
        for (a, b), (fi, gi), size in zip(self.blocks, self.groups, self.group_bytes):
            if b <= start or a >= stop:
                continue
            table = self.files[fi].read_row_group(gi, columns=self.columns)
            self.bytes_read += size
            self.rows_read += b - a
            parts.append(table.slice(max(start - a, 0), min(stop, b) - max(start, a)))
        return self._split(pa.concat_tables(parts) if len(parts) > 1 else parts[0])

    def chunks(self, rows: int = BLOCK_ROWS) -> Iterator:
        # row group by row group: the dataset scanner's read-ahead would hold many row groups at once (a 5M-row
        # file's statistics pass peaked at 1 GB with it, 0.43 GB without)
        for start, stop in self.blocks:
            x, y = self.read(start, stop)
            for a in range(0, stop - start, rows):
                yield x[a:a + rows], None if y is None else y[a:a + rows]

    def close(self) -> None:
        pass


class _Spool:
    """Rows appended chunk by chunk to a raw float64 file, then memory-mapped as an ArraySource."""

    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix="flowgp-spool-")
        self.path = os.path.join(self.folder, "rows.f64")
        self.handle = open(self.path, "wb")
        self.rows, self.width = 0, None

    def append(self, x: np.ndarray, y: Optional[np.ndarray]):
        block = x if y is None else np.column_stack([x, y])
        block = np.ascontiguousarray(block, dtype=np.float64)
        if self.width is None:
            self.width = block.shape[1]
        elif block.shape[1] != self.width:
            raise ValueError(f"data: a chunk has {block.shape[1]} columns but the first had {self.width}")
        self.handle.write(block.tobytes())
        self.rows += block.shape[0]

    def finish(self, feature_names, target_name) -> ArraySource:
        self.handle.close()
        if not self.rows:
            self.discard()
            raise ValueError("data: the table holds no rows")
        array = np.memmap(self.path, dtype=np.float64, mode="r", shape=(self.rows, self.width))
        target = None if target_name is None else self.width - 1
        return ArraySource(array, target, feature_names, target_name, cleanup=self.folder)

    def discard(self):
        if not self.handle.closed:
            self.handle.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _csv_label(name, path) -> str:
    return f"{name} {path}"


def _csv_columns(path, target, features, name, target_flag):
    """(feature names, columns read) of a CSV file, checked against its header (read by flowgp.data.csv)."""
    header = csv_columns(path, label=_csv_label(name, path))
    feature_names = _select(header, target, features, path, target_flag)
    return header, feature_names, feature_names + ([target] if target is not None else [])


def _spool_csv(path, target, features, name, target_flag="target") -> ArraySource:
    header, feature_names, columns = _csv_columns(path, target, features, name, target_flag)
    d = len(feature_names)
    spool = _Spool()
    try:  # flowgp.data.csv's blocks (about BLOCK_BYTES of the file each): memory follows the block
        for block, _ in csv_blocks(path, columns, label=_csv_label(name, path), names=header):
            spool.append(block[:, :d], None if target is None else block[:, d])
    except BaseException:
        spool.discard()
        raise
    return spool.finish(feature_names, target)


def _spool_chunks(chunks, name) -> ArraySource:
    spool = _Spool()
    has_y = None
    try:
        for i, chunk in enumerate(chunks):
            if not isinstance(chunk, (tuple, list)) or len(chunk) != 2:
                raise TypeError(f"{name}: an iterator must yield (X, y) pairs of arrays, chunk {i} is a "
                                f"{type(chunk).__name__}")
            x, y = chunk
            x = np.asarray(x, dtype=np.float64)
            if x.ndim != 2:
                raise ValueError(f"{name}: chunk {i} has X of shape {x.shape}; X chunks must be 2-D")
            if has_y is None:
                has_y = y is not None
            if (y is not None) != has_y:
                raise ValueError(f"{name}: chunk {i} {'lacks' if has_y else 'has'} y unlike the first chunk")
            if y is not None:
                y = np.asarray(y, dtype=np.float64).reshape(-1)
                if len(y) != len(x):
                    raise ValueError(f"{name}: chunk {i} has {len(x)} rows of X but {len(y)} of y")
            spool.append(x, y)
    except BaseException:
        spool.discard()
        raise
    width = spool.width or 1
    d = width - (1 if has_y else 0)
    return spool.finish([f"x{j}" for j in range(d)], "y" if has_y else None)


def open_table(data, target=None, features: Optional[Sequence[str]] = None, *, name: str = "data",
               target_flag: str = "target"):
    """A source (see the module doc) for a path (.npy, .parquet/.pq or a folder of Parquet files, .csv/.txt/.tsv),
    an iterator of (X, y) chunks, or a source (returned as is).

    `target`: the target column's name (CSV, Parquet; None: no target) or index (.npy; None: the last column
    when `features` is None... pass target=False for a .npy of features only). `features`: the feature
    columns (default: every other column). Errors name `name` / `target_flag` (the CLI passes "--data" and
    "--target").
    """
    if all(hasattr(data, a) for a in ("num_rows", "blocks", "read")):
        return data
    if hasattr(data, "__next__") and not isinstance(data, (str, os.PathLike)):
        return _spool_chunks(data, name)
    if not isinstance(data, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path, an iterator of (X, y) chunks or an array, got {type(data).__name__}")
    path = Path(data).expanduser()
    if not path.exists():
        raise ValueError(f"{name} {data}: no such file or folder")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        try:
            array = np.load(path, mmap_mode="r")
        except (ValueError, OSError) as err:
            raise ValueError(f"{name} {data}: not a readable .npy file ({err})") from None
        if array.ndim != 2 or not np.issubdtype(array.dtype, np.number):
            raise ValueError(f"{name} {data}: a .npy table must be a 2-D numeric array, got {array.dtype} "
                             f"{array.shape}")
        cols = array.shape[1]
        if target is False:
            index = None
        else:
            index = cols - 1 if target is None else target
            try:
                index = int(index)
            except (TypeError, ValueError):
                raise ValueError(f"{target_flag} {target!r}: a .npy table's target is a column index "
                                 f"(0..{cols - 1} or -1)") from None
            if not -cols <= index < cols:
                raise ValueError(f"{target_flag} {target!r}: no such column in {data} ({cols} columns)")
            index %= cols
        if features is not None:
            raise ValueError("features: choose columns of a .npy table by saving only those columns")
        names = [f"x{j}" for j in range(cols) if j != index]
        if not names:
            raise ValueError(f"{name} {data}: no feature columns besides the target")
        return ArraySource(array, index, names, None if index is None else f"column {index}")
    if suffix in _PARQUET or (path.is_dir() and any(path.glob("*.parquet"))):
        return ParquetSource(path, target, features, name, target_flag)
    if suffix in _CSV:
        return _spool_csv(path, target, features, name, target_flag)
    raise ValueError(f"{name} {data}: unknown format {suffix!r}; use .csv, .parquet or .npy")


def _count_lines(path) -> int:
    """Lines of a text file (a final line without a newline counted), read in 4 MiB pieces; blank lines and
    quoted newlines make this an upper bound of the CSV rows, which is all the launcher's check needs."""
    count, last = 0, b"\n"
    with open(path, "rb") as fh:
        while True:
            piece = fh.read(1 << 22)
            if not piece:
                break
            count += piece.count(b"\n")
            last = piece[-1:]
    return count + (last != b"\n")


def check_table(data, target=None, features: Optional[Sequence[str]] = None, *, name: str = "data",
                target_flag: str = "target") -> Optional[int]:
    """The checks `open_table` makes that need no pass over the rows (the path, the target and feature
    columns, the column types of a Parquet file); returns the number of rows (for a CSV the count of lines
    after the header, an upper bound). A path only: other data are checked when they are read (None)."""
    if not isinstance(data, (str, os.PathLike)):
        return None
    path = Path(data).expanduser()
    if not path.exists():
        raise ValueError(f"{name} {data}: no such file or folder")
    suffix = path.suffix.lower()
    if suffix == ".npy" or suffix in _PARQUET or path.is_dir():
        source = open_table(data, target, features, name=name, target_flag=target_flag)
        return source.num_rows
    if suffix in _CSV:
        header, _, columns = _csv_columns(path, target, features, name, target_flag)
        # the first block is converted (text or a missing value there is found now; further down, when read)
        next(csv_blocks(path, columns, label=_csv_label(name, path), names=header), None)
        return _count_lines(path) - 1
    raise ValueError(f"{name} {data}: unknown format {suffix!r}; use .csv, .parquet or .npy")


def _as_rows(a, name: str) -> np.ndarray:
    """`a` (numpy or torch) as a C-ordered numpy array whose bytes stand for its values: numbers as float64
    (labels 0/1 as ints or floats hash alike), text as fixed-width unicode."""
    if hasattr(a, "detach"):  # a torch tensor
        a = a.detach().cpu().numpy()
    a = np.asarray(a)
    if a.dtype.kind in "biuf":
        return np.ascontiguousarray(a, dtype=np.float64)
    if a.dtype.kind in "US":
        return np.ascontiguousarray(a)
    if a.dtype.kind == "O":
        return np.ascontiguousarray(a.astype(str))  # e.g. string labels held as objects
    raise TypeError(f"cannot digest {name} of dtype {a.dtype}")


class DataDigest:
    """Incremental SHA-256 of a data set's rows: `update(x, y)` per chunk, `hexdigest()` at the end; what a
    training checkpoint's fingerprint records of the data (`flowgp.training.checkpoint.FingerprintedPath`).

    x [rows, ...] and y [rows, ...] (y may be None throughout) go to separate hashers, so the result depends on
    the concatenated rows only, whatever the chunk sizes: a table streamed in blocks (`scan`, which feeds it in
    its one pass) has the digest of the same rows given as arrays (the estimators' input standardisation).
    """

    def __init__(self):
        self.rows = 0
        self.x_shape: tuple | None = None
        self.y_kind: str | None = None
        self.x_hash = hashlib.sha256()
        self.y_hash = hashlib.sha256()

    def update(self, x, y=None) -> "DataDigest":
        x = _as_rows(x, "x")
        if self.x_shape is None:
            self.x_shape = x.shape[1:]
        elif x.shape[1:] != self.x_shape:
            raise ValueError(f"a chunk of x has shape {x.shape[1:]} per row, the first had {self.x_shape}")
        if x.size:
            self.x_hash.update(memoryview(x).cast("B"))
        if y is not None:
            y = _as_rows(y, "y")
            self.y_kind = self.y_kind or f"{y.dtype.str}{y.shape[1:]}"
            if y.size:
                self.y_hash.update(memoryview(y).cast("B"))
        self.rows += x.shape[0]
        return self

    def hexdigest(self) -> str:
        summary = f"rows={self.rows};x{self.x_shape}={self.x_hash.hexdigest()}"
        if self.y_kind is not None:
            summary += f";y{self.y_kind}={self.y_hash.hexdigest()}"
        return hashlib.sha256(summary.encode()).hexdigest()


def data_digest(x, y=None) -> str:
    """The `DataDigest` of the rows (x, y) in one chunk."""
    return DataDigest().update(x, y).hexdigest()


@dataclass
class TableStats:
    """What one streaming pass learns: rows, per-feature mean and std, the target's mean, std, min and max,
    and a uniform sample of at most `sample_size` rows (x [S, D], y [S])."""

    num_rows: int
    x_mean: np.ndarray
    x_std: np.ndarray
    y_mean: float
    y_std: float
    y_min: float
    y_max: float
    sample_x: np.ndarray
    sample_y: Optional[np.ndarray]
    #: the target's distinct values (scan with max_labels), None when not collected or more than max_labels
    y_values: Optional[np.ndarray] = None
    #: per group of rows (scan with group_feature: the groups are the values 0..G-1 of that feature column):
    #: "count" [G], the target's "y_mean" and "y_std" [G], each feature's "x_min" and "x_max" [G, D]
    groups: Optional[dict] = None
    #: SHA-256 of the rows (`DataDigest`, fed in the same pass): what a fit trained on
    digest: Optional[str] = None


def scan(source, sample_size: int = 10000, seed: int = 0, chunk_rows: int = BLOCK_ROWS,
         name: str = "data", max_labels: Optional[int] = None, group_feature: Optional[int] = None) -> TableStats:
    """One pass over `source`: moments (Chan, Golub & LeVeque's pairwise combination of per-chunk means and
    sums of squares, exact up to rounding whatever the chunking) and a reservoir sample (algorithm R: row i >=
    S replaces a uniform slot with probability S / (i + 1); the uniforms come from one numpy Generator seeded
    with `seed`, drawn row by row, so the sample depends on the seed and the data only). Non-finite values
    raise ValueError naming the row. With `max_labels` the target's distinct values are collected too (class
    labels: every class, not only those the sample happens to hold), up to that many (more: y_values None).
    With `group_feature` (a feature column holding integers 0..G-1, e.g. the series of a multi-output table)
    the same pass also gives each group's row count, target mean and std (the same pairwise combination) and
    feature ranges (`TableStats.groups`); a value that is not a non-negative integer raises ValueError.
    The same pass feeds the rows to a `DataDigest` (`TableStats.digest`): the digest of
    the same rows given as arrays, whatever the chunking."""
    rng = np.random.default_rng(seed)
    digest = DataDigest()
    count = 0
    mean = m2 = None
    y_stats = [0.0, 0.0, np.inf, -np.inf]  # mean, m2, min, max
    sample_x = sample_y = None
    labels = set() if max_labels is not None else None
    group = _GroupMoments(group_feature, name) if group_feature is not None else None
    for x, y in source.chunks(chunk_rows):
        k = x.shape[0]
        if not k:
            continue
        bad = ~np.isfinite(x).all(axis=1)
        if y is not None:
            bad |= ~np.isfinite(y)
        if bad.any():
            raise ValueError(f"{name}: row {count + int(np.argmax(bad))} holds NaN or inf (or an empty field); "
                             "drop or impute those rows first")
        digest.update(x, y)
        cm, cv = x.mean(0), ((x - x.mean(0)) ** 2).sum(0)
        if mean is None:
            mean, m2 = cm, cv
            sample_x = np.empty((0, x.shape[1]))
            sample_y = None if y is None else np.empty(0)
        else:
            delta = cm - mean
            total = count + k
            mean = mean + delta * k / total
            m2 = m2 + cv + delta ** 2 * count * k / total
        if group is not None:
            group.add(x, y, count)
        if y is not None and labels is not None:
            labels.update(np.unique(y).tolist())
            if len(labels) > max_labels:
                labels = None
        if y is not None:
            ym, yv = float(y.mean()), float(((y - y.mean()) ** 2).sum())
            d = ym - y_stats[0]
            total = count + k
            y_stats[0] += d * k / total
            y_stats[1] += yv + d ** 2 * count * k / total
            y_stats[2] = min(y_stats[2], float(y.min()))
            y_stats[3] = max(y_stats[3], float(y.max()))
        # reservoir: fill the first S slots, then replace
        fill = max(0, min(sample_size - len(sample_x), k))
        if fill:
            sample_x = np.concatenate([sample_x, x[:fill]])
            if y is not None:
                sample_y = np.concatenate([sample_y, y[:fill]])
        if fill < k:
            i = np.arange(count + fill, count + k)
            j = np.floor(rng.random(len(i)) * (i + 1)).astype(np.int64)
            keep = j < sample_size
            # later rows overwrite earlier ones at the same slot, as in the sequential algorithm
            sample_x[j[keep]] = x[fill:][keep]
            if y is not None:
                sample_y[j[keep]] = y[fill:][keep]
        count += k
    if not count:
        raise ValueError(f"{name}: the table holds no rows")
    std = np.sqrt(m2 / count)
    y_std = float(np.sqrt(y_stats[1] / count))
    values = None if labels is None else np.array(sorted(labels))
    return TableStats(count, mean, std, y_stats[0], y_std, y_stats[2], y_stats[3], sample_x, sample_y, values,
                      None if group is None else group.result(), digest.hexdigest())


def _moments(values: np.ndarray) -> tuple:
    """(rows, mean, sum of squared deviations) of `values` [k, ...] along the rows."""
    mean = values.mean(0)
    return values.shape[0], mean, ((values - mean) ** 2).sum(0)


def _combine(a: tuple, b: tuple) -> tuple:
    """Chan, Golub & LeVeque's pairwise update of (count, mean, M2): the moments of the union of two sets."""
    (na, ma, qa), (nb, mb, qb) = a, b
    if not na:
        return b
    if not nb:
        return a
    total = na + nb
    delta = mb - ma
    return total, ma + delta * nb / total, qa + qb + delta ** 2 * na * nb / total


@dataclass
class PartialScan:
    """What a pass over some of a source's blocks learns (`scan_blocks`); `merge_scans` combines the parts of
    all the blocks into the `TableStats` of the whole table, whoever read which block.

    `x` and `y`: (count, mean, M2) moments; `y_range`: (min, max); the sample: the rows with the `sample_size`
    smallest keys among those read (`keys`, global row indices `rows`, their x and y); `labels`: the target's
    distinct values (None: more than max_labels, or not collected); `groups`: per-group moments (or None);
    `digests`: {block index: `DataDigest` hex of the block's rows}."""

    x: tuple
    y: tuple
    y_range: tuple
    keys: np.ndarray
    rows: np.ndarray
    sample_x: np.ndarray
    sample_y: Optional[np.ndarray]
    labels: Optional[set]
    groups: Optional["_GroupMoments"]
    digests: dict


def _block_checked(x, y, first: int, name: str) -> None:
    bad = ~np.isfinite(x).all(axis=1)
    if y is not None:
        bad |= ~np.isfinite(y)
    if bad.any():
        raise ValueError(f"{name}: row {first + int(np.argmax(bad))} holds NaN or inf (or an empty field); "
                         "drop or impute those rows first")


def _smallest(keys: np.ndarray, size: int) -> np.ndarray:
    """Positions of the `size` smallest keys (all when fewer)."""
    return np.arange(len(keys)) if len(keys) <= size else np.argpartition(keys, size - 1)[:size]


def scan_blocks(source, blocks: Sequence[int], sample_size: int = 10000, seed: int = 0, name: str = "data",
                max_labels: Optional[int] = None, group_feature: Optional[int] = None) -> PartialScan:
    """One pass over the blocks `blocks` (indices into `source.blocks`) of a source: the part of the table's
    statistics those rows give (`PartialScan`), merged with the other blocks' parts by `merge_scans`.

    The uniform sample is a bottom-k sample (priority sampling without weights): every row gets a key u ~ U(0, 1)
    drawn from a numpy Generator seeded with (seed, first row of its block), and the sample is the sample_size
    rows with the smallest keys. The keys depend on the seed and the block layout only, not on which process
    reads which block, so the merged sample is the same for any number of processes, and every subset of
    sample_size rows is equally likely (the keys are i.i.d.)."""
    x_mom = y_mom = (0, 0.0, 0.0)
    y_range = (np.inf, -np.inf)
    keys, rows, xs, ys = np.empty(0), np.empty(0, dtype=np.int64), [], []
    labels = set() if max_labels is not None else None
    group = _GroupMoments(group_feature, name) if group_feature is not None else None
    digests = {}
    for i in blocks:
        start, stop = source.blocks[i]
        x, y = source.read(start, stop)
        if not x.shape[0]:
            continue
        _block_checked(x, y, start, name)
        digests[int(i)] = DataDigest().update(x, y).hexdigest()
        x_mom = _combine(x_mom, _moments(x))
        if group is not None:
            group.add(x, y, start)
        if y is not None:
            y_mom = _combine(y_mom, _moments(y))
            y_range = (min(y_range[0], float(y.min())), max(y_range[1], float(y.max())))
            if labels is not None:
                labels.update(np.unique(y).tolist())
                labels = labels if len(labels) <= max_labels else None
        block_keys = np.random.default_rng([int(seed), int(start)]).random(x.shape[0])
        keep = _smallest(block_keys, sample_size)
        keys, rows = np.concatenate([keys, block_keys[keep]]), np.concatenate([rows, keep + start])
        xs.append(x[keep]), ys.append(None if y is None else y[keep])
        keep = _smallest(keys, sample_size)
        keys, rows = keys[keep], rows[keep]
        xs, ys = [np.concatenate(xs)[keep]], [None if y is None else np.concatenate(ys)[keep]]
    width = len(source.feature_names)
    sample_x = xs[0] if xs else np.empty((0, width))
    sample_y = ys[0] if xs else (None if getattr(source, "target_name", None) is None else np.empty(0))
    return PartialScan(x_mom, y_mom, y_range, keys, rows, sample_x, sample_y, labels, group, digests)


def merge_scans(parts: Sequence[PartialScan], sample_size: int = 10000, name: str = "data",
                max_labels: Optional[int] = None) -> TableStats:
    """The `TableStats` of a table from the `PartialScan`s of a partition of its blocks (in any order): moments
    combined pairwise (Chan et al.; equal to one pass up to rounding), the sample_size rows of smallest key (in
    row order), the union of the labels, the groups' moments combined, and `digest` the SHA-256 of the blocks'
    digests in block order (the same whoever read which block; not the digest of the rows as one array)."""
    x_mom, y_mom, y_range = (0, 0.0, 0.0), (0, 0.0, 0.0), (np.inf, -np.inf)
    labels, groups, digests = (set() if max_labels is not None else None), None, {}
    for p in parts:
        x_mom, y_mom = _combine(x_mom, p.x), _combine(y_mom, p.y)
        y_range = (min(y_range[0], p.y_range[0]), max(y_range[1], p.y_range[1]))
        labels = None if labels is None or p.labels is None else labels | p.labels
        labels = None if labels is not None and len(labels) > max_labels else labels
        groups = p.groups if groups is None else groups.merge(p.groups)
        digests.update(p.digests)
    count = int(x_mom[0])
    if not count:
        raise ValueError(f"{name}: the table holds no rows")
    keys = np.concatenate([p.keys for p in parts])
    keep = _smallest(keys, sample_size)
    rows = np.concatenate([p.rows for p in parts])[keep]
    order = np.argsort(rows, kind="stable")
    sample_x = np.concatenate([p.sample_x for p in parts])[keep][order]
    has_y = any(p.sample_y is not None for p in parts)
    sample_y = np.concatenate([p.sample_y for p in parts if p.sample_y is not None])[keep][order] if has_y else None
    summary = "blocks;" + ";".join(f"{i}:{digests[i]}" for i in sorted(digests))
    values = None if labels is None else np.array(sorted(labels))
    return TableStats(count, x_mom[1], np.sqrt(x_mom[2] / count), float(y_mom[1]),
                      float(np.sqrt(y_mom[2] / count)) if y_mom[0] else 0.0, float(y_range[0]), float(y_range[1]),
                      sample_x, sample_y, values, None if groups is None else groups.result(),
                      hashlib.sha256(summary.encode()).hexdigest())


class _GroupMoments:
    """Per-group row counts, target moments (pairwise combination, as `scan`) and feature ranges, chunk by chunk."""

    def __init__(self, column: int, name: str):
        self.column, self.name = int(column), name
        self.count = np.zeros(0)
        self.mean = np.zeros(0)
        self.m2 = np.zeros(0)
        self.x_min = self.x_max = None

    def _grow(self, size: int, d: int) -> None:
        if self.x_min is None:
            self.x_min, self.x_max = np.full((0, d), np.inf), np.full((0, d), -np.inf)
        extra = size - len(self.count)
        if extra > 0:
            self.count, self.mean, self.m2 = (np.concatenate([a, np.zeros(extra)]) for a in (self.count, self.mean, self.m2))
            self.x_min = np.concatenate([self.x_min, np.full((extra, d), np.inf)])
            self.x_max = np.concatenate([self.x_max, np.full((extra, d), -np.inf)])

    def add(self, x: np.ndarray, y: Optional[np.ndarray], first_row: int) -> None:
        g = x[:, self.column]
        bad = (g < 0) | (g != np.round(g))
        if bad.any():
            raise ValueError(f"{self.name}: row {first_row + int(np.argmax(bad))} has group value "
                             f"{g[bad][0]!r}; the group column must hold integers 0..G-1")
        g = g.astype(np.int64)
        size = int(g.max()) + 1
        self._grow(size, x.shape[1])
        k = np.bincount(g, minlength=size).astype(float)
        np.minimum.at(self.x_min, g, x)
        np.maximum.at(self.x_max, g, x)
        if y is not None:
            chunk_mean = np.bincount(g, weights=y, minlength=size) / np.maximum(k, 1)
            chunk_m2 = np.bincount(g, weights=(y - chunk_mean[g]) ** 2, minlength=size)
            idx = np.flatnonzero(k)  # the groups this chunk holds
            k, chunk_mean, chunk_m2 = k[idx], chunk_mean[idx], chunk_m2[idx]
            before = self.count[idx]
            total = before + k
            delta = chunk_mean - self.mean[idx]
            self.mean[idx] += delta * k / total
            self.m2[idx] += chunk_m2 + delta ** 2 * before * k / total
            self.count[idx] = total
        else:
            self.count[:size] += k

    def merge(self, other: Optional["_GroupMoments"]) -> "_GroupMoments":
        """A new set of group moments: those of self's rows and other's together (Chan et al.'s combination)."""
        if other is None or other.x_min is None:
            return self
        if self.x_min is None:
            return other
        out = _GroupMoments(self.column, self.name)
        size = max(len(self.count), len(other.count))
        out._grow(size, self.x_min.shape[1])
        for part in (self, other):
            g = len(part.count)
            total, mean, m2 = _combine_groups((out.count[:g], out.mean[:g], out.m2[:g]),
                                              (part.count, part.mean, part.m2))
            out.count[:g], out.mean[:g], out.m2[:g] = total, mean, m2
            out.x_min[:g] = np.minimum(out.x_min[:g], part.x_min)
            out.x_max[:g] = np.maximum(out.x_max[:g], part.x_max)
        return out

    def result(self) -> dict:
        count = self.count
        with np.errstate(invalid="ignore", divide="ignore"):
            std = np.where(count > 0, np.sqrt(self.m2 / np.maximum(count, 1)), np.nan)
        return {"count": count.astype(np.int64), "y_mean": np.where(count > 0, self.mean, np.nan), "y_std": std,
                "x_min": self.x_min, "x_max": self.x_max}


def _combine_groups(a: tuple, b: tuple) -> tuple:
    """`_combine` elementwise over groups (arrays of counts, means, M2), groups without rows left as they are."""
    (na, ma, qa), (nb, mb, qb) = a, b
    total = na + nb
    with np.errstate(invalid="ignore", divide="ignore"):
        delta = mb - ma
        mean = np.where(total > 0, ma + delta * nb / np.maximum(total, 1), 0.0)
        m2 = qa + qb + np.where(total > 0, delta ** 2 * na * nb / np.maximum(total, 1), 0.0)
    return total, mean, m2


class _TableWriter:
    """Rows appended to a CSV or Parquet file as they are computed (the format from the suffix)."""

    def __init__(self, path, columns: Sequence[str]):
        self.path = Path(path)
        self.columns = list(columns)
        self.parquet = self.path.suffix.lower() in _PARQUET
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.partial")
        self.writer = None
        self.handle = None

    def write(self, block: np.ndarray) -> None:
        import pyarrow as pa

        if self.parquet:
            table = pa.table({c: block[:, j] for j, c in enumerate(self.columns)})
            import pyarrow.parquet as pq

            if self.writer is None:
                self.writer = pq.ParquetWriter(str(self.tmp), table.schema)
            self.writer.write_table(table)
        else:
            import csv

            if self.handle is None:
                self.handle = open(self.tmp, "w", newline="")
                self.csv = csv.writer(self.handle)
                self.csv.writerow(self.columns)
            self.csv.writerows(block.tolist())  # shortest round-trip decimal of each float

    def close(self, ok: bool = True) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.handle is not None:
            self.handle.close()
        if ok:
            if self.writer is None and self.handle is None:  # no rows: the header alone
                write_table(self.tmp, np.empty((0, len(self.columns))), self.columns)
            os.replace(self.tmp, self.path)  # the file appears complete or not at all
        elif self.tmp.exists():
            self.tmp.unlink()


def write_table(path, block: np.ndarray, columns: Sequence[str]) -> None:
    """Write a float matrix with named columns to CSV or Parquet (by suffix), in one go."""
    import pyarrow as pa

    table = pa.table({c: np.asarray(block[:, j], dtype=np.float64) for j, c in enumerate(columns)})
    if Path(path).suffix.lower() in _PARQUET:
        import pyarrow.parquet as pq

        pq.write_table(table, str(path))
    else:
        import csv

        with open(path, "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(list(columns))
            writer.writerows(np.asarray(block, dtype=np.float64).tolist())


def table_writer(path, columns: Sequence[str]) -> _TableWriter:
    """A writer of rows to `path` (CSV, or Parquet for .parquet/.pq) in chunks: `write(block)` then
    `close(ok)`; the file is written under a temporary name and renamed into place when closed with ok=True."""
    return _TableWriter(path, columns)
