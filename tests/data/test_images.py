"""Image data loaders (flowgp.data.images): IDX and CIFAR batch readers, checksums, one-line errors, digits."""
import gzip
import hashlib
import pickle
import zlib

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


def _gzip_member(data: bytes, flags: int, stamp: int, name: bytes = b"") -> bytes:
    """A gzip file written by hand: header (flags, time stamp, XFL 0, OS 3, optional name), raw deflate, trailer."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    body = deflate.compress(data) + deflate.flush()
    header = bytes([0x1F, 0x8B, 8, flags]) + stamp.to_bytes(4, "little") + bytes([0, 3]) + name
    return header + body + zlib.crc32(data).to_bytes(4, "little") + len(data).to_bytes(4, "little")


def _packaged_fashion_mnist(folder, monkeypatch, n_train=6, n_test=4):
    """Fashion-MNIST-shaped files as a system package stores them: the published compressed data behind a
    header without the file name and with another time stamp; the 'published' sums are those of the originals."""
    rng = np.random.default_rng(2)
    folder.mkdir(parents=True)
    arrays = {"train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
              "train-labels-idx1-ubyte": rng.integers(0, 10, n_train),
              "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
              "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test)}
    sums, stamps = {}, {}
    for i, (stem, array) in enumerate(arrays.items()):
        data = _idx(array)
        stamps[f"{stem}.gz"] = 1504176606 + i
        published = _gzip_member(data, 0x08, stamps[f"{stem}.gz"], stem.encode() + b"\x00")
        assert gzip.decompress(published) == data
        sums[f"{stem}.gz"] = hashlib.md5(published).hexdigest()
        (folder / f"{stem}.gz").write_bytes(_gzip_member(data, 0x00, 1591347949))  # rewritten header
    monkeypatch.setitem(image_data.IMAGE_DATASETS, "fashion-mnist", ((1, 28, 28), n_train, n_test))
    monkeypatch.setitem(image_data._MD5, "fashion-mnist", sums)
    monkeypatch.setitem(image_data._GZIP_HEADER_TIME, "fashion-mnist", stamps)
    monkeypatch.setitem(image_data.SYSTEM_FOLDERS, "fashion-mnist", folder)
    return arrays


def test_a_packaged_set_is_found_in_its_system_folder_and_checked_against_the_published_sums(tmp_path, monkeypatch):
    system = tmp_path / "usr" / "share" / "datasets" / "fashion-mnist"
    arrays = _packaged_fashion_mnist(system, monkeypatch)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    split = load_images("fashion-mnist", data_dir)
    assert str(system) in split.info
    np.testing.assert_array_equal(split.x_train, arrays["train-images-idx3-ubyte"].reshape(6, 784))
    np.testing.assert_array_equal(split.y_test, arrays["t10k-labels-idx1-ubyte"])
    # without a data folder at all the system folder is still searched
    monkeypatch.setenv("FLOWGP_DATA", str(tmp_path / "nowhere"))
    assert load_images("fashion-mnist").x_test.shape == (4, 784)
    # a changed byte of the compressed data is refused although the header is the packaged one
    path = system / "t10k-labels-idx1-ubyte.gz"
    raw = bytearray(path.read_bytes())
    raw[12] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="t10k-labels-idx1-ubyte.gz has MD5"):
        load_images("fashion-mnist", data_dir)


def test_the_data_folder_comes_first_and_a_missing_set_says_where_it_looked(tmp_path, monkeypatch):
    _packaged_fashion_mnist(tmp_path / "system", monkeypatch)
    own = tmp_path / "data" / "images" / "fashion-mnist"
    own.mkdir(parents=True)
    assert load_images("fashion-mnist", tmp_path / "data").x_train.shape == (6, 784)  # empty: the system folder
    labels = "t10k-labels-idx1-ubyte.gz"
    (own / labels).write_bytes((tmp_path / "system" / labels).read_bytes())
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte.gz is missing; .*apt-get install"):
        load_images("fashion-mnist", tmp_path / "data")  # the first folder holding any file is the one read
    for f in [*(tmp_path / "system").iterdir(), own / labels]:
        f.unlink()
    with pytest.raises(FileNotFoundError) as err:
        load_images("fashion-mnist", tmp_path / "data")
    message = str(err.value)
    assert str(own) in message and str(tmp_path / "system") in message
    assert "apt-get install dataset-fashion-mnist" in message


def test_the_real_fashion_mnist_files_when_installed(tmp_path):
    folder = image_data.SYSTEM_FOLDERS["fashion-mnist"]
    if not (folder / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"Fashion-MNIST is not installed in {folder} (apt-get install dataset-fashion-mnist)")
    split = load_images("fashion-mnist", tmp_path)  # an empty data folder: the system package's files, verified
    assert split.x_train.shape == (60000, 784) and split.x_test.shape == (10000, 784)
    assert np.bincount(split.y_train).tolist() == [6000] * 10 and np.bincount(split.y_test).tolist() == [1000] * 10
    assert split.x_train.min() == 0 and split.x_train.max() == 255
