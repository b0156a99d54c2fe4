"""A NumPy-only reader for PyTorch ``.pth`` / ``.pt`` checkpoints (no torch import).

Contract: :func:`load_state_dict` turns a file written by ``torch.save(state_dict)``
into a ``dict[str, numpy.ndarray]`` (insertion order kept) without importing torch
and without executing arbitrary pickled code. Both on-disk layouts are read:

* the zip layout (torch >= 1.6): a zip archive ``<root>/data.pkl`` whose pickle
  refers to tensor storages through *persistent ids*
  ``("storage", storage_type, key, location, numel)``, the raw little-endian bytes
  of storage ``key`` being the archive member ``<root>/data/<key>``;
* the legacy layout (torch < 1.6): five consecutive pickles -- a magic number, the
  protocol version, a ``sys_info`` dict, the object itself (same persistent ids,
  with a sixth ``view_metadata`` field), then the list of storage keys -- followed,
  per key in that order, by an int64 element count and the storage's raw bytes.

Tensors are rebuilt from ``torch._utils._rebuild_tensor_v2(storage, offset, size,
stride, ...)`` with NumPy strides; the arrays are copies (contiguous, writeable).
Only a small allow-list of globals can be resolved (``collections.OrderedDict``,
the tensor/parameter rebuild helpers and the ``torch.*Storage`` dtypes); anything
else raises :class:`pickle.UnpicklingError`, so a malicious checkpoint cannot run
code. The format description followed is torch's own documentation of
``torch.save`` / ``torch.serialization`` and the ``pickle`` module's.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import zipfile
from collections.abc import Callable
from typing import Any, BinaryIO

import ml_dtypes
import numpy as np

__all__ = ["load_state_dict"]

_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C

# torch storage type name -> numpy dtype (little endian, as torch writes it).
_STORAGE_DTYPES: dict[str, np.dtype] = {
    "DoubleStorage": np.dtype("<f8"),
    "FloatStorage": np.dtype("<f4"),
    "HalfStorage": np.dtype("<f2"),
    "LongStorage": np.dtype("<i8"),
    "IntStorage": np.dtype("<i4"),
    "ShortStorage": np.dtype("<i2"),
    "CharStorage": np.dtype("i1"),
    "ByteStorage": np.dtype("u1"),
    "BoolStorage": np.dtype("?"),
    "BFloat16Storage": np.dtype(ml_dtypes.bfloat16),
}


class _StorageType:
    """Stand-in for a ``torch.<Name>Storage`` class: only carries the dtype."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.dtype = _STORAGE_DTYPES[name]


class _Storage:
    """A flat typed buffer, filled lazily (legacy files store data after the pickle)."""

    def __init__(self, dtype: np.dtype, numel: int) -> None:
        self.dtype = dtype
        self.numel = numel
        self.data: np.ndarray | None = None


class _LazyTensor:
    """A tensor view on a storage, materialised once every storage is read."""

    def __init__(
        self, storage: _Storage, offset: int, size: tuple[int, ...], stride: tuple[int, ...]
    ) -> None:
        self.storage = storage
        self.offset = offset
        self.size = tuple(size)
        self.stride = tuple(stride)

    def materialise(self) -> np.ndarray:
        """Returns the tensor as a contiguous NumPy array (a copy)."""
        data = self.storage.data
        if data is None:
            raise pickle.UnpicklingError("dcjax: tensor storage was never read from the file")
        if not self.size:
            return np.array(data[self.offset])
        extent = (
            self.offset + 1 + sum((n - 1) * s for n, s in zip(self.size, self.stride, strict=True))
        )
        if min(self.size) > 0 and extent > data.size:
            raise pickle.UnpicklingError(
                f"dcjax: tensor of size {self.size} and stride {self.stride} overruns its "
                f"storage of {data.size} elements"
            )
        item = data.itemsize
        view = np.lib.stride_tricks.as_strided(
            data[self.offset :],
            shape=self.size,
            strides=tuple(s * item for s in self.stride),
            writeable=False,
        )
        return np.array(view)


def _rebuild_tensor_v2(
    storage: _Storage,
    storage_offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    requires_grad: bool = False,
    backward_hooks: Any = None,
    metadata: Any = None,
) -> _LazyTensor:
    del requires_grad, backward_hooks, metadata
    return _LazyTensor(storage, storage_offset, size, stride)


def _rebuild_parameter(data: _LazyTensor, requires_grad: bool, backward_hooks: Any) -> Any:
    del requires_grad, backward_hooks
    return data


