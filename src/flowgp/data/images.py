"""Image classification data of CNF-DGP §IV-B: MNIST, Fashion-MNIST, CIFAR-10, and the 8x8 digits.

The three standard sets are read from their distributed files, which flowgp cannot download (no well-kept
package ships them inside its wheel; torchvision, keras and the `mnist` package fetch them at run time):

    <data dir>/images/mnist/           train-images-idx3-ubyte.gz  train-labels-idx1-ubyte.gz
                                       t10k-images-idx3-ubyte.gz   t10k-labels-idx1-ubyte.gz
    <data dir>/images/fashion-mnist/   the same four names (Zalando's Fashion-MNIST files)
    <data dir>/images/cifar10/         cifar-10-python.tar.gz, or its folder cifar-10-batches-py/

where <data dir> is `data_dir`, $FLOWGP_DATA or ../shared/data (`flowgp.data.tables.resolve_data_dir`). Where a
system package installs a set, its folder is searched next (`SYSTEM_FOLDERS`): Debian and Ubuntu ship
Fashion-MNIST's four files (`apt-get install dataset-fashion-mnist`, into /usr/share/datasets/fashion-mnist/).
The first folder holding any of a set's files is read. The IDX files may also be stored decompressed (without
.gz). Every file is checked: the distributed archives and the CIFAR batches by their published MD5 sums,
decompressed IDX files by their header (magic number and shape); a missing or different file is a one-line
error saying where it looked and which file to put where.

Debian's package stores Zalando's compressed data unchanged but rewrites each file's 10-byte gzip header
(its packaging drops the stored file name and replaces the time stamp), so its files' own MD5 sums differ from
the published ones. For those files the published header - the name and the time stamp Zalando's files carry,
`_GZIP_HEADER_TIME` - is put back in front of the compressed data and the result is checked against the
published sum: the check is as strict as for the downloaded files.

Images come back as float64 rows flattened in (C, H, W) order with pixel values 0-255 (CIFAR's python batches
store each image channel by channel, already that order), labels as int64, and the image shape - what `DeepGPClassifier(skip="conv", image_shape=...)`
takes. "digits" is scikit-learn's embedded 8x8 set (1 797 images, values 0-16), split 75/25 stratified with a
fixed seed: the set for tests and CI.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import pickle
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .tables import Split, resolve_data_dir

__all__ = ["IMAGE_DATASETS", "ImageSplit", "load_images", "image_folders", "SYSTEM_FOLDERS", "INSTALL_COMMANDS"]

_MNIST_FILES = {"train_x": "train-images-idx3-ubyte", "train_y": "train-labels-idx1-ubyte",
                "test_x": "t10k-images-idx3-ubyte", "test_y": "t10k-labels-idx1-ubyte"}
#: published MD5 sums of the distributed .gz files (the sets' own pages; torchvision checks the same)
_MD5 = {
    "mnist": {"train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
              "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
              "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
              "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c"},
    "fashion-mnist": {"train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
                      "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
                      "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
                      "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310"},
    "cifar10": {"cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a",
                "data_batch_1": "c99cafc152244af753f735de768cd75f", "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
                "data_batch_3": "54ebc095f3ab1f0389bbae665268c751", "data_batch_4": "634d18415352ddfa80567beed471001a",
                "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb", "test_batch": "40351d587109b95175f43aff81a1287e"},
}
#: the time stamps (gzip MTIME) in the headers of the published Fashion-MNIST .gz files (2017-08-31 10:50 UTC):
#: with the file's name and OS 3 (Unix) they rebuild the published header where a package rewrote it
_GZIP_HEADER_TIME = {
    "fashion-mnist": {"train-images-idx3-ubyte.gz": 1504176606, "train-labels-idx1-ubyte.gz": 1504176606,
                      "t10k-images-idx3-ubyte.gz": 1504176627, "t10k-labels-idx1-ubyte.gz": 1504176627},
}
#: folders where system packages install a set, searched after <data dir>/images/<name>/
SYSTEM_FOLDERS = {"fashion-mnist": Path("/usr/share/datasets/fashion-mnist")}
#: the command that installs a set's files into its SYSTEM_FOLDERS entry
INSTALL_COMMANDS = {"fashion-mnist": "apt-get install dataset-fashion-mnist (Debian, Ubuntu)"}
_SOURCES = {"mnist": "http://yann.lecun.com/exdb/mnist/ (or a mirror such as ossci-datasets.s3.amazonaws.com/mnist/)",
            "fashion-mnist": "https://github.com/zalandoresearch/fashion-mnist (data/fashion/)",
            "cifar10": "https://www.cs.toronto.edu/~kriz/cifar.html (the 'CIFAR-10 python version')"}

#: name -> (image shape, train rows, test rows)
IMAGE_DATASETS = {
    "digits": ((1, 8, 8), 1347, 450),
    "mnist": ((1, 28, 28), 60000, 10000),
    "fashion-mnist": ((1, 28, 28), 60000, 10000),
    "cifar10": ((3, 32, 32), 50000, 10000),
}


@dataclass
class ImageSplit(Split):
    """A `flowgp.data.tables.Split` of images: float64 rows [N, C·H·W] in (C, H, W) order, int64 labels, and the image
    shape (C, H, W).

    Attributes:
        x_train, y_train: training images [N, C·H·W] and labels [N].
        x_test, y_test: test images and labels.
        info: where the split came from.
        image_shape: (C, H, W).

    See Also:
        :func:`flowgp.data.images.load_images`, :class:`flowgp.DeepGPClassifier` (``image_shape=``).
    """

    image_shape: tuple = ()


def load_images(name: str, data_dir=None, *, verify: bool = True) -> ImageSplit:
    """The standard train/test split of image set `name` ("digits", "mnist", "fashion-mnist", "cifar10").

    `verify`: check the published MD5 sums (reading the files once more; the IDX headers are always checked).

    Args:
        name: the set's name.
        data_dir: the data folder (None: `resolve_data_dir`'s choice).
        verify: as above.

    See Also:
        :func:`flowgp.data.images.image_folders` (where the files are looked for).
    """
    if name not in IMAGE_DATASETS:
        raise ValueError(f"unknown image dataset {name!r}; choose one of {sorted(IMAGE_DATASETS)}")
    shape, n_train, n_test = IMAGE_DATASETS[name]
    if name == "digits":
        return _digits(shape)
    folder = _find_folder(name, data_dir)
    if name == "cifar10":
        split = _cifar10(folder, verify)
    else:
        parts = {key: _read_idx(folder, stem, name, verify) for key, stem in _MNIST_FILES.items()}
        split = ImageSplit(parts["train_x"].reshape(len(parts["train_x"]), -1).astype(np.float64),
                           parts["train_y"].astype(np.int64),
                           parts["test_x"].reshape(len(parts["test_x"]), -1).astype(np.float64),
                           parts["test_y"].astype(np.int64), f"{name}: IDX files in {folder}", image_shape=shape)
    for what, array, rows in (("training", split.x_train, n_train), ("test", split.x_test, n_test)):
        if array.shape != (rows, int(np.prod(shape))):
            raise ValueError(f"{name}: the {what} images have shape {array.shape}, expected ({rows}, "
                             f"{int(np.prod(shape))}); the files in {folder} are not the standard set")
    return split


def image_folders(name: str, data_dir=None) -> list[Path]:
    """The folders `load_images` searches for set `name`, in order: <data dir>/images/<name>/ (left out when the
    data folder does not exist, unless `data_dir` names it), then the set's `SYSTEM_FOLDERS` entry if any.

    Args:
        name: the set's name.
        data_dir: the data folder (None: `resolve_data_dir`'s choice).

    See Also:
        :func:`flowgp.data.images.load_images`.
    """
    try:
        folders = [resolve_data_dir(data_dir) / "images" / name]
    except FileNotFoundError:
        if data_dir is not None:
            raise
        folders = []
    if name in SYSTEM_FOLDERS:
        folders.append(SYSTEM_FOLDERS[name])
    return folders


def _expected_files(name: str) -> list[str]:
    if name == "cifar10":
        return ["cifar-10-python.tar.gz", "cifar-10-batches-py"]
    return [f"{stem}{ext}" for stem in _MNIST_FILES.values() for ext in (".gz", "")]


def _find_folder(name: str, data_dir) -> Path:
    """The first of `image_folders` that holds any of the set's files; a FileNotFoundError naming every folder
    searched, where the files come from and how to install them, when none does."""
    folders = image_folders(name, data_dir)
    for folder in folders:
        if any((folder / f).exists() for f in _expected_files(name)):
            return folder
    looked = ", ".join(str(f) for f in folders) or "nowhere (no data folder exists)"
    install = f"install them with `{INSTALL_COMMANDS[name]}`, or " if name in INSTALL_COMMANDS else ""
    target = folders[0] if folders else Path("<data dir>") / "images" / name
    first = next(iter(_MD5[name])) if name != "cifar10" else "cifar-10-python.tar.gz"
    raise FileNotFoundError(f"{name}: {first} is missing (looked in {looked}); {install}put {_file_list(name)} "
                            f"from {_SOURCES[name]} into {target} (the data folder is --data-dir, $FLOWGP_DATA or "
                            "../shared/data)")


def _file_list(name: str) -> str:
    return ", ".join(_MD5[name]) if name != "cifar10" else "cifar-10-python.tar.gz (or cifar-10-batches-py/)"


def _digits(shape) -> ImageSplit:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    return ImageSplit(xtr.astype(np.float64), ytr.astype(np.int64), xte.astype(np.float64), yte.astype(np.int64),
                      "digits: sklearn.datasets.load_digits, 75/25 stratified split (random_state 0)",
                      image_shape=shape)


def _missing(name: str, folder: Path, what: str) -> FileNotFoundError:
    install = f" (or `{INSTALL_COMMANDS[name]}`)" if name in INSTALL_COMMANDS else ""
    return FileNotFoundError(f"{name}: {what} is missing; put {_file_list(name)} from {_SOURCES[name]} into {folder}"
                             f"{install} (the data folder is --data-dir, $FLOWGP_DATA or ../shared/data)")


def _published_sum_matches(raw: bytes, name: str, filename: str) -> bool:
    """Whether `raw` is the published file: its MD5 is the published one, or it is the published compressed data
    behind a rewritten 10-byte gzip header (no name, another time stamp: Debian's package) and putting the
    published header back gives the published MD5."""
    published = _MD5[name][filename]
    if _md5(raw) == published:
        return True
    stamp = _GZIP_HEADER_TIME.get(name, {}).get(filename)
    if stamp is None or len(raw) < 10 or raw[:4] != b"\x1f\x8b\x08\x00":
        return False  # not a gzip file whose header has no optional fields
    header = b"\x1f\x8b\x08\x08" + stamp.to_bytes(4, "little") + b"\x00\x03" + filename[:-3].encode() + b"\x00"
    return _md5(header + raw[10:]) == published


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _read_idx(folder: Path, stem: str, name: str, verify: bool) -> np.ndarray:
    """One IDX file (stem.gz, or stem decompressed) as a uint8 array; MD5 of the .gz, header always checked."""
    packed, plain = folder / f"{stem}.gz", folder / stem
    path = packed if packed.is_file() else plain
    if path is packed:
        raw = packed.read_bytes()
        if verify and not _published_sum_matches(raw, name, packed.name):
            raise ValueError(f"{name}: {packed} has MD5 {_md5(raw)}, not the published {_MD5[name][packed.name]}; "
                             "the file is damaged or another data set's; download it again")
        try:
            data = gzip.decompress(raw)
        except (OSError, EOFError) as err:
            raise ValueError(f"{name}: {packed} is not a readable gzip file ({err}); download it again") from None
    elif plain.is_file():
        data = plain.read_bytes()
    else:
        raise _missing(name, folder, f"{packed.name}")
    return _parse_idx(data, path, name)


def _parse_idx(data: bytes, path: Path, name: str) -> np.ndarray:
    """IDX format: 2 zero bytes, type code 0x08 (unsigned byte), the number of dimensions, big-endian int32 sizes."""
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08 or data[3] not in (1, 3):
        raise ValueError(f"{name}: {path} is not an IDX file of unsigned bytes (bad magic number); "
                         "download the standard file again")
    ndim = data[3]
    dims = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    start = 4 + 4 * ndim
    if len(data) - start != int(np.prod(dims)):
        raise ValueError(f"{name}: {path} declares shape {dims} but holds {len(data) - start} values; the file is "
                         "truncated or damaged")
    return np.frombuffer(data, dtype=np.uint8, offset=start).reshape(dims)


class _ArraysOnly(pickle.Unpickler):
    """Unpickles the CIFAR batches (dicts of bytes, lists and NumPy arrays) and nothing else: a batch file is
    data, and a pickle naming any other callable is refused rather than run."""

    _ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
                ("numpy._core.multiarray", "scalar"),
                ("_codecs", "encode")}  # how protocol-2 pickles written by Python 3 store bytes

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a CIFAR batch file")


def _cifar10(folder: Path, verify: bool) -> ImageSplit:
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    extracted = folder / "cifar-10-batches-py"
    archive = folder / "cifar-10-python.tar.gz"
    blobs = {}
    if extracted.is_dir():
        for n in names:
            path = extracted / n
            if not path.is_file():
                raise _missing("cifar10", folder, f"cifar-10-batches-py/{n}")
            blobs[n] = path.read_bytes()
    elif archive.is_file():
        raw = archive.read_bytes()
        if verify and _md5(raw) != _MD5["cifar10"][archive.name]:
            raise ValueError(f"cifar10: {archive} has MD5 {_md5(raw)}, not the published "
                             f"{_MD5['cifar10'][archive.name]}; download it again")
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as tar:
            for n in names:
                try:
                    blobs[n] = tar.extractfile(f"cifar-10-batches-py/{n}").read()
                except KeyError:
                    raise ValueError(f"cifar10: {archive} has no cifar-10-batches-py/{n}; not the standard "
                                     "archive") from None
    else:
        raise _missing("cifar10", folder, "cifar-10-python.tar.gz")
    xs, ys = {}, {}
    for n, blob in blobs.items():
        if verify and _md5(blob) != _MD5["cifar10"][n]:
            raise ValueError(f"cifar10: batch {n} has MD5 {_md5(blob)}, not the published {_MD5['cifar10'][n]}; "
                             "the file is damaged or not the standard set")
        try:
            batch = _ArraysOnly(io.BytesIO(blob), encoding="bytes").load()
        except (pickle.UnpicklingError, EOFError, ValueError) as err:
            raise ValueError(f"cifar10: batch {n} could not be read: {err}") from None
        data, labels = np.asarray(batch[b"data"], dtype=np.uint8), np.asarray(batch[b"labels"], dtype=np.int64)
        if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
            raise ValueError(f"cifar10: batch {n} holds data {data.shape} and {len(labels)} labels, expected "
                             "[10000, 3072] and 10000")
        # the python batches store each row as 1024 red, then green, then blue values: already (C, H, W)
        xs[n], ys[n] = data, labels
    train = names[:5]
    return ImageSplit(np.concatenate([xs[n] for n in train]).astype(np.float64),
                      np.concatenate([ys[n] for n in train]), xs["test_batch"].astype(np.float64),
                      ys["test_batch"], f"cifar10: python batches in {folder}", image_shape=(3, 32, 32))
