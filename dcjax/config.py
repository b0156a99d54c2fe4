"""Frozen, keyword-only configuration dataclasses for every dcjax knob.

Every field is validated on construction, cross-field rules included, so that a
bad value fails where it is written, with a message that names the field and
the fix. The option lists come from the subsystems that own them:
`dcjax.kernels.IMPLS` (``kernel``), `dcjax.matching.MATCHERS` (``matcher``,
each with its typed options), `dcjax.matching.KEYS` (``key``),
`dcjax.matching.COLORS` (``color``), `dcjax.transforms.motion.ALIGNMENTS`
(``alignment``), `dcjax.transforms.refine.METRICS` (``RefineConfig.metric``)
and `dcjax.transforms.trace.COMPUTE_DTYPES` (``compute_dtype``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from dcjax._checks import check as _check
from dcjax.kernels import IMPLS
from dcjax.kernels.tuning import TUNINGS
from dcjax.matching.matcher import COLORS, KEYS, MATCHERS, matcher_options
from dcjax.transforms.guard import GuardConfig
from dcjax.transforms.motion import ALIGNMENTS
from dcjax.transforms.refine import METRICS
from dcjax.transforms.trace import COMPUTE_DTYPES

__all__ = ["Config", "GuardConfig", "RefineConfig", "SemanticConfig"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SemanticConfig:
    """Semantic-memory early exits (SMTM, Li et al., MM '21), see `dcjax.semantic`.

    After each exit point the step computes the semantic vector (global
    average pooling over space), its cosine similarity with the centres of the
    classes in the fast memory, the cumulative similarity SA (weights
    ``2**(l-1)``, Eq. 3) and the confidence AC (Eq. 4); when ``AC > tau`` the
    rest of the network is skipped and the output is the stored mean output of
    the matched class.

    Attributes:
        exit_points: names of the submodules whose outputs are exit points
            (``"block3"``, or nested ``"block3/project"``), or of the
            `dcjax.exit_point` marks of a plain function. ``None``: every
            top-level submodule (every mark) whose output is followed by more
            convolutions.
        tau: exit threshold on AC. ``inf`` never exits; ``-inf`` always exits at
            the first exit point (once two classes have centres). It is the
            initial ``state.semantic.tau``, which can be changed per stream at
            run time without recompiling.
        window: W of the time-stamp decay ``0.25 ** floor(TS / W)`` (Eq. 5), in
            frames.
        confidence: the fast memory holds the fewest top-scoring classes whose
            share of the total score reaches this (Eq. 6).
        max_fast: most classes in the fast memory (at least 2).
        adapt_centres: update the centres of the predicted class after every
            frame (Eq. 7).
        batch_axis: the ``axis_name`` of a `jax.vmap` over streams; when set, a
            batch exits only when every stream passes its test, so the rest of
            the network is really skipped (without it, `vmap` turns the
            conditionals into selects and computes every branch).
        max_exits: at most this many consecutive exits; the next frame runs
            the full network and checks the last exit's class
            (`dcjax.semantic.guard`).
        min_agreement: the share of exits that must agree with the full
            model: on the images `calibrate` holds back, and on the checks of
            a running stream; below it the stream runs without exits and says
            so (a warning at calibration, ``info["exits_enabled"]``).
        holdout: the share of `calibrate`'s images held back to check the
            memory's exits (`dcjax.semantic.check`); 0 checks nothing.
    """

    exit_points: tuple[str, ...] | None = None
    tau: float = 0.5
    window: int = 10
    confidence: float = 0.95
    max_fast: int = 10
    adapt_centres: bool = True
    batch_axis: str | None = None
    max_exits: int = 10
    min_agreement: float = 0.9
    holdout: float = 0.25

    def __post_init__(self) -> None:
        if isinstance(self.exit_points, list):
            object.__setattr__(self, "exit_points", tuple(self.exit_points))
        _check(
            self.exit_points is None
            or (
                isinstance(self.exit_points, tuple)
                and len(self.exit_points) > 0
                and all(isinstance(n, str) and n for n in self.exit_points)
            ),
            "SemanticConfig.exit_points must be None or a non-empty tuple of submodule names, "
            f"got {self.exit_points!r}",
        )
        _check(
            isinstance(self.tau, (int, float)) and not math.isnan(self.tau),
            f"SemanticConfig.tau must be a number (inf never exits), got {self.tau!r}",
        )
        _check(
            isinstance(self.window, int) and self.window >= 1,
            f"SemanticConfig.window must be a positive int (frames), got {self.window!r}",
        )
        _check(
            isinstance(self.confidence, (int, float)) and 0.0 < self.confidence <= 1.0,
            f"SemanticConfig.confidence must be in (0, 1], got {self.confidence!r}",
        )
        _check(
            isinstance(self.max_fast, int) and self.max_fast >= 2,
            f"SemanticConfig.max_fast must be an int >= 2, got {self.max_fast!r}",
        )
        _check(
            self.batch_axis is None or isinstance(self.batch_axis, str),
            f"SemanticConfig.batch_axis must be None or a vmap axis name, got {self.batch_axis!r}",
        )
        _check(
            isinstance(self.max_exits, int) and not isinstance(self.max_exits, bool)
            and self.max_exits >= 1,
            f"SemanticConfig.max_exits must be an int >= 1, got {self.max_exits!r}",
        )  # fmt: skip
        _check(
            isinstance(self.min_agreement, (int, float)) and 0.0 <= self.min_agreement <= 1.0,
            f"SemanticConfig.min_agreement must be in [0, 1], got {self.min_agreement!r}",
        )
        _check(
            isinstance(self.holdout, (int, float)) and 0.0 <= self.holdout <= 0.5,
            f"SemanticConfig.holdout must be in [0, 0.5], got {self.holdout!r}",
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class RefineConfig:
    """Bounded-error refinement of reuse masks inside the network.

    At the input of every refined convolution, a pixel whose value changed by
    less than ``delta * scale_l`` since the layer's reference copy counts as
    reusable too (see `dcjax.transforms.refine` for the rule and the error
    bound). ``delta=0`` is plain DeepCache.

    Attributes:
        delta: the one knob, relative to each layer's activation scale.
        metric: per-pixel change over channels: ``"max_abs"`` (max of
            ``|x_t - ref|``) or ``"rms"``.
        layers: ``"auto"`` (layers where the test costs less than the
            convolution work it can save), ``"all"``, or a tuple of layer names.
    """

    delta: float = 0.05
    metric: str = "max_abs"
    layers: str | tuple[str, ...] = "auto"

    def __post_init__(self) -> None:
        _check(
            isinstance(self.delta, (int, float)) and self.delta >= 0 and math.isfinite(self.delta),
            f"RefineConfig.delta must be a finite number >= 0, got {self.delta!r}",
        )
        _check(
            self.metric in METRICS,
            f"RefineConfig.metric must be one of {METRICS}, got {self.metric!r}",
        )
        _check(
            self.layers in ("auto", "all")
            or (isinstance(self.layers, tuple) and all(isinstance(n, str) for n in self.layers)),
            f"RefineConfig.layers must be 'auto', 'all' or a tuple of layer names, "
            f"got {self.layers!r}",
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """How `deepcache.transform` matches frames and reuses work.

    Attributes:
        block_size: side in pixels of the square blocks the matcher compares.
        psnr_threshold: a block is reusable when its PSNR (dB) against the
            key frame (see ``key``) at the global motion is above this.
            ``inf`` never reuses.
        max_pixel_change: a per-pixel cap on what a reusable block may hide:
            inside a block that passes ``psnr_threshold``, a pixel whose value
            on the matcher's planes (luma, or any colour with ``color="rgb"``)
            differs from the key's at the global motion by more than this
            fraction of the data range is not reused (nor what its windows
            reach inside the network). A block's PSNR averages its pixels, so
            a small object that moves inside a still block (a face a few
            pixels tall) can pass the block test; this catches it. None (the
            default): blocks only, as in the paper. In [0, 1]; the scene-cut
            test (``min_match``) still counts whole blocks.
        pixel_change_size: with ``max_pixel_change``, the side of the smallest
            square of pixels over the cap that is not reused: the pixels over
            it are opened by that square, so isolated ones (compression noise,
            which every convolution would widen into a hole in each layer's
            reuse) are still reused, and a change of at least that square (an
            object's) is not. 1 (the default) drops every pixel over the cap.
        key: what the matcher compares each frame with (`dcjax.matching.KEYS`).
            ``"reference"`` (the default): the pixels the caches were computed
            from, i.e. the previous key shifted by the motion where the frame
            was reused and the frame itself elsewhere; every reused block is
            then within the threshold of the pixels its cached features come
            from, however many frames it has been reused for. ``"previous"``:
            the previous frame, as in the paper, where a slow change that
            passes the test frame after frame accumulates in the caches until
            the next refresh.
        refresh_every: recompute everything every this many frames (the first
            frame always is); ``None`` refreshes only on scene cuts.
        refresh_bands: spread each periodic refresh over this many frames,
            the last ``refresh_bands`` of the period: on each of them one
            horizontal band of ``1/refresh_bands`` of the input's rows is
            computed afresh (its pixels are not reused, whatever the matcher
            says), top band first, so that every input pixel is recomputed
            once a period without a frame that computes everything (a video
            codec's intra refresh). 1 (the default): the whole frame at once.
            Every layer recomputes the positions over the band's rows, and
            with ``refine`` their references restart there, as a full
            refresh restarts them everywhere. Scene cuts, bad frames and the
            first frame still refresh in full; needs ``refresh_every`` of at
            least ``refresh_bands``.
        min_match: when fewer than this fraction of blocks match (scene cut,
            bad frame), the frame is recomputed in full.
        alignment: ``"exact"`` reuses a layer only when the motion divided by
            the layer's cumulative stride is an integer (results equal a full
            recompute); ``"round"`` rounds the shift, as the paper does.
        kernel: sparse-update implementation of reused convolutions, one of
            `dcjax.kernels.IMPLS` (see `dcjax.kernels.masked_conv`):
            ``"auto"`` (chosen per backend and layer, `dcjax.kernels.auto`),
            ``"xla"`` (tile gather, batched convolution, scatter), ``"rows"``
            (dirty pixels as matrix rows, one matmul; depthwise and
            many-group layers use ``"xla"``), ``"pallas"`` (the Pallas kernel
            of the backend; interpreted on CPU), ``"pallas_gpu"``,
            ``"pallas_tpu"``, ``"dense"`` (compute everything, no select) or
            ``"reference"`` (dense then select: the oracle).
        matcher: one of `dcjax.matching.MATCHERS`: ``"diamond"`` (the
            default: diamond search, DeepCache Section 4), ``"static"``
            (same-position blocks), ``"three_step"``, ``"exhaustive"``,
            ``"histogram"`` (DeepMon), or ``"none"`` (no input reuse: with
            ``refine`` a DeltaCNN-like baseline).
        matcher_options: the matcher's options: a mapping, turned into its
            typed record on construction (`dcjax.matching.matcher_options`:
            `SearchOptions` for the motion searches, `HistogramOptions`), or
            the record itself. The motion searches default to
            ``prejudge=True`` (`dcjax.matching.block`, "Zero-motion
            prejudgement"); ``{"prejudge": False}`` searches every frame, as
            the paper does.
        color: ``"luma"`` or ``"rgb"``: which planes the matcher's PSNR uses.
        data_range: peak value for PSNR; default 255 for integer frames and
            1.0 for float frames (float frames with values beyond 1.0 are then
            refused, since they would never match).
        semantic: semantic-memory early exits (`SemanticConfig`); ``None`` (the
            default) disables them.
        refine: bounded-error refinement of reuse masks inside the network
            (`RefineConfig`); ``None`` (the default) is plain DeepCache. Not
            with ``semantic`` yet.
        fuse_epilogues: cache each reused convolution together with the
            per-channel elementwise chain after it (batch norm, bias,
            activation, a residual add), so that reused pixels skip that
            chain too and no separate pass over the map is left for it (see
            `dcjax.kernels.Epilogue`). Off whatever this says with the Pallas
            TPU kernel or semantic exits.
        fuse_blocks: compute each inverted-residual block (1x1 expansion,
            depthwise, 1x1 projection) on dirty output tiles as one, caching
            only the projection (`dcjax.kernels.chain`), on CPU where its map
            is large enough (`dcjax.kernels.chain.chain_pays`); other layers
            as ``kernel`` says. Needs ``kernel="auto"`` and
            ``fuse_epilogues``, and is not combined with ``refine`` or
            ``semantic``. Off by default: reused block outputs cost top-1
            agreement on near-tied classifiers (docs/performance-notes.md).
            The step's ``flops_ratio`` counts a chain's layers by their own
            masks; the chain computes more (each dirty tile's window with its
            halo).
        skip_unchanged: when every input pixel is reusable and the motion is
            zero (a still scene), return the previous output and keep every
            cache as it is, without running the network: every layer's mask
            is then all reusable, and a reusable output may take its cached
            value (the kernels' contract), so the result is DeepCache's. It
            saves the work DeepCache cannot skip layer by layer (small layers
            computed densely, pooling, normalisation, fully connected
            layers). Not with semantic exits, nor for a model with primitives
            the analysis does not cover, nor when a refined layer reads the
            frame (its change test, not the matcher, decides what is still).
            On by default, on every backend.
        dense_updates: update each large fully connected layer by the weight
            rows of the inputs that changed since the last frame (``x !=
            x_ref``, `dcjax.kernels.matvec`) instead of multiplying its whole
            weight matrix again. Exact reuse: the result equals the full
            product up to the float32 rounding of the updates added since the
            last full product, which every refresh, every frame with more
            than `dcjax.transforms.refine.DENSE_FRACTION` of the inputs
            changed, and every `dcjax.transforms.refine.DENSE_REANCHOR_EVERY`
            frames (a schedule per layer, also with ``refresh_every=None``)
            recompute. The layers are those ``RefineConfig(layers=
            "auto")`` refines (`dcjax.transforms.refine.auto_dense`). On CPU
            only (on GPU and TPU the masked product would cost the full one),
            and not with semantic exits. With ``refine`` the refined layers
            count these elements as unchanged too, so that
            ``RefineConfig(delta=0)`` is plain DeepCache.
        tuning: how ``kernel="auto"`` picks each layer's kernel, one of
            `dcjax.kernels.tuning.TUNINGS`: ``"measure"`` times the candidate
            kernels of every layer on this machine when the model is
            transformed (all of them on each class of layers' largest layer,
            the kinds that won there on the others: `dcjax.kernels.probes`;
            once per machine and layer shape: the measurements are kept in
            `dcjax.kernels.tuning.default_path`) and, where no
            layer's savings pay for the matcher, runs the dense step with only
            the still-frame skip (`dcjax.autotune`); ``"prior"`` takes the
            fixed rules of `dcjax.kernels.auto`. None (the default) reads
            ``$DCJAX_TUNING``, else ``"measure"``. Only with ``kernel="auto"``.
        statistics: report each layer's reuse fraction and the frame's FLOP
            ratio in the step's ``info`` (the default). They need every
            layer's reuse mask, which a layer computed in full does not
            otherwise use, so their propagation is work the step does for the
            report alone. With ``False``, ``info["reuse_fraction"]`` and
            ``info["flops_ratio"]`` are NaN except on still frames (skipped:
            every layer reused, nothing computed); outputs and caches are the
            same. Semantic exits always report them.
        compute_dtype: the floating-point type the model runs in, one of
            `dcjax.transforms.trace.COMPUTE_DTYPES`: its floating variables
            and input are cast to it, so every layer and every cache has it
            (``"bfloat16"`` halves the caches' memory and, on GPUs and TPUs,
            runs on their low-precision units), and its floating outputs are
            returned as float32. None (the default): the model's own types.
            The measured tuning times the kernels in this type; the dense
            lowerings are measured for float32 layers only.
        guard: a `dcjax.transforms.guard.GuardConfig`: after each frame, the cells of
            one of the model's score maps above its threshold, widened by its
            margin, are recomputed on the next frame whatever the matcher and
            the refinement say (for a detector, the places near its decision
            threshold); None (the default): no guard.
    """

    block_size: int = 10
    psnr_threshold: float = 20.0
    max_pixel_change: float | None = None
    pixel_change_size: int = 1
    key: str = "reference"
    refresh_every: int | None = 10
    refresh_bands: int = 1
    min_match: float = 0.1
    alignment: str = "exact"
    kernel: str = "auto"
    matcher: str = "diamond"
    matcher_options: Any = None
    color: str = "luma"
    data_range: float | None = None
    semantic: SemanticConfig | None = None
    refine: RefineConfig | None = None
    fuse_epilogues: bool = True
    fuse_blocks: bool = False
    skip_unchanged: bool = True
    statistics: bool = True
    dense_updates: bool = True
    tuning: str | None = None
    compute_dtype: str | None = None
    guard: GuardConfig | None = None

    def __post_init__(self) -> None:
        _check(
            isinstance(self.block_size, int) and self.block_size >= 1,
            f"Config.block_size must be a positive int, got {self.block_size!r}",
        )
        _check(
            isinstance(self.psnr_threshold, (int, float)) and not math.isnan(self.psnr_threshold),
            f"Config.psnr_threshold must be a number (dB), got {self.psnr_threshold!r}",
        )
        _check(
            self.max_pixel_change is None
            or (
                isinstance(self.max_pixel_change, (int, float))
                and not isinstance(self.max_pixel_change, bool)
                and 0.0 <= self.max_pixel_change <= 1.0
            ),
            "Config.max_pixel_change must be None or a fraction of the data range in [0, 1], "
            f"got {self.max_pixel_change!r}",
        )
        _check(
            isinstance(self.pixel_change_size, int)
            and not isinstance(self.pixel_change_size, bool)
            and self.pixel_change_size >= 1,
            "Config.pixel_change_size must be an int >= 1 (a square's side in pixels), "
            f"got {self.pixel_change_size!r}",
        )
        _check(
            self.pixel_change_size == 1 or self.max_pixel_change is not None,
            "Config.pixel_change_size applies to the pixels over max_pixel_change; set "
            f"max_pixel_change too (pixel_change_size={self.pixel_change_size})",
        )
        _check(
            self.refresh_every is None
            or (isinstance(self.refresh_every, int) and self.refresh_every >= 1),
            f"Config.refresh_every must be a positive int or None, got {self.refresh_every!r}",
        )
        _check(
            isinstance(self.refresh_bands, int)
            and not isinstance(self.refresh_bands, bool)
            and self.refresh_bands >= 1,
            f"Config.refresh_bands must be a positive int, got {self.refresh_bands!r}",
        )
        _check(
            self.refresh_bands == 1
            or (self.refresh_every is not None and self.refresh_bands <= self.refresh_every),
            f"Config.refresh_bands={self.refresh_bands} spreads the periodic refresh over "
            f"that many frames of a period: it needs refresh_every >= {self.refresh_bands}, "
            f"got {self.refresh_every!r}",
        )
        _check(
            0.0 <= self.min_match <= 1.0,
            f"Config.min_match must be in [0, 1], got {self.min_match!r}",
        )
        _check(
            self.alignment in ALIGNMENTS,
            f"Config.alignment must be one of {ALIGNMENTS}, got {self.alignment!r}",
        )
        _check(self.key in KEYS, f"Config.key must be one of {KEYS}, got {self.key!r}")
        _check(
            self.tuning is None or self.tuning in TUNINGS,
            f"Config.tuning must be None or one of {TUNINGS}, got {self.tuning!r}",
        )
        _check(
            self.compute_dtype is None or self.compute_dtype in COMPUTE_DTYPES,
            f"Config.compute_dtype must be None or one of {COMPUTE_DTYPES}, "
            f"got {self.compute_dtype!r}",
        )
        _check(
            self.kernel in IMPLS,
            f"Config.kernel must be one of {IMPLS}, got {self.kernel!r}",
        )
        _check(
            self.matcher in MATCHERS,
            f"Config.matcher must be one of {tuple(MATCHERS)}, got {self.matcher!r}",
        )
        try:
            options = matcher_options(self.matcher, self.matcher_options)
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"dcjax: Config.matcher_options: {str(e).removeprefix('dcjax: ')}"
            ) from None
        object.__setattr__(self, "matcher_options", options)
        _check(
            self.color in COLORS,
            f"Config.color must be one of {COLORS}, got {self.color!r}",
        )
        _check(
            self.data_range is None or self.data_range > 0,
            f"Config.data_range must be positive or None, got {self.data_range!r}",
        )
        _check(
            self.semantic is None or isinstance(self.semantic, SemanticConfig),
            f"Config.semantic must be a SemanticConfig or None, got {self.semantic!r}",
        )
        for name in (
            "fuse_epilogues",
            "fuse_blocks",
            "skip_unchanged",
            "statistics",
            "dense_updates",
        ):
            value = getattr(self, name)
            _check(isinstance(value, bool), f"Config.{name} must be a bool, got {value!r}")
        if self.fuse_blocks:
            _check(
                self.kernel == "auto" and self.fuse_epilogues,
                "Config.fuse_blocks needs kernel='auto' and fuse_epilogues=True, got "
                f"kernel={self.kernel!r}, fuse_epilogues={self.fuse_epilogues!r}",
            )
            _check(
                self.refine is None and self.semantic is None,
                "Config.fuse_blocks cannot be combined with refine or semantic yet",
            )
        _check(
            self.guard is None or isinstance(self.guard, GuardConfig),
            f"Config.guard must be a GuardConfig or None, got {self.guard!r}",
        )
        _check(
            self.refine is None or isinstance(self.refine, RefineConfig),
            f"Config.refine must be a RefineConfig or None, got {self.refine!r}",
        )
        _check(
            self.refine is None or self.semantic is None,
            "Config.refine and Config.semantic cannot be combined yet; use one of them",
        )