def _ordered_dict(*args: Any) -> collections.OrderedDict:
    return collections.OrderedDict(*args)


_ALLOWED_GLOBALS: dict[tuple[str, str], Callable[..., Any]] = {
    ("collections", "OrderedDict"): _ordered_dict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
}


class _Unpickler(pickle.Unpickler):
    """Resolves only allow-listed globals; storages come from ``storage_for``."""

    def __init__(self, file: BinaryIO, storage_for: Callable[[str, np.dtype, int], _Storage]):
        super().__init__(file, encoding="utf-8")
        self._storage_for = storage_for

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"dcjax: refusing to load global {module}.{name} from a checkpoint; only "
                "plain state_dicts of tensors are supported"
            ) from None

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"dcjax: unsupported persistent id {pid!r}")
        storage_type, key, _location, numel = pid[1:5]
        if not isinstance(storage_type, _StorageType):
            raise pickle.UnpicklingError(f"dcjax: unsupported storage type {storage_type!r}")
        return self._storage_for(str(key), storage_type.dtype, int(numel))


def _collect(obj: Any) -> Any:
    """Replaces every lazy tensor in a (nested) container by its NumPy array."""
    if isinstance(obj, _LazyTensor):
        return obj.materialise()
    if isinstance(obj, dict):
        return type(obj)((k, _collect(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_collect(v) for v in obj)
    return obj


def _load_zip(path: str | os.PathLike[str]) -> Any:
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        pkl = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
        if len(pkl) != 1:
            raise pickle.UnpicklingError(f"dcjax: {path} has no single data.pkl member")
        root = pkl[0][: -len("data.pkl")]
        byteorder = "little"
        if f"{root}byteorder" in names:
            byteorder = archive.read(f"{root}byteorder").decode().strip()
        storages: dict[str, _Storage] = {}

        def storage_for(key: str, dtype: np.dtype, numel: int) -> _Storage:
            if key not in storages:
                storage = _Storage(dtype, numel)
                raw = archive.read(f"{root}data/{key}")
                order = "<" if byteorder == "little" else ">"
                arr = np.frombuffer(raw, dtype=dtype.newbyteorder(order), count=numel)
                storage.data = arr.astype(dtype.newbyteorder("="), copy=False)
                storages[key] = storage
            return storages[key]

        obj = _Unpickler(io.BytesIO(archive.read(pkl[0])), storage_for).load()
    return _collect(obj)


def _load_legacy(path: str | os.PathLike[str]) -> Any:
    with open(path, "rb") as f:
        magic = pickle.load(f)
        if magic != _LEGACY_MAGIC:
            raise pickle.UnpicklingError(f"dcjax: {path} is not a PyTorch checkpoint")
        version = pickle.load(f)
        if version != 1001:
            raise pickle.UnpicklingError(f"dcjax: unsupported legacy protocol {version!r}")
        sys_info = pickle.load(f)
        if not sys_info.get("little_endian", True):
            raise pickle.UnpicklingError("dcjax: big-endian legacy checkpoints are not supported")
        storages: dict[str, _Storage] = {}

        def storage_for(key: str, dtype: np.dtype, numel: int) -> _Storage:
            if key not in storages:
                storages[key] = _Storage(dtype, numel)
            return storages[key]

        obj = _Unpickler(f, storage_for).load()
        keys = pickle.load(f)
        for key in keys:
            storage = storages[str(key)]
            (numel,) = struct.unpack("<q", f.read(8))
            raw = f.read(numel * storage.dtype.itemsize)
            if len(raw) != numel * storage.dtype.itemsize:
                raise pickle.UnpicklingError(f"dcjax: {path} is truncated in storage {key}")
            storage.data = np.frombuffer(raw, dtype=storage.dtype)
    return _collect(obj)


def load_state_dict(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Reads a PyTorch checkpoint into NumPy arrays without importing torch.

    Args:
        path: a file written by ``torch.save`` (zip or legacy layout) holding a
            state dict, i.e. a mapping from names to tensors.

    Returns:
        The mapping, with every tensor as a contiguous ``numpy.ndarray`` of the
        tensor's dtype and shape, in the file's order.

    Raises:
        pickle.UnpicklingError: the file is not a PyTorch checkpoint, is
            truncated, or refers to objects other than tensors and dicts.
        TypeError: the checkpoint does not hold a mapping.
    """
    obj = _load_zip(path) if zipfile.is_zipfile(path) else _load_legacy(path)
    if not isinstance(obj, dict):
        raise TypeError(f"dcjax: {path} holds a {type(obj).__name__}, not a state dict")
    return dict(obj)
