"""A content-addressed store of model layers: saved once per content, loaded once
per process, evicted least-recently-used past a byte budget.

Contract:

- `save(params, root, name)` writes a model's parameters layer by layer: one
  safetensors file per distinct layer, named by the layer's key, under
  ``root/layers/``, and the model's manifest ``root/models/NAME.json`` (the layers
  in the order of the parameters' leaves, each with its key, tensors and bytes).
  A layer whose key is already stored is not written again, so models that share
  layers through transfer learning share files.
- A layer's key is the SHA-256 of its tensors' relative names, dtypes, shapes and
  bytes (C order), in sorted name order: computed when the model is saved, so
  whether a layer is resident is known without reading it (`Manifest`).
- `LayerStore(root, budget_bytes=...)` maps keys to loaded device arrays. A key
  is read from storage once however many models or threads ask for it (the lock
  is held only for the lookup, not while reading); before a layer is read,
  layers not pinned are evicted, least recently used first, until it fits the
  budget (pinned layers can still take the resident bytes past it). Every read is
  checked against its key: a file whose bytes do not hash to it raises
  `CorruptLayerError` naming the layer, and nothing of it is returned.
- A budget smaller than the largest layer a caller asks for is a `ValueError`.

Layers are groups of parameter leaves (`layer_of`): a Flax module's kernel and
bias (or a BatchNorm's scale, bias, mean and var, across the ``params`` and
``batch_stats`` collections); for a flat dict of names (ONNX initialisers) the
name up to its last ``/`` (``conv2d/kernel:0``) or, without one, its last dot
(``conv1.weight``); any other leaf is a layer of its own.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

__all__ = [
    "FORMAT",
    "CorruptLayerError",
    "LayerEntry",
    "LayerStore",
    "Manifest",
    "StoreStats",
    "layer_key",
    "layer_of",
    "save",
]

#: The manifest's format tag.
FORMAT = "dcjax-layercache/1"
_COLLECTIONS = ("params", "batch_stats")


class CorruptLayerError(ValueError):
    """A stored layer whose bytes do not hash to its key (a damaged file)."""


def _path_names(path: Sequence[Any]) -> list[str]:
    names = []
    for p in path:
        for attr in ("key", "name", "idx"):
            if hasattr(p, attr):
                names.append(str(getattr(p, attr)))
                break
        else:
            names.append(str(p))
    return names


def layer_of(path: Sequence[Any]) -> tuple[str, str]:
    """``(layer, tensor)``: the layer a parameter leaf belongs to and its name
    within the layer, from the leaf's pytree path (module docstring)."""
    names = _path_names(path)
    collection = ""
    if len(names) > 1 and names[0] in _COLLECTIONS:
        collection, names = names[0], names[1:]
    if len(names) == 1:  # a flat name: TensorFlow's "conv2d/kernel:0", ONNX's "conv1.weight"
        for sep in "/.":
            if sep in names[0].strip(sep):
                layer, _, leaf = names[0].rpartition(sep)
                return layer, leaf
    layer = "/".join(names[:-1]) or names[-1]
    leaf = names[-1] if len(names) > 1 else "value"
    return layer, (f"{collection}:{leaf}" if collection == "batch_stats" else leaf)


