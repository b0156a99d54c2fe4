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
  plus halo) of its tiles from the unpadded input (`gather_windows`), runs one
  VALID convolution over that batch of windows and scatters the tiles into the
  output, which starts as ``cached`` (updated in place when the caller donates
  the cache buffer, e.g. a jitted step with donated state or a `lax.scan`
  carry; otherwise XLA copies the cache once). No dirty tile: no step, the
  output is ``cached``.

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

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from dcjax._loops import pinned, run_if
from dcjax.kernels import tiles as _tiles
from dcjax.kernels.geometry import ConvGeometry, Epilogue
from dcjax.kernels.lowering import chosen, dense_conv, group_weights, valid_conv
from dcjax.kernels.reference import conv

__all__ = [
    "apply_epilogue",
    "epilogue_parts",
    "gather_tiles",
    "gather_windows",
    "pooled",
    "pooled_over_streams",
    "scatter_tiles",
    "sparse_or_dense",
    "window_pixels",
    "xla_masked_conv",
]


def gather_windows(x: jax.Array, origins: jax.Array, p: _tiles.TilePlan) -> jax.Array:
    """Input windows (capacity, win_h, win_w, Cin) of the tiles at ``origins``,
    read from the unpadded input ``x``, zeros where a window covers the
    convolution's padding.

    Where no window reaches the padding (`tiles.reads_padding`), each window is
    one slice of ``x``; otherwise every window pixel is gathered on its own at
    its row and column clamped into the map and zeroed outside it. Either way
    the map is not padded: padding copies all of it once a frame, which costs
    more than the windows of a few dirty tiles (docs/performance-notes.md,
    "Tile windows are read from the unpadded input").

    Args:
        x: (N, H, W, Cin) input.
        origins: int32 (capacity, 3) rows (n, oy, ox) of output tile origins.
        p: the plan.
    """
    if _tiles.reads_padding(p):
        rows, cols, inside = window_pixels(origins, p)
        rows, cols = jnp.clip(rows, 0, p.h - 1), jnp.clip(cols, 0, p.w - 1)
        win = x[origins[:, 0, None, None], rows[:, :, None], cols[:, None, :]]
        return jnp.where(inside[..., None], win, jnp.zeros((), x.dtype))
    row, col = _window_starts(origins, p)
    starts = jnp.stack([origins[:, 0], row, col, jnp.zeros_like(row)], axis=1)
    dnums = lax.GatherDimensionNumbers(
        offset_dims=(1, 2, 3),
        collapsed_slice_dims=(0,),
        start_index_map=(0, 1, 2, 3),
    )
    return lax.gather(
        x,
        starts,
        dnums,
        slice_sizes=(1, p.win_h, p.win_w, p.cin),
        mode=lax.GatherScatterMode.PROMISE_IN_BOUNDS,
    )


def window_pixels(origins: jax.Array, p: _tiles.TilePlan):
    """``(rows, cols, inside)`` of the tiles' input windows: the rows
    (capacity, win_h) and columns (capacity, win_w) of ``x`` under each window
    (negative or past the map in the padding) and, (capacity, win_h, win_w),
    whether a window pixel lies inside the map."""
    row, col = _window_starts(origins, p)
    rows = row[:, None] + jnp.arange(p.win_h)[None]
    cols = col[:, None] + jnp.arange(p.win_w)[None]
    inside = ((rows >= 0) & (rows < p.h))[:, :, None] & ((cols >= 0) & (cols < p.w))[:, None]
    return rows, cols, inside


def _window_starts(origins: jax.Array, p: _tiles.TilePlan) -> tuple[jax.Array, jax.Array]:
    """The row and column of ``x`` at each tile window's top-left corner
    (negative in the padding)."""
    (ply, _), (plx, _) = p.pads
    return origins[:, 1] * p.strides[0] - ply, origins[:, 2] * p.strides[1] - plx


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
    list of dirty tiles, the padded input, slices of the weights);
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
    out_dtype = jnp.result_type(x.dtype, w.dtype)
    how = chosen(p, out_dtype, whole=False)  # on windows
    dirty = _tiles.tile_dirty(reuse_mask, p)
    use_dense, units = _tiles.schedule(dirty.sum(), p)

    def step(out, start, size, x, w, origins, epi_ops):
        o = lax.dynamic_slice_in_dim(origins, start, size)
        fresh = valid_conv(gather_windows(x, o, p), w, p, how)
        ops, pix = epi_ops
        pix = tuple(gather_tiles(q, o, p.th, p.tw) for q in pix)
        return scatter_tiles(out, o, apply_epilogue(fn, fresh.astype(out_dtype), ops, pix))

    def dense(x, w, dirty, epi_ops):
        return apply_epilogue(fn, dense_conv(x, w, p), *epi_ops)

    def prepare(x, w, dirty, epi_ops):  # once a frame: the dirty list, group slices
        origins = _tiles.dirty_tile_list(dirty, p, p.capacity)
        return x, group_weights(w, p, how), origins, epi_ops

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
