"""`dcjax._loops`: the halving step sizes of the sparse kernels, and `run_if`."""

from __future__ import annotations

import jax.numpy as jnp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dcjax._loops import halving_sizes, run_if


@given(st.integers(1, 64), st.integers(1, 5000))
def test_halving_sizes_cover_every_count_with_less_than_one_step_of_padding(smallest, limit):
    sizes = halving_sizes(smallest, limit)
    assert sizes[-1] == smallest
    assert all(a == 2 * b for a, b in zip(sizes, sizes[1:], strict=False))
    assert sum(sizes) >= limit
    assert len(sizes) == 1 or sum(sizes[1:]) < limit  # no step more than needed
    for n in {0, 1, limit // 2, limit - 1, limit}:  # counts the kernels can meet
        units = -(-n // smallest)
        ran = [s for s in sizes if (units // (s // smallest)) % 2]
        assert sum(ran) == units * smallest
        assert 0 <= sum(ran) - n < smallest


def test_halving_sizes_reject_an_empty_step():
    with pytest.raises(ValueError, match="smallest step"):
        halving_sizes(0, 10)


def test_run_if_runs_the_function_only_where_asked():
    fn = lambda a, b: a * b  # noqa: E731
    init = jnp.float32(-1.0)
    assert float(run_if(jnp.bool_(True), fn, (jnp.float32(2.0), jnp.float32(3.0)), init)) == 6.0
    assert float(run_if(jnp.bool_(False), fn, (jnp.float32(2.0), jnp.float32(3.0)), init)) == -1.0
