"""`transform`: compile a model into a per-frame step that reuses earlier work.

::

    from dcjax import deepcache
    cached = deepcache.transform(model, variables, frame_shape=(227, 227, 3))
    state = cached.init()
    out, state, info = cached.step(state, frame)       # jitted
    outs, state, infos = cached.run(frames, state)     # lax.scan over frames

The model (a Flax module or ``fn(variables, x)``) is traced once to a jaxpr;
its convolutions become reuse steps: ``out_t = where(R_out, shift(cache_{t-1},
M/s), conv(x_t))`` with ``R_out`` derived from the matcher's input mask ``R0``
by the per-primitive rules of `dcjax.transforms.regions` (DESIGN.md, "The
contract"). `step` is pure: ``step(state, frame) -> (output, state, info)``;
`run` is a `lax.scan` of it; nothing is retraced per frame.

Frames are ``(H, W, C)`` arrays, uint8 or floating point. Unless a
``preprocess`` function is given, uint8 frames are divided by 255 and float
frames are passed as they are, in ``input_dtype``. ``preprocess`` must act per
pixel (normalisation, colour conversion), since reuse masks refer to pixels.
The matcher sees the raw frames.

The output is what ``model.apply(variables, frame[None])`` returns (with its
batch axis of 1).

A frame is recomputed in full (R0 all false) on the first frame, every
``refresh_every`` frames, when fewer than ``min_match`` of the blocks match,
and when the frame holds NaN or Inf; such a frame is not used as the cache key
for the next one, which is then recomputed in full too. A still frame (every input
pixel reusable, no motion) returns the last output without
running the network (`Config.skip_unchanged`, on by default).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jcore

from dcjax import kernels, matching
from dcjax._loops import pinned, run_if, skipping_pays
from dcjax.config import Config, RefineConfig, SemanticConfig
from dcjax.kernels import chain as chain_lib
from dcjax.kernels.masked import plain_conv
from dcjax.kernels.matvec import delta_matvec
from dcjax.matching.types import Match
from dcjax.transforms import lowering
from dcjax.transforms import refine as refine_lib
from dcjax.transforms.analysis import analyze
from dcjax.transforms.interpreter import FrameContext, evaluate
from dcjax.transforms.records import DenseLayer, Layer
from dcjax.transforms.spatial import Spatial
from dcjax.transforms.trace import check_frame_shape, trace_model

__all__ = [
    "CacheState",
    "CachedModel",
    "Config",
    "Match",
    "RefineConfig",
    "SemanticConfig",
    "transform",
]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class CacheState:
    """Everything a stream carries from one frame to the next (a pytree).

    Attributes:
        prev_frame: the key the next frame is matched against
            (`Config.key`): the last finite frame, or the pixels the caches
            were computed from. With a motion search (``matcher`` "diamond",
            "three_step" or "exhaustive") it is kept as the matcher's planes
            (`dcjax.matching.planes`: (1, H, W) luma, or (C, H, W) with
            ``color="rgb"``), so each frame is converted once; with the other
            matchers it is the (H, W, C) frame in float32.
        has_prev: whether ``prev_frame`` and the caches can be reused.
        since_refresh: frames since the last full recompute.
        frame_index: frames stepped so far.
        motion: the last frame's global motion (the next search starts there).
        caches: one cached output per reused layer, in ``CachedModel.layers``
            order; None for a layer its kernel computes densely without
            reading a cache (`dcjax.kernels.reads_cache`: every plain layer
            under ``kernel="dense"``, small layers on CPU under "auto"). None
            rather than an empty array: each array leaf of the state is an
            output of the step, and XLA:CPU gives each one a buffer of its own
            (EfficientNet-Lite0 under "auto" caches 1 of its 49 layers: its
            step copied an empty array 49 times a frame, and without them it
            ran 0.29-0.41 ms faster of 11-12 ms over vtest, two interleaved
            runs of 100 frames).
        layer_valid: per layer, whether its cache holds the previous frame's
            output (false after a layer was skipped).
        semantic: the semantic memory (`dcjax.semantic.SemanticState`) when
            ``Config.semantic`` is set, else None.
        refs: with ``Config.refine``, per layer the reference copy of its
            input (None for layers that are not refined, and for a layer that
            reads the same variable as an earlier refined one, whose reference
            it shares); else empty.
        ref_scale: with ``Config.refine``, per layer the activation scale its
            threshold is relative to (0 until measured on the first frame).
        output: with ``Config.skip_unchanged``, the last output's leaves (a
            still frame returns them); else empty.
        dense: with ``Config.refine`` or ``Config.dense_updates``, per fully
            connected layer (``CachedModel.dense_layers``) ``(x_ref, y_ref,
            scale)``: the reference input, the product ``x_ref @ W`` kept up
            to date by the changed rows, and the activation scale (0 until
            measured); None for a layer that is not updated by rows. Empty
            when no layer is.
    """

    prev_frame: jax.Array
    has_prev: jax.Array
    since_refresh: jax.Array
    frame_index: jax.Array
    motion: jax.Array
    caches: tuple
    layer_valid: jax.Array
    semantic: Any = None
    refs: tuple = ()
    ref_scale: Any = None
    output: tuple = ()
    dense: tuple = ()


class _Pass(NamedTuple):
    """What one pass of the network returns (`CachedModel._forward`)."""

    outs: list
    caches: list
    reuse_fraction: jax.Array
    layer_valid: jax.Array
    semantic: Any
    semantic_info: dict
    refs: list
    ref_scale: jax.Array
    dense: list
    dense_reuse: jax.Array


class CachedModel:
    """A model compiled for cached per-frame inference; see `transform`.

    Attributes:
        layers: the reused layers (`Layer`), in execution order.
        dense_layers: the fully connected layers (`DenseLayer`), in execution
            order: computed in full on every frame, or updated by the rows of
            their weights whose input changed (`Config.dense_updates`: exactly,
            on CPU, for the large ones; ``Config.refine``: by more than its
            threshold).
        epilogues: per layer, the primitives of the elementwise chain cached
            with it (`Config.fuse_epilogues`); empty where none is.
        keeps_cache: per layer, whether its kernel reuses a cache (False: the
            layer is computed in full on every frame and keeps no state, as
            small and thin layers on CPU are under ``kernel="auto"``, see
            `dcjax.kernels.auto`, every plain layer under ``"dense"``, and
            every layer with semantic exits that never reuse; or it is the
            expansion or depthwise layer of an inverted-residual chain,
            computed on dirty tiles with the chain's projection, which alone
            keeps a cache: `Config.fuse_blocks`, `dcjax.kernels.chain`).
        total_flops: FLOPs of a full recompute: convolutions and matrix
            products (fully connected layers) all computed.
        unsupported_primitives: primitives without a mask rule.
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
    ) -> None:
        if not isinstance(config, Config):
            raise TypeError(
                f"dcjax: config must be a deepcache.Config, got {type(config).__name__}"
            )
        if preprocess is not None and not callable(preprocess):
            raise TypeError("dcjax: preprocess must be a callable frame -> model input")
        self.config = config
        self.frame_shape = check_frame_shape(frame_shape)
        self._preprocess = preprocess
        if config.semantic is not None:  # mark the exit points while tracing
            from dcjax.transforms.exits import marked

            model = marked(model, config.semantic.exit_points)
        self._traced = trace_model(model, variables, self.frame_shape, input_dtype)
        n = len(self._traced.leaves)
        frame_sig = Spatial(axes=(1, 2), size=self.frame_shape[:2], stride=(1, 1))
        self._analysis = analyze(
            self._traced.jaxpr,
            [None] * n + [frame_sig],
            [False] * n + [True],
            reuse_ops=config.reuse_ops,
        )
        self.layers: tuple[Layer, ...] = tuple(self._analysis.layers)
        self.dense_layers: tuple[DenseLayer, ...] = tuple(self._analysis.dense_layers)
        self._semantic = None
        if config.semantic is not None:
            from dcjax.semantic.smtm import SemanticExits

            self._semantic = SemanticExits(config.semantic, self._analysis)
            # never reusing: the exits keep no caches (nothing to carry through them)
            self._semantic.dense = config.psnr_threshold == float("inf")
        # layers computed densely without a select (small layers on CPU under
        # kernel="auto", every plain layer under "dense", every layer when
        # semantic exits never reuse) keep no cache
        self.keeps_cache: tuple[bool, ...] = _layers_reading_cache(
            self._analysis, len(self.layers), config.kernel
        )
        if self._semantic is not None and self._semantic.dense:
            self.keeps_cache = (False,) * len(self.layers)
        self._refined: tuple[bool, ...] | None = None
        self._dense_refined: tuple[bool, ...] | None = None
        if config.refine is not None:
            if config.semantic is not None:
                raise ValueError(
                    "dcjax: Config.refine and Config.semantic cannot be combined yet; "
                    "use one of them"
                )
            # a layer computed densely (no cache) has nothing to reuse: no test
            self._refined = tuple(
                on and keep
                for on, keep in zip(
                    refine_lib.refined_layers(
                        self.layers,
                        config.refine,
                        self.dense_layers,
                        reads_frame=_reads_frame(self._analysis, len(self.layers)),
                        matcher=config.matcher != "none",
                    ),
                    self.keeps_cache,
                    strict=True,
                )
            )
            self._dense_refined = refine_lib.refined_dense(self.dense_layers, config.refine)
        # Fully connected layers updated by the rows of the inputs that changed
        # exactly (`Config.dense_updates`), with or without refinement: plain
        # DeepCache's, so that refinement with delta=0 is plain DeepCache.
        n_dense = len(self.dense_layers)
        self._dense_exact: tuple[bool, ...] = (
            refine_lib.auto_dense(self.dense_layers)
            if config.dense_updates and config.semantic is None and skipping_pays()
            else (False,) * n_dense
        )
        refined_dense = self._dense_refined or (False,) * n_dense
        self._dense_delta = tuple(config.refine.delta if on else 0.0 for on in refined_dense)
        if any(self._dense_exact):
            self._dense_refined = tuple(
                on or exact for on, exact in zip(refined_dense, self._dense_exact, strict=True)
            )
        # refined layers that read the same feature map share one test and reference
        self._ref_owner = _shared_inputs(self._analysis, len(self.layers), self._refined)
        # the Pallas TPU kernel takes no epilogue (`dcjax.kernels.masked`)
        tpu_pallas = config.kernel == "pallas_tpu" or (
            config.kernel == "pallas" and jax.default_backend() == "tpu"
        )
        fused = config.fuse_epilogues and config.semantic is None and not tpu_pallas
        # Inverted-residual chains computed on dirty tiles as one (`kernels.chain`):
        # `Config.fuse_blocks` (checked there: kernel="auto", no refinement or exits).
        self._chains: dict[int, tuple[int, int, int]] = {}
        if config.fuse_blocks and fused:
            self._chains = _conv_chains(self._analysis)
            self.keeps_cache = tuple(
                keep if i not in self._chains else i == self._chains[i][2]
                for i, keep in enumerate(self.keeps_cache)
            )
        self.epilogues: tuple[tuple[str, ...], ...] = tuple(
            chain if fused and (keep or i in self._chains) else ()
            for i, (chain, keep) in enumerate(
                zip(
                    _layer_epilogues(self._analysis, len(self.layers)),
                    self.keeps_cache,
                    strict=True,
                )
            )
        )
        self.unsupported_primitives: tuple[str, ...] = tuple(sorted(self._analysis.unsupported))
        if self.unsupported_primitives:
            warnings.warn(
                "dcjax: no reuse rule for primitive(s) "
                f"{', '.join(self.unsupported_primitives)}; their outputs are recomputed in "
                "full and nothing downstream of them is reused",
                stacklevel=3,
            )
        # A still frame skips the network only where the analysis covers every
        # primitive: an unsupported one is recomputed in full whatever the masks.
        # On every backend: off CPU the skip's loop test reads its predicate
        # once a frame, which a whole network pays for (see `Config.skip_unchanged`).
        self._skips = (
            config.skip_unchanged and self._semantic is None and not self.unsupported_primitives
        )
        self.total_flops = sum(layer.flops for layer in self.layers) + self._analysis.other_flops
        self._flops = jnp.asarray([layer.flops for layer in self.layers], jnp.float32)
        self._dense_flops = jnp.asarray([d.flops for d in self.dense_layers], jnp.float32)
        self._trace_count = 0
        # The state is donated: caches are updated in place, frame after frame.
        self._step_jit = jax.jit(self._step_impl, donate_argnums=(1,))
        self._profiled_jit = None  # `_program`'s step, made when first asked for
        self._run_jit = jax.jit(self._run_impl, donate_argnums=(1,))
        self._apply_jit = jax.jit(self._apply_impl)

    # -- public API ----------------------------------------------------------

    @property
    def trace_count(self) -> int:
        """How many times the step has been traced (compiled) so far."""
        return self._trace_count

    @property
    def sparse(self) -> tuple[bool, ...]:
        """Per layer the step's infos report on (`layers`, then `dense_layers`),
        whether it can skip work: a convolution that reuses its cache or is
        computed with its inverted-residual chain (not with ``psnr_threshold=
        inf`` unless refinement reuses inside the network), a fully connected
        layer updated by its changed inputs (`Config.dense_updates`, or
        refinement)."""
        never = self.config.psnr_threshold == float("inf") and self._refined is None
        convs = (
            (False,) * len(self.layers)
            if never
            else tuple(k or i in self._chains for i, k in enumerate(self.keeps_cache))
        )
        return (*convs, *(self._dense_refined or (False,) * len(self.dense_layers)))

    def init(self) -> CacheState:
        """A fresh state: the first step recomputes everything."""
        caches = tuple(
            jnp.zeros(layer.out_shape, layer.dtype) if keep else None
            for layer, keep in zip(self.layers, self.keeps_cache)
        )
        state = CacheState(
            prev_frame=jnp.zeros(self._key_shape, jnp.float32),
            has_prev=jnp.bool_(False),
            since_refresh=jnp.int32(0),
            frame_index=jnp.int32(0),
            motion=jnp.zeros((2,), jnp.int32),
            caches=caches,
            layer_valid=jnp.zeros((len(self.layers),), bool),
        )
        if self._semantic is not None:
            state = dataclasses.replace(state, semantic=self._semantic.memory)
        if self._dense_refined is not None:
            dense = tuple(
                (
                    jnp.zeros((d.in_features,), jnp.float32),
                    jnp.zeros((d.out_features,), jnp.float32),
                    jnp.float32(0.0),
                )
                if on
                else None
                for d, on in zip(self.dense_layers, self._dense_refined, strict=True)
            )
            state = dataclasses.replace(state, dense=dense)
        if self._refined is not None:
            refs = tuple(
                jnp.zeros(layer.in_shape, jnp.float32) if on and owner == layer.index else None
                for layer, on, owner in zip(self.layers, self._refined, self._ref_owner)
            )
            state = dataclasses.replace(
                state, refs=refs, ref_scale=jnp.zeros((len(self.layers),), jnp.float32)
            )
        if self._skips:
            outs = self._analysis.jaxpr.out_avals
            state = dataclasses.replace(
                state, output=tuple(jnp.zeros(a.shape, a.dtype) for a in outs)
            )
        # fresh buffers: a state is consumed (donated) by the step it is passed to
        return jax.tree_util.tree_map(lambda a: jnp.array(a, copy=True), state)

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
        return self._step_jit(self._traced.leaves, state, frame, match)

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
                functools.partial(self._step_impl, skip_still=False), donate_argnums=(1,)
            )
        return self._profiled_jit, (self._traced.leaves, state, frame, None)

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
        States made by `init` afterwards start from this memory.

        Returns:
            The calibrated `dcjax.semantic.SemanticState`.
        """
        inputs = self._semantic_inputs(images, "calibrate")
        return self._semantic.calibrate(self._traced.leaves, inputs, batch_size)

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
        return jax.jit(jax.vmap(lambda f: self._prepare(f)[None]))(images)

    def apply(self, frame: jax.Array) -> Any:
        """The untransformed model on one frame (no cache), for comparison."""
        frame = self._check_frame(frame, "frame", 3)
        return self._apply_jit(self._traced.leaves, frame)

    # -- checks --------------------------------------------------------------

    def _check_frame(self, frame: Any, name: str, ndim: int) -> jax.Array:
        if not hasattr(frame, "shape") or not hasattr(frame, "dtype"):
            try:
                frame = jnp.asarray(frame)
            except TypeError as e:
                raise TypeError(
                    f"dcjax: {name} must be an array, got {type(frame).__name__}"
                ) from e
        dtype = jnp.dtype(frame.dtype)
        if not (dtype == jnp.uint8 or jnp.issubdtype(dtype, jnp.floating)):
            raise TypeError(
                f"dcjax: {name} has dtype {dtype.name}; pass uint8 (0-255) or floating-point frames"
            )
        want = self.frame_shape if ndim == 3 else ("T", *self.frame_shape)
        shape = tuple(frame.shape)
        if len(shape) != ndim:
            raise ValueError(
                f"dcjax: {name} must have shape {tuple(want)}, got an array of shape {shape}"
            )
        if shape[-3:] != self.frame_shape:
            what = "frame" if ndim == 3 else "frames"
            raise ValueError(
                f"dcjax: {what} has shape {shape[-3:]} but the model was transformed for "
                f"{self.frame_shape}"
            )
        return frame

    def _check_match(self, match: Match | None, *, batched: bool) -> Match | None:
        if match is None:
            return None
        if not isinstance(match, Match):
            raise TypeError(f"dcjax: match must be a deepcache.Match, got {type(match).__name__}")
        lead = (-1,) if batched else ()
        motion = jnp.asarray(match.motion, jnp.int32)
        mask = jnp.asarray(match.mask)
        hw = self.frame_shape[:2]
        if motion.shape[-1:] != (2,) or motion.ndim != len(lead) + 1:
            raise ValueError(f"dcjax: match.motion must be (dy, dx), got shape {motion.shape}")
        if mask.shape[-2:] != hw or mask.ndim != len(lead) + 2:
            raise ValueError(f"dcjax: match.mask has shape {mask.shape} but frames are {hw} (H, W)")
        ratio = match.match_ratio
        if ratio is None:
            ratio = mask.astype(jnp.float32).mean(axis=(-2, -1))
        return Match(motion=motion, mask=mask.astype(bool), match_ratio=ratio)

    # -- compiled bodies -----------------------------------------------------

    def _prepare(self, frame: jax.Array) -> jax.Array:
        if self._preprocess is not None:
            x = self._preprocess(frame)
        elif frame.dtype == jnp.uint8:
            x = frame.astype(jnp.float32) / 255.0
        else:
            x = frame
        x = jnp.asarray(x).astype(self._traced.input_dtype)
        if x.shape != self.frame_shape:
            raise ValueError(
                f"dcjax: preprocess returned shape {x.shape}; it must keep the frame's shape "
                f"{self.frame_shape}"
            )
        return x

    def _apply_impl(self, leaves, frame):
        from jax.extend.core import jaxpr_as_fun

        outs = jaxpr_as_fun(self._traced.jaxpr)(*leaves, self._prepare(frame)[None])
        return jax.tree_util.tree_unflatten(self._traced.out_tree, outs)

    @property
    def _planes_key(self) -> bool:
        """Whether the key is kept as the matcher's planes (see `CacheState.prev_frame`)."""
        return self.config.matcher in ("diamond", "three_step", "exhaustive")

    @property
    def _key_shape(self) -> tuple[int, ...]:
        h, w, c = self.frame_shape
        if not self._planes_key:
            return (h, w, c)
        return (1 if self.config.color == "luma" else c, h, w)

    def _key_of(self, frame: jax.Array) -> jax.Array:
        """What of ``frame`` the key keeps: its planes, or the frame in float32."""
        if self._planes_key:
            return matching.planes(frame, self.config.color)
        return frame.astype(jnp.float32)

    def _match(self, prev: jax.Array, cur: jax.Array, key: jax.Array, init_motion) -> Match:
        """Match frame ``cur`` (whose `_key_of` is ``key``) against the key ``prev``."""
        cfg = self.config
        if self._planes_key:
            # The step uses the motion and the mask, not every block's vector.
            options = {"all_vectors": False, "prejudge": True, **cfg.matcher_options}
            return matching.block_match_planes(
                prev, key, peak=matching.psnr_peak(cur.dtype, cfg.data_range),
                search=cfg.matcher, init_motion=init_motion, block_size=cfg.block_size,
                psnr_threshold=cfg.psnr_threshold, color=cfg.color, **options,
            )  # fmt: skip
        common = dict(
            block_size=cfg.block_size,
            psnr_threshold=cfg.psnr_threshold,
            color=cfg.color,
            data_range=cfg.data_range,
        )
        prev = prev.astype(cur.dtype)
        if cfg.matcher == "none":  # no input reuse; only refinement can reuse
            return Match(
                motion=jnp.zeros((2,), jnp.int32),
                mask=jnp.zeros(cur.shape[:2], bool),
                match_ratio=jnp.float32(1.0),
            )
        if cfg.matcher == "static":
            return matching.static_match(prev, cur, **common, **cfg.matcher_options)
        # "histogram", the last of `Config`'s validated matchers
        return matching.histogram_match(prev, cur, **cfg.matcher_options)

    def _next_key(self, key, new, r0, motion):
        """The key the next frame is matched against (`Config.key`), from the
        current ``key`` and the frame's `_key_of` ``new``.

        With ``"reference"``, reused pixels keep the key's value shifted by the
        motion (the pixel the caches hold the features of, since ``R0[y, x]``
        pairs ``frame[y, x]`` with ``key[y + My, x + Mx]``) and the others
        take the frame's: a block reused frame after frame is always compared
        with what its features were computed from, so a slow drift is caught
        once it exceeds the threshold instead of accumulating.
        """
        if self.config.key == "previous":
            return new
        if self._planes_key:  # (C', H, W)
            return jnp.where(r0[None], _shift(key, motion[0], motion[1], (1, 2)), new)
        return jnp.where(r0[..., None], _shift(key, motion[0], motion[1], (0, 1)), new)

    def _reuse_layer(self, index, eqn, invals, mask, shifted, epilogue=None):
        """One reused convolution: fresh values where ``mask`` is false."""
        scattered = self._refined is not None and self._refined[index]
        return kernels.masked_conv_eqn(
            eqn, invals, mask, shifted, self.config.kernel, scattered=scattered, epilogue=epilogue
        )

    def _fuses(self, index: int) -> bool:
        """Whether layer ``index`` is cached with its epilogue (`Config.fuse_epilogues`)."""
        return bool(self.epilogues[index])

    def _refiner(self, state: CacheState, ctx: FrameContext, refresh: jax.Array):
        """The refinement hook, and the lists it fills with new references and scales.

        See `dcjax.transforms.refine`: a refined layer's input mask gains the
        pixels whose change against its (shifted) reference is under
        ``delta * scale``; the reference takes ``x_t`` everywhere else. Layers
        that read the same feature map (`_shared_inputs`) share the first one's
        test, reference and scale: one pass over the map, one copy in the state.
        """
        if self._refined is None:
            return list(state.refs), [], None
        rcfg = self.config.refine
        refs = list(state.refs)
        scales = [state.ref_scale[i] for i in range(len(self.layers))]
        tested: dict[int, tuple[jax.Array, jax.Array]] = {}

        def refine_fn(index, x, in_mask):
            if not self._refined[index]:
                return in_mask
            owner = self._ref_owner[index]
            if owner not in tested:
                sig = self.layers[owner].in_signature
                old = state.ref_scale[owner]
                scale = lax.cond(
                    (old > 0) & jnp.isfinite(old),
                    lambda: old,
                    lambda: refine_lib.scale(x, sig, rcfg.metric),
                )
                dy, dx, _ = ctx.shift(sig)
                ref = _shift(state.refs[owner], dy, dx, sig.axes)

                valid = ctx.valid(sig) & state.layer_valid[owner] & ~refresh

                def test(small, ref, x, scale, valid):
                    small = refine_lib.change(x, ref, sig, rcfg.metric) < rcfg.delta * scale
                    small = small & valid
                    new_ref = jnp.where(_expand(small, x.ndim, sig.axes), ref, x.astype(ref.dtype))
                    return small, new_ref

                shape = (x.shape[sig.axes[0]], x.shape[sig.axes[1]])  # `change`'s
                carry = (jnp.ones(shape, bool), ref)
                if skipping_pays():
                    # Nothing of the map left to recompute (a still scene): no
                    # test, and the reference keeps what the caches came from.
                    # The reference is the loop's carry, not an operand too, so
                    # it is updated in place rather than copied.
                    small, refs[owner] = lax.fori_loop(
                        0,
                        (~jnp.all(in_mask)).astype(jnp.int32),
                        lambda i, c: test(*c, *pinned((x, scale, valid), i)),
                        carry,
                    )
                else:
                    small, refs[owner] = test(*carry, x, scale, valid)
                tested[owner] = (small, scale)
            small, scales[index] = tested[owner]
            return in_mask | small

        return refs, scales, refine_fn

    def _dense_refiner(self, state: CacheState, refresh: jax.Array):
        """The fully connected layers' hook, and the lists it fills (new state, reuse).

        See `dcjax.transforms.refine`: a refined layer's input elements whose
        change against the reference is under ``delta * scale`` keep their
        reference; the product moves by the weight rows of the others
        (`dcjax.kernels.matvec`); with `Config.dense_updates` so do the
        elements that did not change at all. A refresh, or more than
        ``refine.DENSE_FRACTION`` of the inputs changed, computes the product
        in full and resets the reference.
        """
        n_dense = len(self.dense_layers)
        new, fractions = list(state.dense), [jnp.float32(0.0)] * n_dense
        if self._dense_refined is None or not any(self._dense_refined):
            return new, fractions, None

        def dense_fn(index, eqn, invals):
            if not self._dense_refined[index]:
                return lowering.bind(eqn, invals)[0]
            (x_ref, y_ref, old), (lhs, w) = state.dense[index], invals
            new[index], fractions[index], y = _refined_product(
                eqn, lhs, w, x_ref, y_ref, old, self._dense_delta[index], refresh,
                self._dense_exact[index],
            )  # fmt: skip
            return y

        return new, fractions, dense_fn

    def _step_impl(
        self, leaves, state: CacheState, frame, match: Match | None, skip_still: bool = True
    ):
        self._trace_count += 1
        cfg = self.config
        x = self._prepare(frame)
        finite = (
            jnp.all(jnp.isfinite(frame))
            if jnp.issubdtype(frame.dtype, jnp.floating)
            else jnp.bool_(True)
        )
        with jax.named_scope("dcjax.match"):
            key = self._key_of(frame)
            m = self._match(state.prev_frame, frame, key, state.motion) if match is None else match
        ratio = m.match_ratio if m.match_ratio is not None else m.mask.mean(dtype=jnp.float32)
        refresh = ~state.has_prev | (ratio < cfg.min_match) | ~finite
        if cfg.refresh_every is not None:
            refresh = refresh | (state.since_refresh >= cfg.refresh_every)
        motion = jnp.asarray(m.motion, jnp.int32)
        h, w = self.frame_shape[:2]
        iy = jnp.arange(h)[:, None] + motion[0]
        ix = jnp.arange(w)[None, :] + motion[1]
        inside = (iy >= 0) & (iy < h) & (ix >= 0) & (ix < w)
        if cfg.psnr_threshold == float("inf"):
            r0 = jnp.zeros((h, w), bool)  # never reuse, whatever the matcher says
        else:
            # A conditional materialises the mask: otherwise XLA fuses its whole
            # derivation (block PSNRs, expansion to pixels, the frame border)
            # into every consumer of every layer's mask, once per pixel.
            r0 = lax.cond(refresh, lambda: jnp.zeros((h, w), bool), lambda: m.mask & inside)

        ctx = FrameContext(motion, cfg.alignment)
        n_layers = len(self.layers)
        semantic, semantic_info = state.semantic, {}
        skip = jnp.bool_(False)
        if self._skips and skip_still:
            # A still scene: every layer's mask would be all reusable, so the
            # network would return its last output and keep every cache. The
            # step then runs in a loop of zero trips (a loop carry keeps its
            # buffers, where a lax.cond would copy every cache).
            skip = jnp.all(r0) & jnp.all(motion == 0)

            def body(i, carry):
                # The frame's values are pinned to the trip; the weights are
                # not (pinning them too cost AlexNet ~0.4 ms a frame on vtest,
                # and what XLA hoists from them left still frames unchanged).
                x_i, r0_i = pinned((x, r0), i)
                st = dataclasses.replace(
                    state, caches=carry[0], refs=carry[1], ref_scale=carry[2], dense=carry[3]
                )
                p = self._forward(leaves, st, x_i, r0_i, ctx, refresh, finite)
                return (
                    tuple(p.caches), tuple(p.refs), p.ref_scale, tuple(p.dense), tuple(p.outs),
                    p.reuse_fraction, p.dense_reuse,
                )  # fmt: skip

            carry = (
                state.caches, state.refs, state.ref_scale, state.dense, state.output,
                jnp.ones((n_layers,), jnp.float32),
                jnp.ones((len(self.dense_layers),), jnp.float32),
            )  # fmt: skip
            caches, refs, ref_scale, dense, outs, reuse_fraction, dense_reuse = lax.fori_loop(
                0, _trips(skip), body, carry
            )
            layer_valid = jnp.ones((n_layers,), bool)
        else:
            p = self._forward(leaves, state, x, r0, ctx, refresh, finite)
            outs, caches, reuse_fraction, layer_valid = p[:4]
            semantic, semantic_info, refs, ref_scale, dense, dense_reuse = p[4:]
        output = jax.tree_util.tree_unflatten(self._traced.out_tree, list(outs))

        work = (1.0 - reuse_fraction) * self._flops
        # FLOP counts exceed int32: keep them float
        other = jnp.float32(self._analysis.other_flops)
        if self._semantic is not None:  # what an exit skips costs nothing
            work = jnp.where(layer_valid, work, 0.0)
            exit_index = semantic_info["exit"]
            after = jnp.asarray(self._semantic.plan.other_after, jnp.float32)
            other = other - jnp.where(exit_index >= 0, after[jnp.maximum(exit_index, 0)], 0.0)
        # a refined fully connected layer reads the rows of the changed inputs only
        computed = jnp.sum(work) + other - jnp.sum(dense_reuse * self._dense_flops)
        flops_ratio = jnp.where(skip, 0.0, computed / float(max(self.total_flops, 1)))
        new_state = CacheState(
            prev_frame=jnp.where(
                finite, self._next_key(state.prev_frame, key, r0, motion), state.prev_frame
            ),
            has_prev=finite,
            since_refresh=jnp.where(refresh, 1, state.since_refresh + 1).astype(jnp.int32),
            frame_index=state.frame_index + 1,
            motion=jnp.where(finite, motion, state.motion),
            caches=tuple(caches),
            layer_valid=layer_valid,
            semantic=semantic,
            refs=tuple(refs),
            ref_scale=ref_scale,
            output=tuple(outs) if self._skips else (),
            dense=tuple(dense),
        )
        info = {
            "motion": motion,
            "refreshed": refresh,
            "nonfinite": ~finite,
            "match_ratio": jnp.asarray(ratio, jnp.float32),
            "input_reuse": r0.mean(dtype=jnp.float32),
            "reuse_fraction": reuse_fraction,
            "dense_reuse": dense_reuse,
            "flops_ratio": jnp.asarray(flops_ratio, jnp.float32),
            "skipped": skip,
            **semantic_info,
        }
        return output, new_state, info

    def _forward(self, leaves, state: CacheState, x, r0, ctx: FrameContext, refresh, finite):
        """The network on one frame with reuse: outputs, caches and what the step reports.

        Returns a `_Pass`: ``reuse_fraction`` and ``ref_scale`` as (L,) arrays
        (``ref_scale`` is the state's without refinement), ``dense_reuse`` as
        a (D,) array over the fully connected layers.
        """
        caches = list(state.caches)
        masks: list[Any] = [False] * len(self.layers)

        def reuse_value(index, eqn, invals, mask, epilogue=None):
            """(output, reuse mask, new cache) of one layer."""
            layer = self.layers[index]
            valid = state.layer_valid[index]
            if self.keeps_cache[index] and skipping_pays():
                # A conditional materialises the layer's mask once. Otherwise
                # XLA:CPU fuses the chain of mask propagation behind it (the
                # AND-pools of every layer since the last materialised mask)
                # into each of the sparse kernel's consumers of the mask, and
                # recomputes it per element: on ResNet-50 over vtest the mask
                # and dirty-list operations took 2.5 ms a frame, 1.7 after.
                # Interleaved A/B (30-40 frames, two pairs each): YOLO-tiny
                # 19.40/19.81 -> 19.02/18.72 ms, ResNet-50 40.14/39.88 ->
                # 39.89/39.56, EfficientNet-Lite0 9.78/9.75 -> 9.63/9.70,
                # AlexNet and GoogLeNet level.
                mask = lax.cond(valid, lambda m: m, jnp.zeros_like, mask)
            else:
                mask = mask & valid
            chain = self._chains.get(index)
            if chain is not None and index != chain[2]:
                # the chain's expansion or depthwise layer: computed with its last
                return _Deferred(eqn, invals, epilogue), mask, state.caches[index]
            if not self.keeps_cache[index]:
                return kernels.dense_conv_eqn(eqn, invals), mask, state.caches[index]
            dy, dx, _ = ctx.shift(layer.signature)
            shifted = _shift(state.caches[index], dy, dx, layer.signature.axes)
            if chain is not None:
                mid = invals[0]
                head = mid.invals[0]
                links = tuple(
                    chain_lib.Link(e, ins[1], epi)
                    for e, ins, epi in (
                        (head.eqn, head.invals, head.epilogue),
                        (mid.eqn, mid.invals, mid.epilogue),
                        (eqn, invals, epilogue),
                    )
                )
                x_in = head.invals[0]
                out = chain_lib.chain_masked_conv(
                    x_in, links, jnp.broadcast_to(mask, (x_in.shape[0], *mask.shape)), shifted
                )
                return out, mask, out
            out = self._reuse_layer(index, eqn, invals, mask, shifted, epilogue)
            return out, mask, out

        def reuse(index, eqn, invals, mask, epilogue=None):
            out, masks[index], caches[index] = reuse_value(index, eqn, invals, mask, epilogue)
            return out

        def reuse_fraction_value(index, eqn, invals, mask):
            out, mask, cache = reuse_value(index, eqn, invals, mask)
            return out, jnp.mean(mask, dtype=jnp.float32), cache

        refs, ref_scale, refine_fn = self._refiner(state, ctx, refresh)
        dense, dense_fractions, dense_fn = self._dense_refiner(state, refresh)
        n = len(leaves)
        layer_valid = jnp.ones((len(self.layers),), bool)
        semantic, semantic_info = state.semantic, {}
        if self._semantic is None:
            fuse = self._fuses if any(self.epilogues) else None
            outs, _ = evaluate(
                self._analysis, [*leaves, x[None]], [True] * n + [r0], ctx, reuse,
                refine=refine_fn, fuse=fuse, dense=dense_fn,
            )  # fmt: skip
            if self.config.statistics:
                reuse_fraction = _mean_of_masks(masks)
            else:  # the masks of layers computed in full are left to dead-code elimination
                reuse_fraction = jnp.full((len(masks),), jnp.nan, jnp.float32)
        else:  # early exits: the rest of the network inside nested lax.cond
            outs, caches, fractions, layer_valid, semantic, semantic_info = self._semantic.step(
                state.semantic, [*leaves, x[None]], [True] * n + [r0], ctx,
                reuse_fraction_value, state.caches, finite,
            )  # fmt: skip
            reuse_fraction = jnp.stack(fractions) if fractions else jnp.zeros((0,), jnp.float32)
        ref_scale = jnp.stack(ref_scale) if ref_scale else state.ref_scale
        dense_reuse = (
            jnp.stack(dense_fractions) if dense_fractions else jnp.zeros((0,), jnp.float32)
        )
        return _Pass(
            outs, caches, reuse_fraction, layer_valid, semantic, semantic_info, refs, ref_scale,
            dense, dense_reuse,
        )  # fmt: skip

    def _run_impl(self, leaves, state, frames, matches):
        def body(st, xs):
            frame, match = xs
            out, st, info = self._step_impl(leaves, st, frame, match)
            return st, (out, info)

        state, (outs, infos) = lax.scan(body, state, (frames, matches))
        return outs, state, infos


