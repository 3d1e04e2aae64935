"""Image data loaders (flowgp.data.images): IDX and CIFAR batch readers, checksums, one-line errors, digits."""
import gzip
import hashlib
import pickle

import numpy as np
import pytest

import flowgp.data.images as image_data
from flowgp.data.images import load_images


def _idx(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def _small_mnist(tmp_path, monkeypatch, n_train=6, n_test=4, compress=True):
    rng = np.random.default_rng(0)
    folder = tmp_path / "images" / "mnist"
    folder.mkdir(parents=True)
    arrays = {"train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
              "train-labels-idx1-ubyte": rng.integers(0, 10, n_train),
              "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
              "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test)}
    sums = {}
    for stem, array in arrays.items():
        data = _idx(array)
        if compress:
            data = gzip.compress(data)
            (folder / f"{stem}.gz").write_bytes(data)
            sums[f"{stem}.gz"] = hashlib.md5(data).hexdigest()
        else:
            (folder / stem).write_bytes(data)
    monkeypatch.setitem(image_data.IMAGE_DATASETS, "mnist", ((1, 28, 28), n_train, n_test))
    monkeypatch.setitem(image_data._MD5, "mnist", sums or image_data._MD5["mnist"])
    return arrays, folder


@pytest.mark.parametrize("compress", [True, False])
def test_idx_files_load_as_flat_images(tmp_path, monkeypatch, compress):
    arrays, _ = _small_mnist(tmp_path, monkeypatch, compress=compress)
    split = load_images("mnist", tmp_path)
    assert split.image_shape == (1, 28, 28)
    np.testing.assert_array_equal(split.x_train, arrays["train-images-idx3-ubyte"].reshape(6, 784))
    np.testing.assert_array_equal(split.y_test, arrays["t10k-labels-idx1-ubyte"])
    assert split.x_train.dtype == np.float64 and split.y_train.dtype == np.int64


def test_a_damaged_or_missing_file_says_which_and_where(tmp_path, monkeypatch):
    _, folder = _small_mnist(tmp_path, monkeypatch)
    data = bytearray((folder / "t10k-labels-idx1-ubyte.gz").read_bytes())
    data[-3] ^= 0xFF
    (folder / "t10k-labels-idx1-ubyte.gz").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="t10k-labels-idx1-ubyte.gz has MD5"):
        load_images("mnist", tmp_path)
    (folder / "train-images-idx3-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError, match=r"train-images-idx3-ubyte.gz is missing; put .* into .*mnist"):
        load_images("mnist", tmp_path)
    with pytest.raises(FileNotFoundError, match="cifar-10-python.tar.gz"):
        load_images("cifar10", tmp_path)
    with pytest.raises(ValueError, match="unknown image dataset"):
        load_images("svhn", tmp_path)


def test_a_truncated_idx_file_and_the_published_sums(tmp_path, monkeypatch):
    _, folder = _small_mnist(tmp_path, monkeypatch, compress=False)
    path = folder / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ValueError, match="truncated"):
        load_images("mnist", tmp_path)
    # the real files' sums as published (a typo here would refuse every real download)
    assert image_data._MD5["fashion-mnist"]["t10k-labels-idx1-ubyte.gz"] == "bb300cfdad3c16e7a12a480ee83cd310"
    assert all(len(v) == 32 for sums in image_data._MD5.values() for v in sums.values())


def test_cifar_batches_load_channel_first_and_refuse_code(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    folder = tmp_path / "images" / "cifar10" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    sums, batches = {}, {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (2, 3072)).astype(np.uint8), b"labels": [1, 7]}
        blob = pickle.dumps(batch, protocol=2)
        (folder / name).write_bytes(blob)
        sums[name], batches[name] = hashlib.md5(blob).hexdigest(), batch
    monkeypatch.setitem(image_data.IMAGE_DATASETS, "cifar10", ((3, 32, 32), 10, 2))
    monkeypatch.setitem(image_data._MD5, "cifar10", sums)
    split = load_images("cifar10", tmp_path)
    assert split.x_train.shape == (10, 3072) and split.image_shape == (3, 32, 32)
    np.testing.assert_array_equal(split.x_test, batches["test_batch"][b"data"])
    # a batch naming any callable besides NumPy's array reconstruction is refused, not run
    evil = pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1], b"x": print})
    (folder / "data_batch_3").write_bytes(evil)
    with pytest.raises(ValueError, match="refusing to load builtins.print"):
        load_images("cifar10", tmp_path, verify=False)


def test_digits_is_the_embedded_set():
    split = load_images("digits")
    assert split.x_train.shape == (1347, 64) and split.x_test.shape == (450, 64) and split.image_shape == (1, 8, 8)
    assert set(np.unique(split.y_train)) == set(range(10))
