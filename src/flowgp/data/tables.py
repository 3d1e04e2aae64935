"""Data: the embedded demo set (paper Fig. 4), CSV loading, and the benchmark datasets of `flowgp bench`.

Benchmark loaders read the shared data folder (`resolve_data_dir`: --data-dir, $FLOWGP_DATA, ../shared/data):
UCI regression sets with their shipped standard splits, classification sets (stratified splits; avila's
official split), SIC97 rainfall (official split or CV) and London PM2.5. All return raw units; scaling is
fitted on the training split only (`standardize`, and the estimators standardise on what they are fitted on).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .csv import csv_columns, read_csv

__all__ = ["make_tanh_sine", "tanh_sine", "load_csv"]


def make_tanh_sine(num_points: int = 150, noise_std: float = 0.05, seed: int = 0):
    """150 evenly spaced evaluations of a sine passed through a tanh flow plus Gaussian noise (paper Fig. 4).

    y = tanh(4 sin(2π x)) + ε on x ∈ [0, 2]: the steep tanh makes flat plateaus a plain GP cannot fit.
    Returns (x [N, 1], y [N]) as float64 arrays.

    Args:
        num_points: N, evenly spaced on [0, 2].
        noise_std: the standard deviation of ε.
        seed: seed of the noise.

    Examples:
        >>> from flowgp.data.tables import make_tanh_sine
        >>> x, y = make_tanh_sine(num_points=150, seed=0)
        >>> x.shape, y.shape
        ((150, 1), (150,))
    """
    rng = np.random.default_rng(seed)
    x = np.linspace(0.0, 2.0, num_points)
    y = tanh_sine(x) + noise_std * rng.standard_normal(num_points)
    return x[:, None], y


def tanh_sine(x):
    """The noise-free function of `make_tanh_sine`: f(x) = tanh(4 sin(2π x)).

    Args:
        x: inputs (an array or a number).

    See Also:
        :func:`flowgp.data.tables.make_tanh_sine`.
    """
    return np.tanh(4.0 * np.sin(2.0 * np.pi * np.asarray(x, dtype=float)))


def select_columns(header, target: str | None, features, label: str, target_prefix: str = "") -> list[str]:
    """The feature columns of a table whose columns are `header` (all of them but the target when `features` is
    None), with a ValueError naming `label` (the file) and the fix for duplicate column names, a missing target,
    a target also listed as a feature, a feature listed twice or absent, and no feature left.
    `target_prefix` goes before the missing-target message (e.g. the command-line flag that named it)."""
    header = list(header)
    duplicated = sorted({h for h in header if header.count(h) > 1})
    if duplicated:
        # a name that means two columns cannot select one of them: refuse rather than silently take the first
        raise ValueError(f"{label} has duplicate column names {duplicated}; give every column a unique name")
    if target is not None and target not in header:
        raise ValueError(f"{target_prefix}target column '{target}' is not in {label}; columns are {header}")
    features = [h for h in header if h != target] if features is None else list(features)
    if target is not None and target in features:
        raise ValueError(f"the target column '{target}' is also listed as a feature; drop it from the features")
    repeated = sorted({f for f in features if features.count(f) > 1})
    if repeated:
        raise ValueError(f"feature columns {repeated} are listed more than once; name each feature once")
    unknown = [f for f in features if f not in header]
    if unknown:
        raise ValueError(f"feature columns {unknown} are not in {label}; columns are {header}")
    if not features:
        raise ValueError(f"{label} has no feature columns besides the target '{target}'")
    return features


def load_csv(path, target: str | None, features: list[str] | None = None):
    """Read a numeric CSV with a header; returns (X [N, D], y [N] or None when target is None, feature names).

    Read by flowgp's one CSV reader (`flowgp.data.csv`: a byte-order mark, CRLF line ends and quoted fields are
    handled). Raises FileNotFoundError for a missing file and ValueError naming the column or row for a missing
    target, unknown feature, a target also listed as a feature, duplicate column names in the header or the
    feature list, text in a numeric column, a missing value, or a row of the wrong width.

    Args:
        path: the CSV file.
        target: the name of the target column (None: no target).
        features: the feature columns' names (None: every column but the target).

    See Also:
        :class:`flowgp.SVGPRegressor` (``fit`` also streams a CSV path directly).
    """
    path = Path(path)
    header = csv_columns(path, label=path.name)
    features = select_columns(header, target, features, path.name)
    columns = list(features) + ([target] if target is not None else [])
    data, _ = read_csv(path, columns, label=path.name, names=header)
    if target is None:
        return data, None, list(features)
    return data[:, :-1], data[:, -1], list(features)


# ---------------------------------------------------------------------------------------------------------
# Benchmark datasets in the shared data folder (layout: ../shared/data/SOURCES.md)
# ---------------------------------------------------------------------------------------------------------
__all__ += ["UCI_DATASETS", "CLASSIFICATION_DATASETS", "Split", "resolve_data_dir", "load_uci", "uci_num_splits",
            "uci_split", "load_classification", "classification_split", "load_rainfall", "rainfall_official_split",
            "load_air_quality", "cv_splits", "standardize"]

#: the UCI regression sets of the TGP appendix that `load_uci` reads, each with its standard 90/10 splits
UCI_DATASETS = ("boston", "concrete", "energy", "kin8nm", "power", "wine-red", "yacht")

#: name -> (relative path, has header, target column (name or index), dropped non-feature columns)
CLASSIFICATION_DATASETS = {
    "banknote": ("classification/banknote_authentication.txt", False, 4, ()),
    "heart": ("classification/heart_failure_clinical_records.csv", True, "DEATH_EVENT", ()),
    "heart-statlog": ("classification/heart_statlog.csv", True, "Class", ()),
    "ionosphere": ("classification/ionosphere.data", False, 34, ()),
    "movement": ("classification/movement_aal.csv", True, "label", ("sequence_id", "time_step")),
    "activity": ("classification/arem_activity.csv", True, "label", ("sequence", "time_ms")),
    "avila": ("classification/avila/avila-tr.txt", False, 10, ()),  # + avila-ts.txt, the official test set
}

RAINFALL_FILE = "sic97_rainfall/sic97_all.csv"
AIR_QUALITY_FILE = "air_quality/london_n_kensington_pm25_2019-03-15_2019-04-15.csv"


@dataclass
class Split:
    """One train/test partition in raw (unstandardised) units; `info` says where it came from.

    Attributes:
        x_train, y_train: the training inputs [N, D] and targets [N].
        x_test, y_test: the test inputs and targets.
        info: where the split came from.

    See Also:
        :func:`flowgp.data.tables.uci_split`, :func:`flowgp.data.tables.standardize`.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    info: str = ""