def _mean_of_masks(masks: Sequence[Any]) -> jax.Array:
    """The fraction of ``True`` in each mask, as an (L,) float32 array.

    Masks of one shape are stacked and reduced together: one reduction per
    map size rather than one per layer, each a fixed cost on CPU. On
    EfficientNet-Lite0 (49 layers) the step's fusions went 585 -> 555, and
    its frames over vtest 0.11-0.21 ms faster in four interleaved runs of 80
    frames (~1.5 %, near the noise).
    """
    out = [jnp.float32(0.0)] * len(masks)
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, m in enumerate(masks):
        groups.setdefault(jnp.shape(m), []).append(i)
    for shape, members in groups.items():
        if not shape:
            for i in members:
                out[i] = jnp.asarray(masks[i], jnp.float32)
            continue
        means = jnp.stack([masks[i] for i in members]).mean(
            axis=tuple(range(1, len(shape) + 1)), dtype=jnp.float32
        )
        for j, i in enumerate(members):
            out[i] = means[j]
    return jnp.stack(out) if out else jnp.zeros((0,), jnp.float32)


def _refined_product(eqn, lhs, w, x_ref, y_ref, old_scale, delta, refresh, exact_updates):
    """One fully connected layer updated by rows: ``(new state, reuse fraction, product)``.

    An input element counts as unchanged when its change against the reference
    is under ``delta * scale`` (refinement) or, with ``exact_updates``
    (`Config.dense_updates`), exactly zero.
    """
    k = x_ref.shape[0]
    x = lhs.reshape(-1).astype(jnp.float32)
    d = x - x_ref
    if delta == 0:  # no threshold: no scale to measure
        scale, small = old_scale, d == 0 if exact_updates else jnp.zeros_like(d, bool)
    else:
        measured = (old_scale > 0) & jnp.isfinite(old_scale)
        scale = jnp.where(measured, old_scale, refine_lib.dense_scale(x))
        small = jnp.abs(d) < delta * scale
        if exact_updates:
            small = small | (d == 0)
    small = small & ~refresh
    changed = ~small
    count = jnp.sum(changed, dtype=jnp.int32)
    full = refresh | (count > int(refine_lib.DENSE_FRACTION * k))
    # exact updates are on only where skipping pays (CPU: `CachedModel._dense_exact`)
    exact_only = delta == 0 and not exact_updates
    full = full | exact_only

    def exact(lhs):
        return lowering.bind(eqn, [lhs, w])[0].reshape(-1).astype(jnp.float32)

    if exact_only:
        # every input counts as changed: the full product, on any backend
        y = exact(lhs)
    elif skipping_pays():
        y = run_if(full, exact, (lhs,), jnp.zeros_like(y_ref))
        y = run_if(
            ~full, lambda y_ref, d, changed: delta_matvec(y_ref, w, d, changed),
            (y_ref, d, changed), y,
        )  # fmt: skip
    else:  # one dense product: the input itself, or the changed differences
        e = jnp.where(full, x, jnp.where(changed, d, 0.0))
        y = jnp.where(full, 0.0, y_ref) + exact(e.reshape(lhs.shape).astype(lhs.dtype))
    state = (jnp.where(changed | full, x, x_ref), y, scale)
    fraction = jnp.where(full, 0.0, 1.0 - count / k).astype(jnp.float32)
    out = y.reshape(eqn.outvars[0].aval.shape).astype(eqn.outvars[0].aval.dtype)
    return state, fraction, out


