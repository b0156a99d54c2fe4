"""`compact` against numpy's flatnonzero: listed slots, fill, overflow, shapes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcjax._compact import BLOCK, LIST_BITS, LIST_MAX, SQUARE_MAX, compact, listed, listing


def _expected(flags: np.ndarray, capacity: int) -> np.ndarray:
    idx = np.flatnonzero(flags)[:capacity]
    fill = flags.size + np.arange(capacity)
    fill[: idx.size] = idx
    return fill


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    density=st.floats(0.0, 1.0),
    capacity=st.integers(0, 300),
    seed=st.integers(0, 2**31 - 1),
)
def test_compact_lists_the_true_entries_in_order_then_distinct_out_of_range_slots(
    shape, density, capacity, seed
):
    flags = np.random.default_rng(seed).random(shape) < density
    got = np.asarray(jax.jit(compact, static_argnums=1)(jnp.asarray(flags), capacity))
    assert got.dtype == np.int32 and got.shape == (capacity,)
    np.testing.assert_array_equal(got, _expected(flags, capacity))


@pytest.mark.parametrize("size", [1, 2, 196, 1024, 1025, 3137, 12544, 32 * 1024 + 33, 50176])
def test_compact_matches_nonzero_at_kernel_sizes_all_true_and_all_false(size):
    """Every flag set (the largest prefix sums) and none set, where float rounding would show."""
    for flags in (np.ones(size, bool), np.zeros(size, bool)):
        got = np.asarray(compact(jnp.asarray(flags), size))
        np.testing.assert_array_equal(got, _expected(flags, size))


@pytest.mark.parametrize("size", [SQUARE_MAX, SQUARE_MAX + 1, BLOCK * SQUARE_MAX + 1, 50176])
def test_compact_across_the_layouts_of_the_prefix_sum(size):
    """One square layout up to SQUARE_MAX, blocks of BLOCK above it, blocks of
    blocks above BLOCK * SQUARE_MAX: scattered flags and runs crossing block edges."""
    rng = np.random.default_rng(size)
    flags = rng.random(size) < 0.3
    flags[BLOCK - 3 : 3 * BLOCK + 5] = True  # a run across block boundaries
    for capacity in (size, int(flags.sum()) // 2):
        got = np.asarray(jax.jit(compact, static_argnums=1)(jnp.asarray(flags), capacity))
        np.testing.assert_array_equal(got, _expected(flags, capacity))


def test_compact_of_an_empty_array_is_all_fill():
    got = np.asarray(compact(jnp.zeros((0, 5), bool), 3))
    np.testing.assert_array_equal(got, [0, 1, 2])


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 40), min_size=1, max_size=3),
    density=st.floats(0.0, 1.0),
    start=st.integers(0, 300),
    n=st.integers(0, 300),
    seed=st.integers(0, 2**31 - 1),
)
def test_listed_slots_are_those_of_compact(shape, density, start, n, seed):
    """`listed(listing(flags), start, n)` is slots ``start .. start + n - 1`` of
    numpy's listing: the true entries in order, then ``size + slot``."""
    flags = np.random.default_rng(seed).random(shape) < density
    lst = jax.jit(listing)(jnp.asarray(flags))
    got = np.asarray(jax.jit(listed, static_argnums=2)(lst, start, n))
    assert got.dtype == np.int32 and got.shape == (n,)
    np.testing.assert_array_equal(got, _expected(flags, start + n)[start:])
    assert int(lst.count) == int(flags.sum())


@pytest.mark.parametrize("size", [1, LIST_BITS - 1, LIST_BITS, LIST_BITS + 1, 110592])
def test_listing_of_all_and_of_none_and_of_number_flags(size):
    """Every flag set (the largest prefix sums), none set, and flags given as
    numbers (nonzero is set), across the word boundary and at a 288x384 map."""
    rng = np.random.default_rng(size)
    numbers = rng.integers(-2, 3, size).astype(np.float32)
    for flags in (np.ones(size, bool), np.zeros(size, bool), numbers):
        lst = listing(jnp.asarray(flags))
        assert int(lst.count) == np.count_nonzero(flags)
        np.testing.assert_array_equal(
            np.asarray(listed(lst, 0, size + 3)), _expected(flags != 0, size + 3)
        )


def test_listing_of_an_empty_array_is_all_fill():
    lst = listing(jnp.zeros((0, 5), bool))
    assert int(lst.count) == 0
    np.testing.assert_array_equal(np.asarray(listed(lst, 2, 3)), [2, 3, 4])


def test_a_batch_of_listings_counts_each_and_too_many_flags_are_refused():
    flags = np.zeros((3, 40), bool)
    flags[0, :5] = flags[1, 3:10] = flags[2, 39] = True
    lst = jax.vmap(listing)(jnp.asarray(flags))
    np.testing.assert_array_equal(np.asarray(lst.count), [5, 7, 1])
    got = jax.vmap(lambda one: listed(one, 1, 4))(lst)
    np.testing.assert_array_equal(np.asarray(got), [_expected(f, 5)[1:] for f in flags])
    with pytest.raises(ValueError, match="fewer than"):
        jax.eval_shape(listing, jax.ShapeDtypeStruct((LIST_MAX,), jnp.bool_))
