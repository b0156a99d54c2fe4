"""The `rows` masked convolution against the dense oracle, pixel by pixel and path by path."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcjax._compact import LIST_BITS
from dcjax.kernels import ConvGeometry, Epilogue, masked_conv, plan, reference_masked_conv
from dcjax.kernels.lowering import dense_conv
from dcjax.kernels.reference import conv
from dcjax.kernels.rows import (
    DENSE_FRACTION,
    TAP_ROWS_MIN_CIN,
    computes_depthwise,
    computes_groups,
    row_plan,
    row_schedule,
    rows_masked_conv,
)
from tests.kernels._strategies import Case, all_eqns, cases, dense

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _expected_dense(case: Case, chunk: int | None = None) -> bool:
    """Whether the dense path runs, from a numpy count of dirty pixels."""
    p = plan(case.x.shape, case.w.shape, case.geometry)
    frac = DENSE_FRACTION["pointwise" if p.kh * p.kw == 1 else "spatial"]
    rows = p.n * p.ho * p.wo
    return int((~case.mask).sum()) > max(1, int(np.floor(frac * rows)))


def check_pixel_contract(case: Case, out: np.ndarray, dense_path: bool) -> None:
    """Fresh where the mask is false; on the sparse path the cache, bit for bit, elsewhere."""
    ref = dense(case)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    if dense_path:
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
        return
    fresh = ~case.mask
    np.testing.assert_allclose(out[fresh], ref[fresh], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(out[~fresh], case.cached[~fresh])


@st.composite
def ungrouped_cases(draw) -> Case:
    case = draw(cases(max_k=7, max_hw=20))
    if case.groups == 1:
        return case
    rng = np.random.default_rng(case.x.shape[1])
    w = rng.normal(size=(*case.w.shape[:2], case.x.shape[-1], case.w.shape[3]))
    return dataclasses.replace(case, w=w.astype(np.float32), groups=1)


@SETTINGS
@given(ungrouped_cases(), st.sampled_from([None, 1, 3, 8]))
def test_rows_matches_reference(case: Case, chunk: int | None) -> None:
    conv = jax.jit(functools.partial(rows_masked_conv, chunk=chunk, geometry=case.geometry))
    out = np.asarray(conv(case.x, case.w, case.mask, case.cached))
    check_pixel_contract(case, out, _expected_dense(case))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ungrouped_cases())
def test_tap_gathers_from_the_unpadded_input_match_the_reference(case: Case) -> None:
    """With every layer on the per-tap gathers (`TAP_ROWS_MIN_CIN` lowered to 1),
    taps reaching into the padding (SAME, VALID and explicit, asymmetric, strided
    and dilated) read zeros, and the gathers read the input's own pixel rows
    (no padded copy)."""
    from dcjax.kernels import rows as rows_module

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rows_module, "TAP_ROWS_MIN_CIN", 1)
        f = functools.partial(rows_masked_conv, dense_fraction=1.0, geometry=case.geometry)
        out = np.asarray(jax.jit(f)(case.x, case.w, case.mask, case.cached))
        eqns = all_eqns(jax.make_jaxpr(f)(case.x, case.w, case.mask, case.cached).jaxpr)
    check_pixel_contract(case, out, dense_path=False)
    n, h, w, cin = case.x.shape
    operands = [
        e.invars[0].aval.shape
        for e in eqns
        if e.primitive.name == "gather" and e.params["slice_sizes"] == (1, cin)
    ]
    assert operands and set(operands) == {(n * h * w, cin)}  # pixel rows of the input itself


#: The row kernel on SAME 1x1 and 3x3 layers, jitted once for every dirty count below.
_same_rows = jax.jit(
    functools.partial(rows_masked_conv, geometry=ConvGeometry(strides=(1, 1), padding="SAME"))
)


@pytest.mark.parametrize(
    ("k", "n_dirty", "dense_path", "units"),
    [
        (1, 0, False, 0),
        (1, 1, False, 1),
        (1, 16, False, 1),
        (1, 17, False, 2),
        (1, 240, False, 15),  # every step size: 128 + 64 + 32 + 16 rows
        (1, 256, False, 16),  # the largest step alone
        (3, 345, False, 22),  # 256 + 64 + 32
        (1, 346, True, 0),
        (3, 346, True, 0),
    ],
)
def test_schedule_by_dirty_count(k: int, n_dirty: int, dense_path: bool, units: int) -> None:
    """24x24 pixels, 16-row units: dense above 60 % (345 pixels), else the binary
    digits of the unit count pick the steps, and every dirty pixel is computed."""
    rng = np.random.default_rng(k + n_dirty)
    x = rng.normal(size=(1, 24, 24, 20)).astype(np.float32)  # 20 channels: tap gathers
    w = rng.normal(size=(k, k, 20, 5)).astype(np.float32)
    cached = rng.normal(size=(1, 24, 24, 5)).astype(np.float32) + 100.0
    rp = row_plan(plan(x.shape, w.shape, ConvGeometry(strides=(1, 1), padding="SAME")))
    assert (rp.rows, rp.chunk, rp.dense_threshold) == (576, 16, 345)
    assert rp.sizes == (256, 128, 64, 32, 16)
    mask = np.ones((1, 24, 24), bool)
    mask.reshape(-1)[rng.permutation(576)[:n_dirty]] = False
    got_dense, got_units = row_schedule(jnp.int32(n_dirty), rp)
    assert (bool(got_dense), int(got_units)) == (dense_path, units)
    out = np.asarray(_same_rows(x, w, mask, cached))
    case = Case(x, w, mask, cached, (1, 1), "SAME", (1, 1), 1, None)
    check_pixel_contract(case, out, dense_path)
    if n_dirty == 0:
        np.testing.assert_array_equal(out, cached)


@pytest.mark.parametrize(
    ("hw", "k", "sizes"),
    [
        (7, 3, (32, 16)),  # 60 % of 49 = 29 dirty at most
        (4, 3, (16,)),  # 9 dirty at most, 16 rows in all
        (2, 1, (4,)),  # 2 dirty at most: one step of the whole (4-pixel) map
        (14, 1, (128, 64, 32, 16)),  # 117 dirty at most
        (56, 3, (1024, 512, 256, 128, 64, 32, 16)),  # 1881 dirty at most
    ],
)
def test_step_sizes_cover_the_dense_threshold_and_no_more(hw, k, sizes) -> None:
    """Halving steps down to ``chunk``: any count up to the threshold is a sum of
    distinct steps with less than one chunk of padding, and no step is unneeded."""
    p = plan((1, hw, hw, 8), (k, k, 8, 8), ConvGeometry(strides=(1, 1), padding="SAME"))
    rp = row_plan(p)
    assert rp.sizes == sizes and rp.capacity == sum(sizes)
    assert rp.capacity >= rp.dense_threshold
    assert rp.capacity - sizes[0] < rp.dense_threshold  # the largest step is needed


@pytest.mark.parametrize("cin", [3, 16])
@pytest.mark.parametrize(
    ("kernel", "stride", "dilation"),
    [
        ((3, 3), (1, 1), (1, 1)),
        ((3, 3), (2, 2), (1, 1)),
        ((3, 3), (1, 1), (2, 2)),
        ((3, 3), (1, 1), (2, 1)),
        ((1, 5), (1, 2), (1, 1)),
        ((4, 2), (3, 1), (1, 1)),
    ],
)
def test_segment_window_and_tap_gathers_agree_with_the_oracle(
    cin, kernel, stride, dilation
) -> None:
    """Fewer than TAP_ROWS_MIN_CIN channels: one gather per kernel row of its
    ``kw * Cin`` contiguous values, or with a horizontally dilated kernel one
    window gather per pixel; more channels: one row gather per kernel tap. With
    non-square kernels, strides and dilation, over two images."""
    assert (cin >= TAP_ROWS_MIN_CIN) == (cin == 16)
    seed = cin + 10 * sum(stride) + 100 * sum(dilation) + 1000 * sum(kernel)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2, 13, 11, cin)).astype(np.float32)
    w = rng.normal(size=(*kernel, cin, 7)).astype(np.float32)
    geom = ConvGeometry(strides=stride, padding="SAME", dilation=dilation)
    ref = dense(Case(x, w, None, None, stride, "SAME", dilation, 1, None))
    cached = rng.normal(size=ref.shape).astype(np.float32) + 100.0
    mask = rng.uniform(size=ref.shape[:3]) > 0.3
    f = functools.partial(rows_masked_conv, dense_fraction=1.0, geometry=geom)
    out = np.asarray(f(x, w, mask, cached))
    np.testing.assert_allclose(out[~mask], ref[~mask], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(out[mask], cached[mask])
    # which gather ran: the slice each gather takes from the padded input
    eqns = all_eqns(jax.make_jaxpr(f)(x, w, mask, cached).jaxpr)
    slices = {e.params["slice_sizes"] for e in eqns if e.primitive.name == "gather"}
    if cin >= TAP_ROWS_MIN_CIN:
        expected = (1, cin)  # a pixel per tap
    elif dilation[1] == 1:
        expected = (1, kernel[1] * cin)  # a kernel row
    else:
        eh, ew = ((k - 1) * d + 1 for k, d in zip(kernel, dilation, strict=True))
        expected = (1, eh, ew, cin)  # a window
    assert expected in slices


def test_vmapped_streams_are_pooled_into_one_schedule() -> None:
    """vmap folds streams into N: scalar trip counts, no cond, results per stream."""
    rng = np.random.default_rng(1)
    xs = rng.normal(size=(3, 1, 16, 16, 4)).astype(np.float32)
    w = rng.normal(size=(1, 1, 4, 6)).astype(np.float32)
    caches = rng.normal(size=(3, 1, 16, 16, 6)).astype(np.float32) + 100.0
    masks = np.ones((3, 1, 16, 16), bool)
    masks[0, 0, :5, :7] = False
    masks[2, 0, 10, 10] = False

    def f(x, m, c):
        return masked_conv(x, w, m, c, ConvGeometry(strides=(1, 1), padding="SAME"), impl="rows")

    out = np.asarray(jax.jit(jax.vmap(f))(xs, masks, caches))
    for i in range(3):
        case = Case(xs[i], w, masks[i], caches[i], (1, 1), "SAME", (1, 1), 1, None)
        check_pixel_contract(case, out[i], dense_path=False)
    eqns = list(all_eqns(jax.make_jaxpr(jax.vmap(f))(xs, masks, caches).jaxpr))
    assert not [e for e in eqns if e.primitive.name == "cond"]
    loops = [e for e in eqns if e.primitive.name == "while"]
    rp = row_plan(plan((3, 16, 16, 4), w.shape, ConvGeometry(strides=(1, 1), padding="SAME")))
    assert len(loops) == len(rp.sizes) + 2  # around the steps, each step, the dense fallback
    for loop in loops:  # counters stay scalars: one schedule for the pooled batch
        ints = [v for v in loop.outvars if jnp.issubdtype(v.aval.dtype, jnp.integer)]
        assert ints and all(v.aval.shape == () for v in ints)


def test_batch_pools_pixels_of_all_images() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 12, 12, 3)).astype(np.float32)
    w = rng.normal(size=(3, 3, 3, 4)).astype(np.float32)
    cached = rng.normal(size=(2, 12, 12, 4)).astype(np.float32) + 100.0
    mask = np.ones((2, 12, 12), bool)
    mask[0, 3:6, 4:6] = False
    mask[1, 11, 11] = False
    geom = ConvGeometry(strides=(1, 1), padding="SAME")
    out = np.asarray(masked_conv(x, w, mask, cached, geom, impl="rows"))
    ref = np.asarray(reference_masked_conv(x, w, mask, cached, geom))
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(out[mask], cached[mask])


def _check_with_bias_relu(call, x, mask, cached, ref, bias, dense_path, atol) -> None:
    """``call(x, mask, cached, epilogue)``, jitted, with a bias-and-ReLU epilogue:
    fresh (``ref`` through the epilogue) where dirty or on the dense path, the
    cache bit for bit elsewhere."""

    def relu_bias(y, b):
        return jnp.maximum(y + b, 0.0)

    out = np.asarray(
        jax.jit(lambda x, m, c: call(x, m, c, Epilogue(relu_bias, (bias,))))(x, mask, cached)
    )
    fresh = np.maximum(ref + bias, 0.0)
    if dense_path:
        np.testing.assert_allclose(out, fresh, rtol=1e-4, atol=atol)
    else:
        np.testing.assert_allclose(out[~mask], fresh[~mask], rtol=1e-4, atol=atol)
        np.testing.assert_array_equal(out[mask], cached[mask])


@pytest.mark.parametrize(
    ("groups", "cg", "k", "stride", "n_dirty"),
    [
        (2, 16, 5, 1, 40),  # AlexNet's conv2 in small: 5x5, two groups
        (3, 16, 3, 2, 7),
        (2, 24, 1, 1, 60),
        (4, 16, 3, 1, 250),  # the dense path
    ],
)
def test_grouped_layers_match_the_oracle(groups, cg, k, stride, n_dirty) -> None:
    """A few groups of at least TAP_ROWS_MIN_CIN channels: each group's patches
    times its own weights, side by side; fresh where dirty, the cache bit for
    bit elsewhere, over two images, with an epilogue."""
    assert computes_groups(groups * cg, groups) and cg >= TAP_ROWS_MIN_CIN
    rng = np.random.default_rng(groups + 10 * k + n_dirty)
    cin, cout = groups * cg, 6 * groups
    x = rng.normal(size=(2, 13, 14, cin)).astype(np.float32)
    w = rng.normal(size=(k, k, cg, cout)).astype(np.float32)
    geom = ConvGeometry(strides=(stride, stride), padding="SAME", groups=groups)
    ref = np.asarray(conv(x, w, geom))
    cached = rng.normal(size=ref.shape).astype(np.float32) + 100.0
    mask = np.ones(ref.shape[:3], bool)
    mask.reshape(-1)[rng.permutation(mask.size)[:n_dirty]] = False
    dense_path = n_dirty > int(np.floor(DENSE_FRACTION["spatial"] * mask.size))
    bias = rng.normal(size=(cout,)).astype(np.float32)
    _check_with_bias_relu(
        lambda x, m, c, epi: rows_masked_conv(x, w, m, c, geom, epilogue=epi, chunk=8),
        x, mask, cached, ref, bias, dense_path, atol=1e-3,
    )  # fmt: skip
    # the groups are not mixed: group g's outputs do not depend on group h's inputs
    x2 = x.copy()
    x2[..., :cg] += 1.0
    out2 = np.asarray(masked_conv(x2, w, np.zeros_like(mask), cached, geom, impl="rows"))
    np.testing.assert_allclose(out2[..., cout // groups :], ref[..., cout // groups :],
                               rtol=1e-4, atol=1e-3)  # fmt: skip
    assert not np.allclose(out2[..., : cout // groups], ref[..., : cout // groups], atol=1e-3)


@pytest.mark.parametrize(
    ("cin", "mult", "k", "stride", "dilation", "padding", "n_dirty"),
    [
        (16, 1, 3, 1, 1, "SAME", 30),  # MobileNetV2's depthwise layers in small
        (24, 1, 3, 2, 1, ((1, 1), (1, 1)), 9),  # stride 2, CenterFace's padding
        (16, 2, 3, 1, 1, "VALID", 20),  # channel multiplier 2, no padding
        (16, 1, 5, 2, 1, ((1, 2), (1, 2)), 5),  # 5x5, uneven padding
        (16, 1, 3, 1, 2, "SAME", 25),  # dilated
        (16, 1, 3, 1, 1, "SAME", 300),  # the dense path
    ],
)
def test_depthwise_layers_match_the_oracle(cin, mult, k, stride, dilation, padding, n_dirty):
    """A depthwise convolution of at least TAP_ROWS_MIN_CIN channels: per tap one
    gather of whole pixels from the unpadded input (zeros outside the map),
    times the tap's weights, summed; fresh where dirty, the cache bit for bit
    elsewhere, over two images, with an epilogue."""
    assert computes_depthwise(cin, cin) and not computes_groups(cin, cin)
    rng = np.random.default_rng(cin + 10 * k + n_dirty + stride)
    cout = cin * mult
    x = rng.normal(size=(2, 13, 14, cin)).astype(np.float32)
    w = rng.normal(size=(k, k, 1, cout)).astype(np.float32)
    geom = ConvGeometry(strides=(stride, stride), padding=padding, dilation=(dilation, dilation),
                        groups=cin)  # fmt: skip
    ref = np.asarray(conv(x, w, geom))
    cached = rng.normal(size=ref.shape).astype(np.float32) + 100.0
    mask = np.ones(ref.shape[:3], bool)
    n_dirty = min(n_dirty, mask.size)
    mask.reshape(-1)[rng.permutation(mask.size)[:n_dirty]] = False
    mask[0, 0, 0] = mask[1, -1, -1] = False  # corners: taps in the padding
    dense_path = int((~mask).sum()) > int(np.floor(DENSE_FRACTION["spatial"] * mask.size))
    bias = rng.normal(size=(cout,)).astype(np.float32)
    _check_with_bias_relu(
        lambda x, m, c, epi: masked_conv(x, w, m, c, geom, impl="rows", epilogue=epi, chunk=8),
        x, mask, cached, ref, bias, dense_path, atol=1e-4,
    )  # fmt: skip
    # the sparse path pads no map: the kernel holds the dense path's pads alone
    sparse = jax.jit(lambda x, m, c: rows_masked_conv(x, w, m, c, geom, chunk=8))
    full = jax.jit(lambda x: dense_conv(x, w, plan(x.shape, w.shape, geom)))
    pads = [
        sum("stablehlo.pad " in line and f"x{cin}xf32>, tensor<f32>)" in line
            for line in f.lower(*a).as_text().splitlines())
        for f, a in ((sparse, (x, mask, cached)), (full, (x,)))
    ]  # fmt: skip
    assert pads[0] == pads[1]


@pytest.mark.parametrize(("groups", "cg", "cout"), [(2, 16, 8), (16, 1, 16)])  # 2 wide; depthwise
def test_grouped_layers_pool_vmapped_streams(groups, cg, cout) -> None:
    """Two streams of a two-group or a depthwise layer under vmap: one pooled
    schedule, each stream's result as when run alone."""
    rng = np.random.default_rng(7)
    xs = rng.normal(size=(2, 1, 9, 9, groups * cg)).astype(np.float32)
    w = rng.normal(size=(3, 3, cg, cout)).astype(np.float32)
    caches = rng.normal(size=(2, 1, 9, 9, cout)).astype(np.float32) + 100.0
    masks = np.ones((2, 1, 9, 9), bool)
    masks[0, 0, 2:5, 3:7] = False
    masks[1, 0, 8, 0] = False
    geom = ConvGeometry(strides=(1, 1), padding="SAME", groups=groups)

    def f(x, m, c):
        return masked_conv(x, w, m, c, geom, impl="rows")

    out = np.asarray(jax.jit(jax.vmap(f))(xs, masks, caches))
    for i in range(2):
        alone = np.asarray(f(xs[i], masks[i], caches[i]))
        np.testing.assert_allclose(out[i], alone, rtol=1e-5, atol=1e-5)
        ref = np.asarray(conv(xs[i], w, geom))
        np.testing.assert_allclose(out[i][~masks[i]], ref[~masks[i]], rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(out[i][masks[i]], caches[i][masks[i]])
    eqns = list(all_eqns(jax.make_jaxpr(jax.vmap(f))(xs, masks, caches).jaxpr))
    assert not [e for e in eqns if e.primitive.name == "cond"]


def test_grouped_layers_are_refused_and_dispatched_to_tiles() -> None:
    rng = np.random.default_rng(4)
    x = rng.normal(size=(1, 10, 10, 4)).astype(np.float32)
    w = rng.normal(size=(3, 3, 1, 4)).astype(np.float32)
    cached = np.zeros((1, 10, 10, 4), np.float32)
    mask = np.ones((1, 10, 10), bool)
    mask[0, 2, 2] = False
    geom = ConvGeometry(strides=(1, 1), padding="SAME", groups=4)
    with pytest.raises(ValueError, match="ungrouped"):
        rows_masked_conv(x, w, mask, cached, geom)
    out = np.asarray(masked_conv(x, w, mask, cached, geom, impl="rows"))
    ref = np.asarray(reference_masked_conv(x, w, mask, cached, geom))
    np.testing.assert_allclose(out[~mask], ref[~mask], rtol=1e-4, atol=1e-4)


def test_bfloat16_keeps_dtype() -> None:
    rng = np.random.default_rng(5)
    x, w = rng.normal(size=(1, 8, 8, 3)), rng.normal(size=(1, 1, 3, 4))
    cached = rng.normal(size=(1, 8, 8, 4))
    mask = np.ones((1, 8, 8), bool)
    mask[0, :3, :3] = False
    xb, wb, cb = (jnp.asarray(a, jnp.bfloat16) for a in (x, w, cached))
    out = rows_masked_conv(xb, wb, mask, cb, ConvGeometry(strides=(1, 1), padding="VALID"))
    ref = reference_masked_conv(xb, wb, mask, cb, ConvGeometry(strides=(1, 1), padding="VALID"))
    assert out.dtype == ref.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(out, np.float32), np.asarray(ref, np.float32), rtol=2e-2, atol=0.1
    )