def _per_layer(analysis, n_layers: int, value: Callable[[Any, Any, Any], Any]) -> tuple:
    """``value(analysis, eqn, info)`` for each layer's equation, in layer order."""
    out: list = [None] * n_layers

    def walk(an):
        for eqn, info in zip(an.jaxpr.jaxpr.eqns, an.eqns):
            if info.sub is not None:
                walk(info.sub)
            elif info.layer is not None:
                out[info.layer] = value(an, eqn, info)

    walk(analysis)
    return tuple(out)


def _layers_reading_cache(analysis, n_layers: int, impl: str) -> tuple[bool, ...]:
    """Per layer, whether its kernel reads a cache (`kernels.reads_cache`)."""
    return _per_layer(analysis, n_layers, lambda an, eqn, info: kernels.reads_cache(eqn, impl))


def _reads_frame(analysis, n_layers: int) -> tuple[bool, ...]:
    """Per layer, whether its input is computed from the frame with no reused
    layer in between (the stem, or the first layers of parallel stems).

    Data flow through the jaxpr: a variable is "behind a layer" when a layer's
    output reaches it; sub-jaxprs (``pjit``, custom derivatives) pass it from
    their operands to their parameters and back from their results.
    """
    out = [False] * n_layers

    def walk(an, behind_in: Sequence[bool]) -> list[bool]:
        jaxpr = an.jaxpr.jaxpr
        behind = {v for v, b in zip(jaxpr.invars, behind_in, strict=True) if b}

        def is_behind(v) -> bool:
            return isinstance(v, jcore.Var) and v in behind

        for eqn, info in zip(jaxpr.eqns, an.eqns):
            ins = [is_behind(v) for v in eqn.invars]
            if info.sub is not None:
                sub_in = info.sub.jaxpr.jaxpr.invars
                if len(sub_in) == len(ins):
                    outs = walk(info.sub, ins)
                else:  # operands we cannot pair up: everything inside counts as behind
                    outs = walk(info.sub, [True] * len(sub_in))
                    outs = [o or any(ins) for o in outs]
            elif info.layer is not None:
                out[info.layer] = not ins[0]
                outs = [True] * len(eqn.outvars)
            else:
                outs = [any(ins)] * len(eqn.outvars)
            behind.update(v for v, b in zip(eqn.outvars, outs, strict=False) if b)
        return [is_behind(v) for v in jaxpr.outvars]

    walk(analysis, [False] * len(analysis.jaxpr.jaxpr.invars))
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class _Deferred:
    """A chain's layer (`_conv_chains`) whose output is computed with the
    chain's last layer: what the interpreter holds in place of that output
    (not an array, nor a pytree, so that any other use of it fails loudly)."""

    eqn: Any
    invals: list
    epilogue: Any


