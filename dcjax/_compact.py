"""`compact`: where a boolean array is true, as a static number of index slots.

Contract: ``compact(flags, capacity)`` returns int32 ``(capacity,)``: the flat
(row-major) indices of the true entries of ``flags``, in increasing order,
then, in each slot ``j`` past their count, ``flags.size + j`` (distinct and out
of range, so a scatter with ``mode="drop"`` ignores them; callers that gather
replace them). True entries past ``capacity`` are left out. On the listed
slots it equals ``jnp.nonzero(flags.ravel(), size=capacity)``.

Why not `jnp.nonzero`: XLA:CPU computes its prefix sum as a sequence of small
operations that costs more than the rest of a sparse kernel's bookkeeping
(``jnp.nonzero`` on 196 tile flags, ResNet-50's 56x56 map in 4x4 tiles, took
23-48 us a call here, on 12544 pixel flags 230 us). `compact` lays the flags
out as a ``(rows, cols)`` matrix with ``cols ~ sqrt(size)`` and takes the
prefix sum as two small triangular matrix products, exact in float32 (whose
integers are exact below 2**24) at ``Precision.HIGHEST``, then scatters each
index to its slot: 12-13 us on 196 flags and 70-80 us on 12544.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["compact"]


def compact(flags: jax.Array, capacity: int) -> jax.Array:
    """Int32 (capacity,): flat indices of the true entries, then out-of-range fill."""
    flat = flags.reshape(-1).astype(bool)
    size = flat.shape[0]
    fill = size + jnp.arange(capacity, dtype=jnp.int32)
    if size == 0 or capacity == 0:
        return fill
    cols = max(1, math.isqrt(size - 1) + 1)
    rows = -(-size // cols)
    f = jnp.pad(flat, (0, rows * cols - size)).astype(jnp.float32).reshape(rows, cols)
    hi = lax.Precision.HIGHEST
    within = jnp.dot(f, jnp.triu(jnp.ones((cols, cols), jnp.float32)), precision=hi)
    before = jnp.dot(jnp.tril(jnp.ones((rows, rows), jnp.float32), -1), within[:, -1], precision=hi)
    pos = (within + before[:, None]).reshape(-1)[:size].astype(jnp.int32) - 1
    # false entries go to distinct slots past every true entry's: dropped
    pos = jnp.where(flat, pos, capacity + size + jnp.arange(size, dtype=jnp.int32))
    return fill.at[pos].set(
        jnp.arange(size, dtype=jnp.int32), mode="drop", unique_indices=True
    )  # fmt: skip
