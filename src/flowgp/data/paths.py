"""Files a command or function writes, checked against the files it reads before any work: no output may be an
input, and no file is overwritten that the user did not name as an output.

`check_distinct(outputs, inputs)` is the one check, used by `flowgp fit`, `flowgp predict`, `flowgp bench` and
`predict_to_file`. Two paths are the same file when their resolved paths are equal (symbolic links followed,
relative paths taken from the working folder, `~` expanded) or when `os.path.samefile` says so (hard links, a
case-insensitive file system). An output inside an input *folder* (e.g. a folder of Parquet files read as one
table) is refused as well: the next read of that folder would take it for part of the table.

`flowgp fit --out m.pt` also writes the model's column names to the metadata file `m.pt.json` next to it. That
file is flowgp's when it is a JSON object with `"written_by": "flowgp fit"` (`METADATA_MARKER`; files of earlier
versions: an object with exactly the keys features, target, model and optionally output, features a list of
strings). `check_metadata_file` refuses to replace any other file there: a user's own `m.pt.json` is kept.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping, Optional

__all__ = ["same_file", "check_distinct", "metadata_path", "is_metadata_file", "check_metadata_file",
           "METADATA_MARKER"]

#: the field that marks a model's metadata file as written by `flowgp fit`
METADATA_MARKER = {"written_by": "flowgp fit"}
_LEGACY_METADATA_KEYS = {"features", "target", "model"}


def _resolved(path) -> Path:
    p = Path(os.fspath(path)).expanduser()
    try:
        return p.resolve()
    except (OSError, RuntimeError):  # a symbolic-link loop: compare the absolute path
        return p.absolute()


def same_file(a, b) -> bool:
    """Whether paths `a` and `b` name the same file (see the module doc), whether or not it exists yet."""
    if _resolved(a) == _resolved(b):
        return True
    try:
        return os.path.samefile(os.fspath(a), os.fspath(b))
    except (OSError, ValueError):  # one of them does not exist (yet): equal resolved paths were the test
        return False


def _inside(path, folder) -> bool:
    folder = Path(os.fspath(folder)).expanduser()
    if not folder.is_dir():
        return False
    top = _resolved(folder)
    return top in _resolved(path).parents


def _named(label: str, path) -> str:
    return f"{label} {os.fspath(path)}"


def _option(label: str) -> str:
    """The option or argument a label names ("--out's metadata file" -> "--out")."""
    return label.split("'s ")[0].split(" ")[0]


def check_distinct(outputs: Mapping[str, object], inputs: Mapping[str, object] = None) -> None:
    """ValueError before any work when an output is an input or another output, or lies inside an input folder.

    `outputs`, `inputs`: {how the user named the path (an option such as "--out", an argument such as "path",
    or a file derived from one: "--out's metadata file"): the path}; None values are skipped, as are inputs that
    are not paths (arrays, iterators)."""
    outs = [(k, v) for k, v in outputs.items() if isinstance(v, (str, os.PathLike))]
    ins = [(k, v) for k, v in (inputs or {}).items() if isinstance(v, (str, os.PathLike))]
    for i, (out_label, out) in enumerate(outs):
        for in_label, src in ins:
            if same_file(out, src):
                raise ValueError(f"{_named(out_label, out)} is the same file as {_named(in_label, src)}; writing it "
                                 f"would destroy that input: give {_option(out_label)} another path")
            if _inside(out, src):
                raise ValueError(f"{_named(out_label, out)} lies inside the folder {_named(in_label, src)}, which "
                                 f"is read as one table: give {_option(out_label)} a path outside it")
        for other_label, other in outs[i + 1:]:
            if same_file(out, other):
                raise ValueError(f"{_named(out_label, out)} is the same file as {_named(other_label, other)}; one "
                                 f"would overwrite the other: give {_option(out_label)} or {_option(other_label)} "
                                 "another path")


def metadata_path(model_path) -> Path:
    """The metadata file `flowgp fit` writes next to a model file: `<model>.json`."""
    return Path(str(os.fspath(model_path)) + ".json")


def is_metadata_file(path) -> bool:
    """Whether `path` holds a model's metadata as `flowgp fit` writes it (see the module doc)."""
    try:
        meta = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    if not isinstance(meta, dict):
        return False
    if all(meta.get(k) == v for k, v in METADATA_MARKER.items()):
        return True
    keys = set(meta)
    return (_LEGACY_METADATA_KEYS <= keys <= _LEGACY_METADATA_KEYS | {"output"}
            and isinstance(meta["features"], list) and all(isinstance(f, str) for f in meta["features"]))


def check_metadata_file(model_path, label: str = "--out") -> Optional[Path]:
    """ValueError when the metadata file of `model_path` exists and is not flowgp's (a user's own file of that
    name, which writing the model would silently replace); returns the metadata path."""
    meta = metadata_path(model_path)
    if meta.is_dir() or (meta.exists() and not is_metadata_file(meta)):
        raise ValueError(f"{label} {os.fspath(model_path)}: {meta} exists and was not written by flowgp fit "
                         "(flowgp writes the model's column names there); move that file or choose another "
                         f"{label}")
    return meta