def _conv_chains(analysis) -> dict[int, tuple[int, int, int]]:
    """Per layer in an inverted-residual chain (`dcjax.kernels.chain`), the
    chain's layers (expansion, depthwise, projection).

    A chain is three layers of the top-level jaxpr: a 1x1 expansion (stride 1,
    no padding, ungrouped), a depthwise layer (one group per channel) and a
    1x1 projection, where the variable each of the first two layers' epilogues
    ends in (the layer's output without one) is read by the next layer alone
    and is not an output of the model, and those two epilogues read no other
    pixel values. `kernels.chain.chain_pays` decides on the projection's output
    size. Layers inside calls (``pjit`` and the like) are left alone.
    """
    jaxpr = analysis.jaxpr.jaxpr
    eqns, infos = jaxpr.eqns, analysis.eqns
    users: dict[Any, list[int]] = {}
    for j, e in enumerate(eqns):
        for v in e.invars:
            if isinstance(v, jcore.Var):
                users.setdefault(v, []).append(j)
    model_outs = {v for v in jaxpr.outvars if isinstance(v, jcore.Var)}

    def end(i: int):
        info = infos[i]
        return eqns[info.epilogue[-1]].outvars[0] if info.epilogue else eqns[i].outvars[0]

    def next_layer(i: int) -> int | None:
        v = end(i)
        readers = users.get(v, [])
        if v in model_outs or len(readers) != 1:
            return None
        j = readers[0]
        return j if infos[j].layer is not None and eqns[j].invars[0] is v else None

    def reads_no_pixels(i: int) -> bool:
        inside = {eqns[i].outvars[0]}
        for j in infos[i].epilogue:
            for u, sig in zip(eqns[j].invars, infos[j].in_sigs, strict=True):
                if isinstance(u, jcore.Var) and u not in inside and sig is not None:
                    return False
            inside.add(eqns[j].outvars[0])
        return True

    def conv(e, depthwise: bool) -> bool:
        p = e.params
        if not plain_conv(p) or p["precision"] is not None:
            return False
        kh, kw, cig, cout = e.invars[1].aval.shape
        cin = e.invars[0].aval.shape[-1]
        if depthwise:
            return cig == 1 and p["feature_group_count"] == cin == cout
        return (
            (kh, kw) == (1, 1)
            and p["feature_group_count"] == 1
            and tuple(p["window_strides"]) == (1, 1)
            and tuple(map(tuple, p["padding"])) == ((0, 0), (0, 0))
        )

    chains: dict[int, tuple[int, int, int]] = {}
    for i, info in enumerate(infos):
        if info.layer is None or info.layer in chains or not conv(eqns[i], False):
            continue
        j = next_layer(i)
        k = next_layer(j) if j is not None else None
        if k is None or not (conv(eqns[j], True) and conv(eqns[k], False)):
            continue
        if not (reads_no_pixels(i) and reads_no_pixels(j)):
            continue
        if not chain_lib.chain_pays(tuple(eqns[k].outvars[0].aval.shape[1:3])):
            continue
        members = (info.layer, infos[j].layer, infos[k].layer)
        chains.update(dict.fromkeys(members, members))
    return chains


