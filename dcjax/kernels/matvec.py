"""Delta matrix-vector products: update ``x @ W`` where few inputs changed.

Contract: ``delta_matvec(y, w, d, changed)`` returns, in float32,
``y + sum_{i: changed[i]} d[i] * w[i, :]`` for ``w`` of shape ``(K, N)``,
``y`` of shape ``(N,)``, ``d`` and ``changed`` of shape ``(K,)``. Entries of
``d`` where ``changed`` is false are ignored (they may be anything finite).
`reference_delta_matvec` is the oracle: ``y + where(changed, d, 0) @ w``.

A fully connected layer on a frame-dependent vector reads its whole weight
matrix on every frame, at memory speed. When only a fraction ``f`` of its
inputs changed, the product moves by the changed rows only (DeltaCNN's update
for linear layers). On CPU the kernel lists the changed inputs
(`dcjax._compact.compact`) and adds `ROWS_PER_TRIP` of their scaled rows per
trip of a loop, ``ceil(f K / ROWS_PER_TRIP)`` trips: each row is a
``dynamic_slice`` of ``w``, so the trip is one elementwise fusion that streams
its rows from memory once; a gather of the rows followed by a product ran
XLA:CPU's gather at a fraction of the dense product's bandwidth
(docs/performance-notes.md, "Delta matvec: 32 changed rows a trip of dynamic
slices (ROWS_PER_TRIP)"). The update breaks even with the dense product at
60-80 % of the rows, hence `dcjax.transforms.refine.DENSE_FRACTION` (75 %;
docs/performance-notes.md, "The delta update breaks even at 60-80 % of the
rows (refinement's 75 %)").

On GPU and TPU (`dcjax._loops.skipping_pays` false) a loop with a dynamic trip
count stalls the stream, so the kernel is the reference form there: one dense
product of the masked differences, at the device's bandwidth.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from dcjax._compact import compact
from dcjax._loops import skipping_pays

__all__ = ["ROWS_PER_TRIP", "delta_matvec", "reference_delta_matvec"]

#: Rows of ``w`` added per trip of the CPU loop (docs/performance-notes.md,
#: "Delta matvec: 32 changed rows a trip of dynamic slices (ROWS_PER_TRIP)").
ROWS_PER_TRIP = 32


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
    u = ROWS_PER_TRIP
    changed = changed.astype(bool)
    count = jnp.sum(changed, dtype=jnp.int32)
    # changed rows first, then out-of-range fill: read as row 0, weighted 0
    idx = compact(changed, -(-k // u) * u)
    live = idx < k
    ids = jnp.where(live, idx, 0)
    coef = jnp.where(live, d.astype(jnp.float32)[ids], 0.0)
    ids, coef = ids.reshape(-1, u), coef.reshape(-1, u)

    def body(t, acc):
        rows, c = ids[t], coef[t]
        for j in range(u):
            acc = acc + c[j] * lax.dynamic_slice_in_dim(w, rows[j], 1)[0].astype(jnp.float32)
        return acc

    return lax.fori_loop(0, (count + u - 1) // u, body, y.astype(jnp.float32))
