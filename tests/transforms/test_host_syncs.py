"""The host synchronisation points of a program (`dcjax.transforms.host_syncs`):
every `while` and `cond`, nested ones included, none inside a Pallas kernel."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from dcjax.transforms.host_syncs import host_syncs, sub_jaxprs


def _kinds(fn, *args):
    return [s.primitive for s in host_syncs(jax.make_jaxpr(fn)(*args))]


def test_conditionals_and_loops_with_a_dynamic_trip_count_are_listed():
    def f(x, n):
        y = lax.cond(x.sum() > 0, lambda v: v + 1, lambda v: v - 1, x)
        return lax.fori_loop(0, n, lambda i, v: v * 2, y)

    assert _kinds(f, jnp.ones(3), jnp.int32(2)) == ["cond", "while"]


def test_static_loops_and_selects_are_not_listed():
    def f(x):
        y = lax.fori_loop(0, 3, lambda i, v: v * 2, x)  # static bounds: a scan
        return jnp.where(y.sum() > 0, y, -y)

    assert _kinds(f, jnp.ones(3)) == []


def test_nested_control_flow_is_found_inside_jit_scan_and_branches():
    @jax.jit
    def inner(v):
        return lax.while_loop(lambda c: c[0] < c[1].sum(), lambda c: (c[0] + 1, c[1]), (0.0, v))[1]

    def f(x):
        def body(carry, _):
            return lax.cond(carry.sum() > 0, inner, lambda v: v, carry), None

        return lax.scan(body, x, None, length=2)[0]

    syncs = host_syncs(jax.make_jaxpr(f)(jnp.ones(3)))
    assert [s.primitive for s in syncs] == ["cond", "while"]
    # each says where it was made: this file, the line of the `lax.` call
    assert all(s.where.startswith("test_host_syncs.py:") for s in syncs)
    assert "inner" in syncs[1].where


def test_loops_inside_a_pallas_kernel_run_on_the_device_and_are_not_listed():
    def kernel(n_ref, x_ref, o_ref):
        o_ref[...] = lax.fori_loop(0, n_ref[0], lambda i, v: v + 1.0, x_ref[...])

    def f(n, x):
        shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
        out = pl.pallas_call(kernel, out_shape=shape, interpret=True)(n, x)
        return lax.cond(n[0] > 0, lambda: out, lambda: x)

    n, x = jnp.array([3], jnp.int32), jnp.zeros((8, 128))
    assert _kinds(f, n, x) == ["cond"]
    assert float(f(n, x)[0, 0]) == 3.0


def test_sub_jaxprs_opens_closed_jaxprs_in_order():
    jaxpr = jax.make_jaxpr(lambda p, x: lax.cond(p, jnp.sin, jnp.cos, x))(True, 1.0)
    (eqn,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "cond"]
    branches = sub_jaxprs(eqn.params)
    assert len(branches) == 2
    assert [e.primitive.name for b in branches for e in b.eqns] == ["cos", "sin"]