def _shared_inputs(analysis, n_layers: int, refined: tuple[bool, ...] | None) -> tuple[int, ...]:
    """Per layer, the first refined layer that reads the same input variable
    (itself when none does, and for layers that are not refined).

    Equal inputs give equal tests (same values, reference, scale and validity),
    so only the first layer of each group keeps a reference (ResNet's first
    block of a stage feeds ``conv1`` and ``downsample`` from one map; an
    inception module feeds three branches).
    """
    inputs = _per_layer(analysis, n_layers, lambda an, eqn, info: eqn.invars[0])
    owner: list[int] = list(range(n_layers))
    first: dict[int, int] = {}
    for i, var in enumerate(inputs):
        if refined is None or not refined[i] or not isinstance(var, jcore.Var):
            continue
        owner[i] = first.setdefault(id(var), i)
    return tuple(owner)


def _layer_epilogues(analysis, n_layers: int) -> tuple[tuple[str, ...], ...]:
    """Per layer, the primitive names of its epilogue chain (`signatures`)."""
    return _per_layer(
        analysis,
        n_layers,
        lambda an, eqn, info: tuple(an.jaxpr.jaxpr.eqns[j].primitive.name for j in info.epilogue),
    )


@jax.custom_batching.custom_vmap
def _trips(skip: jax.Array) -> jax.Array:
    """Trips of the step's loop: 0 for a skipped (still) frame, else 1.

    Under `jax.vmap` over streams the count is 1 when any stream's frame is
    not still, for all streams: the full step computes what skipping would
    for the still ones, so no per-stream select (a copy of every cache) is
    needed.
    """
    return (~skip).astype(jnp.int32)


