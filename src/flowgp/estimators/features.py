"""scikit-learn's feature-name contract for every estimator, and the columns a saved model records.

Fitted on a table with string column names held in memory (a pandas or polars DataFrame, a pyarrow Table),
an estimator keeps them in `feature_names_in_` (a NumPy object array) next to `n_features_in_`; every method
given X afterwards checks X's names against them and raises scikit-learn's own ValueError when they are
missing, unseen or in another order ("The feature names should match those that were passed during fit."), or
warns as scikit-learn does when only one side has names. Both come from scikit-learn itself
(`sklearn.utils.validation.validate_data` with `skip_check_array=True`): the messages and the rules are
scikit-learn's (`check_dataframe_column_names_consistency` holds).

A fit on a streamed table (a CSV or Parquet path, `Estimator.fit_stream`) records the table's columns instead:
`feature_names_` (the feature columns, in order), `target_name_` (the target column, as the fit was given it)
and, for the multi-output estimator, `output_name_` (the output-index column). `saved_columns` /
`restore_columns` carry all of these in the model file, so a model copied without anything beside it still
selects its columns by name (`Estimator.predict_to_file`, `flowgp predict`).
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager

import numpy as np
from sklearn.utils.validation import validate_data

__all__ = ["fit_feature_names", "check_feature_names", "start_table_columns", "table_feature_names",
           "saved_columns", "restore_columns", "names_checked_by_table"]

#: the fitted attributes that describe a streamed table's columns
_TABLE_ATTRIBUTES = ("feature_names_", "target_name_", "output_name_")

#: the start of scikit-learn's warning for X without names given to an estimator fitted with names
_UNNAMED_WARNING = "X does not have valid feature names"


def fit_feature_names(estimator, X) -> None:
    """Set (or, for X without string column names, remove) `feature_names_in_` from the X given to `fit`, and
    forget the columns of an earlier streamed fit: nothing of another fit is kept. Call before X is converted."""
    validate_data(estimator, X, reset=True, skip_check_array=True, ensure_2d=False)
    for name in _TABLE_ATTRIBUTES:
        if hasattr(estimator, name):
            delattr(estimator, name)


def check_feature_names(estimator, X) -> None:
    """scikit-learn's check of X's column names against `feature_names_in_` (ValueError on a mismatch, a
    UserWarning where only one side has names). Call before X is converted to an array."""
    validate_data(estimator, X, reset=False, skip_check_array=True, ensure_2d=False)


def start_table_columns(estimator, feature_names, target=None) -> None:
    """A streamed fit's columns: `feature_names_` (the table's feature columns) and `target_name_` (`target` as
    the fit was given it: a column name, or a .npy table's column index; none for chunks) set, and what an
    earlier fit left (`feature_names_in_` of a fit in memory, `output_name_`) removed."""
    for name in ("feature_names_in_", *_TABLE_ATTRIBUTES):
        if hasattr(estimator, name):
            delattr(estimator, name)
    estimator.feature_names_ = [str(n) for n in feature_names]
    if target is not None and target is not False:
        estimator.target_name_ = target if isinstance(target, str) else int(target)


def table_feature_names(estimator):
    """The feature columns to take from a table by name: a streamed fit's `feature_names_`, else the
    `feature_names_in_` of a fit in memory; None when the model was fitted on unnamed arrays."""
    names = getattr(estimator, "feature_names_", None)
    if names:
        return list(names)
    names = getattr(estimator, "feature_names_in_", None)
    return None if names is None else [str(n) for n in names]


@contextmanager
def names_checked_by_table():
    """Predicting chunks of a table whose columns were already selected by name: the arrays carry no names, and
    scikit-learn's warning about it would say nothing true."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_UNNAMED_WARNING, category=UserWarning)
        yield


def saved_columns(estimator) -> dict:
    """What a model file records of the columns its estimator was fitted on (all None for unnamed arrays)."""
    names_in = getattr(estimator, "feature_names_in_", None)
    names = getattr(estimator, "feature_names_", None)
    return {"feature_names_in": None if names_in is None else [str(n) for n in names_in],
            "feature_names": None if names is None else [str(n) for n in names],
            "target_name": getattr(estimator, "target_name_", None),
            "output_name": getattr(estimator, "output_name_", None)}


def restore_columns(estimator, state: dict) -> None:
    """Set the attributes `saved_columns` recorded (files written before they were recorded have none)."""
    if state.get("feature_names_in") is not None:
        estimator.feature_names_in_ = np.asarray(state["feature_names_in"], dtype=object)
    for key, attribute in (("feature_names", "feature_names_"), ("target_name", "target_name_"),
                           ("output_name", "output_name_")):
        if state.get(key) is not None:
            setattr(estimator, attribute, list(state[key]) if key == "feature_names" else state[key])
