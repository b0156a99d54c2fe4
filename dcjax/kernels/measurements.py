"""The measurements' file of the kernel tuning: where it lives, what it is keyed by.

Contract:

- `TuningCache` keeps measurements in a JSON file keyed by the machine
  (`machine_key`: backend, device kind or processor model, cores, on CPU the
  allocator's settings, jax and jaxlib versions, `KERNELS_REVISION`) and the
  layer's geometry (`dcjax.kernels.tiles.layer_key`), so a layer is measured
  once per machine and software; `default_path` says where the file lives
  (``$DCJAX_TUNING_CACHE``, `CACHE_ENV`). Each measurement is seconds a call
  at each of `FRACTIONS`; a file made on another grid is read as empty. A
  candidate passed over (`TuningCache.pass_over`) is kept as an empty list.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
from collections.abc import Sequence
from pathlib import Path

import jax

from dcjax import allocator

__all__ = [
    "CACHE_ENV",
    "FRACTIONS",
    "KERNELS_REVISION",
    "TuningCache",
    "cores",
    "cpu_model",
    "default_path",
    "machine_key",
]

#: Dirty fractions of a layer's output at which each candidate is timed; the
#: cost between them is linear (`expected_cost`).
FRACTIONS: tuple[float, ...] = (0.0, 0.125, 0.25, 0.5, 1.0)

#: Revision of the sparse kernels' code, part of `machine_key`: raised by a
#: change that alters what a kernel costs, so that measurements of the older
#: code are not read (2: tile windows read from the unpadded input).
KERNELS_REVISION = 2

#: Environment variable naming the measurements' file (`default_path`).
CACHE_ENV = "DCJAX_TUNING_CACHE"


def machine_key() -> str:
    """What a measurement depends on besides the layer: backend, device kind
    (on CPU, the processor's model, `cpu_model`: XLA's device kind is ``"cpu"``
    on every processor), cores this process may use, jax and jaxlib versions,
    the kernels' revision (`KERNELS_REVISION`), and on CPU the allocator's
    and dispatch's settings (`dcjax.allocator.setting`: without them XLA:CPU's
    buffers fault their pages in on every call, which slows large dense layers
    several-fold, so the ``dcjax`` command and a program that leaves the
    allocator alone keep their own measurements)."""
    import jaxlib

    backend = jax.default_backend()
    kind = str(getattr(jax.devices()[0], "device_kind", "?"))
    setting: tuple[str, ...] = ()
    if backend == "cpu":
        kind = f"{kind} {cpu_model()}"
        setting = (allocator.setting(),)
    versions = f"jax {jax.__version__}", f"jaxlib {jaxlib.__version__}"
    revision = f"kernels r{KERNELS_REVISION}"
    return "|".join((backend, kind, f"{cores()} cores", *setting, *versions, revision))


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The processor's model name (Linux's ``cpuinfo``, else `platform.processor`,
    else the architecture), so that measurements made on one processor are not
    read on another that shares the file (a home directory mounted on several
    machines)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                name, sep, value = line.partition(":")
                if sep and name.strip() in ("model name", "Processor", "cpu model"):
                    if value.strip():
                        return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "?"


def cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_path() -> Path:
    """``$DCJAX_TUNING_CACHE``, else ``$XDG_CACHE_HOME/dcjax/tuning.json`` (``~/.cache``
    when unset)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dcjax" / "tuning.json"


class TuningCache:
    """Measurements kept in a JSON file: ``{machine: {layer: {candidate: [seconds at
    each fraction]}}}`` with the fractions recorded beside them.

    A missing or unreadable file is an empty cache (an unreadable one is
    replaced at the next `save`). `save` merges with what other processes
    wrote meanwhile and replaces the file atomically. ``path=None`` keeps the
    measurements in memory only.
    """

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = None if path is None else Path(path)
        self._data = self._read()
        self._dirty: dict[tuple[str, str, str], list[float]] = {}
        self.puts = 0  # measurements put since it was opened
        self.passed = 0  # candidates passed over since it was opened

    def _read(self) -> dict:
        if self.path is None or not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("fractions") != list(FRACTIONS):
            return {}
        return data.get("machines", {})

    def get(self, machine: str, layer: str, candidate: str) -> tuple[float, ...] | None:
        got = self._data.get(machine, {}).get(layer, {}).get(candidate)
        return None if got is None else tuple(float(v) for v in got)

    def put(self, machine: str, layer: str, candidate: str, costs: Sequence[float]) -> None:
        self._store(machine, layer, candidate, [float(v) for v in costs])
        self.puts += 1

    def pass_over(self, machine: str, layer: str, candidate: str) -> None:
        """Record ``candidate`` as not measured for ``layer`` (its kind lost on
        its class's probe, `tune`): `get` returns ``()`` for it, and it is no
        measurement (``puts`` does not count it; ``passed`` does)."""
        self._store(machine, layer, candidate, [])
        self.passed += 1

    def _store(self, machine: str, layer: str, candidate: str, values: list[float]) -> None:
        """Keep ``values`` in memory and mark them for the next `save`."""
        self._data.setdefault(machine, {}).setdefault(layer, {})[candidate] = values
        self._dirty[(machine, layer, candidate)] = values

    def save(self) -> None:
        if self.path is None or not self._dirty:
            return
        data = self._read()
        for (machine, layer, candidate), values in self._dirty.items():
            data.setdefault(machine, {}).setdefault(layer, {})[candidate] = values
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tuning-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({"fractions": list(FRACTIONS), "machines": data}, f, indent=1)
        os.replace(tmp, self.path)
        self._data, self._dirty = data, {}
