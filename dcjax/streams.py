"""Many video streams through one cached model: `Streams`.

::

    streams = cached.streams(8)                        # or cached.streams(8, mesh=mesh)
    states = streams.init()                            # 8 stacked states
    outs, states, infos = streams.step(states, frames) # frames (8, H, W, C)

Contract:

- ``streams.step(states, frames)`` equals ``n`` independent
  `dcjax.cached_model.CachedModel.step` calls, one per stream (each stream keeps
  its own matcher key, motion, refresh schedule, refinement references and
  still-frame output), with every output, state leaf and info stacked along a
  leading axis of ``n``. It is ``jax.vmap`` of the step: under it every layer
  pools the dirty tiles of all streams into one computation sized by their
  total (`dcjax.kernels.xla.pooled`), so a still stream contributes no tiles;
  the network is skipped when every stream's frame is still.
- ``schedule`` says how the streams share the machine (`SCHEDULES`):
  ``"pooled"`` is the ``jax.vmap`` above, one program for all streams;
  ``"sequential"`` steps each stream with the model's own compiled step, one
  after the other (its states are a tuple of ``n`` states, not a stack): no
  pooling, but each layer's maps stay as small as one stream's, which is
  faster where they outgrow the processor's caches (a camera's full
  resolution on a CPU: docs/performance-notes.md), and a still stream skips
  its whole network even while others move. Outputs and infos are stacked
  alike; the outputs of the two are equal (to float rounding). The
  sequential schedule runs on one device (no ``mesh``). ``"auto"`` (the
  default) races the two (`dcjax.race.race`) on ``n`` streams made of
  the frames the model was calibrated on (`CachedModel.calibration`, stream
  ``i`` starting ``i * T // n`` frames in, wrapping) and keeps the faster
  (`Streams.raced` holds the seconds a step of each); without calibration
  frames, or with a ``mesh``, it pools.
- ``init()`` makes ``n`` fresh states; with ``stagger`` (the default) stream
  ``i`` refreshes on its own phase (``refresh_phase = i * refresh_every //
  n``, `dcjax.state.init_state`), so that the streams' periodic full
  recomputes fall on different frames rather than all on one.
- With a ``mesh``, the streams are split over the mesh axis ``axis``: states
  and frames are placed with ``NamedSharding(mesh, P(axis))`` and each device
  steps, and pools the tiles of, its own streams (``jax.shard_map``); the
  outputs equal the unsharded run's. Across processes (`jax.distributed`),
  each process passes the frames of its own streams (``n / process_count``
  of them, in the order of the mesh's devices) and `local` gives the
  process's part of a result.
- Bad input is a ValueError or TypeError naming the argument: frames of
  another size or count, states made for another model, config or number of
  streams, a mesh without ``axis`` or whose axis size does not divide ``n``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dcjax import inputs, race
from dcjax.matching import Match

if TYPE_CHECKING:
    from dcjax.cached_model import CachedModel

__all__ = ["SCHEDULES", "Streams", "refresh_phases", "stacked"]

#: How `Streams` steps its streams (see the module docstring).
SCHEDULES = ("auto", "pooled", "sequential")


def refresh_phases(n: int, refresh_every: int | None, *, stagger: bool = True) -> list[int]:
    """The refresh phase of each of ``n`` streams: spread evenly over
    ``refresh_every`` frames with ``stagger``, else all 0."""
    if not stagger or refresh_every is None:
        return [0] * n
    return [i * refresh_every // n for i in range(n)]


class Streams:
    """``n`` streams of one `CachedModel` stepped together (see the module docstring).

    Args:
        cached: the cached model.
        n: the number of streams.
        stagger: spread the streams' periodic refreshes over the period.
        mesh: a `jax.sharding.Mesh` to split the streams over, or None (one device).
        axis: the mesh axis the streams are split along.
        schedule: one of `SCHEDULES`.

    Attributes:
        schedule: the schedule that runs (``"auto"`` resolved).
        raced: with ``"auto"``, the seconds a step of each schedule over the
            calibration frames; None where no race ran.
    """

    def __init__(
        self,
        cached: CachedModel,
        n: int,
        *,
        stagger: bool = True,
        mesh: Mesh | None = None,
        axis: str = "streams",
        schedule: str = "auto",
    ) -> None:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"dcjax: n (streams) must be a positive int, got {n!r}")
        if schedule not in SCHEDULES:
            raise ValueError(f"dcjax: schedule must be one of {SCHEDULES}, got {schedule!r}")
        if schedule == "sequential" and mesh is not None:
            raise ValueError(
                "dcjax: the sequential schedule runs on one device; use schedule='pooled' "
                "to split streams over a mesh"
            )
        self.cached, self.n, self.stagger = cached, int(n), bool(stagger)
        self.mesh, self.axis, self.schedule = mesh, axis, schedule
        if mesh is not None:
            if not isinstance(mesh, Mesh):
                raise TypeError(
                    f"dcjax: mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}"
                )
            if axis not in mesh.axis_names:
                raise ValueError(
                    f"dcjax: mesh has axes {tuple(mesh.axis_names)}, not the streams axis {axis!r}"
                )
            size = mesh.shape[axis]
            if self.n % size:
                raise ValueError(
                    f"dcjax: the mesh's {axis!r} axis has {size} devices, which does not "
                    f"divide n={self.n} streams; use a multiple of {size} streams"
                )
        self.phases = refresh_phases(self.n, cached.config.refresh_every, stagger=self.stagger)
        self._abstract = jax.eval_shape(cached.init)
        # the jitted steps are the model's, shared by all its Streams on one mesh
        # (they depend on neither n, the stagger nor a race): compiled once a shape
        self._step_fns: dict[tuple, Any] = cached._streams_fns
        self.raced: dict[str, float] | None = None
        if schedule == "auto":
            self.schedule = "pooled"
            if mesh is None and cached.calibration is not None:
                self.schedule, self.raced = self._race(np.asarray(cached.calibration))

    def _race(self, frames: np.ndarray) -> tuple[str, dict[str, float]]:
        """The faster schedule over ``n`` streams of ``frames`` (see the module
        docstring), and the seconds a step of each."""
        t = len(frames)
        clips = np.stack([np.roll(frames, -(i * t // self.n), axis=0) for i in range(self.n)], 1)
        rivals = {
            name: Streams(self.cached, self.n, stagger=self.stagger, schedule=name)
            for name in ("pooled", "sequential")
        }
        times = race.race(list(rivals.values()), clips)
        raced = {name: float(x) for name, x in zip(rivals, times, strict=True)}
        return min(raced, key=raced.get), raced

    # -- placement -------------------------------------------------------------

    @property
    def sharding(self) -> NamedSharding | None:
        """Where per-stream arrays live: split along the streams axis, or None."""
        return None if self.mesh is None else NamedSharding(self.mesh, P(self.axis))

    @property
    def local_count(self) -> int:
        """How many of the streams this process feeds (all of them in one process)."""
        return self.n // jax.process_count() if self.mesh is not None else self.n

    def _place(self, x: Any, *, axis: int = 0) -> Any:
        """Per-stream host or device data (``n`` streams along ``axis``, or this
        process's share of them across processes) placed on the mesh."""
        if self.mesh is None:
            return x
        sharding = NamedSharding(self.mesh, P(*[None] * axis, self.axis))
        if jax.process_count() > 1:
            return jax.tree_util.tree_map(
                lambda a: jax.make_array_from_process_local_data(sharding, np.asarray(a)), x
            )
        return jax.device_put(x, sharding)

    def local(self, x: Any, *, axis: int = 0) -> Any:
        """This process's streams of a per-stream result (all of them in one
        process), as NumPy arrays with `local_count` streams along ``axis``
        (0 for `step`'s results, 1 for `run`'s)."""

        def part(a):
            if not isinstance(a, jax.Array) or a.is_fully_addressable:
                return np.asarray(a)
            shards = {s.index[axis].start or 0: s.data for s in a.addressable_shards}
            return np.concatenate([np.asarray(shards[k]) for k in sorted(shards)], axis=axis)

        return jax.tree_util.tree_map(part, x)

    # -- the streams -----------------------------------------------------------

    def init(self, *, stagger: bool | None = None) -> Any:
        """``n`` fresh states stacked along a leading axis (placed on the mesh;
        a tuple of ``n`` states with the sequential schedule), their refreshes
        staggered as the `Streams` says, or as ``stagger`` does (the same
        compiled step runs either)."""
        phases = self.phases
        if stagger is not None:
            phases = refresh_phases(self.n, self.cached.config.refresh_every, stagger=stagger)
        states = [self.cached.init(refresh_phase=p) for p in phases]
        if self.schedule == "sequential":
            return tuple(states)
        stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *states)
        if self.mesh is None:
            return stacked
        sharding = self.sharding

        def place(a):  # every process holds the same stack: each takes its shards
            host = np.asarray(a)
            return jax.make_array_from_callback(host.shape, sharding, lambda i: host[i])

        return jax.tree_util.tree_map(place, stacked)

    def step(self, states: Any, frames: Any, matches: Match | None = None) -> tuple[Any, Any, dict]:
        """One frame of every stream: ``(outputs, states, infos)``, each with a
        leading axis of ``n`` (see the module docstring). ``states`` is consumed
        (donated); keep using the returned one. ``frames``: ``(n, H, W, C)``, or
        a sequence of ``n`` frames (across processes: this process's streams)."""
        frames = self.checked_frames(frames)
        self._check_states(states)
        matches = self._check_matches(matches, lead=())
        if self.schedule == "sequential":
            results = [
                self.cached.step(st, frames[i], None if matches is None else _index(matches, i))
                for i, st in enumerate(states)
            ]
            outs, new, infos = zip(*results, strict=True)
            return stacked(outs, 0), tuple(new), stacked(infos, 0)
        fn = self._step_fn(matches is not None)
        return fn(self.cached._traced.leaves, states, self._place(frames), self._place(matches))

    def run(self, frames: Any, states: Any = None) -> tuple[Any, Any, dict]:
        """`step` over ``frames`` (T, n, H, W, C) in a `lax.scan`: outputs and
        infos stacked along a leading T axis (then the streams axis)."""
        frames = self._check_frames(frames, "frames", lead=("T",))
        if states is None:
            states = self.init()
        self._check_states(states)
        if self.schedule == "sequential":
            results = [self.cached.run(frames[:, i], st) for i, st in enumerate(states)]
            outs, new, infos = zip(*results, strict=True)
            return stacked(outs, 1), tuple(new), stacked(infos, 1)
        run_key = ("run", self.mesh, self.axis)
        if run_key not in self._step_fns:
            step = self._step_fn(False, jitted=False)

            def scan(leaves, states, frames):
                def body(st, f):
                    out, st, info = step(leaves, st, f, None)
                    return st, (out, info)

                states, (outs, infos) = jax.lax.scan(body, states, frames)
                return outs, states, infos

            self._step_fns[run_key] = jax.jit(scan, donate_argnums=(1,))
        run = self._step_fns[run_key]
        return run(self.cached._traced.leaves, states, self._place(frames, axis=1))

    # -- the compiled step -----------------------------------------------------

    def _step_fn(self, with_matches: bool, *, jitted: bool = True):
        key = (with_matches, jitted, self.mesh, self.axis)
        if key in self._step_fns:
            return self._step_fns[key]
        step = self.cached._step
        batched = jax.vmap(step, in_axes=(None, 0, 0, 0 if with_matches else None))
        if self.mesh is not None:
            spec = P(self.axis)
            in_specs = (P(), spec, spec, spec if with_matches else None)
            inner = batched

            def batched(leaves, states, frames, matches):
                return jax.shard_map(
                    lambda st, f, m: inner(leaves, st, f, m),
                    mesh=self.mesh,
                    in_specs=in_specs[1:],
                    out_specs=spec,
                    check_vma=False,
                )(states, frames, matches)

        fn = jax.jit(batched, donate_argnums=(1,)) if jitted else batched
        self._step_fns[key] = fn
        return fn

    # -- checks ----------------------------------------------------------------

    def checked_frames(self, frames: Any) -> jax.Array:
        """One frame of every stream, ``(n, H, W, C)`` or a sequence of ``n``
        frames, as one array; a ValueError or TypeError for anything else."""
        return self._check_frames(frames, "frames", lead=())

    def _check_frames(self, frames: Any, name: str, lead: tuple) -> jax.Array:
        count = self.local_count
        if isinstance(frames, (list, tuple)):
            if len(frames) != count:
                raise ValueError(f"dcjax: {name} has {len(frames)} streams; expected {count}")
            shapes = [tuple(np.shape(f)) for f in frames]
            for i, s in enumerate(shapes):
                if s[len(lead) :] != self.cached.frame_shape:
                    raise ValueError(
                        f"dcjax: {name}[{i}] has frame shape {s[len(lead) :]}, but the model "
                        f"was transformed for {self.cached.frame_shape}; every stream of a "
                        "batch must have the model's frame size"
                    )
            frames = jnp.stack([jnp.asarray(f) for f in frames], axis=len(lead))
        ndim = len(lead) + 4
        want = (*lead, count, *self.cached.frame_shape)
        if not hasattr(frames, "shape"):
            try:
                frames = jnp.asarray(frames)
            except TypeError as e:
                raise TypeError(f"dcjax: {name} must be an array of frames") from e
        if len(frames.shape) != ndim:
            raise ValueError(f"dcjax: {name} must have shape {want}, got {tuple(frames.shape)}")
        shape = tuple(frames.shape)
        if shape[len(lead)] != count:
            raise ValueError(
                f"dcjax: {name} has {shape[len(lead)]} streams on axis {len(lead)}; "
                f"expected {count}"
            )
        flat = inputs.check_frame(
            frames.reshape(-1, *shape[len(lead) + 1 :]), name, 4, self.cached.frame_shape
        )
        return flat.reshape(shape)

    def _check_states(self, states: Any) -> None:
        if self.schedule == "sequential":
            if not isinstance(states, tuple) or len(states) != self.n:
                raise ValueError(
                    f"dcjax: states must be the tuple of {self.n} states this Streams' "
                    "init() makes (sequential schedule)"
                )
            for st in states:
                self._check_state(st, ())
            return
        self._check_state(states, (self.n,))

    def _check_state(self, states: Any, lead: tuple) -> None:
        structure = jax.tree_util.tree_structure
        if structure(self._abstract) != structure(states):
            raise ValueError(
                "dcjax: states were not made for this model and config (their structure "
                "differs); make them with this Streams' init()"
            )
        for path, a, b in zip(
            jax.tree_util.tree_flatten_with_path(self._abstract)[0],
            jax.tree_util.tree_leaves(self._abstract),
            jax.tree_util.tree_leaves(states),
        ):
            shape = tuple(np.shape(b))
            if shape != (*lead, *a.shape) or jnp.dtype(b.dtype) != a.dtype:
                where = jax.tree_util.keystr(path[0])
                raise ValueError(
                    f"dcjax: states{where} has shape {shape} {jnp.dtype(b.dtype).name}, "
                    f"expected {(*lead, *a.shape)} {a.dtype.name} ({self.n} streams of this "
                    "model and config); make them with this Streams' init()"
                )

    def _check_matches(self, matches: Match | None, lead: tuple) -> Match | None:
        if matches is None:
            return None
        checked = inputs.check_match(matches, self.cached.frame_shape, batched=True)
        if checked.motion.shape[0] != self.local_count:
            raise ValueError(
                f"dcjax: matches has {checked.motion.shape[0]} streams; expected {self.local_count}"
            )
        return checked


def _index(tree: Any, i: int) -> Any:
    """Stream ``i`` of a pytree of per-stream arrays."""
    return jax.tree_util.tree_map(lambda a: a[i], tree)


def stacked(trees: Sequence[Any], axis: int) -> Any:
    """Per-stream pytrees (outputs, states or infos of one structure) stacked
    along ``axis``."""
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs, axis=axis), *trees)