def test_plan_rejects_bad_parameters() -> None:
    p = plan((1, 8, 8, 3), (1, 1, 3, 4), ConvGeometry(strides=(1, 1), padding="SAME"))
    with pytest.raises(ValueError, match="chunk"):
        row_plan(p, chunk=0)
    with pytest.raises(ValueError, match="dense_fraction"):
        row_plan(p, dense_fraction=1.5)


def test_the_dirty_pixels_are_listed_by_each_step_not_once_for_the_map() -> None:
    """Outside its loops the kernel packs the flags (`listing`: arrays of one
    entry per `LIST_BITS` pixels) and builds no integer array as long as the map
    or as the plan's capacity; the flat indices are made inside the steps, one
    slot per row the step computes; with nothing dirty it returns the cache."""
    x = np.ones((1, 16, 16, 8), np.float32)
    w = np.ones((1, 1, 8, 4), np.float32)
    geometry = ConvGeometry(strides=(1, 1), padding="SAME")
    rp = row_plan(plan(x.shape, w.shape, geometry))

    def f(x, m, c):
        return rows_masked_conv(x, w, m, c, geometry)

    mask = np.ones((1, 16, 16), bool)
    jaxpr = jax.make_jaxpr(f)(x, mask, np.zeros((1, 16, 16, 4), np.float32)).jaxpr
    words = -(-rp.rows // LIST_BITS)
    top = [v for e in all_eqns(jaxpr, into_loops=False) for v in e.outvars]
    assert not [v for v in top if jnp.issubdtype(v.aval.dtype, jnp.integer)
                and v.aval.size > words]  # fmt: skip
    inner = {v.aval.shape for e in all_eqns(jaxpr) for v in e.outvars
             if jnp.issubdtype(v.aval.dtype, jnp.integer)}  # fmt: skip
    assert inner >= {(size,) for size in rp.sizes}
    assert not inner & {(rp.capacity,), (rp.rows,)}  # no list of the map's pixels
    cached = np.full((1, 16, 16, 4), 3.0, np.float32)
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(x, mask, cached)), cached)
