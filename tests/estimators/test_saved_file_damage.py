"""Damaged or foreign files never load into a silently different model (saved files)."""
import os
import pickle

import numpy as np
import pytest

import flowgp
from flowgp import TGPRegressor


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (40, 2))
    y = np.sin(3 * X[:, 0]) + 0.1 * rng.standard_normal(40)
    est = TGPRegressor(flow="sal", num_inducing=5, epochs=3, verbose=False, kmeans_restarts=1).fit(X, y)
    path = tmp_path_factory.mktemp("saved") / "tgp.pt"
    est.save(path)
    return path, X[:5], est.predict(X[:5], return_std=True)


def test_200_random_byte_corruptions_never_change_a_prediction_silently(saved, tmp_path):
    path, x, (mean, std) = saved
    data = path.read_bytes()
    rng = np.random.default_rng(1)
    outcomes = {"identical": 0, "refused": 0}
    for i in range(200):
        damaged = bytearray(data)
        k = int(rng.integers(len(damaged)))
        damaged[k] = (damaged[k] + int(rng.integers(1, 256))) % 256  # a different byte, never the same one
        target = tmp_path / f"damaged{i}.pt"
        target.write_bytes(bytes(damaged))
        try:
            est = flowgp.load(target)
        except ValueError as err:
            assert "weights_only=False" not in str(err)
            outcomes["refused"] += 1
            continue
        m, s = est.predict(x, return_std=True)
        np.testing.assert_array_equal(m, mean, err_msg=f"byte {k} changed the predictions silently")
        np.testing.assert_array_equal(s, std)
        outcomes["identical"] += 1
    assert outcomes["refused"] > 0 and sum(outcomes.values()) == 200


@pytest.mark.parametrize("content", [b"", b"not a model\n", b"PK\x03\x04 truncated"])
def test_empty_text_and_truncated_files_give_one_clear_error(tmp_path, content, saved):
    target = tmp_path / "bad.pt"
    target.write_bytes(content if content else b"")
    with pytest.raises(ValueError, match="not a readable flowgp file"):
        flowgp.load(target)
    target.write_bytes(saved[0].read_bytes()[:200])
    with pytest.raises(ValueError, match="not a readable flowgp file"):
        flowgp.load(target)


class _Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_a_pickle_that_would_run_code_is_refused_without_unsafe_advice(tmp_path):
    import torch

    target = tmp_path / "evil.pt"
    torch.save({"format": "flowgp-estimator-v1", "payload": _Payload()}, target, pickle_module=pickle)
    with pytest.raises(ValueError, match="refused without running them") as info:
        flowgp.load(target)
    assert "weights_only=False" not in str(info.value)


def _tensor_data_offsets(path):
    """Byte offset of each stored tensor's data in a saved file (torch's zip entries '<archive>/data/<key>')."""
    import struct
    import zipfile

    raw = path.read_bytes()
    offsets = []
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            if "/data/" in info.filename and info.file_size >= 8:
                name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
                offsets.append((info.filename, info.header_offset + 30 + name_len + extra_len))
    return offsets


def test_sign_bit_flip_of_every_saved_tensor_is_refused(saved, tmp_path):
    """The reported case: flipping the sign bit of the first value of each of a saved TGP's tensors loaded all of
    them without a word and moved predictions by up to 1.99; every one must now be refused as corrupted."""
    path = saved[0]
    data = path.read_bytes()
    offsets = _tensor_data_offsets(path)
    # kernel, inducing inputs, q(u), noise, flow, input scaling: the report counted 12 when each flow parameter was
    # its own tensor; the SAL's four are one tensor now
    assert len(offsets) >= 9
    for name, offset in offsets:
        damaged = bytearray(data)
        damaged[offset + 7] ^= 0x80  # little-endian float64: the sign bit is the top bit of the 8th byte
        target = tmp_path / "flipped.pt"
        target.write_bytes(bytes(damaged))
        with pytest.raises(ValueError, match="corrupted") as err:
            flowgp.load(target)
        assert "weights_only=False" not in str(err.value), name