@_trips.def_vmap
def _trips_vmap(axis_size, in_batched, skip):
    del axis_size
    trips = jnp.any(~skip) if in_batched[0] else ~skip
    return trips.astype(jnp.int32), False


def _shift(a: jax.Array, dy: jax.Array, dx: jax.Array, axes: tuple[int, int]) -> jax.Array:
    """``out[i, j] = a[i + dy, j + dx]`` (wrapping; callers mask what leaves the map).

    A zero shift, the common case of a fixed camera, returns ``a`` untouched:
    the roll sits in a loop whose trip count is 0 or 1. A ``lax.cond`` with an
    identity branch would not do: XLA:CPU copies a conditional's pass-through
    operand into its result buffer, which cost ~15 ms a frame on ResNet-50
    (76.9 -> 62.6 ms, ``dcjax bench --models resnet50 --videos vtest``), while
    a loop carry keeps its buffer, so the kernels update the cache in place.
    Off CPU the roll runs unconditionally (`dcjax._loops.skipping_pays`).
    """
    if not skipping_pays():  # on GPU a roll costs less than the loop's test
        return jnp.roll(a, (-dy, -dx), axis=axes)
    moved = ((dy != 0) | (dx != 0)).astype(jnp.int32)
    return lax.fori_loop(0, moved, lambda _, a: jnp.roll(a, (-dy, -dx), axis=axes), a)


