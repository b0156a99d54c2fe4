"""Shared pieces of the Pallas kernels: the per-tile implicit-GEMM convolution.

Contract: `tile_conv(load, w, p)` returns the (th * tw, Cout) float32 output of
one output tile, where ``load(ky, kx)`` (``ky`` may be traced: the kernel
rows are a `lax.fori_loop`, the columns unrolled) returns the (th, tw, Cin) input pixels
that kernel tap (ky, kx) multiplies (the window already strided and dilated).
Each tap is one (th*tw, Cin/g) x (Cin/g, Cout/g) matrix product per group;
depthwise convolutions (one input channel per group) are a per-channel
multiply-add instead.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from dcjax.kernels.tiles import TilePlan

__all__ = ["tile_conv"]


def tile_conv(load: Callable[[int, int], jax.Array], w: jax.Array, p: TilePlan) -> jax.Array:
    """Implicit-GEMM convolution of one tile; (th * tw, Cout) float32."""
    m = p.th * p.tw
    g = p.groups
    cig = p.cin // g
    cog = p.cout // g

    def row(ky, acc):
        for kx in range(p.kw):
            a = load(ky, kx).reshape(m, p.cin).astype(jnp.float32)
            wt = w[ky, kx].astype(jnp.float32)  # (cig, cout)
            if g == 1:
                acc = acc + jnp.dot(a, wt, preferred_element_type=jnp.float32)
            elif cig == 1:
                # Depthwise: output channel o reads input channel o // cog.
                a_rep = jnp.repeat(a, cog, axis=1) if cog > 1 else a
                acc = acc + a_rep * wt[0][None, :]
            else:
                parts = [
                    jnp.dot(
                        a[:, i * cig : (i + 1) * cig],
                        wt[:, i * cog : (i + 1) * cog],
                        preferred_element_type=jnp.float32,
                    )
                    for i in range(g)
                ]
                acc = acc + jnp.concatenate(parts, axis=1)
        return acc

    acc = jnp.zeros((m, p.cout), jnp.float32)
    if p.kh == 1:
        return row(0, acc)
    return lax.fori_loop(0, p.kh, row, acc)
