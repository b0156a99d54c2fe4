"""The CPU lowerings give what the primitives give: pools bit for bit, powers within ulps."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from jax import lax
from jax.extend import core as jcore

from dcjax.eval import methods, registry
from dcjax.models.layers import LocalResponseNorm
from dcjax.transforms import lowering


def _eqn(fn, *args):
    """The single equation of ``fn``'s jaxpr."""
    (eqn,) = jax.make_jaxpr(fn)(*args).jaxpr.eqns
    return eqn


def _primitives(fn, *args) -> set[str]:
    return {e.primitive.name for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns}


def _lowered(eqn):
    """``lowering.bind`` of ``eqn`` as a function of its non-literal operands."""

    def fn(*xs):
        it = iter(xs)
        invals = [v.val if isinstance(v, jcore.Literal) else next(it) for v in eqn.invars]
        return lowering.bind(eqn, invals)[0]

    return fn


@settings(max_examples=40, deadline=None)
@given(
    h=st.integers(1, 13),
    w=st.integers(1, 13),
    win=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    dil=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    pad=st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)),
    is_max=st.booleans(),
    dtype=st.sampled_from([np.float32, np.int32]),
    seed=st.integers(0, 2**16),
)
def test_pools_match_reduce_window_bit_for_bit(h, w, win, stride, dil, pad, is_max, dtype, seed):
    assume(win != (1, 1))  # jax folds a 1x1 window away: no reduce_window to lower
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, h, w, 3)) * 10
    if dtype == np.float32:
        x[0, 0, 0, 0] = -np.inf
        x[1, -1, -1, 1] = np.inf
    x = jnp.asarray(x.astype(dtype))
    padding = ((0, 0), (pad[0], pad[1]), (pad[2], pad[3]), (0, 0))
    span_h, span_w = (win[0] - 1) * dil[0] + 1, (win[1] - 1) * dil[1] + 1
    assume(h + pad[0] + pad[1] >= span_h and w + pad[2] + pad[3] >= span_w)  # an output
    init, op = (-jnp.inf, lax.max) if is_max else (jnp.inf, lax.min)
    if dtype == np.int32:
        init = jnp.iinfo(np.int32).min if is_max else jnp.iinfo(np.int32).max

    def pool(x):
        return lax.reduce_window(
            x, np.asarray(init, dtype), op, (1, *win, 1), (1, *stride, 1), padding,
            window_dilation=(1, *dil, 1),
        )  # fmt: skip

    eqn = _eqn(pool, x)
    assert eqn.primitive in (lax.reduce_window_max_p, lax.reduce_window_min_p)
    want = np.asarray(pool(x))
    got = np.asarray(jax.jit(_lowered(eqn))(x))
    np.testing.assert_array_equal(got, want)
    assert not {"reduce_window_max", "reduce_window_min"} & _primitives(_lowered(eqn), x)


def test_nan_propagates_like_reduce_window():
    x = jnp.arange(2 * 6 * 6 * 2, dtype=jnp.float32).reshape(2, 6, 6, 2)
    x = x.at[0, 2, 3, 1].set(jnp.nan)
    eqn = _eqn(lambda x: nn.max_pool(x, (3, 3), (2, 2), padding=((1, 1), (1, 1))), x)
    want = np.asarray(lax.reduce_window_max_p.bind(x, **eqn.params))
    np.testing.assert_array_equal(np.asarray(_lowered(eqn)(x)), want)


def test_channel_and_wide_windows_keep_reduce_window():
    x = jnp.ones((1, 20, 20, 8))
    channel = _eqn(
        lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 1, 3), (1,) * 4, "SAME"), x
    )
    wide = _eqn(lambda x: nn.max_pool(x, (20, 20), (1, 1)), x)
    for eqn in (channel, wide):
        assert "reduce_window_max" in _primitives(_lowered(eqn), x)
        np.testing.assert_array_equal(
            np.asarray(_lowered(eqn)(x)), np.asarray(eqn.primitive.bind(x, **eqn.params))
        )


def test_constant_power_within_ulps_and_special_values():
    x = np.concatenate(
        [
            np.geomspace(1e-30, 1e30, 4001, dtype=np.float32),
            np.float32([0.0, -0.0, np.inf, -1.5, np.nan, 1.0]),
        ]
    )
    x = jnp.asarray(x)
    for c in (-0.75, 0.5, 2.5, -1.25, 3.75):
        eqn = _eqn(lambda x, c=c: x**c, x)
        assert eqn.primitive is lax.pow_p
        assert "pow" not in _primitives(_lowered(eqn), x)
        want = np.asarray(x**c)
        got = np.asarray(jax.jit(_lowered(eqn))(x))
        finite = np.isfinite(want) & (want != 0)
        np.testing.assert_allclose(got[finite], want[finite], rtol=(abs(4 * c) + 2) * 2**-23)
        np.testing.assert_array_equal(got[~finite], want[~finite])  # 0, inf, NaN alike


def test_integer_and_other_exponents_keep_pow():
    x = jnp.asarray([-2.0, -0.5, 3.0])
    eqn = _eqn(lambda x: lax.pow(x, 2.0), x)
    assert "pow" in _primitives(_lowered(eqn), x)
    np.testing.assert_array_equal(np.asarray(_lowered(eqn)(x)), [4.0, 0.25, 9.0])
    for c in (0.3, 4.25):  # not a quarter; too many quarters
        eqn = _eqn(lambda x, c=c: x**c, x)
        assert "pow" in _primitives(_lowered(eqn), x)


class _PoolLRN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(8, (3, 3), strides=2, padding="SAME")(x))
        x = nn.max_pool(x, (3, 3), (2, 2), padding=((0, 1), (0, 1)))
        x = LocalResponseNorm()(x)
        return nn.max_pool(x, (3, 3), (1, 1), padding="SAME")


def test_nocache_baseline_uses_the_lowerings_and_matches_the_model():
    module = _PoolLRN()
    variables = module.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
    spec = registry.ModelSpec(
        name="pool_lrn", module=module, variables=variables, frame_shape=(32, 32, 3)
    )
    apply, leaves = methods.fast_apply(spec)
    frame = jnp.asarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), np.uint8))
    prims = _primitives(apply, leaves, frame)
    assert "reduce_window_max" not in prims and "pow" not in prims
    np.testing.assert_allclose(
        np.asarray(apply(leaves, frame)), np.asarray(spec.apply(frame)), rtol=1e-5, atol=1e-6
    )
