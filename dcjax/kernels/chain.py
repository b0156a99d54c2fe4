"""Inverted-residual chains computed on dirty tiles: three layers, one gather.

Contract. A *chain* is three plain NHWC convolutions, each followed by its
elementwise epilogue (`dcjax.kernels.Epilogue`): a 1x1 expansion ``a``
(stride 1, no padding, ungrouped), a depthwise ``b`` (any kernel, stride,
padding, dilation; one group per channel) and a 1x1 projection ``c``
(ungrouped). ``chain_masked_conv(x, links, reuse_mask, cached)`` equals
``where(reuse_mask, cached, dense_chain(x, links))`` to float rounding, where
`dense_chain` computes link after link in full the way the dense path does
(`dcjax.kernels.dense_conv_eqn`, then the epilogue); `reference_chain` is
that oracle. Only ``c``'s epilogue may have pixel operands (a residual).
Clean output tiles keep ``cached`` bit for bit.

How. Output tiles of ``th x tw`` pixels (`dcjax.kernels.tiles`, with the
depthwise layer's geometry applied to ``x``: a chain sees through the 1x1
layers). For each dirty tile the window of ``x`` under it is gathered once;
``a`` and its epilogue run on the window, whose positions in the depthwise
layer's padding are set to zero (the padding pads ``a``'s output, not ``x``);
``b`` runs on that with no padding, ``c`` on ``b``'s tile, the residual is
read at the tile, and the tile is scattered into the cache. Per layer, the
sparse kernels gather and scatter each thin map and write the wide expanded
map out; here the expanded map never leaves the tile, which is what makes
the thin layers of EfficientNet-Lite0's early blocks worth skipping on CPU.

A chain starts at an expansion: without one (depthwise then projection) the
window's halo costs more than it saves (docs/performance-notes.md, "Chains are
computed on tiles and start at an expansion"). `chain_pays` is the rule the
transform applies with ``Config(fuse_blocks=True)``; the end-to-end effect
(faster, and less exact than computing those layers in full) is in
`dcjax.config.Config`'s docs.

Off CPU (`dcjax._loops.skipping_pays` false) chains are not formed: the
per-layer kernels and their Pallas forms apply there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from dcjax._loops import skipping_pays
from dcjax.kernels import tiles as _tiles
from dcjax.kernels import xla as _xla
from dcjax.kernels.geometry import ConvGeometry, Epilogue
from dcjax.kernels.masked import dense_conv_eqn

__all__ = [
    "CHAIN_MIN_SIDE",
    "CHAIN_TILE",
    "Link",
    "chain_masked_conv",
    "chain_pays",
    "dense_chain",
    "reference_chain",
]

#: The smallest output side (pixels) on which a chain is computed by tiles (`chain_pays`).
CHAIN_MIN_SIDE: int = 56
#: Output tile of a chain (clipped to the map). Smaller tiles cover less clean
#: area around the dirty pixels, larger ones recompute less halo
#: (docs/performance-notes.md, "Chain tiles of 4x4 (CHAIN_TILE)").
CHAIN_TILE: tuple[int, int] = (4, 4)


@dataclasses.dataclass(frozen=True)
class Link:
    """One convolution of a chain: its equation, weights and epilogue."""

    eqn: Any
    w: jax.Array
    epilogue: Epilogue | None = None


def chain_pays(out_hw: tuple[int, int]) -> bool:
    """Whether a chain is computed by tiles (``Config(fuse_blocks=True)``): on
    CPU, with an output of at least `CHAIN_MIN_SIDE` pixels a side. On smaller
    maps too many of the few tiles are dirty (docs/performance-notes.md,
    "Chains only on maps of 56 pixels and more (CHAIN_MIN_SIDE, chain_pays)").
    """
    return skipping_pays() and min(out_hw) >= CHAIN_MIN_SIDE


def _apply(link: Link, y: jax.Array) -> jax.Array:
    e = link.epilogue
    return y if e is None else e(y)


def dense_chain(x: jax.Array, links: Sequence[Link]) -> jax.Array:
    """Every link in full, as the dense path computes each layer."""
    y = x
    for link in links:
        y = _apply(link, dense_conv_eqn(link.eqn, [y, link.w]))
    return y


def reference_chain(
    x: jax.Array, links: Sequence[Link], reuse_mask: jax.Array, cached: jax.Array
) -> jax.Array:
    """The oracle: `dense_chain`, with ``cached`` where ``reuse_mask`` is true."""
    fresh = dense_chain(x, links)
    return jnp.where(reuse_mask[..., None], cached.astype(fresh.dtype), fresh)


def _plan(x_shape, links: Sequence[Link]) -> _tiles.TilePlan:
    """The tile plan of the depthwise layer's window over ``x`` (see the module
    docstring): the depthwise geometry, ungrouped, from ``x`` to the projection's
    channels."""
    depthwise = ConvGeometry.from_params(links[1].eqn.params)
    kh, kw = links[1].w.shape[:2]
    return _tiles.plan(
        x_shape,
        (kh, kw, x_shape[-1], links[2].w.shape[-1]),
        dataclasses.replace(depthwise, groups=1),
        tile=CHAIN_TILE,
    )


def _unpadded(eqn):
    """The depthwise equation with no padding, for windows that carry it."""
    return eqn.replace(params={**eqn.params, "padding": ((0, 0), (0, 0))})


def _chain_unbatched(x, ws, reuse_mask, cached, ops, pix, links, p):
    b_valid = dataclasses.replace(links[1], eqn=_unpadded(links[1].eqn))
    dirty = _tiles.tile_dirty(reuse_mask, p)
    use_dense, units = _tiles.schedule(dirty.sum(), p)

    def step(out, start, size, x, ws, origins, ops, pix):
        o = lax.dynamic_slice_in_dim(origins, start, size)
        at_tiles = tuple(_xla.gather_tiles(q, o, p.th, p.tw) for q in pix)
        la, lb, lc = _relinked((links[0], b_valid, links[2]), ws, ops, at_tiles)
        win = _xla.gather_windows(x, o, p)
        inside = _xla.window_pixels(o, p)[2]
        ya = _apply(la, dense_conv_eqn(la.eqn, [win, la.w], whole=False))
        ya = jnp.where(inside[..., None], ya, jnp.zeros((), ya.dtype))
        yb = _apply(lb, dense_conv_eqn(lb.eqn, [ya, lb.w], whole=False))
        yc = _apply(lc, dense_conv_eqn(lc.eqn, [yb, lc.w], whole=False))
        return _xla.scatter_tiles(out, o, yc)

    def dense(x, ws, dirty, ops, pix):
        return dense_chain(x, _relinked(links, ws, ops, pix))

    def prepare(x, ws, dirty, ops, pix):  # once a frame: the dirty list
        origins = _tiles.dirty_tile_list(dirty, p, p.capacity)
        return x, ws, origins, ops, pix

    return _xla.sparse_or_dense(
        cached, units, p.sizes, step, use_dense, dense, (x, ws, dirty, ops, pix), prepare
    )


def chain_masked_conv(
    x: jax.Array, links: Sequence[Link], reuse_mask: jax.Array, cached: jax.Array
) -> jax.Array:
    """The chain's output: fresh on the dirty tiles, ``cached`` elsewhere.

    Args:
        x: (N, H, W, Cin) input of the expansion.
        links: the three `Link` (expansion, depthwise, projection).
        reuse_mask: (N, Ho, Wo) bool, true where the output may be reused.
        cached: (N, Ho, Wo, Cout), the output of the chain's last epilogue.

    Under `jax.vmap` the streams are folded into N (one dirty list for all),
    unless weights or per-channel operands differ per stream, which then run
    `reference_chain` per stream.
    """
    links = tuple(links)
    if len(links) != 3:
        raise ValueError(f"dcjax: a chain has three links, got {len(links)}")
    for link in links[:2]:
        if link.epilogue is not None and link.epilogue.pixel_operands:
            raise ValueError("dcjax: only the last link of a chain may read pixel operands")
    ws = tuple(link.w for link in links)
    ops = tuple(link.epilogue.operands if link.epilogue else () for link in links)
    pix = tuple(links[2].epilogue.pixel_operands) if links[2].epilogue else ()

    def unbatched(x, ws, reuse_mask, cached, epi_ops):
        p = _plan(x.shape, links)
        return _chain_unbatched(x, ws, reuse_mask, cached, *epi_ops, links, p)

    def per_stream(x, ws, m, c, ops, pix):
        return reference_chain(x, _relinked(links, ws, ops, pix), m, c)

    return _xla.pooled(unbatched, per_stream)(x, ws, reuse_mask, cached, (ops, pix))


def _relinked(links, ws, ops, pix) -> tuple[Link, ...]:
    """``links`` with weights ``ws``, per-channel operands ``ops`` and the last
    link's pixel operands ``pix``."""
    out = []
    for i, (link, w, o) in enumerate(zip(links, ws, ops, strict=True)):
        epi = link.epilogue
        if epi is not None:
            epi = dataclasses.replace(epi, operands=o, pixel_operands=pix if i == 2 else ())
        out.append(Link(eqn=link.eqn, w=w, epilogue=epi))
    return tuple(out)
