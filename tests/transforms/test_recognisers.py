"""Recognisers: an equation's geometry along the frame's H and W, from the equation alone."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from dcjax.transforms.recognisers import (
    Pick,
    Window,
    conv_out_axes,
    conv_window,
    gather_pick,
    linear_map,
    reduce_window_window,
)
from dcjax.transforms.spatial import Spatial

NHWC = Spatial(axes=(1, 2), size=(12, 16), stride=(1, 1))


def _eqn(fn, *shapes, primitive: str):
    """The first equation of ``primitive`` in ``fn``'s jaxpr, and the jaxpr's constants."""
    closed = jax.make_jaxpr(fn)(*(jnp.zeros(s, jnp.float32) for s in shapes))
    consts = dict(zip(closed.jaxpr.constvars, closed.consts, strict=True))
    eqn = next(e for e in closed.jaxpr.eqns if e.primitive.name == primitive)
    return eqn, [getattr(v, "val", None) if v not in consts else consts[v] for v in eqn.invars]


def test_conv_window_reads_the_spatial_axes_of_any_layout():
    # NCHW input, OIHW kernel, NHWC output: the window follows H and W wherever they are.
    def conv(x, w):
        return lax.conv_general_dilated(
            x, w, (2, 1), ((1, 2), (0, 0)), rhs_dilation=(1, 2),
            dimension_numbers=("NCHW", "OIHW", "NHWC"),
        )  # fmt: skip

    eqn, _ = _eqn(conv, (1, 3, 12, 16), (8, 3, 3, 5), primitive="conv_general_dilated")
    sig = Spatial(axes=(2, 3), size=(12, 16), stride=(1, 1))
    assert conv_window(eqn, sig) == Window(
        size=(3, 5), strides=(2, 1), padding=((1, 2), (0, 0)),
        lhs_dilation=(1, 1), rhs_dilation=(1, 2),
    )  # fmt: skip
    assert conv_out_axes(eqn, sig) == (1, 2)
    # The frame's axes on the batch and feature axes: not a window over the frame.
    assert conv_window(eqn, Spatial(axes=(0, 1), size=(1, 3), stride=(1, 1))) is None


def test_reduce_window_window():
    def pool(x):
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 2, 1), (1, 2, 2, 1), "SAME")

    eqn, _ = _eqn(pool, (1, 12, 16, 4), primitive="reduce_window_max")
    win = reduce_window_window(eqn, NHWC)
    assert (win.size, win.strides) == ((3, 2), (2, 2))
    # SAME padding of a 3-window at stride 2 over 12 pixels: 1 in total, after.
    assert win.padding == ((0, 1), (0, 0))


@pytest.mark.parametrize(
    "idx, pick",
    [
        (np.arange(24) // 2, Pick(axis=0, repeat=2, step=1, offset=0)),  # nearest 2x up
        (1 + 3 * np.arange(4), Pick(axis=0, repeat=1, step=3, offset=1)),  # subsampling
        (np.array([0, 1, 3, 2] * 3), None),  # a permutation is no pick
    ],
)
def test_gather_pick(idx, pick):
    idx = np.asarray(idx, np.int32)[:, None]
    # The rows ``idx`` of H: the indices' axis lands where H was.
    dn = lax.GatherDimensionNumbers(
        offset_dims=(0, 2, 3), collapsed_slice_dims=(1,), start_index_map=(1,)
    )

    def take(x):
        return lax.gather(x, idx, dn, slice_sizes=(1, 1, 16, 4))

    eqn, operands = _eqn(take, (1, 12, 16, 4), primitive="gather")
    found = gather_pick(eqn, NHWC, operands[1])
    if pick is None:
        assert found is None
    else:
        assert found == (pick, (1, 2))
    # Without the constant indices nothing is recognised.
    assert gather_pick(eqn, NHWC, None) is None


def test_linear_map_marks_the_columns_that_translate():
    # Linear resampling of W by 2: the interior columns repeat one pattern per
    # phase, shifted by one input pixel; the first and last are renormalised.
    out = jax.image.resize(jnp.eye(16), (16, 32), "linear")
    weights = np.asarray(out, np.float64)  # (n_in, n_out): column o is output o's weights

    def resample_w(x):
        return lax.dot_general(x, weights.astype(np.float32), (((2,), (0,)), ((), ())))

    eqn, operands = _eqn(resample_w, (1, 12, 16, 4), primitive="dot_general")
    sigs = [NHWC, None]
    lm, axes = linear_map(eqn, sigs, operands)
    assert lm.axis == 1 and lm.weights.shape == (16, 32)
    np.testing.assert_allclose(lm.weights, weights)
    # Independently: output o samples input coordinate (o + 0.5) / 2 - 0.5 with
    # weights on its two neighbours; where one of them lies outside the input
    # (the first and last columns) the resize renormalises, and the column
    # is not a translated copy of its phase's pattern.
    src = (np.arange(32) + 0.5) / 2 - 0.5
    np.testing.assert_array_equal(lm.interior, (src >= 0) & (src <= 15))
    # dot_general's output: the lhs free axes (n, h, c), then the rhs free axis (v).
    assert axes == (1, 3)
    # A non-constant matrix is no resampling.
    assert linear_map(eqn, sigs, [None, None]) is None