def resolve_data_dir(data_dir=None) -> Path:
    """The data folder: `data_dir` if given, else $FLOWGP_DATA, else ../shared/data relative to the CWD.

    Args:
        data_dir: a folder, or None.

    See Also:
        :func:`flowgp.data.tables.load_uci` (and the other loaders that take ``data_dir``).
    """
    if data_dir is not None:
        path, origin = Path(data_dir), "--data-dir"
    elif os.environ.get("FLOWGP_DATA"):
        path, origin = Path(os.environ["FLOWGP_DATA"]), "$FLOWGP_DATA"
    else:
        path, origin = Path("..") / "shared" / "data", "the default ../shared/data"
    if not path.is_dir():
        raise FileNotFoundError(f"data folder {path} (from {origin}) does not exist; pass --data-dir or set "
                                "FLOWGP_DATA to the folder holding uci/, classification/, sic97_rainfall/, air_quality/")
    return path


def _read_index(path: Path, n_rows: int) -> np.ndarray:
    if not path.is_file():
        raise FileNotFoundError(f"split file {path} is missing; the UCI folder needs index_train_<i>.txt and "
                                "index_test_<i>.txt for every split listed in n_splits.txt")
    try:
        idx = np.loadtxt(path, dtype=float, ndmin=1)
    except ValueError as err:
        raise ValueError(f"{path} must hold one integer row index per line: {err}") from None
    if idx.size == 0 or np.any(idx != np.round(idx)) or idx.min() < 0 or idx.max() >= n_rows:
        raise ValueError(f"{path} must hold integer row indices in [0, {n_rows}); check the file")
    return idx.astype(np.int64)


