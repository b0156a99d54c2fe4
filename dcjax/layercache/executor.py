"""Running a saved model layer by layer, loading each layer from a `LayerStore`,
in the four ways EdgeCaffe compares.

Contract: `LayerwiseModel(fn, manifest, params_like, x_like, store=...)` splits
``fn`` at its layers (`dcjax.layercache.split`), checks that the manifest holds
every parameter leaf with its shape, and `run(x, mode=...)` returns ``fn``'s
outputs (the same values as ``fn(params, x)``, segment by segment) and a
`RunTimes`. The modes (`MODES`):

- ``bulk``: load every layer, then run every segment.
- ``linear``: per segment, load its layer, run it, release it.
- ``deepeye``: one thread loads and runs the convolutional part while a second
  loads the fully connected tail (the segments after the last convolution);
  the tail runs once both are done.
- ``partial``: a pool of load and run tasks served by ``workers`` threads:
  every load is available at once, in execution order (each waits for room in
  the store's budget), a segment runs once its layer is loaded and the segment
  before it has run.

A value is dropped as soon as the last segment that reads it has been
dispatched (`Segment.frees`), so a run holds a few activations at a time and
their buffers are reused. Each segment's run is timed to completion
(``block_until_ready``), so ``exec_s`` is device time plus dispatch;
``load_s`` is the time spent getting each layer from the store (a layer
already resident costs a lookup). "Release" unpins the
layer: the store keeps it for other models until its budget evicts it. A model
that cannot be split (`Split.whole`) runs as one segment after every layer is
loaded, whatever the mode, and `RunTimes.whole` says why.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from dcjax.layercache.split import Split
from dcjax.layercache.split import split as _split
from dcjax.layercache.store import LayerEntry, LayerStore, Manifest

__all__ = ["MODES", "LayerTimes", "LayerwiseModel", "RunTimes", "params_of"]

#: The ways to load and run a model (module docstring).
MODES = ("bulk", "linear", "deepeye", "partial")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerTimes:
    """One segment of one run: its layers, the seconds getting them from the
    store and running it, and whether every layer was already resident."""

    layers: tuple[str, ...]
    load_s: float
    exec_s: float
    resident: bool


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunTimes:
    """One run: wall seconds, summed load and run seconds, per segment times."""

    mode: str
    total_s: float
    load_s: float
    exec_s: float
    segments: tuple[LayerTimes, ...]
    whole: str | None = None


class LayerwiseModel:
    """A saved model run layer by layer (module docstring).

    Args:
        fn: the model, ``fn(params, x)``.
        manifest: where its layers are (`dcjax.layercache.save`).
        params_like: its parameters or their shapes (the pytree ``fn`` takes).
        x_like: an input or its shape.
        store: the layer store, shared by the models that should share layers.
        split: ``fn`` already split (`dcjax.layercache.split`), for models of one
            architecture that differ only in their weights; default: split here.
    """

    def __init__(self, fn: Callable[[Any, Any], Any], manifest: Manifest, params_like: Any,
                 x_like: Any, *, store: LayerStore | None = None,
                 split: Split | None = None) -> None:  # fmt: skip
        self.manifest = manifest
        self.store = LayerStore() if store is None else store
        self.split: Split = _split(fn, params_like, x_like) if split is None else split
        self._treedef = jax.tree_util.tree_structure(params_like)
        self._check_manifest(params_like)
        by_name = {lay.name: lay for lay in manifest.layers}
        self.store.check_fits(manifest.layers)
        tensor_of = dict(zip(self.split.param_ids, self.split.leaf_layers, strict=True))
        # per segment: its layers' entries, and per parameter id (layer, tensor)
        self._entries: list[tuple[LayerEntry, ...]] = []
        self._params: list[tuple[tuple[str, str], ...]] = []
        segments = self.split.segments
        if self.split.whole is not None:
            segments = ()
        for seg in segments:
            self._entries.append(tuple(by_name[name] for name in seg.layers))
            self._params.append(tuple(tensor_of[p] for p in seg.params))
        self._whole_fn = jax.jit(fn) if self.split.whole is not None else None

    def _check_manifest(self, params_like: Any) -> None:
        leaves = jax.tree_util.tree_leaves(params_like)
        m = self.manifest
        if len(m.leaves) != len(leaves):
            raise ValueError(
                f"dcjax: manifest {m.name!r} holds {len(m.leaves)} parameters, the model "
                f"{len(leaves)}: it was saved from another model"
            )
        for (layer, tensor), (index, saved), leaf in zip(
            self.split.leaf_layers, m.leaves, leaves, strict=True
        ):
            entry = m.layers[index]
            shape = tuple(np.shape(leaf))
            if entry.name != layer or saved != tensor or entry.tensors[saved][0] != shape:
                raise ValueError(
                    f"dcjax: manifest {m.name!r} has {entry.name}/{saved} "
                    f"{entry.tensors[saved][0]} where the model has {layer}/{tensor} {shape}"
                )

    @property
    def layers(self) -> tuple[LayerEntry, ...]:
        return self.manifest.layers

    # -- one segment ------------------------------------------------------------------

    def _load(self, k: int) -> tuple[dict[str, dict[str, jax.Array]], float, bool]:
        start = time.perf_counter()
        resident = all(e.key in self.store for e in self._entries[k])
        arrays = {e.name: self.store.get(e, self.manifest.path(e.key), pin=True)
                  for e in self._entries[k]}  # fmt: skip
        return arrays, time.perf_counter() - start, resident

    def _exec(self, k: int, env: dict[int, Any], arrays) -> float:
        seg = self.split.segments[k]
        start = time.perf_counter()
        params = [arrays[layer][tensor] for layer, tensor in self._params[k]]
        outs = seg.fn([env[r] for r in seg.reads], params)
        for r in seg.frees:  # dead: their buffers go back to the allocator
            del env[r]
        jax.block_until_ready(outs)
        env.update(zip(seg.writes, outs, strict=True))
        return time.perf_counter() - start

    def _release(self, k: int) -> None:
        for e in self._entries[k]:
            self.store.unpin(e.key)

    # -- a run ------------------------------------------------------------------------

    def run(self, x: Any, *, mode: str = "linear", workers: int = 2) -> tuple[Any, RunTimes]:
        """``fn``'s outputs on ``x`` and the run's times (module docstring)."""
        if mode not in MODES:
            raise ValueError(f"dcjax: unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        if workers < 1:
            raise ValueError(f"dcjax: workers must be at least 1, got {workers}")
        start = time.perf_counter()
        if self.split.whole is not None:
            return self._run_whole(x, mode, start)
        env: dict[int, Any] = dict(self.split.consts)
        env.update(zip(self.split.input_ids, jax.tree_util.tree_leaves(x), strict=True))
        n = len(self.split.segments)
        loads: list[tuple[float, bool]] = [(0.0, True)] * n
        execs = [0.0] * n
        if mode == "bulk":
            got = []
            for k in range(n):
                arrays, t, res = self._load(k)
                got.append(arrays)
                loads[k] = (t, res)
            for k in range(n):
                execs[k] = self._exec(k, env, got[k])
            for k in range(n):
                self._release(k)
        elif mode == "linear":
            for k in range(n):
                arrays, t, res = self._load(k)
                loads[k] = (t, res)
                execs[k] = self._exec(k, env, arrays)
                self._release(k)
        elif mode == "deepeye":
            self._deepeye(env, loads, execs)
        else:
            self._partial(env, loads, execs, workers)
        out = [env[o] if not isinstance(o, tuple) else o[1] for o in self.split.output_ids]
        times = RunTimes(
            mode=mode,
            total_s=time.perf_counter() - start,
            load_s=float(sum(t for t, _ in loads)),
            exec_s=float(sum(execs)),
            segments=tuple(
                LayerTimes(
                    layers=self.split.segments[k].layers,
                    load_s=loads[k][0],
                    exec_s=execs[k],
                    resident=loads[k][1],
                )
                for k in range(n)
            ),  # fmt: skip
        )
        return jax.tree_util.tree_unflatten(self.split.out_tree, out), times

    def _run_whole(self, x: Any, mode: str, start: float) -> tuple[Any, RunTimes]:
        t0 = time.perf_counter()
        entries = self.manifest.layers
        resident = all(e.key in self.store for e in entries)
        arrays = {e.name: self.store.get(e, self.manifest.path(e.key), pin=True) for e in entries}
        load_s = time.perf_counter() - t0
        leaves = [arrays[layer][tensor] for layer, tensor in self.split.leaf_layers]
        t1 = time.perf_counter()
        params = jax.tree_util.tree_unflatten(self._treedef, leaves)
        out = jax.block_until_ready(self._whole_fn(params, x))
        exec_s = time.perf_counter() - t1
        for e in entries:
            self.store.unpin(e.key)
        seg = LayerTimes(layers=tuple(e.name for e in entries), load_s=load_s, exec_s=exec_s,
                         resident=resident)  # fmt: skip
        return out, RunTimes(mode=mode, total_s=time.perf_counter() - start, load_s=load_s,
                             exec_s=exec_s, segments=(seg,), whole=self.split.whole)  # fmt: skip

    def _deepeye(self, env, loads, execs) -> None:
        segs = self.split.segments
        n = len(segs)
        last_conv = max((k for k, s in enumerate(segs) if not s.is_dense), default=-1)
        tail = list(range(last_conv + 1, n))
        got: dict[int, Any] = {}
        errors: list[BaseException] = []

        def load_tail() -> None:
            try:
                for k in tail:
                    arrays, t, res = self._load(k)
                    got[k] = arrays
                    loads[k] = (t, res)
            except BaseException as e:  # re-raised by the caller
                errors.append(e)

        loader = threading.Thread(target=load_tail, name="dcjax-deepeye-loader")
        loader.start()
        try:
            for k in range(last_conv + 1):
                arrays, t, res = self._load(k)
                loads[k] = (t, res)
                execs[k] = self._exec(k, env, arrays)
                self._release(k)
        finally:
            loader.join()
        if errors:
            raise errors[0]
        for k in tail:
            execs[k] = self._exec(k, env, got[k])
            self._release(k)

    def _partial(self, env, loads, execs, workers: int) -> None:
        n = len(self.split.segments)
        sizes = [sum(e.nbytes for e in self._entries[k]) for k in range(n)]
        budget = self.store.budget_bytes
        cond = threading.Condition()
        state = {"next_load": 0, "next_exec": 0, "running": False, "pinned": 0}
        got: dict[int, Any] = {}
        errors: list[BaseException] = []

        def fits(k: int) -> bool:
            return budget is None or k == state["next_exec"] or state["pinned"] + sizes[k] <= budget

        def take():
            while True:
                if errors or state["next_exec"] == n:
                    return None
                k = state["next_exec"]
                if not state["running"] and k in got:
                    state["running"] = True
                    return "exec", k
                j = state["next_load"]
                if j < n and fits(j):
                    state["next_load"] += 1
                    state["pinned"] += sizes[j]
                    return "load", j
                cond.wait()

        def worker() -> None:
            while True:
                with cond:
                    task = take()
                if task is None:
                    return
                kind, k = task
                try:
                    if kind == "load":
                        arrays, t, res = self._load(k)
                        loads[k] = (t, res)
                        with cond:
                            got[k] = arrays
                    else:
                        execs[k] = self._exec(k, env, got[k])
                        self._release(k)
                        with cond:
                            del got[k]
                            state["pinned"] -= sizes[k]
                            state["next_exec"] += 1
                            state["running"] = False
                except BaseException as e:  # re-raised by the caller
                    with cond:
                        errors.append(e)
                with cond:
                    cond.notify_all()

        threads = [threading.Thread(target=worker, name=f"dcjax-partial-{i}")
                   for i in range(workers)]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for k in list(got):  # loaded but not run (after an error)
            self._release(k)
        if errors:
            raise errors[0]


def params_of(manifest: Manifest, store: LayerStore, treedef: Any) -> Any:
    """The whole parameter pytree of a saved model, from the store (tests and
    the reference path)."""
    leaves = []
    for index, tensor in manifest.leaves:
        e = manifest.layers[index]
        leaves.append(store.get(e, manifest.path(e.key))[tensor])
    return jax.tree_util.tree_unflatten(treedef, leaves)
