"""Transposed convolutions whose kernel tiles the output (`dcjax.kernels.transposed`)
against XLA's convolution of the dilated input, and which equations take them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax import lax

from dcjax.kernels import dense_conv_eqn
from dcjax.kernels.transposed import subpixel_conv, tiles_output


def _params(x_shape, w_shape, *, stride, layout=("NHWC", "HWIO", "NHWC"), **changes):
    """The params of a transposed convolution as traced (the input dilated by
    ``stride``, padded by ``stride - 1``), with ``changes``."""
    jaxpr = jax.make_jaxpr(
        lambda x, w: lax.conv_general_dilated(
            x,
            w,
            (1, 1),
            [(s - 1, s - 1) for s in stride],
            lhs_dilation=stride,
            dimension_numbers=layout,
        )
    )(jnp.zeros(x_shape), jnp.zeros(w_shape))
    (eqn,) = jaxpr.jaxpr.eqns
    return {**eqn.params, **changes}


def _eqn(x, w, params):
    """The ``conv_general_dilated`` equation of ``params`` on ``x`` and ``w``."""
    jaxpr = jax.make_jaxpr(lambda x, w: lax.conv_general_dilated_p.bind(x, w, **params))(x, w)
    (eqn,) = jaxpr.jaxpr.eqns
    return eqn


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 2),
    h=st.integers(1, 6),
    w=st.integers(1, 6),
    sy=st.integers(2, 3),
    sx=st.integers(2, 3),
    cin=st.integers(1, 5),
    cout=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_the_matrix_product_equals_the_convolution_of_the_dilated_input(
    n, h, w, sy, sx, cin, cout, seed
):
    kx, kw = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (n, h, w, cin))
    k = jax.random.normal(kw, (sy, sx, cin, cout))
    params = _params(x.shape, k.shape, stride=(sy, sx))
    assert tiles_output(params, k.shape)
    want = lax.conv_general_dilated_p.bind(x, k, **params)
    got = subpixel_conv(x, k, params)
    assert got.shape == want.shape == (n, sy * h, sx * w, cout)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_bfloat16_operands_keep_their_dtype():
    x = jax.random.normal(jax.random.key(0), (1, 4, 5, 3)).astype(jnp.bfloat16)
    k = jax.random.normal(jax.random.key(1), (2, 2, 3, 4)).astype(jnp.bfloat16)
    params = _params(x.shape, k.shape, stride=(2, 2))
    got = subpixel_conv(x, k, params)
    want = lax.conv_general_dilated_p.bind(x, k, **params)
    assert got.dtype == want.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=2e-2, atol=5e-2
    )


@pytest.mark.parametrize(
    "kernel, changes",
    [
        ((3, 3), {}),  # taps overlap: kernel wider than the stride
        ((2, 2), {"padding": ((0, 0), (1, 1))}),  # ONNX pads: outputs shifted
        ((2, 2), {"padding": ((1, 2), (1, 1))}),  # output_padding
        ((2, 2), {"window_strides": (2, 2)}),
        ((2, 2), {"rhs_dilation": (2, 1)}),
        ((2, 2), {"feature_group_count": 2}),
        ((2, 2), {"preferred_element_type": jnp.float32}),
        ((2, 2), {"layout": ("NCHW", "OIHW", "NCHW")}),
        ((1, 1), {"lhs_dilation": (1, 1), "padding": ((0, 0), (0, 0))}),  # no dilation
    ],
)
def test_only_non_overlapping_unpadded_transposed_convolutions_take_it(kernel, changes):
    changes = dict(changes)
    layout = changes.pop("layout", ("NHWC", "HWIO", "NHWC"))
    stride = changes.pop("lhs_dilation", (2, 2))
    w_shape = (*kernel, 4, 4) if layout[1] == "HWIO" else (4, 4, *kernel)
    x_shape = (1, 6, 6, 4) if layout[0] == "NHWC" else (1, 4, 6, 6)
    params = _params(x_shape, w_shape, stride=stride, layout=layout, **changes)
    assert not tiles_output(params, w_shape)
    assert tiles_output(_params((1, 6, 6, 4), (2, 2, 4, 4), stride=(2, 2)), (2, 2, 4, 4))


def test_the_dense_path_computes_such_a_layer_without_a_convolution():
    """`dense_conv_eqn` (the dense step's and the cached step's path for a
    transposed layer) takes the matrix product on CPU and equals XLA's."""
    x = jax.random.normal(jax.random.key(0), (1, 5, 7, 6))
    k = jax.random.normal(jax.random.key(1), (2, 2, 6, 3))
    eqn = _eqn(x, k, _params(x.shape, k.shape, stride=(2, 2)))
    jaxpr = jax.make_jaxpr(lambda x, k: dense_conv_eqn(eqn, [x, k]))(x, k)
    prims = {e.primitive.name for e in jaxpr.jaxpr.eqns}
    assert ("conv_general_dilated" in prims) == (jax.default_backend() != "cpu")
    np.testing.assert_allclose(
        np.asarray(dense_conv_eqn(eqn, [x, k])),
        np.asarray(lax.conv_general_dilated_p.bind(x, k, **eqn.params)),
        rtol=1e-5,
        atol=1e-5,
    )
