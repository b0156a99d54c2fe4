"""`masked_conv`: the single entry point of the sparse-update convolution kernels.

Contract: ``out = masked_conv(x, w, reuse_mask, cached, geometry)`` equals
``lax.conv_general_dilated`` (NHWC input, HWIO weights, same dtype, fp
tolerance) wherever ``reuse_mask`` is false; where it is true, ``out`` is
``cached`` or the freshly computed value. With a sparse implementation every
output tile without a false pixel (see `dcjax.kernels.tiles`) is ``cached``
bit for bit and costs no convolution work.

Epilogues: ``masked_conv(..., epilogue=Epilogue(fn, operands))`` returns
``fn(conv(x, w), *operands)`` wherever ``reuse_mask`` is false (``cached`` then
holds previous *epilogue outputs*). ``fn`` must act on every output element
independently, keep shape and dtype, and take ``operands`` that are scalars or
``(Cout,)`` vectors broadcast along the channel axis (a batch norm in inference
mode, a bias, an activation) and ``pixel_operands`` shaped like the output (a
residual branch added in). The sparse kernels apply it to the rows or tiles
they compute, before the scatter, so the reused pixels skip the epilogue as
well as the convolution, and no separate pass over the whole map is left for
it. The Pallas GPU kernel applies it inside the kernel; the Pallas TPU kernel
takes none: with one, ``masked_conv`` computes the reference (dense, epilogue,
select) instead.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp

from dcjax.kernels import auto as _auto
from dcjax.kernels import lowering as _lowering
from dcjax.kernels import rows as _rows
from dcjax.kernels import tiles as _tiles
from dcjax.kernels.geometry import ConvGeometry, Epilogue, nhwc_conv, plain_conv, precision_name
from dcjax.kernels.lowering import dense_conv
from dcjax.kernels.reference import conv, reference_masked_conv
from dcjax.kernels.rows import rows_masked_conv
from dcjax.kernels.transposed import subpixel_conv, tiles_output
from dcjax.kernels.xla import xla_masked_conv

__all__ = [
    "IMPLS",
    "dense_conv_eqn",
    "masked_conv",
    "masked_conv_eqn",
    "reads_cache",
]

#: Accepted values of ``impl``.
IMPLS = ("auto", "reference", "dense", "xla", "rows", "pallas", "pallas_gpu", "pallas_tpu")


def masked_conv(
    x: jax.Array,
    w: jax.Array,
    reuse_mask: jax.Array,
    cached: jax.Array,
    geometry: ConvGeometry,
    *,
    impl: str = "auto",
    tile: tuple[int, int] | None = None,
    chunk: int | None = None,
    interpret: bool = False,
    scattered: bool = False,
    epilogue: Epilogue | None = None,
) -> jax.Array:
    """Convolution that recomputes only the output tiles holding non-reusable pixels.

    Args:
        x: (N, H, W, Cin) input.
        w: (kh, kw, Cin / groups, Cout) weights (HWIO).
        reuse_mask: bool (N, Ho, Wo); true where ``cached`` may be used.
        cached: (N, Ho, Wo, Cout) previous output, already shifted to the
            current frame.
        geometry: strides, padding ("SAME", "VALID" or ((lo, hi), (lo, hi))),
            kernel dilation and feature groups (`ConvGeometry`).
        impl: ``"reference"`` (dense conv then select, the oracle), ``"dense"``
            (the dense convolution alone: every pixel fresh, which the contract
            allows; an option for 1x1 layers when the cache cannot be donated),
            ``"xla"``
            (tile gather, batched conv, scatter; any backend), ``"rows"`` (dirty
            pixels gathered as matrix rows, one matmul per feature group, row
            scatter; narrow depthwise and many-group convolutions go to ``"xla"``;
            `dcjax.kernels.rows`), ``"pallas"`` (the
            Pallas kernel of the current backend: ``"pallas_tpu"`` on TPU,
            ``"pallas_gpu"`` otherwise), or ``"auto"`` (the measured fastest for
            this backend and layer, see `dcjax.kernels.auto`).
        tile: (th, tw) output tile; the per-layer rule `tiles.default_tile`
            (or the auto table's entry) when None.
        chunk: the row kernel's smallest step (``impl="rows"``); its own rule
            (or the auto rule's) when None.
        interpret: run Pallas kernels in interpret mode (needed on CPU).
        scattered: a hint for ``impl="auto"``: the masks are scattered at
            pixel level (refinement), which favours pixel-granular kernels.
        epilogue: an `Epilogue` applied to every freshly computed output (see
            the module docstring); ``cached`` then holds epilogue outputs.

    Returns:
        (N, Ho, Wo, Cout) output, dtype of ``lax.conv_general_dilated``.

    Raises:
        ValueError: unknown ``impl`` or inconsistent shapes.
    """
    if impl not in IMPLS:
        raise ValueError(f"dcjax: masked_conv impl must be one of {IMPLS}, got {impl!r}")
    reuse_mask = jnp.asarray(reuse_mask).astype(bool)
    p = _tiles.plan(x.shape, w.shape, geometry, tile=tile)
    if reuse_mask.shape != (p.n, p.ho, p.wo):
        raise ValueError(
            f"dcjax: masked_conv reuse_mask has shape {reuse_mask.shape} but the convolution "
            f"output is {(p.n, p.ho, p.wo, p.cout)}; pass a bool (N, Ho, Wo) mask"
        )
    if cached.shape != (p.n, p.ho, p.wo, p.cout):
        raise ValueError(
            f"dcjax: masked_conv cached has shape {cached.shape} but the convolution output "
            f"is {(p.n, p.ho, p.wo, p.cout)}; pass the previous output shifted to this frame"
        )
    if impl == "auto":
        impl, auto_tile = _auto.choose(p, jax.default_backend(), scattered)
        if tile is None and auto_tile is not None:
            tile = auto_tile
        if impl == "rows" and chunk is None:
            chunk = _auto.row_chunk(p, scattered)
    if impl == "pallas":
        impl = "pallas_tpu" if jax.default_backend() == "tpu" else "pallas_gpu"
    if impl == "reference" or (epilogue is not None and impl == "pallas_tpu"):
        if epilogue is None:
            return reference_masked_conv(x, w, reuse_mask, cached, geometry)
        fresh = epilogue(conv(x, w, geometry))
        return jnp.where(reuse_mask[..., None], cached.astype(fresh.dtype), fresh)
    if impl == "dense":
        out = dense_conv(x, w, p)
        return out if epilogue is None else epilogue(out)
    if impl == "rows" and _rows.computes(x.shape[-1], geometry.groups):
        return rows_masked_conv(x, w, reuse_mask, cached, geometry, chunk=chunk, epilogue=epilogue)
    if impl in ("xla", "rows"):  # rows leaves few-channel and many-group convolutions to xla
        return xla_masked_conv(x, w, reuse_mask, cached, geometry, tile=tile, epilogue=epilogue)
    if not interpret and jax.default_backend() != {"pallas_gpu": "gpu", "pallas_tpu": "tpu"}[impl]:
        raise ValueError(
            f"dcjax: masked_conv impl={impl!r} compiles only on "
            f"{impl.removeprefix('pallas_').upper()}, but the default backend is "
            f"{jax.default_backend()!r}; pass interpret=True to run it in interpret mode"
        )
    if impl == "pallas_gpu":
        from dcjax.kernels import pallas_gpu

        if not pallas_gpu.supports(w.shape, geometry.groups):
            return xla_masked_conv(x, w, reuse_mask, cached, geometry, tile=tile, epilogue=epilogue)
        return pallas_gpu.pallas_gpu_masked_conv(
            x, w, reuse_mask, cached, geometry, tile=tile, interpret=interpret, epilogue=epilogue
        )
    from dcjax.kernels.pallas_tpu import pallas_tpu_masked_conv

    return pallas_tpu_masked_conv(
        x, w, reuse_mask, cached, geometry, tile=tile, interpret=interpret
    )


def dense_conv_eqn(eqn, invals, *, whole: bool = True, materialized: bool = False) -> jax.Array:
    """A ``conv_general_dilated`` equation computed in full, as the dense path does.

    An NHWC/HWIO convolution goes through `dcjax.kernels.lowering.dense_conv`
    (the sparse kernels' own dense path) where its lowering
    (`dcjax.kernels.lowering.chosen`: measured on this machine, else the
    fixed rules; the fixed rules on a batch of tile windows, ``whole=False``)
    is not XLA's convolution; on CPU a transposed convolution whose kernel
    tiles its output as a matrix product (`dcjax.kernels.transposed`);
    everything else is bound as it is.
    The no-cache baseline and the semantic exits use this so they compute
    convolutions the way the cached step does.

    ``materialized``: the input is a buffer some kernel wrote (a sparse
    kernel's output), not a value XLA may fuse into its readers (the last
    layer's batch norm and activation): only then ``"edges"``
    (`dcjax.kernels.lowering.chosen`; docs/performance-notes.md, "Strided
    depthwise layers without a padded copy (edges_pays)").
    """
    p = eqn.params
    x, w = invals
    if nhwc_conv(p):
        tp = _tiles.plan(x.shape, w.shape, ConvGeometry.from_params(p))
        dtype = jnp.result_type(x.dtype, w.dtype)
        how = _lowering.chosen(tp, dtype, whole=whole, materialized=materialized)
        if how != "conv":
            return dense_conv(x, w, tp, how)
    elif jax.default_backend() == "cpu" and tiles_output(p, w.shape):
        return subpixel_conv(x, w, p)
    return eqn.primitive.bind(x, w, **p)


def masked_conv_eqn(
    eqn,
    invals,
    mask: jax.Array,
    cached: jax.Array,
    impl: str,
    scattered: bool = False,
    epilogue: Epilogue | None = None,
    *,
    tile: tuple[int, int] | None = None,
    chunk: int | None = None,
) -> jax.Array:
    """`masked_conv` for a ``conv_general_dilated`` equation of a traced model.

    ``mask`` is (Ho, Wo) in the output's spatial order and ``cached`` has the
    equation's output layout. Plain NHWC convolutions with default precision go
    through `masked_conv` (Pallas interpreted on CPU); any other layout, and
    ``impl="reference"``, computes the equation densely and selects (the step
    computes other layouts with `dense_conv_eqn` instead: `reads_cache`). An
    ``epilogue`` is only accepted for plain convolutions (channels last).
    """
    p = eqn.params
    x, w = invals
    plain = plain_conv(p)
    if impl != "reference" and plain:
        # An explicit precision (jax.default_matmul_precision("highest") around
        # the traced model) holds for every product the kernels compute.
        name = precision_name(p["precision"])
        with contextlib.nullcontext() if name is None else jax.default_matmul_precision(name):
            return masked_conv(
                x, w, jnp.broadcast_to(mask, (x.shape[0], *mask.shape)), cached,
                ConvGeometry.from_params(p), impl=impl, tile=tile, chunk=chunk,
                interpret=impl == "pallas" and jax.default_backend() == "cpu",
                scattered=scattered, epilogue=epilogue,
            )  # fmt: skip
    dense = eqn.primitive.bind(x, w, **p)
    if epilogue is not None:
        if not nhwc_conv(p):
            raise ValueError("dcjax: an epilogue needs a channels-last (NHWC) convolution")
        dense = epilogue(dense)
    oy, ox = p["dimension_numbers"].out_spec[2:]
    shape = [1] * dense.ndim
    shape[oy], shape[ox] = mask.shape
    m = (mask if oy < ox else mask.T).reshape(shape)
    return jnp.where(m, cached.astype(dense.dtype), dense)


def reads_cache(eqn, impl: str) -> bool:
    """Whether `masked_conv_eqn` with ``impl`` reads the cache for ``eqn`` (static).

    False when the equation is computed densely without a select: ``impl=
    "dense"``, or ``"auto"`` choosing ``"dense"`` (small layers on CPU), for a
    plain NHWC convolution; and any other convolution (transposed, other
    layouts) under every impl but ``"reference"``: no sparse kernel computes
    it, so selecting its cache would only add a shift and a select to its
    full computation, and put back values of earlier frames where the full
    computation has the current ones. Such a layer needs no cache:
    `dense_conv_eqn` computes it, and the transform keeps no state for it.
    """
    p = eqn.params
    if not plain_conv(p):
        return impl == "reference"
    if impl == "dense":
        return False
    if impl != "auto":
        return True
    x, w = (v.aval for v in eqn.invars)
    tp = _tiles.plan(x.shape, w.shape, ConvGeometry.from_params(p))
    return _auto.choose(tp, jax.default_backend())[0] != "dense"
