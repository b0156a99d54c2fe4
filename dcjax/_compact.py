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
23-48 us a call here, on 12544 pixel flags 230 us). `compact` takes the
prefix sum as small triangular matrix products, exact in float32 (whose
integers are exact below 2**24) at ``Precision.HIGHEST``, then scatters each
index to its slot. Up to `SQUARE_MAX` flags it lays them out as one
``(rows, cols)`` matrix with ``cols ~ sqrt(size)`` (two products); above, as
rows of `BLOCK` flags whose totals are summed the same way, recursively, so
the products stay small instead of growing as ``size ** 1.5``. Medians of
interleaved jitted calls (dispatch included) on the 2-core development CPU,
square layout at every size against this rule: 196 and 784 flags 18-23 us
either way, 3136 flags 39.8 -> 22.5 us, 12544 72 -> 56 us, 50176 513 -> 158 us.

`listing` and `listed` give the same slots lazily, for a kernel that walks its
dirty entries in steps: ``listed(listing(flags), start, n)`` equals
``compact(flags, start + n)[start:]``. `listing` makes two passes over the
flags (packed into `LIST_BITS`-bit words by a matrix product, whose set-bit
counts it prefix-sums: `Listing.count` is the number of true entries);
`listed` costs ``O(n log(words))``, whatever the flags' size. Why: a pixel
map's `compact` makes about eight passes over its flags and its ``capacity``
slots, each of which XLA:CPU runs as a single-threaded loop (on CenterFace's
288x384 maps, 0.6 ms a layer, 1 ms with the count and the mask's negation),
while a sparse step reads only its own slots (docs/performance-notes.md,
"Dirty pixels listed lazily, per step").
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["LIST_BITS", "LIST_MAX", "Listing", "compact", "listed", "listing"]


def compact(flags: jax.Array, capacity: int) -> jax.Array:
    """Int32 (capacity,): flat indices of the true entries, then out-of-range fill."""
    flat = flags.reshape(-1).astype(bool)
    size = flat.shape[0]
    fill = size + jnp.arange(capacity, dtype=jnp.int32)
    if size == 0 or capacity == 0:
        return fill
    pos = _prefix_sum(flat.astype(jnp.float32)).astype(jnp.int32) - 1
    # false entries go to distinct slots past every true entry's: dropped
    pos = jnp.where(flat, pos, capacity + size + jnp.arange(size, dtype=jnp.int32))
    return fill.at[pos].set(
        jnp.arange(size, dtype=jnp.int32), mode="drop", unique_indices=True
    )  # fmt: skip


#: Sizes up to which `_prefix_sum` lays the flags out as one ~square matrix.
SQUARE_MAX = 1024

#: Row length of the blocked layout above `SQUARE_MAX`.
BLOCK = 32


def _prefix_sum(f: jax.Array) -> jax.Array:
    """Inclusive prefix sums of a float32 vector of small integers, exact below 2**24."""
    size = f.shape[0]
    cols = max(1, math.isqrt(size - 1) + 1) if size <= SQUARE_MAX else BLOCK
    rows = -(-size // cols)
    m = jnp.pad(f, (0, rows * cols - size)).reshape(rows, cols)
    hi = lax.Precision.HIGHEST
    within = jnp.dot(m, jnp.triu(jnp.ones((cols, cols), jnp.float32)), precision=hi)
    totals = within[:, -1]
    if size <= SQUARE_MAX:
        before = jnp.dot(jnp.tril(jnp.ones((rows, rows), jnp.float32), -1), totals, precision=hi)
    else:
        before = _prefix_sum(totals) - totals
    return (within + before[:, None]).reshape(-1)[:size]


#: Flags packed into one word of a `Listing` (each word a float32 sum of powers
#: of two, exact below 2**24).
LIST_BITS = 16


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Listing:
    """The flags of `listing`, packed for `listed`.

    Attributes:
        words: int32 ``(ceil(size / LIST_BITS),)``: bit ``b`` of word ``i`` is
            flag ``i * LIST_BITS + b`` (zero past ``size``).
        ends: float32, same shape: the inclusive prefix sums of the words' set
            bits (the number of true flags up to each word's end).
        size: the number of flags (static).
    """

    words: jax.Array
    ends: jax.Array
    size: int = dataclasses.field(metadata=dict(static=True))

    @property
    def count(self) -> jax.Array:
        """Int32: the number of true flags (per listing, for a batch of them)."""
        if self.words.shape[-1] == 0:
            return jnp.zeros(self.words.shape[:-1], jnp.int32)
        return self.ends[..., -1].astype(jnp.int32)


#: Flags a `Listing` takes: its prefix sums are float32, exact below 2**24.
LIST_MAX = 2**24


def listing(flags: jax.Array) -> Listing:
    """The flags (any shape; nonzero or true counts as set), packed for `listed`.

    Raises:
        ValueError: ``LIST_MAX`` flags or more.
    """
    flags = jnp.asarray(flags)
    if flags.size >= LIST_MAX:
        raise ValueError(
            f"dcjax: listing takes fewer than {LIST_MAX} flags (its float32 counts are exact "
            f"below that), got {flags.size}; list the streams' flags apart"
        )
    f = (flags if flags.dtype == jnp.bool_ else flags != 0).astype(jnp.float32).reshape(-1)
    size = f.shape[0]
    words = -(-size // LIST_BITS)
    if words == 0:
        empty = jnp.zeros((0,), jnp.int32)
        return Listing(words=empty, ends=empty.astype(jnp.float32), size=size)
    f = jnp.pad(f, (0, words * LIST_BITS - size)).reshape(words, LIST_BITS)
    powers = jnp.asarray(2.0 ** np.arange(LIST_BITS), jnp.float32)
    packed = jnp.dot(f, powers, precision=lax.Precision.HIGHEST).astype(jnp.int32)
    counts = lax.population_count(packed).astype(jnp.float32)
    return Listing(words=packed, ends=_prefix_sum(counts), size=size)


def listed(lst: Listing, start: jax.Array | int, n: int) -> jax.Array:
    """Int32 ``(n,)``: slots ``start .. start + n - 1`` of `compact` of the
    listed flags: the flat index of the ``j``-th true flag at slot ``j``, and
    ``size + j`` at each slot ``j`` past their count. ``lst`` is one listing
    (map over a batch of them with `jax.vmap`)."""
    j = jnp.asarray(start, jnp.int32) + jnp.arange(n, dtype=jnp.int32)
    total = lst.words.shape[0]
    if total == 0:
        return lst.size + j
    # the word holding flag number j: the first whose inclusive end passes j
    word = jnp.searchsorted(lst.ends, j.astype(jnp.float32), side="right", method="scan")
    wc = jnp.minimum(word, total - 1)
    bits = lst.words[wc]
    rank = j - (lst.ends[wc].astype(jnp.int32) - lax.population_count(bits))
    col = jnp.zeros_like(j)
    half = LIST_BITS // 2
    while half:  # the rank-th set bit of the word, by halves
        below = lax.population_count(bits & ((1 << half) - 1))
        up = rank >= below
        rank = jnp.where(up, rank - below, rank)
        bits = jnp.where(up, bits >> half, bits)
        col = col + jnp.where(up, half, 0)
        half //= 2
    return jnp.where(word < total, wc * LIST_BITS + col, lst.size + j)