def _uci_dir(name: str, data_dir) -> Path:
    folder = resolve_data_dir(data_dir) / "uci" / name
    if not folder.is_dir():
        raise FileNotFoundError(f"no UCI dataset folder {folder}; known sets: {', '.join(UCI_DATASETS)}")
    return folder


def load_uci(name: str, data_dir=None):
    """A UCI regression set from uci/<name>/ (data.txt + index_features/index_target): (X [N, D], y [N]).

    Args:
        name: the set's name (one of `UCI_DATASETS`, e.g. "boston").
        data_dir: the data folder (None: `resolve_data_dir`'s choice).

    See Also:
        :func:`flowgp.data.tables.uci_split` (the standard splits).
    """
    folder = _uci_dir(name, data_dir)
    path = folder / "data.txt"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing (expected a whitespace-separated numeric table)")
    try:
        table = np.loadtxt(path, dtype=float, ndmin=2)
    except ValueError as err:
        raise ValueError(f"{path} is not a numeric whitespace-separated table: {err}") from None
    if not np.all(np.isfinite(table)):
        raise ValueError(f"{path} holds non-finite values (NaN/inf); the UCI tables have no missing values")
    cols = table.shape[1]
    feats, target = folder / "index_features.txt", folder / "index_target.txt"
    if feats.is_file() and target.is_file():
        f_idx = _read_index(feats, cols)
        t_idx = int(_read_index(target, cols)[0])
    else:  # the shipped convention when the index files are absent: last column is the target
        f_idx, t_idx = np.arange(cols - 1), cols - 1
    return table[:, f_idx], table[:, t_idx]


def uci_num_splits(name: str, data_dir=None) -> int:
    """The number of standard train/test splits shipped with the UCI set `name` (its n_splits.txt).

    Args:
        name: the set's name.
        data_dir: the data folder (None: `resolve_data_dir`'s choice).

    See Also:
        :func:`flowgp.data.tables.uci_split`.
    """
    path = _uci_dir(name, data_dir) / "n_splits.txt"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; it should hold the number of standard splits")
    try:
        return int(path.read_text().split()[0])
    except (ValueError, IndexError):
        raise ValueError(f"{path} must hold one integer (the number of splits)") from None


def uci_split(name: str, split: int, data_dir=None) -> Split:
    """The shipped standard 90/10 split number `split` of a UCI set (index_train_<i> / index_test_<i>).

    Args:
        name: the set's name.
        split: the split's number, 0 ≤ split < `uci_num_splits(name)`.
        data_dir: the data folder (None: `resolve_data_dir`'s choice).

    See Also:
        :func:`flowgp.data.tables.load_uci`, :func:`flowgp.data.tables.standardize`.
    """
    x, y = load_uci(name, data_dir)
    n_splits = uci_num_splits(name, data_dir)
    if not 0 <= split < n_splits:
        raise ValueError(f"split must be in 0..{n_splits - 1} for {name}, got {split}")
    folder = _uci_dir(name, data_dir)
    tr = _read_index(folder / f"index_train_{split}.txt", len(y))
    te = _read_index(folder / f"index_test_{split}.txt", len(y))
    if np.intersect1d(tr, te).size:
        raise ValueError(f"{name} split {split}: train and test indices overlap")
    return Split(x[tr], y[tr], x[te], y[te], f"uci/{name} standard split {split}")


