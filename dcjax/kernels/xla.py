"""XLA masked convolution: gather dirty tiles, one batched convolution, scatter.

Contract (see `dcjax.kernels.tiles` for the tile plan): the output equals
``lax.conv_general_dilated`` on every pixel of every dirty tile (so on every
pixel whose reuse flag is false) and equals ``cached`` bit for bit on every
pixel that no computed tile covers. The number of dirty tiles, pooled over the
batch, decides (`tiles.schedule`):

- more than ``dense_fraction`` of the tiles dirty: the dense convolution,
  every pixel fresh;
- otherwise the dirty tiles are listed (`dcjax._compact.compact`, of a static
  size, inside the sparse path's loop) and computed in steps of static sizes
  ``chunk * 2**j`` (`TilePlan.sizes`, largest first), each run when bit j of
  ``ceil(n_dirty / chunk)`` is set; each step gathers the input windows (tile
  plus halo) of its tiles from the padded input, runs one VALID convolution
  over that batch of windows and scatters the tiles into the output, which
  starts as ``cached`` (updated in place when the caller donates the cache
  buffer, e.g. a jitted step with donated state or a `lax.scan` carry;
  otherwise XLA copies the cache once). No dirty tile: no step, the output is
  ``cached``.

No path is a conditional branch: all are loops with dynamic trip counts of
zero or one (`sparse_or_dense`), because XLA:CPU copies a conditional's
pass-through operand, the whole cache.

Batched streams: the tiles of all N images are pooled into one list, so one
schedule (one set of loops) serves the batch. Under `jax.vmap`, a custom
batching rule folds the mapped axis into N instead of letting vmap batch the
trip counts, which would run every stream's loop as long as the longest one
(per-stream weights, which cannot be pooled, fall back to the dense reference
per stream).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from dcjax._loops import pinned, run_if
from dcjax.kernels import tiles as _tiles
from dcjax.kernels.geometry import ConvGeometry, Epilogue
from dcjax.kernels.reference import DIMENSION_NUMBERS, conv

__all__ = [
    "apply_epilogue",
    "conv_as_dot",
    "dense_conv",
    "dot_pays",
    "epilogue_parts",
    "gather_tiles",
    "gather_windows",
    "pooled",
    "pooled_over_streams",
    "rgb_pays",
    "scatter_tiles",
    "sparse_or_dense",
    "taps_pays",
    "valid_conv",
    "xla_masked_conv",
]


def gather_windows(xp: jax.Array, origins: jax.Array, p: _tiles.TilePlan) -> jax.Array:
    """Input windows (capacity, win_h, win_w, Cin) of the tiles at ``origins``.

    Args:
        xp: input padded by `tiles.pad_input`.
        origins: int32 (capacity, 3) rows (n, oy, ox) of output tile origins.
        p: the plan.
    """
    sy, sx = p.strides
    starts = jnp.stack(
        [origins[:, 0], origins[:, 1] * sy, origins[:, 2] * sx, jnp.zeros_like(origins[:, 0])],
        axis=1,
    )
    dnums = lax.GatherDimensionNumbers(
        offset_dims=(1, 2, 3),
        collapsed_slice_dims=(0,),
        start_index_map=(0, 1, 2, 3),
    )
    return lax.gather(
        xp,
        starts,
        dnums,
        slice_sizes=(1, p.win_h, p.win_w, p.cin),
        mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS,
    )


def scatter_tiles(out: jax.Array, origins: jax.Array, values: jax.Array) -> jax.Array:
    """Write tiles (capacity, th, tw, Cout) into ``out`` at ``origins`` (n, oy, ox)."""
    starts = jnp.concatenate([origins, jnp.zeros_like(origins[:, :1])], axis=1)
    dnums = lax.ScatterDimensionNumbers(
        update_window_dims=(1, 2, 3),
        inserted_window_dims=(0,),
        scatter_dims_to_operand_dims=(0, 1, 2, 3),
    )
    return lax.scatter(
        out,
        starts,
        values.astype(out.dtype),
        dnums,
        indices_are_sorted=True,
        unique_indices=False,
        mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS,
    )


def group_weights(w: jax.Array, p: _tiles.TilePlan, fast: bool) -> jax.Array | tuple:
    """``w``, or its per-group slices where `valid_conv` convolves group by group.

    The tile kernel calls it in `sparse_or_dense`'s ``prepare``, once a frame
    and only when the sparse path runs: sliced inside the sparse loop the
    weights were copied on every step, and sliced in a loop of their own they
    needed a zero-filled placeholder (docs/performance-notes.md, "Grouped
    weights are sliced once a frame, around the sparse loop (group_weights)").
    """
    g, cig = p.groups, w.shape[2]
    if not (fast and g > 1 and cig > 1):
        return w
    cog = p.cout // g
    return tuple(w[..., i * cog : (i + 1) * cog] for i in range(g))


def valid_conv(x: jax.Array, w: jax.Array | tuple, p: _tiles.TilePlan, fast: bool) -> jax.Array:
    """VALID convolution of ``x`` with the plan's strides, dilation and groups.

    With ``fast`` (used on CPU, where XLA's grouped convolution is slow) grouped
    convolutions are rewritten: depthwise ones (one input channel per group) as
    a sum over kernel taps of strided slices times per-channel weights, other
    grouped ones as one convolution per group, concatenated; ungrouped ones
    that `taps_pays` picks (3x3 on RGB to few outputs) as a sum over taps and
    input channels of a slice's channel times its row of weights. Same result as
    `lax.conv_general_dilated` up to fp rounding. ``w`` may be `group_weights`'
    per-group slices.
    """
    g = p.groups
    if isinstance(w, tuple):
        return _per_group(x, w, p)
    cig = w.shape[2]
    if fast and g > 1 and cig == 1:
        mult = p.cout // g
        if mult > 1:
            x = jnp.repeat(x, mult, axis=-1)
        out_dtype = jnp.result_type(x.dtype, w.dtype)
        return _tap_sum(
            x, p, lambda sl, ky, kx: sl.astype(out_dtype) * w[ky, kx, 0].astype(out_dtype)
        )
    if fast and g == 1 and taps_pays(p):
        out_dtype = jnp.result_type(x.dtype, w.dtype)
        acc = jnp.promote_types(out_dtype, jnp.float32)  # as a convolution accumulates

        def term(sl, ky, kx):  # (..., 1) input channel times its (Cout,) weights
            parts = [sl[..., c : c + 1].astype(acc) * w[ky, kx, c].astype(acc)
                     for c in range(p.cin)]  # fmt: skip
            return functools.reduce(operator.add, parts)

        return _tap_sum(x, p, term).astype(out_dtype)
    if fast and g > 1:
        return _per_group(x, group_weights(w, p, fast), p)
    if fast and rgb_pays(p):
        x, w = _rgb_padded(x, w)
    return lax.conv_general_dilated(
        x,
        w,
        window_strides=p.strides,
        padding="VALID",
        rhs_dilation=p.dilation,
        dimension_numbers=DIMENSION_NUMBERS,
        feature_group_count=g,
    )


def _tap_sum(x: jax.Array, p: _tiles.TilePlan, term: Callable[..., jax.Array]) -> jax.Array:
    """``sum over taps (ky, kx) of term(slice, ky, kx)``: a VALID convolution of
    ``x`` written as elementwise terms, ``slice`` the tap's strided (and
    dilated) view of ``x`` with the output's spatial shape. XLA fuses the sum
    into one pass over the output."""
    (sy, sx), (dy, dx) = p.strides, p.dilation
    n, hh, ww, c = x.shape
    oh = (hh - (p.kh - 1) * dy - 1) // sy + 1
    ow = (ww - (p.kw - 1) * dx - 1) // sx + 1
    acc = None
    for ky in range(p.kh):
        for kx in range(p.kw):
            sl = lax.slice(
                x,
                (0, ky * dy, kx * dx, 0),
                (n, ky * dy + (oh - 1) * sy + 1, kx * dx + (ow - 1) * sx + 1, c),
                (1, sy, sx, 1),
            )
            t = term(sl, ky, kx)
            acc = t if acc is None else acc + t
    return acc


def _per_group(x: jax.Array, ws: tuple, p: _tiles.TilePlan) -> jax.Array:
    """One VALID convolution per group (weights ``ws``), concatenated."""
    cig = ws[0].shape[2]
    parts = [
        lax.conv_general_dilated(
            x[..., i * cig : (i + 1) * cig],
            wi,
            window_strides=p.strides,
            padding="VALID",
            rhs_dilation=p.dilation,
            dimension_numbers=DIMENSION_NUMBERS,
        )
        for i, wi in enumerate(ws)
    ]
    return jnp.concatenate(parts, axis=-1)


def dot_pays(p: _tiles.TilePlan) -> bool:
    """Whether XLA:CPU runs ungrouped convolution ``p`` faster as `conv_as_dot`:
    every 1x1 convolution, and those on maps of at most 64 output pixels with
    at least 128 input channels.

    XLA:CPU's convolution (YNNPACK) is slow where the weight matrix is large
    against the map (docs/performance-notes.md, "Ungrouped 1x1 convolutions and
    small maps as a matrix product on CPU (dot_pays)").
    """
    if p.groups != 1:
        return False
    if p.kh * p.kw == 1:
        return True
    return p.ho * p.wo <= 64 and p.cin >= 128


def rgb_pays(p: _tiles.TilePlan) -> bool:
    """Whether XLA:CPU runs ungrouped convolution ``p`` faster with a fourth,
    zero input channel (`_rgb_padded`): 3 input channels and 17-32 outputs.

    XLA:CPU's convolution (YNNPACK) takes a slow path for 3-channel inputs with
    17 to 32 output channels (docs/performance-notes.md, "RGB inputs with 17-32
    outputs get a zero fourth channel on CPU (rgb_pays)").
    """
    return p.groups == 1 and p.cin == 3 and 16 < p.cout <= 32


#: Most multiply-adds per output value (``kh * kw * Cin``) of a convolution
#: that `taps_pays` computes as a sum of taps (3x3 on RGB).
TAPS_MAX_TERMS = 27

#: Most output channels of a convolution that `taps_pays` computes as a sum of
#: taps (docs/performance-notes.md, "3x3 RGB convolutions to at most 16 outputs
#: as a sum of taps on CPU (taps_pays)").
TAPS_MAX_COUT = 16


def taps_pays(p: _tiles.TilePlan) -> bool:
    """Whether XLA:CPU runs ungrouped convolution ``p`` faster as a fused sum
    of ``kh * kw * Cin`` elementwise terms (`valid_conv`'s tap path, summed in
    float32 at least): a kernel larger than 1x1 on at most `TAPS_MAX_TERMS`
    input values per output (3x3 on RGB; also 5x5 on one channel or 3x3 on
    two) with at most `TAPS_MAX_COUT` output channels.

    XLA:CPU's convolution (YNNPACK) is slow on RGB inputs with few output
    channels; larger kernels lose as a sum of taps, and 1x1 convolutions are
    matrix products (`dot_pays`). See docs/performance-notes.md, "3x3 RGB
    convolutions to at most 16 outputs as a sum of taps on CPU (taps_pays)".
    """
    return (
        p.groups == 1
        and p.kh * p.kw > 1
        and p.kh * p.kw * p.cin <= TAPS_MAX_TERMS
        and p.cout <= TAPS_MAX_COUT
    )


def _rgb_padded(x: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``x`` and ``w`` with a zero fourth input channel: the same convolution."""
    x = jnp.pad(x, ((0, 0),) * 3 + ((0, 1),))
    return x, jnp.pad(w, ((0, 0), (0, 0), (0, 1), (0, 0)))


def conv_as_dot(x: jax.Array, w: jax.Array, p: _tiles.TilePlan) -> jax.Array:
    """An ungrouped convolution as one matrix product of the input's patches.

    The padded input's ``kh * kw`` strided (and dilated) slices, concatenated
    along the channels, are the rows of an ``(N Ho Wo, kh kw Cin)`` matrix; the
    weights reshaped to ``(kh kw Cin, Cout)`` multiply it. Same result as
    `lax.conv_general_dilated` up to fp rounding.
    """
    xp = _tiles.pad_input(x, p)
    (sy, sx), (dy, dx) = p.strides, p.dilation
    n = xp.shape[0]
    taps = [
        lax.slice(
            xp,
            (0, ky * dy, kx * dx, 0),
            (n, ky * dy + (p.ho - 1) * sy + 1, kx * dx + (p.wo - 1) * sx + 1, p.cin),
            (1, sy, sx, 1),
        )
        for ky in range(p.kh)
        for kx in range(p.kw)
    ]
    cols = taps[0] if len(taps) == 1 else jnp.concatenate(taps, axis=-1)
    rows = cols.reshape(n * p.ho * p.wo, p.kh * p.kw * p.cin)
    out = rows @ w.reshape(p.kh * p.kw * p.cin, p.cout)
    return out.reshape(n, p.ho, p.wo, p.cout)


def dense_conv(x: jax.Array, w: jax.Array, p: _tiles.TilePlan) -> jax.Array:
    """The whole convolution; on CPU grouped ones and those `taps_pays` picks by
    `valid_conv`'s fast path, ungrouped ones as a matrix product where
    `dot_pays` and with a zero input channel where `rgb_pays`."""
    out_dtype = jnp.result_type(x.dtype, w.dtype)
    if jax.default_backend() == "cpu" and (p.groups > 1 or taps_pays(p)):
        return valid_conv(_tiles.pad_input(x, p), w, p, True).astype(out_dtype)
    if jax.default_backend() == "cpu" and dot_pays(p):
        return conv_as_dot(x, w, p).astype(out_dtype)
    if jax.default_backend() == "cpu" and rgb_pays(p):
        x, w = _rgb_padded(x, w)
    return lax.conv_general_dilated(
        x,
        w,
        window_strides=p.strides,
        padding=p.pads,
        rhs_dilation=p.dilation,
        dimension_numbers=DIMENSION_NUMBERS,
        feature_group_count=p.groups,
    ).astype(out_dtype)


def sparse_or_dense(cached, units, sizes, step, use_dense, dense, operands, prepare=None):
    """A sparse kernel's output, built without `lax.cond`.

    ``out = cached``; then, for each step size in ``sizes`` (largest first, the
    `dcjax._loops.halving_sizes` of the kernel's smallest step) whose bit is
    set in ``units`` (the work in smallest steps), ``out = step(out, start,
    size, *operands)`` with ``start`` the number of slots the earlier steps
    took; then, if ``use_dense``, ``out = dense(*operands)``. Every step and
    the dense path are `lax.fori_loop` with a dynamic trip count of zero or
    one, because on XLA:CPU a conditional copies the operand a branch passes
    through into its result buffer (the whole cache, on every frame), while
    loop carries keep their buffer, so the cache is updated in place
    (docs/performance-notes.md, "No lax.cond between the sparse and the dense
    path (sparse_or_dense)").

    Halving steps rather than a loop over fixed chunks: on XLA:CPU one big
    batched convolution or matrix product runs faster than several small ones,
    and the steps pad less than one smallest step (docs/performance-notes.md,
    "Halving steps instead of a loop of fixed chunks (tile kernel)").

    Inside the loops the operands go through an optimization barrier tied to
    the loop counter: XLA hoists loop-invariant work out of loops, and the
    dense body (which does not depend on the step) or a step body (whose slice
    does not either) then ran unconditionally.

    ``prepare(*operands)``, if given, returns the operands of ``step`` (the
    list of dirty pixels or tiles, the padded input, slices of the weights);
    it runs once, before the first step, in a loop of zero or one trip around
    the steps, so it costs nothing on a frame with no step to run (nothing
    dirty, or the dense path) and is not repeated for each step
    (docs/performance-notes.md, "The dirty list is built once a frame inside
    the sparse path (prepare)").
    """

    operands = tuple(operands)
    smallest = sizes[-1]

    def sparse(out, *ops):
        if prepare is not None:
            ops = tuple(prepare(*ops))
        start = jnp.int32(0)
        for size in sizes:
            bit = (units // (size // smallest)) % 2
            out = lax.fori_loop(
                0, bit,
                lambda i, out, start=start, size=size: step(out, start, size, *pinned(ops, i)),
                out,
            )  # fmt: skip
            start = start + bit * size
        return out

    ran = (units > 0).astype(jnp.int32)
    out = lax.fori_loop(0, ran, lambda j, out: sparse(out, *pinned(operands, j)), cached)
    return run_if(use_dense, lambda *ops: dense(*ops).astype(out.dtype), operands, out)


def apply_epilogue(
    fn: Callable[..., jax.Array] | None, y: jax.Array, ops: tuple, pix: tuple = ()
) -> jax.Array:
    """``fn(y, *ops, *pix)``, or ``y`` without an epilogue (see `dcjax.kernels.Epilogue`).

    ``pix`` are the epilogue's pixel operands already cut to ``y``'s pixels.
    """
    return y if fn is None else fn(y, *ops, *pix)


def gather_tiles(a: jax.Array, origins: jax.Array, th: int, tw: int) -> jax.Array:
    """Tiles (capacity, th, tw, C) of an output-shaped ``a`` at ``origins`` (n, oy, ox)."""
    starts = jnp.concatenate([origins, jnp.zeros_like(origins[:, :1])], axis=1)
    dnums = lax.GatherDimensionNumbers(
        offset_dims=(1, 2, 3), collapsed_slice_dims=(0,), start_index_map=(0, 1, 2, 3)
    )
    return lax.gather(
        a, starts, dnums, slice_sizes=(1, th, tw, a.shape[-1]),
        mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS,
    )  # fmt: skip


def _masked_conv_unbatched(
    x: jax.Array,
    w: jax.Array,
    reuse_mask: jax.Array,
    cached: jax.Array,
    epi_ops: tuple,
    p: _tiles.TilePlan,
    fn: Callable[..., jax.Array] | None = None,
) -> jax.Array:
    fast = jax.default_backend() == "cpu"
    out_dtype = jnp.result_type(x.dtype, w.dtype)
    dirty = _tiles.tile_dirty(reuse_mask, p)
    use_dense, units = _tiles.schedule(dirty.sum(), p)

    def step(out, start, size, xp, w, origins, epi_ops):
        o = lax.dynamic_slice_in_dim(origins, start, size)
        fresh = valid_conv(gather_windows(xp, o, p), w, p, fast)
        ops, pix = epi_ops
        pix = tuple(gather_tiles(q, o, p.th, p.tw) for q in pix)
        return scatter_tiles(out, o, apply_epilogue(fn, fresh.astype(out_dtype), ops, pix))

    def dense(x, w, dirty, epi_ops):
        return apply_epilogue(fn, dense_conv(x, w, p), *epi_ops)

    def prepare(x, w, dirty, epi_ops):  # once a frame: the dirty list, padding, group slices
        origins = _tiles.dirty_tile_list(dirty, p, p.capacity)
        return _tiles.pad_input(x, p), group_weights(w, p, fast), origins, epi_ops

    return sparse_or_dense(
        cached.astype(out_dtype), units, p.sizes, step, use_dense, dense,
        (x, w, dirty, epi_ops), prepare,
    )  # fmt: skip


def xla_masked_conv(
    x: jax.Array,
    w: jax.Array,
    reuse_mask: jax.Array,
    cached: jax.Array,
    geometry: ConvGeometry,
    *,
    tile: tuple[int, int] | None = None,
    p: _tiles.TilePlan | None = None,
    epilogue: Epilogue | None = None,
) -> jax.Array:
    """Sparse masked convolution by tile gather, batched conv and scatter.

    Args:
        x, w, reuse_mask, cached, geometry, tile, epilogue: as in
            `dcjax.kernels.masked_conv`.
        p: a precomputed plan (overrides ``tile``).

    Returns:
        (N, Ho, Wo, Cout) output.

    Inference only: the custom batching rule defines no derivative.
    """
    fn, epi_ops = epilogue_parts(epilogue)

    def unbatched(x, w, reuse_mask, cached, epi_ops):
        if p is not None and p.n == x.shape[0]:
            q = p
        else:  # no plan, or a batch folded in by vmap: same tile, new tile count
            q = _tiles.plan(
                x.shape, w.shape, geometry, tile=(p.th, p.tw) if p is not None else tile
            )
        return _masked_conv_unbatched(x, w, reuse_mask, cached, epi_ops, q, fn)

    run = pooled_over_streams(unbatched, geometry, fn)
    return run(x, w, reuse_mask, cached, epi_ops)


def epilogue_parts(epilogue: Epilogue | None) -> tuple[Callable | None, tuple[tuple, tuple]]:
    """``(fn, (operands, pixel_operands))`` of an `Epilogue`, or ``(None, ((), ()))``."""
    if epilogue is None:
        return None, ((), ())
    return epilogue.fn, (tuple(epilogue.operands), tuple(epilogue.pixel_operands))


def pooled_over_streams(unbatched, geometry: ConvGeometry, fn=None):
    """``unbatched(x, w, mask, cached, (ops, pix))`` with a batching rule pooling streams into N.

    Under `jax.vmap` the mapped axis is folded into the batch axis N, so one
    schedule serves every stream instead of vmap batching the trip counts
    (every stream running as many steps as the longest). The epilogue's pixel
    operands ``pix`` are folded like ``x``. Per-stream weights or per-channel
    epilogue operands ``ops`` (of the epilogue ``fn``), which cannot be pooled,
    fall back to the dense reference per stream.
    """

    def per_stream(x, w, m, c, ops, pix):
        fresh = conv(x, w, geometry)
        return jnp.where(m[..., None], c.astype(fresh.dtype), apply_epilogue(fn, fresh, ops, pix))

    return pooled(unbatched, per_stream)


def pooled(unbatched, per_stream):
    """`pooled_over_streams` for any kernel: ``unbatched(x, w, mask, cached,
    (ops, pix))`` with streams folded into N under `jax.vmap`, and
    ``per_stream(x, w, mask, cached, ops, pix)`` (a dense reference) run per
    stream where ``w`` or ``ops`` (pytrees) differ between streams."""

    @jax.custom_batching.custom_vmap
    def run(x, w, reuse_mask, cached, epi_ops):
        return unbatched(x, w, reuse_mask, cached, epi_ops)

    @run.def_vmap
    def _run_vmap(axis_size, in_batched, x, w, reuse_mask, cached, epi_ops):
        x_b, w_b, m_b, c_b, (ops_b, pix_b) = in_batched
        ops, pix = epi_ops
        if any(jax.tree_util.tree_leaves((w_b, ops_b))):
            # Per-stream weights: no pooling possible; compute densely per stream.
            axes = jax.tree_util.tree_map(
                lambda b: 0 if b else None, (x_b, w_b, m_b, c_b, ops_b, pix_b)
            )
            return jax.vmap(per_stream, in_axes=axes)(x, w, reuse_mask, cached, ops, pix), True

        def fold(a, batched):
            if not batched:
                a = jnp.broadcast_to(a, (axis_size, *a.shape))
            return a.reshape((axis_size * a.shape[1], *a.shape[2:]))

        batched = ((x, x_b), (reuse_mask, m_b), (cached, c_b), *zip(pix, pix_b, strict=True))
        n = next(a.shape[1] for a, b in batched if b)  # the batch N inside one stream
        pix = tuple(fold(q, b) for q, b in zip(pix, pix_b, strict=True))
        out = run(fold(x, x_b), w, fold(reuse_mask, m_b), fold(cached, c_b), (ops, pix))
        return out.reshape((axis_size, n, *out.shape[1:])), True

    return run
