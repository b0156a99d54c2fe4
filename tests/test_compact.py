"""`compact` against numpy's flatnonzero: listed slots, fill, overflow, shapes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcjax._compact import BLOCK, SQUARE_MAX, compact


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