def _load_class_file(path: Path, header: bool, target, drop, drop_incomplete: bool = False):
    """(features [N, D], target values as str [N]) of a classification file; `drop_incomplete`: rows with an
    empty cell are left out (non-numeric text still raises)."""
    names = csv_columns(path, header=header, label=path.name)
    if isinstance(target, str):
        if target not in names:
            raise ValueError(f"target column '{target}' is not in {path.name}; columns are {names}")
    else:
        if target >= len(names):
            raise ValueError(f"{path.name} has {len(names)} columns, expected the target in column {target}")
        target = names[target]
    missing = [d for d in drop if d not in names]
    if missing:
        raise ValueError(f"{path.name} lacks the bookkeeping columns {missing}; columns are {names}")
    features = [n for n in names if n != target and n not in drop]
    x, (labels,) = read_csv(path, features, [target], header=header, label=path.name, names=names,
                            missing="drop" if drop_incomplete else "error")
    return x, list(labels)


def load_classification(name: str, data_dir=None, part: str = "train"):
    """A classification set: (X [N, D], labels [N] int in 0..K-1, class names). `part` matters for avila only.

    Labels are the sorted distinct target values mapped to 0..K-1 (for avila over train and test together,
    so both parts share one coding).

    Args:
        name: the set's name (a key of `CLASSIFICATION_DATASETS`).
        data_dir: the data folder (None: `resolve_data_dir`'s choice).
        part: "train" or "test" (avila only).

    See Also:
        :func:`flowgp.data.tables.classification_split`.
    """
    if name not in CLASSIFICATION_DATASETS:
        raise ValueError(f"unknown classification set '{name}'; choose one of {sorted(CLASSIFICATION_DATASETS)}")
    rel, header, target, drop = CLASSIFICATION_DATASETS[name]
    root = resolve_data_dir(data_dir)
    # The shipped heart-failure file has empty cells in 26 of 299 rows (not in the UCI original); drop those.
    x, raw = _load_class_file(root / rel, header, target, drop, drop_incomplete=name == "heart")
    all_raw = list(raw)
    if name == "avila":
        x_te, raw_te = _load_class_file(root / rel.replace("avila-tr", "avila-ts"), header, target, drop)
        all_raw += raw_te
        if part == "test":
            x, raw = x_te, raw_te
    elif part != "train":
        raise ValueError(f"part='test' exists only for avila (official split); {name} uses classification_split")

    def _key(v):  # numeric labels sort numerically, letters alphabetically
        try:
            return (0, float(v), "")
        except ValueError:
            return (1, 0.0, v)

    classes = sorted(set(all_raw), key=_key)
    code = {c: i for i, c in enumerate(classes)}
    return x, np.array([code[v] for v in raw], dtype=np.int64), classes


def classification_split(name: str, split: int = 0, data_dir=None, test_fraction: float = 0.1, seed: int = 0) -> Split:
    """Avila: the official train/test files (split must be 0). Others: a stratified random split whose
    random state is (seed, split), so split i is the same on every machine.

    Args:
        name: the set's name.
        split: the split's number.
        data_dir: the data folder (None: `resolve_data_dir`'s choice).
        test_fraction: the share of rows in the test part of a random split.
        seed: with `split`, the random state of a random split.

    See Also:
        :func:`flowgp.data.tables.load_classification`.
    """
    if name == "avila":
        if split != 0:
            raise ValueError("avila has one official train/test split; use split 0")
        x_tr, y_tr, _ = load_classification(name, data_dir, "train")
        x_te, y_te, _ = load_classification(name, data_dir, "test")
        return Split(x_tr, y_tr, x_te, y_te, "avila official train/test")
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    from sklearn.model_selection import train_test_split

    x, y, _ = load_classification(name, data_dir)
    idx = np.arange(len(y))
    tr, te = train_test_split(idx, test_size=test_fraction, stratify=y, random_state=seed * 1000 + split)
    return Split(x[tr], y[tr], x[te], y[te], f"{name} stratified split {split} (seed {seed})")