def layer_key(tensors: Mapping[str, np.ndarray]) -> str:
    """The content key of a layer (module docstring)."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        digest.update(f"{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        digest.update(a.reshape(-1).view(np.uint8))  # the bytes, without a copy
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerEntry:
    """One layer of a saved model.

    Attributes:
        name: the layer's name in this model (``block3/depthwise/conv``).
        key: its content key (`layer_key`); the file is ``layers/KEY.safetensors``.
        tensors: tensor name -> (shape, dtype).
        nbytes: the tensors' bytes.
    """

    name: str
    key: str
    tensors: Mapping[str, tuple[tuple[int, ...], str]]
    nbytes: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class Manifest:
    """A saved model: its layers and, per parameter leaf in flattening order, the
    layer and tensor that hold it.

    Attributes:
        name: the model's name.
        root: the store's folder.
        layers: the layers, in the order their first leaf appears.
        leaves: per parameter leaf, ``(layer index, tensor name)``.
    """

    name: str
    root: Path
    layers: tuple[LayerEntry, ...]
    leaves: tuple[tuple[int, str], ...]

    @property
    def nbytes(self) -> int:
        return sum(lay.nbytes for lay in self.layers)

    def path(self, key: str) -> Path:
        return self.root / "layers" / f"{key}.safetensors"

    @classmethod
    def read(cls, root: str | os.PathLike[str], name: str) -> Manifest:
        """The manifest of model ``name`` saved under ``root``."""
        path = Path(root) / "models" / f"{name}.json"
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(
                f"dcjax: no saved model {name!r} under {root} (no {path}); "
                "save it with dcjax.layercache.save"
            ) from None
        if doc.get("format") != FORMAT:
            raise ValueError(f"dcjax: {path} is not a {FORMAT} manifest")
        layers = tuple(
            LayerEntry(
                name=lay["name"],
                key=lay["key"],
                tensors={k: (tuple(v[0]), v[1]) for k, v in lay["tensors"].items()},
                nbytes=int(lay["nbytes"]),
            )
            for lay in doc["layers"]
        )
        leaves = tuple((int(i), str(t)) for i, t in doc["leaves"])
        return cls(name=doc["model"], root=Path(root), layers=layers, leaves=leaves)


def _group(params: Any) -> tuple[dict[str, dict[str, np.ndarray]], list[tuple[str, str]]]:
    """Layer name -> {tensor name: array}, and per leaf ``(layer, tensor)``."""
    layers: dict[str, dict[str, np.ndarray]] = {}
    leaves = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        layer, tensor = layer_of(path)
        if tensor in layers.setdefault(layer, {}):
            raise ValueError(f"dcjax: two parameters map to {layer}/{tensor}")
        layers[layer][tensor] = np.asarray(leaf)
        leaves.append((layer, tensor))
    return layers, leaves


def _safetensors():
    try:
        import safetensors.numpy
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "dcjax: the layer cache stores layers as safetensors files: "
            "pip install 'dcjax[layercache]'",
            name="safetensors",
        ) from None
    return safetensors


def save(params: Any, root: str | os.PathLike[str], name: str) -> Manifest:
    """Saves ``params`` layer by layer under ``root`` as model ``name`` (module
    docstring) and returns its manifest. Layers already stored are not rewritten."""
    save_file = _safetensors().numpy.save_file

    root = Path(root)
    (root / "layers").mkdir(parents=True, exist_ok=True)
    (root / "models").mkdir(parents=True, exist_ok=True)
    groups, leaves = _group(params)
    order = list(groups)
    entries = []
    for layer in order:
        tensors = {k: np.ascontiguousarray(v) for k, v in groups[layer].items()}
        key = layer_key(tensors)
        target = root / "layers" / f"{key}.safetensors"
        if not target.exists():
            tmp = target.with_suffix(f".tmp{os.getpid()}")
            save_file(tensors, str(tmp), metadata={"key": key})
            os.replace(tmp, target)
        entries.append(
            LayerEntry(
                name=layer,
                key=key,
                tensors={k: (tuple(v.shape), v.dtype.str) for k, v in tensors.items()},
                nbytes=int(sum(v.nbytes for v in tensors.values())),
            )
        )
    index = {layer: i for i, layer in enumerate(order)}
    doc = {
        "format": FORMAT,
        "model": name,
        "layers": [
            {
                "name": e.name,
                "key": e.key,
                "nbytes": e.nbytes,
                "tensors": {k: [list(s), d] for k, (s, d) in e.tensors.items()},
            }
            for e in entries
        ],  # fmt: skip
        "leaves": [[index[layer], tensor] for layer, tensor in leaves],
    }
    (root / "models" / f"{name}.json").write_text(json.dumps(doc, indent=1))
    return Manifest(
        name=name,
        root=root,
        layers=tuple(entries),
        leaves=tuple((index[layer], tensor) for layer, tensor in leaves),
    )


@dataclasses.dataclass
class StoreStats:
    """What a `LayerStore` did: reads from storage and their seconds and bytes,
    lookups served from memory, evictions, and the most bytes resident at once."""

    loads: int = 0
    hits: int = 0
    evictions: int = 0
    load_s: float = 0.0
    bytes_loaded: int = 0
    peak_bytes: int = 0


class _Slot:
    __slots__ = ("arrays", "nbytes", "pins", "ready", "error")

    def __init__(self) -> None:
        self.arrays: dict[str, jax.Array] | None = None
        self.nbytes = 0
        self.pins = 0
        self.ready = threading.Event()
        self.error: BaseException | None = None


class LayerStore:
    """Loaded layers by key (module docstring).

    Args:
        budget_bytes: resident bytes past which unpinned layers are evicted,
            least recently used first; None: no limit.
        device: where layers are placed (default: jax's default device).
    """

    def __init__(self, *, budget_bytes: int | None = None, device: Any = None) -> None:
        if budget_bytes is not None and budget_bytes <= 0:
            raise ValueError(f"dcjax: budget_bytes must be positive, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self.device = device
        self.stats = StoreStats()
        self._lock = threading.Lock()
        self._slots: collections.OrderedDict[str, _Slot] = collections.OrderedDict()
        self._resident = 0
        self._reserved = 0  # bytes of layers being read

    @property
    def resident_bytes(self) -> int:
        return self._resident

    def __contains__(self, key: str) -> bool:
        with self._lock:
            slot = self._slots.get(key)
            return slot is not None and slot.ready.is_set() and slot.error is None

    def check_fits(self, entries: Iterable[LayerEntry]) -> None:
        """Raises ``ValueError`` if a layer is larger than the budget."""
        if self.budget_bytes is None:
            return
        for e in entries:
            if e.nbytes > self.budget_bytes:
                raise ValueError(
                    f"dcjax: layer {e.name} takes {e.nbytes} bytes, more than the store's "
                    f"budget of {self.budget_bytes}; raise budget_bytes to at least {e.nbytes}"
                )

    def get(self, entry: LayerEntry, path: Path, *, pin: bool = False) -> dict[str, jax.Array]:
        """The layer's arrays, read from ``path`` unless resident. With ``pin``
        the layer is not evicted until `unpin`."""
        self.check_fits([entry])
        with self._lock:
            slot = self._slots.get(entry.key)
            owner = slot is None
            if owner:
                slot = self._slots[entry.key] = _Slot()
            else:
                self._slots.move_to_end(entry.key)
            slot.pins += 1  # held while loading or waiting, so it is not evicted
            if owner:  # make room first, so the read itself stays within the budget
                self._evict(extra=entry.nbytes)
                self._reserved += entry.nbytes
        if owner:
            try:
                arrays = self._read(entry, path)
            except BaseException as e:
                with self._lock:
                    slot.error = e
                    self._reserved -= entry.nbytes
                    del self._slots[entry.key]
                slot.ready.set()
                raise
            with self._lock:
                slot.arrays, slot.nbytes = arrays, entry.nbytes
                self._reserved -= entry.nbytes
                self._resident += entry.nbytes
                self.stats.peak_bytes = max(self.stats.peak_bytes, self._resident)
                slot.ready.set()
                self._evict()
        else:
            slot.ready.wait()
            if slot.error is not None:
                raise slot.error
            with self._lock:
                self.stats.hits += 1
        if not pin:
            self.unpin(entry.key)
        return slot.arrays  # type: ignore[return-value]

    def unpin(self, key: str) -> None:
        """Releases one pin of ``key``; evicts past the budget."""
        with self._lock:
            slot = self._slots.get(key)
            if slot is None or slot.pins == 0:
                raise KeyError(f"dcjax: layer {key[:12]} is not pinned")
            slot.pins -= 1
            self._evict()

    def clear(self) -> None:
        """Frees every unpinned layer."""
        with self._lock:
            for key in [k for k, s in self._slots.items() if s.pins == 0 and s.ready.is_set()]:
                self._remove(key)

    def _remove(self, key: str) -> None:
        slot = self._slots.pop(key)
        self._resident -= slot.nbytes
        self.stats.evictions += 1

    def _evict(self, extra: int = 0) -> None:
        """Evicts unpinned layers, least recently used first, until ``extra`` more
        bytes fit the budget (or nothing more can go)."""
        if self.budget_bytes is None:
            return
        for key in list(self._slots):
            if self._resident + self._reserved + extra <= self.budget_bytes:
                return
            slot = self._slots[key]
            if slot.pins == 0 and slot.ready.is_set():
                self._remove(key)

    def _read(self, entry: LayerEntry, path: Path) -> dict[str, jax.Array]:
        safe_open = _safetensors().safe_open
        start = time.perf_counter()
        try:
            with safe_open(str(path), framework="numpy") as f:
                tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
        except FileNotFoundError:
            raise FileNotFoundError(
                f"dcjax: layer {entry.name} ({entry.key[:12]}) is missing: no {path}"
            ) from None
        except Exception as e:  # a header or length safetensors cannot parse
            raise CorruptLayerError(
                f"dcjax: layer {entry.name} ({path}) cannot be read ({e}); refusing to run it"
            ) from None
        if set(tensors) != set(entry.tensors) or layer_key(tensors) != entry.key:
            raise CorruptLayerError(
                f"dcjax: layer {entry.name} ({path}) does not match its manifest key "
                f"{entry.key[:12]}: the file is damaged; refusing to run it"
            )
        arrays = {k: jax.device_put(v, self.device) for k, v in tensors.items()}
        jax.block_until_ready(arrays)
        with self._lock:
            self.stats.loads += 1
            self.stats.load_s += time.perf_counter() - start
            self.stats.bytes_loaded += entry.nbytes
        return arrays