def _expand(mask: jax.Array, ndim: int, axes: tuple[int, int]) -> jax.Array:
    """Insert unit axes so a (H, W) mask broadcasts against a rank-`ndim` value."""
    shape = [1] * ndim
    shape[axes[0]], shape[axes[1]] = mask.shape
    if axes[0] > axes[1]:
        mask = mask.T
    return mask.reshape(shape)


def transform(
    model: Any,
    variables: Any,
    *,
    frame_shape: tuple[int, int, int],
    config: Config | None = None,
    preprocess: Callable[[jax.Array], jax.Array] | None = None,
    input_dtype: Any = jnp.float32,
) -> CachedModel:
    """Compile ``model`` into a cached per-frame step.

    Args:
        model: a `flax.linen.Module` (called as ``model.apply(variables, x)``)
            or a callable ``fn(variables, x)``; ``x`` has a leading batch axis.
        variables: the model's variables (params, batch stats, ...).
        frame_shape: ``(H, W, C)`` of the frames.
        config: a `Config`; default ``Config()``.
        preprocess: per-pixel function from a raw ``(H, W, C)`` frame to the
            model's input; default divides uint8 frames by 255.
        input_dtype: dtype the model is traced with.

    Returns:
        A `CachedModel` with ``init``, ``step``, ``run``, ``apply`` and
        ``layers``.
    """
    return CachedModel(
        model,
        variables,
        frame_shape=frame_shape,
        config=Config() if config is None else config,
        preprocess=preprocess,
        input_dtype=input_dtype,
    )