def load_rainfall(data_dir=None):
    """SIC97 Swiss rainfall: (X [467, 2] = (x_km, y_km), rainfall [467] (1/10 mm, > 0), is_train100 [467] bool).

    Args:
        data_dir: the data folder (None: `resolve_data_dir`'s choice).

    See Also:
        :func:`flowgp.data.tables.rainfall_official_split`.
    """
    path = resolve_data_dir(data_dir) / RAINFALL_FILE
    head = csv_columns(path, label=path.name)
    need = ["x_km", "y_km", "rainfall", "split"]
    missing = [c for c in need if c not in head]
    if missing:
        raise ValueError(f"{path.name} lacks columns {missing}; columns are {head}")
    table, (split,) = read_csv(path, need[:3], ["split"], label=path.name, names=head)
    bad = sorted(set(split) - {"train100", "test367"})
    if bad:
        raise ValueError(f"{path.name} column 'split' must be train100 or test367, found {bad}")
    return table[:, :2], table[:, 2], np.array([s == "train100" for s in split])


def rainfall_official_split(data_dir=None) -> Split:
    """The official SIC97 split: 100 training stations, 367 test stations.

    Args:
        data_dir: the data folder (None: `resolve_data_dir`'s choice).

    See Also:
        :func:`flowgp.data.tables.load_rainfall`.
    """
    x, y, is_train = load_rainfall(data_dir)
    return Split(x[is_train], y[is_train], x[~is_train], y[~is_train], "sic97 official train100/test367")


def load_air_quality(data_dir=None):
    """London N. Kensington PM2.5, 15 Mar - 15 Apr 2019: (X [744, 1] = hours_since_start, pm25 [744] > 0).

    Args:
        data_dir: the data folder (None: `resolve_data_dir`'s choice).

    See Also:
        :class:`flowgp.AlignedMultiOutputGPRegressor` (the London air-quality experiments).
    """
    path = resolve_data_dir(data_dir) / AIR_QUALITY_FILE
    x, y, _ = load_csv(path, "pm25", ["hours_since_start"])
    if not np.all(np.isfinite(y)):
        raise ValueError(f"{path.name} column 'pm25' holds NaN/inf values")
    return x, y


def cv_splits(n: int, k: int = 5, seed: int = 0):
    """Shuffled k-fold cross-validation: list of k (train_idx, test_idx) over range(n), seeded.

    Args:
        n: the number of rows.
        k: the number of folds.
        seed: seed of the shuffle.

    Examples:
        >>> from flowgp.data.tables import cv_splits
        >>> folds = cv_splits(10, k=5, seed=0)
        >>> len(folds), sorted(i for _, test in folds for i in test) == list(range(10))
        (5, True)
    """
    if k < 2 or k > n:
        raise ValueError(f"k must be in 2..n={n}, got {k}")
    perm = np.random.default_rng(seed).permutation(n)
    folds = np.array_split(perm, k)
    return [(np.sort(np.concatenate(folds[:i] + folds[i + 1:])), np.sort(folds[i])) for i in range(k)]


def standardize(train: np.ndarray, *others: np.ndarray):
    """Scale columns by the TRAINING split's mean and std only (no test statistics leak in).

    Returns (train_std, *others_std, mean, std); constant columns keep std 1.

    Args:
        train: the training array [N, D] (or [N]).
        *others: further arrays scaled with the training statistics (e.g. the test inputs).

    Examples:
        >>> import numpy as np
        >>> from flowgp.data.tables import standardize
        >>> train_std, test_std, mean, std = standardize(np.array([[1.0], [3.0]]), np.array([[5.0]]))
        >>> test_std.tolist(), mean.tolist(), std.tolist()
        ([[3.0]], [2.0], [1.0])
    """
    train = np.asarray(train, dtype=float)
    mean = train.mean(0)
    std = train.std(0)
    std = np.where(std > 0, std, 1.0)
    return (((train - mean) / std),) + tuple((np.asarray(o, dtype=float) - mean) / std for o in others) + (mean, std)
