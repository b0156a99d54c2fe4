"""`dcjax._loops`: the halving step sizes of the sparse kernels, `run_if` and `shifted`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.extend.core import jaxpr_as_fun

from dcjax._loops import halving_sizes, run_if, shifted, skipping, skipping_pays


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


def test_shifted_rolls_each_stream_by_its_own_shift_under_vmap():
    a = jnp.arange(3 * 5 * 6 * 2, dtype=jnp.float32).reshape(3, 5, 6, 2)
    dy = jnp.array([0, 1, -2])
    dx = jnp.array([0, 0, 3])
    got = jax.jit(jax.vmap(lambda a, dy, dx: shifted(a, dy, dx, (0, 1))))(a, dy, dx)
    for i in range(3):  # a still stream (shift 0) beside moving ones keeps its values
        want = jnp.roll(a[i], (-int(dy[i]), -int(dx[i])), axis=(0, 1))
        np.testing.assert_array_equal(got[i], want)
    # every stream still: nothing moves
    still = jax.vmap(lambda a, dy, dx: shifted(a, dy, dx, (0, 1)))(a, 0 * dy, 0 * dx)
    np.testing.assert_array_equal(still, a)


def test_shifted_under_vmap_runs_one_unbatched_loop_without_a_per_stream_select():
    # A batched trip count makes vmap select the whole carry per stream on
    # every trip (a copy of every cache in the streams' step).
    jaxpr = jax.make_jaxpr(jax.vmap(lambda a, dy, dx: shifted(a, dy, dx, (0, 1))))(
        jnp.zeros((4, 8, 8, 3)), jnp.zeros((4,), jnp.int32), jnp.zeros((4,), jnp.int32)
    )
    loops = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "while"]
    assert len(loops) == 1
    cond = loops[0].params["cond_jaxpr"].jaxpr
    assert cond.outvars[0].aval.shape == ()
    body = loops[0].params["body_jaxpr"].jaxpr
    assert not [e for e in body.eqns if e.primitive.name == "select_n"]


def test_skipping_overrides_the_backend_inside_and_restores_it_after():
    on_cpu = jax.default_backend() == "cpu"
    assert skipping_pays() == on_cpu
    with skipping(not on_cpu):
        assert skipping_pays() == (not on_cpu)
        with skipping(on_cpu):
            assert skipping_pays() == on_cpu
        assert skipping_pays() == (not on_cpu)
    with pytest.raises(RuntimeError), skipping(False):
        raise RuntimeError
    assert skipping_pays() == on_cpu
    # what a program traced inside does: the roll of `shifted` unconditional
    a = jnp.arange(12.0).reshape(3, 4)
    with skipping(False):
        jaxpr = jax.make_jaxpr(lambda a, d: shifted(a, d, d, (0, 1)))(a, jnp.int32(1))
    assert "while" not in [e.primitive.name for e in jaxpr.jaxpr.eqns]
    np.testing.assert_array_equal(
        np.asarray(jaxpr_as_fun(jaxpr)(a, jnp.int32(1))[0]),
        np.roll(np.asarray(a), (-1, -1), (0, 1)),
    )
