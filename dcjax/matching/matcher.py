"""The matchers a stream can use, by name: one table, one dispatch.

`MATCHERS` maps each matcher name to the frozen record of its options:

- ``"diamond"``, ``"three_step"``, ``"exhaustive"``: the motion searches of
  `dcjax.matching.block` (DeepCache Section 4), options `SearchOptions`;
- ``"static"``: same-position blocks, motion (0, 0) (`static_match`), no
  options;
- ``"histogram"``: DeepMon's same-position colour histograms
  (`histogram_match`), options `HistogramOptions`;
- ``"none"``: no input reuse (an all-false mask; only refinement can reuse).

`matcher_options(name, options)` turns a mapping (or an options record) into
the validated record of that matcher; an unknown key or a bad value is an
error naming it. `StreamMatcher` is what a stream runs per frame: it keeps the
key frame in the form its matcher reads (`key_of`: the matcher's planes for
the motion searches and the same-position matcher, so each frame is converted
once; the float32 frame for DeepMon's histograms; nothing for ``"none"``),
matches a frame against the key (`match`) and says which key the next frame
is matched against (`next_key`, by the policy of `KEYS`).

The contract of a `Match` is the one of `dcjax.matching` (docs/design.md,
"Matcher"): ``cur[y, x] ~ key[y + My, x + Mx]`` where the mask is true.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from dcjax._loops import shifted
from dcjax.matching.block import (
    DEFAULT_MAX_STEPS,
    DEFAULT_SEARCH_RANGE,
    SEARCHES,
    block_match,
    block_match_planes,
)
from dcjax.matching.histogram import histogram_match
from dcjax.matching.static import planes, psnr_peak, static_match, static_match_planes
from dcjax.matching.types import Match

__all__ = [
    "COLORS",
    "KEYS",
    "MATCHERS",
    "HistogramOptions",
    "NoOptions",
    "SearchOptions",
    "StreamMatcher",
    "matcher_options",
    "opened",
]

#: Which planes the PSNR is computed on: the luma plane or every colour channel.
COLORS = ("luma", "rgb")

#: What each frame is matched against: the pixels the caches were computed
#: from (``"reference"``), or the previous frame as the paper does.
KEYS = ("reference", "previous")


def _int_at_least(name: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"dcjax: matcher option {name} must be an int >= {least}, got {value!r}")
    return int(value)


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"dcjax: matcher option {name} must be a bool, got {value!r}")
    return bool(value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """Options of the motion searches (`dcjax.matching.block_match`).

    Attributes:
        max_steps: most large-diamond moves of the diamond search.
        k_skip: Step 2 searches only every ``k_skip``-th block row and column.
        reuse_scores: Step 4 reuses the SSDs Step 2 computed at the global motion.
        search_range: largest ``|dy|`` and ``|dx|`` searched.
        prejudge: after a frame without motion, take the zero vector without
            searching when more than half of the blocks pass the threshold
            there (`dcjax.matching.prejudge`).
            ``False`` searches every frame, as the paper does.
        all_vectors: every block's vector exact; ``False`` lets a steady
            search stop once the motion and the mask are settled (the step
            uses the motion and the mask only).
    """

    max_steps: int = DEFAULT_MAX_STEPS
    k_skip: int = 1
    reuse_scores: bool = True
    search_range: int = DEFAULT_SEARCH_RANGE
    prejudge: bool = True
    all_vectors: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_steps", _int_at_least("max_steps", self.max_steps, 0))
        object.__setattr__(self, "k_skip", _int_at_least("k_skip", self.k_skip, 1))
        object.__setattr__(
            self, "search_range", _int_at_least("search_range", self.search_range, 0)
        )
        for name in ("reuse_scores", "prejudge", "all_vectors"):
            object.__setattr__(self, name, _bool(name, getattr(self, name)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class HistogramOptions:
    """Options of DeepMon's histogram matcher (`dcjax.matching.histogram_match`).

    Attributes:
        grid: ``(gy, gx)`` cells down and across.
        bins: histogram bins per channel.
        distance_threshold: a cell is reused when its chi-square distance is
            below this.
    """

    grid: tuple[int, int] = (8, 8)
    bins: int = 16
    distance_threshold: float = 0.005

    def __post_init__(self) -> None:
        grid = self.grid
        if not isinstance(grid, (tuple, list)) or len(grid) != 2:
            raise ValueError(f"dcjax: matcher option grid must be (gy, gx), got {grid!r}")
        object.__setattr__(
            self, "grid", tuple(_int_at_least(f"grid[{i}]", g, 1) for i, g in enumerate(grid))
        )
        object.__setattr__(self, "bins", _int_at_least("bins", self.bins, 1))
        t = self.distance_threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0:
            raise ValueError(
                f"dcjax: matcher option distance_threshold must be a number >= 0, got {t!r}"
            )
        object.__setattr__(self, "distance_threshold", float(t))


@dataclasses.dataclass(frozen=True, kw_only=True)
class NoOptions:
    """The options of a matcher that takes none (``"static"``, ``"none"``)."""


#: Matcher name -> its options record.
MATCHERS: dict[str, type] = {
    "diamond": SearchOptions,
    "static": NoOptions,
    **{s: SearchOptions for s in SEARCHES if s != "diamond"},
    "histogram": HistogramOptions,
    "none": NoOptions,
}

Options = SearchOptions | HistogramOptions | NoOptions


def matcher_options(matcher: str, options: Mapping[str, Any] | Options | None = None) -> Options:
    """The validated options record of ``matcher`` from a mapping or a record.

    Raises:
        ValueError: an unknown matcher, an option the matcher does not take
            (naming it and those it takes), or a bad value.
    """
    if matcher not in MATCHERS:
        raise ValueError(f"dcjax: unknown matcher {matcher!r}; choose from {tuple(MATCHERS)}")
    kind = MATCHERS[matcher]
    if options is None:
        return kind()
    if isinstance(options, (SearchOptions, HistogramOptions, NoOptions)):
        if not isinstance(options, kind):
            raise ValueError(
                f"dcjax: matcher {matcher!r} takes {kind.__name__}, got {type(options).__name__}"
            )
        return options
    if not isinstance(options, Mapping):
        raise ValueError(
            f"dcjax: matcher options must be a mapping or {kind.__name__}, got {options!r}"
        )
    allowed = [f.name for f in dataclasses.fields(kind)]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        takes = ", ".join(allowed) if allowed else "no options"
        raise ValueError(
            f"dcjax: matcher {matcher!r} has no option {', '.join(map(repr, unknown))}; "
            f"it takes {takes}"
        )
    return kind(**options)


def opened(flags: jax.Array, size: int) -> jax.Array:
    """The morphological opening of the bool map ``flags`` (H, W) by a
    ``size`` x ``size`` square: the flags that lie in some square of ``size``
    all of whose pixels are flagged.

    An erosion then a dilation, each separable into ``size - 1`` shifted
    ANDs (ORs) along rows and then along columns: elementwise work that XLA
    fuses, where a windowed reduction is a slower loop on CPU
    (docs/performance-notes.md, "Isolated pixels over the cap")."""
    flags = jnp.asarray(flags, bool)
    h, w = flags.shape
    if size <= 1:
        return flags
    if size > min(h, w):  # no square fits
        return jnp.zeros(flags.shape, bool)
    k = size - 1

    def along(x: jax.Array, axis: int, op, forward: bool) -> jax.Array:
        # op over x[i], x[i + 1], ..., x[i + k] (forward) or x[i - k], ..., x[i],
        # reading False beyond the map
        n = x.shape[axis]
        pad = [(0, 0), (0, 0)]
        pad[axis] = (0, k) if forward else (k, 0)
        padded = jnp.pad(x, pad)
        out = x
        for d in range(1, size):
            start = d if forward else k - d
            out = op(out, lax.slice_in_dim(padded, start, start + n, axis=axis))
        return out

    # erosion anchored at the square's top-left pixel: no square that leaves
    # the map; then the dilation spreads each full square over its pixels
    eroded = along(along(flags, 1, jnp.logical_and, True), 0, jnp.logical_and, True)
    return along(along(eroded, 1, jnp.logical_or, False), 0, jnp.logical_or, False)


def _search_kwargs(options: SearchOptions) -> dict[str, Any]:
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class StreamMatcher:
    """How one stream's frames are matched (see the module docstring).

    Attributes:
        name: a key of `MATCHERS`.
        options: its options record (`matcher_options`).
        block_size: side in pixels of the square blocks compared.
        psnr_threshold: a block is reusable when its PSNR (dB) is above this.
        color: one of `COLORS`.
        data_range: PSNR peak; None for 255 (integer frames) or 1.0 (float).
        key: one of `KEYS`.
        max_change: a reusable pixel's largest change against the key at the
            global motion, as a fraction of the data range, on the matcher's
            planes (`Config.max_pixel_change`); None: no per-pixel test.
        change_size: the side of the smallest square of pixels over
            ``max_change`` that is not reused (`Config.pixel_change_size`):
            the pixels over the cap are opened morphologically by a
            ``change_size`` square, so an isolated pixel over it (compression
            noise) is still reused; 1 drops every pixel over the cap.
    """

    name: str
    options: Options
    block_size: int = 10
    psnr_threshold: float = 20.0
    color: str = "luma"
    data_range: float | None = None
    key: str = "reference"
    max_change: float | None = None
    change_size: int = 1

    @property
    def planes_key(self) -> bool:
        """Whether the key is kept as the matcher's planes (the motion searches
        and the same-position matcher)."""
        return self.name in SEARCHES or self.name == "static"

    def key_shape(self, frame_shape: tuple[int, int, int]) -> tuple[int, ...]:
        """Shape of the key of ``(H, W, C)`` frames: ``(C', H, W)`` planes or the
        frame's; ``(0,)`` for ``"none"``, which reads no key."""
        h, w, c = frame_shape
        if self.name == "none":
            return (0,)
        if not self.planes_key:
            return (h, w, c)
        return (1 if self.color == "luma" else c, h, w)

    def key_of(self, frame: jax.Array) -> jax.Array:
        """What of ``frame`` the key keeps: its planes, or the frame in float32
        (nothing for ``"none"``)."""
        if self.name == "none":
            return jnp.zeros((0,), jnp.float32)
        if self.planes_key:
            return planes(frame, self.color)
        return frame.astype(jnp.float32)

    def match(
        self, prev_key: jax.Array, frame: jax.Array, key: jax.Array, init_motion: jax.Array
    ) -> Match:
        """Match ``frame`` (whose `key_of` is ``key``) against the key ``prev_key``."""
        if not self.planes_key:
            return self.match_frames(prev_key.astype(frame.dtype), frame)
        peak = psnr_peak(frame.dtype, self.data_range)
        if self.name == "static":
            m = static_match_planes(
                prev_key, key, peak=peak, block_size=self.block_size,
                psnr_threshold=self.psnr_threshold,
            )  # fmt: skip
        else:
            m = block_match_planes(
                prev_key, key, peak=peak, search=self.name, init_motion=init_motion,
                block_size=self.block_size, psnr_threshold=self.psnr_threshold,
                color=self.color, **_search_kwargs(self.options),
            )  # fmt: skip
        return self._capped(m, prev_key, key, peak)

    def match_frames(self, prev: jax.Array, cur: jax.Array, init_motion: Any = (0, 0)) -> Match:
        """Match frame ``cur`` against frame ``prev`` (both ``(H, W, C)``, one dtype)."""
        m = self._match_frames(prev, cur, init_motion)
        if self.max_change is None or self.name == "none":
            return m
        peak = psnr_peak(cur.dtype, self.data_range)
        return self._capped(m, planes(prev, self.color), planes(cur, self.color), peak)

    def _capped(self, m: Match, prev_planes: jax.Array, cur_planes: jax.Array, peak) -> Match:
        """``m`` without the pixels that changed by more than `max_change` (the
        planes ``(C', H, W)`` of the key and of the frame), in squares of at
        least `change_size`."""
        if self.max_change is None:
            return m
        dy, dx = m.motion[0], m.motion[1]
        change = jnp.abs(cur_planes - shifted(prev_planes, dy, dx, (1, 2))).max(0)
        over = opened(change > self.max_change * peak, self.change_size)
        return dataclasses.replace(m, mask=m.mask & ~over)

    def _match_frames(self, prev: jax.Array, cur: jax.Array, init_motion: Any) -> Match:
        if self.name in SEARCHES:
            return block_match(
                prev, cur, search=self.name, init_motion=init_motion,
                block_size=self.block_size, psnr_threshold=self.psnr_threshold,
                color=self.color, data_range=self.data_range, **_search_kwargs(self.options),
            )  # fmt: skip
        if self.name == "static":
            return static_match(
                prev, cur, block_size=self.block_size, psnr_threshold=self.psnr_threshold,
                color=self.color, data_range=self.data_range,
            )  # fmt: skip
        if self.name == "histogram":
            o = self.options
            return histogram_match(
                prev, cur, grid=o.grid, bins=o.bins, distance_threshold=o.distance_threshold,
                data_range=self.data_range,
            )  # fmt: skip
        # "none": no input reuse
        return Match(
            motion=jnp.zeros((2,), jnp.int32),
            mask=jnp.zeros(cur.shape[:2], bool),
            match_ratio=jnp.float32(1.0),
        )

    def next_key(
        self, key: jax.Array, new: jax.Array, r0: jax.Array, motion: jax.Array
    ) -> jax.Array:
        """The key the next frame is matched against, from the current ``key``
        and the frame's `key_of` ``new``, given the frame's reuse mask ``r0`` and
        ``motion``.

        With ``"reference"``, reused pixels keep the key's value shifted by the
        motion (the pixel the caches hold the features of, since ``R0[y, x]``
        pairs ``frame[y, x]`` with ``key[y + My, x + Mx]``) and the others take
        the frame's: a block reused frame after frame is always compared with
        what its features were computed from, so a slow drift is caught once it
        exceeds the threshold instead of accumulating. With ``"previous"``, the
        frame itself; with ``"none"``, which reads no key, ``new`` (empty).
        """
        if self.key == "previous" or self.name == "none":
            return new
        if self.planes_key:  # (C', H, W)
            return jnp.where(r0[None], shifted(key, motion[0], motion[1], (1, 2)), new)
        return jnp.where(r0[..., None], shifted(key, motion[0], motion[1], (0, 1)), new)
