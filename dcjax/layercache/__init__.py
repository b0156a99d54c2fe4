"""The layer cache across models (EdgeCaffe) and shared stems (Mainstream).

- `save` writes a model layer by layer into a content-addressed folder; models
  that share layers share files (`dcjax.layercache.store`).
- `LayerStore` loads each layer once however many models ask, and evicts least
  recently used layers past a byte budget.
- `LayerwiseModel` runs a saved model layer by layer in one of `MODES`
  (``bulk``, ``linear``, ``deepeye``, ``partial``), timing loads and runs
  (`dcjax.layercache.executor`).
- `fuse` computes the longest common stem of models that see the same frame
  once (`dcjax.layercache.fuse`).
"""

from dcjax.layercache.executor import MODES, LayerTimes, LayerwiseModel, RunTimes, params_of
from dcjax.layercache.fuse import Fused, fuse
from dcjax.layercache.split import Segment, Split, split
from dcjax.layercache.store import (
    CorruptLayerError,
    LayerEntry,
    LayerStore,
    Manifest,
    StoreStats,
    layer_key,
    layer_of,
    save,
)

__all__ = [
    "MODES",
    "CorruptLayerError",
    "Fused",
    "LayerEntry",
    "LayerStore",
    "LayerTimes",
    "LayerwiseModel",
    "Manifest",
    "RunTimes",
    "Segment",
    "Split",
    "StoreStats",
    "fuse",
    "layer_key",
    "layer_of",
    "params_of",
    "save",
    "split",
]
