"""The NumPy-only PyTorch checkpoint reader, on files written here in both layouts.

The files are produced with the standard pickle module and stand-in ``torch``
modules (registered in ``sys.modules`` only while writing), following the layouts
described in `dcjax.models._torch_pickle`; torch itself is never imported.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import sys
import types
import zipfile

import numpy as np
import pytest

from dcjax.models._torch_pickle import load_state_dict

_MAGIC = 0x1950A86A20F9469CFC6C


class _FakeStorage:
    def __init__(self, key: str, data: np.ndarray) -> None:
        self.key = key
        self.data = data


class _FakeTensor:
    def __init__(self, storage: _FakeStorage, offset: int, size, stride) -> None:
        self.args = (storage, offset, tuple(size), tuple(stride), False, collections.OrderedDict())

    def __reduce__(self):
        return (sys.modules["torch._utils"]._rebuild_tensor_v2, self.args)


@pytest.fixture
def fake_torch(monkeypatch):
    """Stand-in ``torch`` modules, so that pickle can name torch's globals."""
    torch = types.ModuleType("torch")
    utils = types.ModuleType("torch._utils")

    def _rebuild_tensor_v2(*args):  # never called: only its name is pickled
        raise AssertionError(args)

    _rebuild_tensor_v2.__module__ = "torch._utils"
    _rebuild_tensor_v2.__qualname__ = "_rebuild_tensor_v2"
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2
    for name in ("FloatStorage", "LongStorage", "HalfStorage"):
        cls = type(name, (), {"__module__": "torch"})
        setattr(torch, name, cls)
    torch._utils = utils
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch._utils", utils)
    return torch


_STORAGE_NAMES = {np.float32: "FloatStorage", np.int64: "LongStorage", np.float16: "HalfStorage"}


class _Pickler(pickle.Pickler):
    def __init__(self, file, torch, legacy: bool) -> None:
        super().__init__(file, protocol=2)
        self.torch = torch
        self.legacy = legacy
        self.storages: dict[str, _FakeStorage] = {}

    def persistent_id(self, obj):
        if isinstance(obj, _FakeStorage):
            self.storages[obj.key] = obj
            cls = getattr(self.torch, _STORAGE_NAMES[obj.data.dtype.type])
            pid = ("storage", cls, obj.key, "cpu", obj.data.size)
            return pid + (None,) if self.legacy else pid
        return None


def _state(torch_like_storages):
    a = _FakeStorage("0", np.arange(12, dtype=np.float32))
    b = _FakeStorage("1", np.array([7, -3, 2**40], dtype=np.int64))
    c = _FakeStorage("2", np.array([0.5, 1.5, -2.0], dtype=np.float16))
    state = collections.OrderedDict(
        [
            ("conv.weight", _FakeTensor(a, 0, (3, 4), (4, 1))),
            ("conv.weight_t", _FakeTensor(a, 0, (4, 3), (1, 4))),  # a transposed view
            ("tail", _FakeTensor(a, 8, (2, 2), (2, 1))),  # offset into shared storage
            ("bn.num_batches_tracked", _FakeTensor(b, 2, (), ())),  # a 0-d tensor
            ("ints", _FakeTensor(b, 0, (3,), (1,))),
            ("half", _FakeTensor(c, 0, (3,), (1,))),
        ]
    )
    expected = {
        "conv.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
        "conv.weight_t": np.arange(12, dtype=np.float32).reshape(3, 4).T,
        "tail": np.array([[8, 9], [10, 11]], np.float32),
        "bn.num_batches_tracked": np.array(2**40, np.int64),
        "ints": np.array([7, -3, 2**40], np.int64),
        "half": np.array([0.5, 1.5, -2.0], np.float16),
    }
    return state, expected


def _write_legacy(path, torch, state) -> None:
    with open(path, "wb") as f:
        for header in (_MAGIC, 1001, {"protocol_version": 1001, "little_endian": True}):
            pickle.dump(header, f, protocol=2)
        pickler = _Pickler(f, torch, legacy=True)
        pickler.dump(state)
        keys = sorted(pickler.storages)
        pickle.dump(keys, f, protocol=2)
        for key in keys:
            data = pickler.storages[key].data
            f.write(struct.pack("<q", data.size))
            f.write(data.astype(data.dtype.newbyteorder("<")).tobytes())


def _write_zip(path, torch, state) -> None:
    buf = io.BytesIO()
    pickler = _Pickler(buf, torch, legacy=False)
    pickler.dump(state)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/version", "3\n")
        for key, storage in pickler.storages.items():
            z.writestr(f"archive/data/{key}", storage.data.tobytes())


@pytest.mark.parametrize("layout", ["legacy", "zip"])
def test_reads_tensors_views_and_dtypes(tmp_path, fake_torch, layout):
    state, expected = _state(fake_torch)
    path = tmp_path / f"model_{layout}.pth"
    (_write_legacy if layout == "legacy" else _write_zip)(path, fake_torch, state)
    sys.modules.pop("torch")  # the reader must not need torch
    sys.modules.pop("torch._utils")
    loaded = load_state_dict(os.fspath(path))
    assert list(loaded) == list(expected)
    for name, want in expected.items():
        got = loaded[name]
        assert got.dtype == want.dtype, name
        assert got.shape == want.shape, name
        np.testing.assert_array_equal(got, want, err_msg=name)
        assert got.flags.writeable


def test_refuses_arbitrary_globals(tmp_path):
    path = tmp_path / "evil.pth"
    with open(path, "wb") as f:
        for header in (_MAGIC, 1001, {"little_endian": True}):
            pickle.dump(header, f, protocol=2)
        pickle.dump({"x": os.getcwd}, f, protocol=2)
        pickle.dump([], f, protocol=2)
    with pytest.raises(pickle.UnpicklingError, match="refusing to load global"):
        load_state_dict(path)


def test_rejects_non_checkpoints_and_truncation(tmp_path, fake_torch):
    bad = tmp_path / "bad.pth"
    with open(bad, "wb") as f:
        pickle.dump(12345, f, protocol=2)
    with pytest.raises(pickle.UnpicklingError, match="not a PyTorch checkpoint"):
        load_state_dict(bad)
    state, _ = _state(fake_torch)
    path = tmp_path / "cut.pth"
    _write_legacy(path, fake_torch, state)
    data = path.read_bytes()
    path.write_bytes(data[:-5])
    with pytest.raises(pickle.UnpicklingError, match="truncated"):
        load_state_dict(path)


def test_rejects_views_past_their_storage(tmp_path, fake_torch):
    a = _FakeStorage("0", np.arange(4, dtype=np.float32))
    path = tmp_path / "overrun.pth"
    _write_zip(path, fake_torch, {"w": _FakeTensor(a, 2, (2, 2), (2, 1))})
    with pytest.raises(pickle.UnpicklingError, match="overruns"):
        load_state_dict(path)
