"""Inverted-residual chains on dirty tiles against the dense chain (`dcjax.kernels.chain`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from dcjax.kernels import Epilogue, chain, tiles


def _conv_eqn(x_shape, w_shape, strides, padding, groups):
    """A ``conv_general_dilated`` equation as a traced model holds it."""

    def f(x, w):
        return lax.conv_general_dilated(
            x, w, strides, padding, dimension_numbers=("NHWC", "HWIO", "NHWC"),
            feature_group_count=groups,
        )  # fmt: skip

    jaxpr = jax.make_jaxpr(f)(jnp.zeros(x_shape), jnp.zeros(w_shape))
    (eqn,) = jaxpr.jaxpr.eqns
    return eqn


def _bn_relu6(y, scale, bias):
    return jnp.clip(y * scale + bias, 0.0, 6.0)


def _bn_residual(y, scale, residual):
    return y * scale + residual


def _chain(rng, n, h, cin, expand, k, stride, padding, residual):
    e, cout = cin * expand, cin if residual else cin + 2
    x = jnp.asarray(rng.standard_normal((n, h, h, cin)), jnp.float32)
    wa = jnp.asarray(rng.standard_normal((1, 1, cin, e)) * 0.5, jnp.float32)
    wb = jnp.asarray(rng.standard_normal((k, k, 1, e)) * 0.5, jnp.float32)
    wc = jnp.asarray(rng.standard_normal((1, 1, e, cout)) * 0.3, jnp.float32)
    ea = _conv_eqn(x.shape, wa.shape, (1, 1), ((0, 0), (0, 0)), 1)
    eb = _conv_eqn((n, h, h, e), wb.shape, (stride, stride), padding, e)
    ho = eb.outvars[0].aval.shape[1]
    ec = _conv_eqn((n, ho, ho, e), wc.shape, (1, 1), ((0, 0), (0, 0)), 1)

    def vec(c, lo, hi):
        return jnp.asarray(rng.uniform(lo, hi, c), jnp.float32)

    epi_c = (
        Epilogue(_bn_residual, (vec(cout, 0.5, 1.5),), (x,))
        if residual
        else Epilogue(_bn_relu6, (vec(cout, 0.5, 1.5), vec(cout, -0.5, 0.5)))
    )
    links = (
        chain.Link(ea, wa, Epilogue(_bn_relu6, (vec(e, 0.5, 1.5), vec(e, 0.5, 1.0)))),
        chain.Link(eb, wb, Epilogue(_bn_relu6, (vec(e, 0.5, 1.5), vec(e, -0.5, 0.5)))),
        chain.Link(ec, wc, epi_c),
    )
    return x, links, (n, ho, ho, cout)


def _mask(rng, shape, fraction):
    return jnp.asarray(rng.random(shape) >= fraction)


CASES = [
    # (h, expand, k, stride, padding, residual)
    (16, 3, 3, 1, ((1, 1), (1, 1)), True),
    (20, 2, 3, 2, ((0, 1), (0, 1)), False),  # TensorFlow SAME padding at stride 2
    (18, 2, 5, 2, ((1, 2), (1, 2)), False),
    (14, 2, 5, 1, ((2, 2), (2, 2)), True),  # the last tile row clamped
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"h{c[0]}-k{c[2]}s{c[3]}")
@pytest.mark.parametrize("fraction", [0.0, 0.05, 0.3, 1.0])
def test_chain_matches_the_dense_chain(case, fraction):
    h, expand, k, stride, padding, residual = case
    rng = np.random.default_rng(h * 10 + k + int(fraction * 100))
    x, links, out_shape = _chain(rng, 2, h, 4, expand, k, stride, padding, residual)
    mask = _mask(rng, out_shape[:3], fraction)
    cached = jnp.asarray(rng.standard_normal(out_shape), jnp.float32)
    got = np.asarray(
        jax.jit(lambda x, m, c: chain.chain_masked_conv(x, links, m, c))(x, mask, cached)
    )
    fresh = np.asarray(chain.dense_chain(x, links))
    want = np.asarray(chain.reference_chain(x, links, mask, cached))
    m = np.asarray(mask)
    # every pixel that may not be reused is computed afresh
    np.testing.assert_allclose(got[~m], want[~m], rtol=1e-5, atol=1e-5)
    # a reusable pixel is the cache or the fresh value (recomputed with its tile)
    p = chain._plan(x.shape, links)
    dirty = np.asarray(tiles.tile_dirty(mask, p))
    in_dirty = np.zeros(got.shape[:3], bool)  # the computed rectangles (clamped origins)
    for n, ty, tx in zip(*np.nonzero(dirty), strict=True):
        oy, ox = min(ty * p.th, p.ho - p.th), min(tx * p.tw, p.wo - p.tw)
        in_dirty[n, oy : oy + p.th, ox : ox + p.tw] = True
    np.testing.assert_allclose(got[m & in_dirty], fresh[m & in_dirty], rtol=1e-5, atol=1e-5)
    if dirty.sum() <= p.dense_threshold:  # the sparse path: clean tiles keep the cache
        np.testing.assert_array_equal(got[~in_dirty], np.asarray(cached)[~in_dirty])
    else:  # the dense path: every pixel is fresh
        np.testing.assert_allclose(got, fresh, rtol=1e-5, atol=1e-5)


def test_dense_chain_is_the_layers_in_sequence():
    rng = np.random.default_rng(0)
    x, links, _ = _chain(rng, 1, 16, 4, 3, 3, 1, ((1, 1), (1, 1)), True)
    y = x
    for link in links:
        p = link.eqn.params
        y = lax.conv_general_dilated(
            y, link.w, p["window_strides"], p["padding"],
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            feature_group_count=p["feature_group_count"],
        )  # fmt: skip
        y = link.epilogue(y)
    np.testing.assert_allclose(chain.dense_chain(x, links), y, rtol=1e-5, atol=1e-5)


def test_streams_under_vmap_are_pooled_and_match_single_streams():
    rng = np.random.default_rng(3)
    x, links, out_shape = _chain(rng, 1, 16, 4, 2, 3, 1, ((1, 1), (1, 1)), False)
    xs = jnp.stack([x, x[:, ::-1]])
    # 16x16 maps: 16 tiles of 4x4 each. Alone, stream 0 (12 dirty tiles, over
    # its threshold of 10) would take the dense path; pooled with stream 1 (2
    # dirty tiles) the 14 of 32 are under 20, so its 4 clean tiles keep the cache.
    masks = np.ones((2, *out_shape[:3]), bool)
    masks[0, :, :12] = False
    masks[1, :, 0:3, 0:6] = False
    masks = jnp.asarray(masks)
    caches = jnp.asarray(rng.standard_normal((2, *out_shape)), jnp.float32)

    def one(x, m, c):
        return chain.chain_masked_conv(x, links, m, c)

    got = np.asarray(jax.jit(jax.vmap(one))(xs, masks, caches))
    for i in range(2):
        fresh = np.asarray(chain.dense_chain(xs[i], links))
        m, c = np.asarray(masks[i]), np.asarray(caches[i])
        np.testing.assert_allclose(got[i][~m], fresh[~m], rtol=1e-5, atol=1e-5)
        # a reusable pixel holds the cache or its fresh value, whole
        keep = np.all(got[i] == c, axis=-1)
        np.testing.assert_allclose(got[i][m & ~keep], fresh[m & ~keep], rtol=1e-5, atol=1e-5)
    assert np.all(got[0] == np.asarray(caches[0]), axis=-1).sum() == 4 * 16


def test_a_chain_needs_three_links_and_pixels_only_at_its_end():
    rng = np.random.default_rng(0)
    x, links, out_shape = _chain(rng, 1, 16, 4, 2, 3, 1, ((1, 1), (1, 1)), True)
    mask, cached = jnp.ones(out_shape[:3], bool), jnp.zeros(out_shape)
    with pytest.raises(ValueError, match="three links"):
        chain.chain_masked_conv(x, links[:2], mask, cached)
    bad = (links[2].__class__(links[0].eqn, links[0].w, links[2].epilogue), *links[1:])
    with pytest.raises(ValueError, match="only the last link"):
        chain.chain_masked_conv(x, bad, mask, cached)


def test_chains_pay_on_cpu_from_56_pixels_a_side():
    on_cpu = jax.default_backend() == "cpu"
    assert chain.chain_pays((56, 56)) is on_cpu
    assert chain.chain_pays((112, 64)) is on_cpu
    assert not chain.chain_pays((28, 28)) and not chain.chain_pays((56, 28))
    x, links, _ = _chain(np.random.default_rng(0), 1, 14, 4, 2, 3, 1, ((1, 1), (1, 1)), False)
    p = chain._plan(x.shape, links)
    assert (p.th, p.tw, p.nty, p.ntx) == (4, 4, 4, 4)  # the last tile clamped (14 = 3*4 + 2)


def test_per_stream_weights_under_vmap_run_the_reference_per_stream():
    rng = np.random.default_rng(5)
    x, links, out_shape = _chain(rng, 1, 16, 4, 2, 3, 1, ((1, 1), (1, 1)), False)
    mask = _mask(rng, out_shape[:3], 0.5)
    cached = jnp.asarray(rng.standard_normal(out_shape), jnp.float32)
    last = links[2]

    def one(w):
        relinked = (*links[:2], chain.Link(last.eqn, w, last.epilogue))
        return chain.chain_masked_conv(x, relinked, mask, cached)

    ws = jnp.stack([last.w, -2.0 * last.w])
    got = jax.vmap(one)(ws)
    for i in range(2):
        relinked = (*links[:2], chain.Link(last.eqn, ws[i], last.epilogue))
        want = chain.reference_chain(x, relinked, mask, cached)
        np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-5)
