"""`CachedModel`: a model compiled for cached per-frame inference.

`dcjax.deepcache.transform` makes one: the model is traced once to a jaxpr
and analysed, the measured tuning (`dcjax.autotune`) or the fixed rules choose
each layer's kernel, `dcjax.plan.make_plan` decides what the step does at each
layer, and `dcjax.step.Step` is the step (see `dcjax.deepcache` for the
contract). The class holds the plan and the compiled step, and derives the
same model under other statistics settings (`CachedModel.with_statistics`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dcjax import autotune, inputs
from dcjax.config import Config
from dcjax.kernels.tuning import resolve_tuning
from dcjax.matching import Match
from dcjax.plan import Plan, make_plan
from dcjax.state import CacheState, init_state
from dcjax.step import Step, frame_finite
from dcjax.streams import Streams
from dcjax.transforms.analysis import analyze
from dcjax.transforms.host_syncs import HostSync, host_syncs
from dcjax.transforms.interpreter import dense_forward
from dcjax.transforms.records import DenseLayer, Layer
from dcjax.transforms.spatial import Spatial
from dcjax.transforms.trace import check_frame_shape, trace_model

__all__ = ["CachedModel"]


class CachedModel:
    """A model compiled for cached per-frame inference; see `transform`.

    Attributes:
        layers: the reused layers (`Layer`), in execution order.
        dense_layers: the fully connected layers (`DenseLayer`), in execution
            order: computed in full on every frame, or updated by the rows of
            their weights whose input changed (`Config.dense_updates`, or
            refinement).
        plan: the per-layer decisions of the step (`dcjax.plan.Plan`).
        keeps_cache: per layer, whether its kernel reuses a cache
            (`LayerPlan.keeps_cache`).
        epilogues: per layer, the primitives of the elementwise chain cached
            with it (`Config.fuse_epilogues`); empty where none is.
        total_flops: FLOPs of a full recompute: convolutions and matrix
            products (fully connected layers) all computed.
        unsupported_primitives: primitives without a mask rule.
        config: the `Config` the step runs: the one given, or its dense form
            (`dcjax.autotune.dense_config`) when the measured plan is dense.
        tuning: what the measured tuning found and decided
            (`dcjax.autotune.Tuning`), or None where it did not run
            (``Config.kernel`` other than "auto", ``Config.tuning="prior"``,
            semantic exits).
        calibration: the frames `transform` was given to calibrate on, or
            None (`streams` races its schedules on them).
    """

    def __init__(
        self,
        model: Any,
        variables: Any,
        *,
        frame_shape: tuple[int, int, int],
        config: Config,
        preprocess: Callable[[jax.Array], jax.Array] | None,
        input_dtype: Any,
        tuning_fractions: Sequence[float] | float | None = None,
        tuning_frames: Any = None,
        progress: bool = True,
    ) -> None:
        if not isinstance(config, Config):
            raise TypeError(
                f"dcjax: config must be a deepcache.Config, got {type(config).__name__}"
            )
        if preprocess is not None and not callable(preprocess):
            raise TypeError("dcjax: preprocess must be a callable frame -> model input")
        self.config = config
        self.frame_shape = check_frame_shape(frame_shape)
        if preprocess is not None:
            inputs.check_preprocess(preprocess, self.frame_shape, input_dtype)
        if config.semantic is not None:  # mark the exit points while tracing
            from dcjax.transforms.exits import marked

            model = marked(model, config.semantic.exit_points)
        self._traced = trace_model(
            model, variables, self.frame_shape, input_dtype, config.compute_dtype
        )
        n = len(self._traced.leaves)
        frame_sig = Spatial(axes=(1, 2), size=self.frame_shape[:2], stride=(1, 1))
        self._analysis = analyze(self._traced.jaxpr, [None] * n + [frame_sig], [False] * n + [True])
        self.tuning: autotune.Tuning | None = None
        self.calibration: Any = None
        self._streams_fns: dict[tuple, Any] = {}  # `Streams`' jitted steps
        kernels = None
        measure = resolve_tuning(config.tuning) == "measure"
        if config.kernel == "auto" and config.semantic is None and measure:
            self.tuning = autotune.tune_model(
                self._analysis, config, frame_shape=self.frame_shape,
                fractions=tuning_fractions, frames=tuning_frames, progress=progress,
            )  # fmt: skip
            if self.tuning.plan == "dense":
                config = self.config = autotune.dense_config(config)
            else:
                kernels = self.tuning.choices
        self.plan: Plan = make_plan(self._analysis, config, jax.default_backend(), kernels)
        #: the dense lowerings the model is traced with (`dcjax.kernels.lowering.use`):
        #: every convolution computed over its whole map takes them, whatever
        #: the plan; the sparse kernels' tile windows keep the fixed rules
        self.lowerings: Mapping[str, str] = {}
        if measure:
            start = time.perf_counter()
            found = autotune.measure_lowerings(
                self._analysis, self._traced.leaves, progress=progress
            )
            self.lowerings = found.choices
            if self.tuning is not None:
                self.tuning = dataclasses.replace(
                    self.tuning,
                    lowerings=found,
                    seconds=self.tuning.seconds + time.perf_counter() - start,
                )
        self._preprocess = preprocess
        self._kernels = kernels
        self.unsupported_primitives: tuple[str, ...] = self.plan.unsupported
        if self.unsupported_primitives:
            warnings.warn(
                "dcjax: no reuse rule for primitive(s) "
                f"{', '.join(self.unsupported_primitives)}; their outputs are recomputed in "
                "full and nothing downstream of them is reused",
                stacklevel=3,
            )
        self._build(config)

    def _build(self, config: Config) -> None:
        """The step of ``self.plan`` under ``config``, and what derives from the plan."""
        self.layers: tuple[Layer, ...] = tuple(self._analysis.layers)
        self.dense_layers: tuple[DenseLayer, ...] = tuple(self._analysis.dense_layers)
        self.keeps_cache: tuple[bool, ...] = self.plan.keeps_cache
        self.epilogues: tuple[tuple[str, ...], ...] = self.plan.epilogues
        self.total_flops = self.plan.total_flops
        self._semantic = None
        if config.semantic is not None:
            from dcjax.semantic.smtm import SemanticExits

            self._semantic = SemanticExits(config.semantic, self._analysis)
            # never reusing: the exits keep no caches (nothing to carry through them)
            self._semantic.dense = self.plan.semantic_dense
        matcher = autotune.matcher_of(config)
        self._step = Step(
            plan=self.plan, analysis=self._analysis, traced=self._traced, config=config,
            matcher=matcher, semantic=self._semantic, frame_shape=self.frame_shape,
            preprocess=self._preprocess,
            lowerings=self.lowerings,
        )  # fmt: skip
        # The state is donated: caches are updated in place, frame after frame.
        self._step_jit = jax.jit(self._step, donate_argnums=(1,))
        self._profiled_jit = None  # `_program`'s step, made when first asked for
        self._float_range_checked = False
        self._run_jit = jax.jit(self._step.run, donate_argnums=(1,))
        self._apply_jit = jax.jit(self._apply_impl)
        # Nothing to reuse, match or skip (the nocache plan): `step` runs the
        # dense lowering alone and leaves the state as it is.
        self.bare = (
            config.matcher == "none"
            and not config.skip_unchanged
            and self._semantic is None
            and not self.plan.refines
            and not any(self.plan.keeps_cache)
            and not any(self.plan.updated_dense)
            and all(lp.chain is None for lp in self.plan.layers)
        )
        self._bare_jit = jax.jit(self._bare_step) if self.bare else None

    # -- public API ----------------------------------------------------------

    def with_statistics(self, statistics: bool) -> CachedModel:
        """This model with ``Config.statistics`` set to ``statistics``, on the same
        plan: the same kernels, lowerings and tuning, the same plan the
        measurements and the race chose, nothing measured or raced again (a
        second `transform` could race to another plan). A model of its own: a
        step compiled anew, states from its own `init`.

        Raises:
            ValueError: the model has semantic exits (which always report the
                statistics).
        """
        if self.config.semantic is not None:
            raise ValueError("dcjax: semantic exits always report the statistics")
        return self._twin(dataclasses.replace(self.config, statistics=bool(statistics)))

    def with_tuning(self, tuning: autotune.Tuning) -> CachedModel:
        """This model with the kernels of ``tuning`` (a `dcjax.autotune.Tuning`
        of this model's layers, such as `dcjax.autotune.cut_tuning` makes), on
        the same analysis and config: a model of its own, its step compiled
        anew.

        Raises:
            ValueError: ``tuning`` is not a cached plan of this model's layers.
        """
        if self.tuning is None or tuning.plan not in ("cached", "cut"):
            raise ValueError("dcjax: with_tuning takes a cached plan of a tuned model")
        if len(tuning.layers) != len(self.layers):
            raise ValueError(
                f"dcjax: with_tuning got a tuning of {len(tuning.layers)} layers for "
                f"{len(self.layers)}"
            )
        twin = self._twin(self.config, tuning.choices)
        twin.tuning = tuning
        return twin

    def _twin(self, config: Config, kernels: Sequence[Any] | None = None) -> CachedModel:
        """A copy of this model with ``config`` and ``kernels`` (default: this
        model's), its plan made and its step built anew."""
        twin = copy.copy(self)
        twin.config = config
        twin._kernels = self._kernels if kernels is None else tuple(kernels)
        twin.plan = make_plan(self._analysis, config, jax.default_backend(), twin._kernels)
        twin._streams_fns = {}
        twin._build(config)
        return twin

    @property
    def trace_count(self) -> int:
        """How many times the step has been traced (compiled) so far."""
        return self._step.traces

    @property
    def sparse(self) -> tuple[bool, ...]:
        """Per layer the step's infos report on (`layers`, then `dense_layers`),
        whether it can skip work: a convolution that reuses its cache or is
        computed with its inverted-residual chain (not with ``psnr_threshold=
        inf`` unless refinement reuses inside the network), a fully connected
        layer updated by its changed inputs (`Config.dense_updates`, or
        refinement)."""
        plan = self.plan
        never = self.config.psnr_threshold == float("inf") and not plan.refines
        convs = tuple(not never and (lp.keeps_cache or lp.chain is not None) for lp in plan.layers)
        return (*convs, *plan.updated_dense)

    def init(self, *, refresh_phase: int = 0) -> CacheState:
        """A fresh state: the first step recomputes everything.

        ``refresh_phase`` (``0 <= refresh_phase < Config.refresh_every``) brings
        the stream's first periodic refresh that many frames early, so that
        streams started together refresh on different frames
        (`dcjax.state.init_state`; `streams` staggers them this way).
        """
        every = self.config.refresh_every
        if (
            isinstance(refresh_phase, bool)
            or not isinstance(refresh_phase, (int, np.integer))
            or refresh_phase < 0
            or (every is None and refresh_phase != 0)
            or (every is not None and refresh_phase >= every)
        ):
            span = "0 (Config.refresh_every is None)" if every is None else f"0..{every - 1}"
            raise ValueError(
                f"dcjax: refresh_phase must be an int in {span}, got {refresh_phase!r}"
            )
        return init_state(
            self.plan,
            key_shape=self._step.matcher.key_shape(self.frame_shape),
            out_avals=self._analysis.jaxpr.out_avals,
            semantic=None if self._semantic is None else self._semantic.memory,
            refresh_phase=int(refresh_phase),
            guard_cells=self._step.guard_cells,
        )

    def streams(
        self,
        n: int,
        *,
        stagger: bool = True,
        mesh: Any = None,
        axis: str = "streams",
        schedule: str = "auto",
    ) -> Streams:
        """``n`` streams stepped together (`dcjax.streams.Streams`): stacked
        states, one step for all of them that pools their dirty tiles layer by
        layer (``schedule="pooled"``) or the streams' own steps one after the
        other (``"sequential"``; ``"auto"`` races the two on the calibration
        frames), refreshes staggered over the streams (``stagger``),
        optionally split over the ``axis`` of a `jax.sharding.Mesh`."""
        return Streams(self, n, stagger=stagger, mesh=mesh, axis=axis, schedule=schedule)

    def step(
        self, state: CacheState, frame: jax.Array, match: Match | None = None
    ) -> tuple[Any, CacheState, dict]:
        """Process one frame.

        Args:
            state: from `init` or the previous step. It is consumed: its
                buffers are donated to the step, which updates the caches in
                place; keep using the returned state.
            frame: ``(H, W, C)`` uint8 or floating-point frame.
            match: a known match (motion and mask) to use instead of the
                built-in matcher.

        Returns:
            ``(output, state, info)``; ``info`` holds ``motion``, ``refreshed``,
            ``refresh_band`` (the band a banded refresh recomputes,
            `Config.refresh_bands`, else -1),
            ``nonfinite``, ``match_ratio``, ``input_reuse`` (fraction of input
            pixels reused), ``reuse_fraction`` (per layer), ``dense_reuse``
            (per fully connected layer, the fraction of its inputs whose
            weight rows were not read: 0 without refinement), ``flops_ratio``
            (convolution and matrix-product FLOPs that had to be computed / those of a full
            recompute) and ``skipped`` (a still frame: the network did not
            run, `Config.skip_unchanged`). Without `Config.statistics`,
            ``reuse_fraction`` and ``flops_ratio`` are NaN on frames that ran.
        """
        frame = self._check_frame(frame, "frame", 3)
        match = self._check_match(match, batched=False)
        if self._bare_jit is not None and match is None:
            output, varying = self._bare_jit(self._traced.leaves, frame)
            return output, state, {**self._bare_info, **varying}
        return self._step_jit(self._traced.leaves, state, frame, match)

    def _bare_step(self, leaves: Sequence[Any], frame: jax.Array) -> tuple[Any, dict]:
        """`step` where nothing is reused, matched or skipped (`bare`): the dense
        lowering of the model, and the info of a frame computed in full. What
        does not depend on the frame is made once: each output of a jitted
        call costs its dispatch. ``nonfinite`` is an output whatever the
        frame's dtype (a constant for integer frames): without an output
        beside the model's, XLA:CPU ran CenterFace's program about 0.9 ms a
        frame slower (docs/performance-notes.md, "The bare step returns
        `nonfinite` beside the model's outputs")."""
        x = self._step.prepare(frame)
        outs = dense_forward(self._analysis, leaves, x[None], self.lowerings)
        output = jax.tree_util.tree_unflatten(self._traced.out_tree, outs)
        return output, {"nonfinite": ~frame_finite(frame)}

    @functools.cached_property
    def _bare_info(self) -> dict:
        return {
            "motion": jnp.zeros((2,), jnp.int32),
            "refreshed": jnp.bool_(True),
            "refresh_band": jnp.int32(-1),
            "nonfinite": jnp.bool_(False),
            "match_ratio": jnp.float32(0.0),
            "input_reuse": jnp.float32(0.0),
            "guarded": jnp.float32(0.0),
            "reuse_fraction": jnp.zeros((len(self.layers),), jnp.float32),
            "dense_reuse": jnp.zeros((len(self.dense_layers),), jnp.float32),
            "flops_ratio": jnp.float32(1.0),
            "skipped": jnp.bool_(False),
        }

    def _program(self, state: CacheState, frame: jax.Array) -> tuple[Any, tuple]:
        """``(jitted, args)`` with ``jitted(*args)`` the step on ``(state, frame)``, for profiling.

        A still frame runs the network here instead of being skipped
        (`Config.skip_unchanged`), and no frame's network runs inside the
        skipping loop, so that the profiler sees every layer's operations at
        the top level; otherwise it is `step`, with the same state layout.
        """
        frame = self._check_frame(frame, "frame", 3)
        if self._profiled_jit is None:
            self._profiled_jit = jax.jit(
                functools.partial(self._step, skip_still=False), donate_argnums=(1,)
            )
        return self._profiled_jit, (self._traced.leaves, state, frame, None)

    def host_syncs(self) -> tuple[HostSync, ...]:
        """The step's data-dependent control flow as traced for the default
        backend (`dcjax.transforms.host_syncs`): on a GPU each entry is a
        predicate the host reads every frame (a loop's, every trip).

        On a GPU with ``kernel="auto"`` or ``"pallas"`` there is one, the
        still-frame skip (`Config.skip_unchanged`; none without it); each
        semantic exit adds a conditional. The tile and row kernels
        (``kernel="xla"`` or ``"rows"``) add loops of zero or one trip per
        layer and step size. Tracing does not count in `trace_count`.
        """
        frame = jax.ShapeDtypeStruct(self.frame_shape, jnp.uint8)
        traces = self._step.traces
        try:
            if self._bare_jit is not None:
                jaxpr = jax.make_jaxpr(self._bare_step)(self._traced.leaves, frame)
            else:
                state = jax.eval_shape(self.init)
                jaxpr = jax.make_jaxpr(self._step)(self._traced.leaves, state, frame, None)
        finally:
            self._step.traces = traces
        return host_syncs(jaxpr)

    def run(
        self,
        frames: jax.Array,
        state: CacheState | None = None,
        matches: Match | None = None,
    ) -> tuple[Any, CacheState, dict]:
        """Process ``frames`` (T, H, W, C) with a `lax.scan` of `step`.

        Returns outputs and infos stacked along a leading T axis.
        """
        frames = self._check_frame(frames, "frames", 4)
        matches = self._check_match(matches, batched=True)
        if state is None:
            state = self.init()
        return self._run_jit(self._traced.leaves, state, frames, matches)

    @property
    def exit_points(self) -> tuple[str, ...]:
        """The semantic exit points, in order (empty without ``Config.semantic``)."""
        return () if self._semantic is None else self._semantic.names

    def calibrate(self, images: jax.Array, batch_size: int = 16) -> Any:
        """Initialise the semantic memory from the full model on ``images``.

        Each image (``(N, H, W, C)`` frames, preprocessed like `step`'s) is
        labelled with the model's own top-1; the semantic vectors and outputs
        are averaged per class (SMTM uses a labelled training set instead).
        States made by `init` afterwards start from this memory. A share of
        the images (``SemanticConfig.holdout``) is held back first to check
        that the exits agree with the full model (`semantic_check`); where
        they do not, the memory runs without exits and a warning says so.

        Returns:
            The calibrated `dcjax.semantic.SemanticState`.
        """
        inputs = self._semantic_inputs(images, "calibrate")
        return self._semantic.calibrate(self._traced.leaves, inputs, batch_size)

    @property
    def semantic_check(self) -> Any:
        """The last `calibrate`'s held-back check (`dcjax.semantic.check.CalibrationCheck`):
        whether the memory's exits agreed with the full model, and whether they
        stay on; None before a calibration or without semantic exits."""
        return None if self._semantic is None else self._semantic.check

    def semantic_features(
        self, images: jax.Array, batch_size: int = 16
    ) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
        """The full model on ``images``: outputs, semantic vectors and classes.

        ``images`` are ``(N, H, W, C)`` frames, preprocessed like `step`'s.
        Returns per model output ``(N, *shape)`` (``shape`` with the traced
        batch axis of 1), per exit point ``(N, D_e)``
        (the vectors `calibrate` averages) and ``(N,)`` the top-1 classes, as
        numpy arrays: the inputs of `dcjax.semantic.exit_ceiling`.
        """
        inputs = self._semantic_inputs(images, "semantic_features")
        outs, vecs = self._semantic.features(self._traced.leaves, inputs, batch_size)
        return outs, vecs, self._semantic.labels(outs)

    def _semantic_inputs(self, images: jax.Array, what: str) -> jax.Array:
        """``images`` checked and preprocessed as model inputs (N, 1, H, W, C)."""
        if self._semantic is None:
            raise ValueError(
                f"dcjax: {what} needs semantic exits: transform with "
                "Config(semantic=SemanticConfig(...))"
            )
        images = self._check_frame(images, "images", 4)
        return jax.jit(jax.vmap(lambda f: self._step.prepare(f)[None]))(images)

    def apply(self, frame: jax.Array) -> Any:
        """The untransformed model on one frame (no cache), for comparison."""
        frame = self._check_frame(frame, "frame", 3)
        return self._apply_jit(self._traced.leaves, frame)

    # -- checks --------------------------------------------------------------

    def _check_frame(self, frame: Any, name: str, ndim: int) -> jax.Array:
        frame = inputs.check_frame(frame, name, ndim, self.frame_shape)
        if not self._float_range_checked and self.config.data_range is None:
            self._float_range_checked = inputs.check_float_range(frame, name)
        return frame

    def _check_match(self, match: Match | None, *, batched: bool) -> Match | None:
        return inputs.check_match(match, self.frame_shape, batched=batched)

    def _apply_impl(self, leaves, frame):
        from jax.extend.core import jaxpr_as_fun

        outs = jaxpr_as_fun(self._traced.jaxpr)(*leaves, self._step.prepare(frame)[None])
        return jax.tree_util.tree_unflatten(self._traced.out_tree, outs)
