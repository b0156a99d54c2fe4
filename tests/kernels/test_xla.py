"""The `xla` masked convolution against the dense oracle, tile by tile and branch by branch."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from dcjax.kernels import (
    ConvGeometry,
    masked_conv,
    plan,
    reference_masked_conv,
    tiles,
    work_fraction,
    xla,
)
from dcjax.kernels.lowering import dense_conv
from tests.kernels._strategies import (
    Case,
    all_eqns,
    cases,
    check_list_built_in_loops,
    computed_np,
    dense,
    dirty_tiles_np,
)

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _expected_schedule(case: Case, p: tiles.TilePlan) -> tuple[bool, int]:
    """(dense, chunks) from a numpy count of dirty tiles."""
    n_dirty = int(dirty_tiles_np(case.mask, p.th, p.tw).sum())
    if n_dirty > max(1, int(np.floor(p.dense_fraction * p.num_tiles))):
        return True, 0
    return False, -(-n_dirty // p.chunk)


def check_sparse_contract(case: Case, out: np.ndarray, p: tiles.TilePlan, dense_path: bool) -> None:
    """Asserts the masked_conv contract plus the path-specific skipping behaviour."""
    ref = dense(case)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    fresh = ~case.mask
    np.testing.assert_allclose(out[fresh], ref[fresh], rtol=1e-4, atol=1e-4)
    if dense_path:
        # dense path: every pixel is freshly computed
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
        return
    computed = computed_np(case.mask, p)
    # clean pixels are the cache, bit for bit: they were skipped
    np.testing.assert_array_equal(out[~computed], case.cached[~computed])
    # computed tiles hold fresh values everywhere, also on reusable pixels
    np.testing.assert_allclose(out[computed], ref[computed], rtol=1e-4, atol=1e-4)


@SETTINGS
@given(cases())
def test_xla_matches_reference(case: Case) -> None:
    p = plan(case.x.shape, case.w.shape, case.geometry, tile=case.tile)
    conv = jax.jit(
        functools.partial(masked_conv, impl="xla", tile=case.tile, geometry=case.geometry)
    )
    out = np.asarray(conv(case.x, case.w, case.mask, case.cached))
    want_dense, want_chunks = _expected_schedule(case, p)
    got_dense, got_chunks = tiles.schedule(tiles.tile_dirty(jnp.asarray(case.mask), p).sum(), p)
    assert (bool(got_dense), int(got_chunks)) == (want_dense, want_chunks)
    check_sparse_contract(case, out, p, want_dense)


@settings(max_examples=15, deadline=None)
@given(cases(max_k=5, max_hw=16))
def test_reference_impl_is_dense_then_select(case: Case) -> None:
    out = np.asarray(
        masked_conv(case.x, case.w, case.mask, case.cached, case.geometry, impl="reference")
    )
    want = np.where(case.mask[..., None], case.cached, dense(case))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("name", "hw", "cin", "cout", "k", "s", "d", "g", "pad"),
    [
        ("alexnet_conv1_like", (45, 39), 3, 4, 11, 4, 1, 1, "VALID"),
        ("alexnet_conv2_like", (13, 11), 4, 6, 5, 1, 1, 2, ((2, 2), (2, 2))),
        ("depthwise_s2_same", (17, 18), 4, 4, 3, 2, 1, 4, "SAME"),
        ("depthwise_mult2_dil2", (15, 15), 3, 6, 3, 1, 2, 3, "SAME"),
        ("dilated_s3_explicit", (23, 19), 2, 3, 3, 3, 2, 1, ((3, 0), (1, 4))),
        ("pointwise_s2", (14, 15), 5, 7, 1, 2, 1, 1, "VALID"),
    ],
)
def test_named_layers_with_blob_masks(name, hw, cin, cout, k, s, d, g, pad) -> None:
    """Fixed geometries of the issue's layer list with a blob mask and a single pixel."""
    rng = np.random.default_rng(len(name))
    x = rng.normal(size=(2, *hw, cin)).astype(np.float32)
    wt = rng.normal(size=(k, k, cin // g, cout)).astype(np.float32)
    geom = ConvGeometry(strides=(s, s), padding=pad, dilation=(d, d), groups=g)
    p = plan(x.shape, wt.shape, geom)
    mask = np.ones((2, p.ho, p.wo), bool)
    mask[0, p.ho // 3 : p.ho // 3 + 3, 1:4] = False
    mask[1, -1, -1] = False
    cached = rng.normal(size=(2, p.ho, p.wo, cout)).astype(np.float32) + 100.0
    case = Case(x, wt, mask, cached, (s, s), pad, (d, d), g, None)
    out = np.asarray(jax.jit(lambda *a: masked_conv(*a, geom, impl="xla"))(x, wt, mask, cached))
    check_sparse_contract(case, out, p, _expected_schedule(case, p)[0])


def _fixed_case(n: int = 1, h: int = 24, w: int = 24, c: int = 3, k: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, h, w, c)).astype(np.float32)
    wt = rng.normal(size=(k, k, c, 4)).astype(np.float32)
    geom = ConvGeometry(strides=(1, 1), padding="SAME", dilation=(1, 1), groups=1)
    cached = rng.normal(size=(n, h, w, 4)).astype(np.float32) + 100.0
    return x, wt, cached, geom


@pytest.mark.parametrize(
    ("n_dirty", "dense_path", "chunks"),
    [
        (0, False, 0),
        (1, False, 1),
        (3, False, 1),
        (4, False, 2),
        (22, False, 8),
        (23, True, 0),
        (36, True, 0),
    ],
)
def test_schedule_by_dirty_count(n_dirty: int, dense_path: bool, chunks: int) -> None:
    """A 6x6 grid of 4x4 tiles, chunks of 3, dense above 22: path and work follow the count."""
    x, wt, cached, geom = _fixed_case()
    p = plan(x.shape, wt.shape, geom, tile=(4, 4))
    assert (p.nty, p.ntx, p.chunk, p.dense_threshold) == (6, 6, 3, 22)
    mask = np.ones((1, 24, 24), bool)
    for t in range(n_dirty):  # one false pixel in each of the first n_dirty tiles
        mask[0, (t // 6) * 4 + 1, (t % 6) * 4 + 2] = False
    case = Case(x, wt, mask, cached, (1, 1), "SAME", (1, 1), 1, (4, 4))
    assert _expected_schedule(case, p) == (dense_path, chunks)
    d = jnp.asarray(mask)
    got_dense, got_chunks = tiles.schedule(tiles.tile_dirty(d, p).sum(), p)
    assert (bool(got_dense), int(got_chunks)) == (dense_path, chunks)
    expected_work = 1.0 if dense_path else chunks * 3 / 36
    assert float(work_fraction(d, p)) == pytest.approx(expected_work)
    out = np.asarray(masked_conv(x, wt, mask, cached, geom, impl="xla", tile=(4, 4)))
    check_sparse_contract(case, out, p, dense_path)
    if n_dirty == 0:
        np.testing.assert_array_equal(out, cached)
    if not dense_path:
        assert (out == cached).sum() == (36 - n_dirty) * 16 * 4  # skipped tiles, exactly


def test_batched_tiles_are_pooled_under_jit_and_vmap() -> None:
    """N > 1 pools tiles; vmap over streams folds into N and keeps scalar trip counts."""
    x, wt, cached, geom = _fixed_case(n=1)
    rng = np.random.default_rng(1)
    xs = rng.normal(size=(3, 1, 24, 24, 3)).astype(np.float32)
    masks = np.ones((3, 1, 24, 24), bool)
    masks[0, 0, :5, :7] = False
    masks[2, 0, 10, 10] = False
    caches = np.stack([cached] * 3)

    def f(x, m, c):
        return masked_conv(x, wt, m, c, geom, impl="xla", tile=(4, 4))

    out = np.asarray(jax.jit(jax.vmap(f))(xs, masks, caches))
    for i in range(3):
        case = Case(xs[i], wt, masks[i], caches[i], (1, 1), "SAME", (1, 1), 1, (4, 4))
        p = plan(xs[i].shape, wt.shape, geom, tile=(4, 4))
        # per stream, the behaviour of a pooled 3-image batch: still a sparse branch
        check_sparse_contract(case, out[i], p, dense_path=False)
    eqns = list(all_eqns(jax.make_jaxpr(jax.vmap(f))(xs, masks, caches).jaxpr))
    assert not [e for e in eqns if e.primitive.name == "cond"]  # no select of both paths
    loops = [e for e in eqns if e.primitive.name == "while"]
    pooled = plan((3, 24, 24, 3), wt.shape, geom, tile=(4, 4))
    # around the steps, each halving step, the dense fallback: all survive vmap
    assert len(loops) == len(pooled.sizes) + 2
    for loop in loops:  # with scalar counters: one schedule for the pooled batch
        ints = [v for v in loop.outvars if jnp.issubdtype(v.aval.dtype, jnp.integer)]
        assert ints and all(v.aval.shape == () for v in ints)


def test_batched_equals_per_image() -> None:
    x, wt, cached, geom = _fixed_case(n=2, seed=3)
    mask = np.ones((2, 24, 24), bool)
    mask[0, 3:9, 4:6] = False
    mask[1, 20:, 20:] = False
    out = np.asarray(masked_conv(x, wt, mask, cached, geom, impl="xla"))
    ref = np.asarray(reference_masked_conv(x, wt, mask, cached, geom))
    np.testing.assert_allclose(out[~mask], ref[~mask], rtol=1e-4, atol=1e-4)
    p = plan(x.shape, wt.shape, geom)
    comp = computed_np(mask, p)
    np.testing.assert_array_equal(out[~comp], cached[~comp])


def test_bfloat16_inputs_keep_dtype() -> None:
    x, wt, cached, geom = _fixed_case()
    mask = np.ones((1, 24, 24), bool)
    mask[0, :4, :4] = False
    xb, wb, cb = (jnp.asarray(a, jnp.bfloat16) for a in (x, wt, cached))
    out = masked_conv(xb, wb, mask, cb, geom, impl="xla")
    ref = reference_masked_conv(xb, wb, mask, cb, geom)
    assert out.dtype == ref.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(out, np.float32)[~mask], np.asarray(ref, np.float32)[~mask], rtol=2e-2, atol=0.1
    )


@pytest.mark.skipif(
    jax.default_backend() != "cpu",
    reason="inspects the CPU program: only XLA:CPU convolves grouped layers group by group "
    "(kernels.lowering.group_weights); other backends take the weights whole",
)
def test_grouped_weights_are_sliced_once_a_frame_with_no_placeholder() -> None:
    """A grouped layer's per-group weight slices are made in a loop around the sparse
    loop, so no zero-filled placeholder of their shape is built (and copied) on every
    call, and the sparse path still matches the reference on every dirty pixel."""
    x = jax.random.normal(jax.random.key(0), (1, 12, 12, 8))
    w = jax.random.normal(jax.random.key(1), (3, 3, 4, 6)) * 0.1  # 2 groups of 4 -> 3
    mask = np.ones((1, 12, 12), bool)
    mask[0, 2:5, 6:9] = False  # a few dirty tiles: the sparse path
    cached = jnp.full((1, 12, 12, 6), 7.0)
    geom = ConvGeometry(strides=(1, 1), padding="SAME", groups=2)
    fn = jax.jit(lambda x, w, m, c: masked_conv(x, w, m, c, geom, impl="xla"))
    hlo = fn.lower(x, w, mask, cached).compile().as_text()
    placeholders = [ln for ln in hlo.splitlines() if "f32[3,3,4,3]" in ln and "broadcast" in ln]
    assert placeholders == []
    out = np.asarray(fn(x, w, mask, cached))
    ref = np.asarray(reference_masked_conv(x, w, mask, cached, geom))
    np.testing.assert_allclose(out[~mask], ref[~mask], rtol=1e-5, atol=1e-5)
    assert (out[0, 10:, :2] == 7.0).all()  # a clean tile keeps the cache


def test_the_dirty_tile_list_is_built_inside_the_sparse_path() -> None:
    """The list of dirty tiles is made in the loop around the steps, so a frame with
    nothing dirty, or one that takes the dense path, does not build it: no equation
    outside the loops yields an integer array of the plan's capacity."""
    x = np.ones((1, 16, 16, 3), np.float32)
    w = np.ones((3, 3, 3, 4), np.float32)
    geom = ConvGeometry(strides=(1, 1), padding="SAME")
    p = plan(x.shape, w.shape, geom)

    def f(x, m, c):
        return masked_conv(x, w, m, c, geom, impl="xla")

    check_list_built_in_loops(f, x, 4, p.capacity)


def test_which_layers_read_padding() -> None:
    """A padded layer's border windows reach into its padding; a VALID layer's
    and a layer padded only past its last window's end do not."""
    geom = ConvGeometry(strides=(1, 1), padding="SAME")
    assert tiles.reads_padding(plan((1, 10, 10, 2), (3, 3, 2, 2), geom, tile=(4, 4)))
    valid = ConvGeometry(strides=(1, 1), padding="VALID")
    assert not tiles.reads_padding(plan((1, 10, 10, 2), (3, 3, 2, 2), valid))
    # stride 2 on an even side: 'SAME' pads (0, 1), and the last window needs
    # rows 8..10 of 10: padding; cropping that row instead reads none
    same2 = ConvGeometry(strides=(2, 2), padding="SAME")
    assert tiles.reads_padding(plan((1, 10, 10, 2), (3, 3, 2, 2), same2))
    cropped = ConvGeometry(strides=(2, 2), padding=((0, -1), (0, -1)))
    assert not tiles.reads_padding(plan((1, 10, 10, 2), (3, 3, 2, 2), cropped))


@pytest.mark.parametrize(
    "hw, k, s, d, pad, tile",
    [
        ((11, 13), 3, 2, 1, ((1, 0), (1, 0)), (3, 4)),  # a stem: stride 2, padding before only
        ((10, 10), 3, 1, 1, "SAME", (4, 4)),  # last tile clamped and overlapping
        ((12, 9), 5, 1, 2, ((4, 4), (3, 5)), (3, 3)),  # dilated, uneven pads wider than a tile
        ((9, 9), 3, 1, 1, ((0, 2), (2, 0)), (2, 5)),  # padding after only, on one axis
        ((7, 8), 5, 1, 1, ((2, 2), (2, 2)), (5, 6)),  # one tile row: both borders in one window
        ((3, 8), 5, 1, 1, ((2, 2), (2, 2)), (3, 4)),  # a window taller than the map
        ((12, 12), 3, 2, 1, "VALID", (2, 3)),  # no padding: one slice per window
    ],
)
def test_windows_read_from_the_unpadded_input(hw, k, s, d, pad, tile) -> None:
    """Every tile's window read from the unpadded input equals the window of the
    input padded by numpy (an independent oracle), zeros in the padding
    included."""
    x = np.random.default_rng(0).normal(size=(2, *hw, 3)).astype(np.float32)
    geom = ConvGeometry(strides=(s, s), padding=pad, dilation=(d, d))
    p = plan(x.shape, (k, k, 3, 4), geom, tile=tile)
    (ply, phy), (plx, phx) = p.pads
    xp = np.pad(x, ((0, 0), (ply, max(phy, 0)), (plx, max(phx, 0)), (0, 0)))
    origins = np.array(
        [
            (n, min(ty * p.th, p.ho - p.th), min(tx * p.tw, p.wo - p.tw))
            for n in range(2)
            for ty in range(p.nty)
            for tx in range(p.ntx)
        ],
        np.int32,
    )
    want = np.stack(
        [xp[n, oy * s : oy * s + p.win_h, ox * s : ox * s + p.win_w] for n, oy, ox in origins]
    )
    got = np.asarray(jax.jit(xla.gather_windows, static_argnums=2)(x, origins, p))
    np.testing.assert_array_equal(got, want)


def test_a_sparse_frame_pads_no_map() -> None:
    """The sparse path of a padded 3x3 layer pads nothing as large as its input
    (the windows are read from the input itself): the only such pad is the
    dense path's, if its lowering pads."""
    x = jax.random.normal(jax.random.key(0), (1, 32, 48, 3))
    w = jax.random.normal(jax.random.key(1), (3, 3, 3, 8))
    geom = ConvGeometry(strides=(2, 2), padding=((1, 0), (1, 0)))
    mask = np.ones((1, 16, 24), bool)
    mask[0, 0:3, 20:24] = False  # a corner: windows crossing two borders
    cached = jnp.zeros((1, 16, 24, 8))
    fn = jax.jit(lambda x, m, c: masked_conv(x, w, m, c, geom, impl="xla"))

    def map_pads(f, *args):
        eqns = all_eqns(jax.make_jaxpr(f)(*args).jaxpr)
        return [e for e in eqns if e.primitive.name == "pad" and e.outvars[0].aval.size >= x.size]

    p = plan(x.shape, w.shape, geom)
    assert len(map_pads(fn, x, mask, cached)) == len(map_pads(lambda x: dense_conv(x, w, p), x))
    out = np.asarray(fn(x, mask, cached))
    ref = np.asarray(reference_masked_conv(x, w, mask, cached, geom))
    np.testing.assert_allclose(out[0, ~mask[0]], ref[0, ~mask[0]], rtol=1e-5, atol=1e-5)
