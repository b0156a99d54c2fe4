"""Delta matrix-vector products: update ``x @ W`` where few inputs changed.

Contract: ``delta_matvec(y, w, d, changed)`` returns, in float32,
``y + sum_{i: changed[i]} d[i] * w[i, :]`` for ``w`` of shape ``(K, N)``,
``y`` of shape ``(N,)``, ``d`` and ``changed`` of shape ``(K,)``. Entries of
``d`` where ``changed`` is false are ignored (they may be anything finite).
`reference_delta_matvec` is the oracle: ``y + where(changed, d, 0) @ w``.

A fully connected layer on a frame-dependent vector reads its whole weight
matrix on every frame (AlexNet's ``fc6`` is 151 MB of float32 weights, 6.2 ms
a frame on this project's 2-core CPU, at memory speed). When only a fraction
``f`` of its inputs changed, the product moves by the changed rows only
(DeltaCNN's update for linear layers). On CPU the kernel lists the changed
inputs (`dcjax._compact.compact`) and gathers their rows in chunks of
`chunk_rows` rows, one trip of a loop per chunk, ``ceil(f K / chunk)`` trips;
each chunk's rows (about 4 MiB) are read once from memory and multiplied while
in cache. Measured on ``fc6``'s shape (9216 x 4096, random rows, medians of 30
jitted calls): dense 5.6-6.2 ms; nothing changed 0.09 ms; 10 / 20 / 33 / 60 %
of the rows changed 0.82 / 1.73 / 2.54 / 4.42 ms (about one process in eight
on the 2-core development machine ran it 2-3x slower throughout, as it did
any loop of row gathers: see docs/benchmarks.md). On GPU and TPU
(`dcjax._loops.skipping_pays` false) a loop with a dynamic trip count stalls
the stream, so the kernel is the reference form there: one dense product of
the masked differences, at the device's bandwidth.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from dcjax._compact import compact
from dcjax._loops import skipping_pays

__all__ = ["chunk_rows", "delta_matvec", "reference_delta_matvec"]

#: Elements of ``w`` gathered per trip (4 MiB of float32).
CHUNK_ELEMENTS = 1 << 20


def chunk_rows(k: int, n: int) -> int:
    """Rows per trip for a ``(k, n)`` matrix: a power of two near
    ``CHUNK_ELEMENTS / n``, between 8 and ``k`` rounded up to a power of two."""
    rows = 8
    while rows * 2 * n <= CHUNK_ELEMENTS and rows < k:
        rows *= 2
    return rows


def reference_delta_matvec(
    y: jax.Array, w: jax.Array, d: jax.Array, changed: jax.Array
) -> jax.Array:
    """``y + where(changed, d, 0) @ w`` in float32: the oracle, and the GPU/TPU form."""
    e = jnp.where(changed, d.astype(jnp.float32), 0.0)
    return y.astype(jnp.float32) + jnp.dot(e, w.astype(jnp.float32))


def delta_matvec(y: jax.Array, w: jax.Array, d: jax.Array, changed: jax.Array) -> jax.Array:
    """``y + sum_{changed i} d[i] w[i]``, reading only the changed rows of ``w``."""
    k, n = w.shape
    if y.shape != (n,) or d.shape != (k,) or changed.shape != (k,):
        raise ValueError(
            f"dcjax: delta_matvec needs y (N,), w (K, N), d and changed (K,); got y "
            f"{y.shape}, w {w.shape}, d {d.shape}, changed {changed.shape}"
        )
    if not skipping_pays():
        return reference_delta_matvec(y, w, d, changed)
    chunk = chunk_rows(k, n)
    slots = -(-k // chunk) * chunk
    changed = changed.astype(bool)
    count = jnp.sum(changed, dtype=jnp.int32)
    # changed rows first, then out-of-range fill: clipped to row 0, weighted 0
    idx = compact(changed, slots)
    d = d.astype(jnp.float32)

    def body(c, acc):
        ids = lax.dynamic_slice(idx, (c * chunk,), (chunk,))
        live = ids < k
        ids = jnp.where(live, ids, 0)
        coef = jnp.where(live, d[ids], 0.0)
        rows = jnp.take(w, ids, axis=0, mode="clip").astype(jnp.float32)
        return acc + jnp.dot(coef, rows)

    return lax.fori_loop(0, (count + chunk - 1) // chunk, body, y.astype(jnp.float32))
