"""The per-shape lowerings of `dcjax.kernels.lowering` against XLA's convolution,
and which layer shapes take them (dense and sparse paths alike)."""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jax import lax

from dcjax.kernels import ConvGeometry, masked_conv, plan, reference
from tests.kernels._strategies import Case, all_eqns, cases, dense


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_conv_as_dot_equals_the_convolution(case: Case) -> None:
    """The im2col product matches XLA's convolution for every stride, dilation and padding."""
    from dcjax.kernels.lowering import conv_as_dot

    assume(case.groups == 1)  # grouped convolutions never take this path
    p = plan(case.x.shape, case.w.shape, case.geometry)
    out = np.asarray(jax.jit(conv_as_dot, static_argnums=2)(case.x, case.w, p))
    np.testing.assert_allclose(out, dense(case), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "hw, cin, cout, k, as_dot",
    [
        (7, 512, 2048, 1, True),  # ResNet-50's 1x1 layers: a plain matrix product
        (56, 64, 256, 1, True),  # every 1x1 layer, narrow ones too
        (112, 16, 96, 1, True),
        (56, 256, 128, 1, True),
        (7, 512, 512, 3, True),  # a 3x3 layer on a 7x7 map with many channels
        (14, 256, 256, 3, False),  # 14x14: im2col's copies cost more than they save
        (7, 32, 128, 5, False),  # few input channels
        (7, 512, 512, 1, True),
    ],
)
def test_dense_convolutions_go_through_a_product_where_it_pays(hw, cin, cout, k, as_dot) -> None:
    from dcjax.kernels import dense_conv_eqn
    from dcjax.kernels.lowering import dot_pays

    p = plan((1, hw, hw, cin), (k, k, cin, cout), ConvGeometry(strides=(1, 1), padding="SAME"))
    assert dot_pays(p) is as_dot
    x = jax.random.normal(jax.random.key(0), (1, hw, hw, cin))
    w = jax.random.normal(jax.random.key(1), (k, k, cin, cout)) * 0.05

    def conv(x, w):
        dn = ("NHWC", "HWIO", "NHWC")
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dn)

    eqn = jax.make_jaxpr(conv)(x, w).jaxpr.eqns[0]
    lowered = jax.make_jaxpr(lambda x, w: dense_conv_eqn(eqn, (x, w)))(x, w).jaxpr
    names = {e.primitive.name for e in all_eqns(lowered)}
    on_cpu = jax.default_backend() == "cpu"
    assert ("dot_general" in names) is (as_dot and on_cpu)
    assert ("conv_general_dilated" in names) is not (as_dot and on_cpu)
    np.testing.assert_allclose(dense_conv_eqn(eqn, (x, w)), conv(x, w), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "cin, cout, padded",
    [(3, 24, True), (3, 32, True), (3, 17, True), (3, 64, False), (3, 40, False), (4, 24, False)],
)
def test_rgb_layers_with_17_to_32_outputs_get_a_zero_fourth_channel(cin, cout, padded) -> None:
    """The dense path and the tile kernel's sparse path both pad where `rgb_pays`, and
    compute the same convolution as XLA's on the three channels."""
    from dcjax.kernels import dense_conv_eqn
    from dcjax.kernels.lowering import rgb_pays

    geom = ConvGeometry(strides=(2, 2), padding=((1, 1), (1, 1)))
    p = plan((1, 20, 22, cin), (3, 3, cin, cout), geom)
    assert rgb_pays(p) is padded
    rng = np.random.default_rng(cout)
    x = rng.normal(size=(1, 20, 22, cin)).astype(np.float32)
    w = rng.normal(size=(3, 3, cin, cout)).astype(np.float32)
    mask = np.ones((1, p.ho, p.wo), bool)
    mask[0, 2:5, 3:7] = False
    cached = np.zeros((1, p.ho, p.wo, cout), np.float32)

    def conv(x, w):
        dn = ("NHWC", "HWIO", "NHWC")
        return jax.lax.conv_general_dilated(x, w, (2, 2), geom.padding, dimension_numbers=dn)

    want = np.asarray(conv(x, w))
    eqn = jax.make_jaxpr(conv)(x, w).jaxpr.eqns[0]
    channels = 4 if padded and jax.default_backend() == "cpu" else cin
    paths = {
        "dense": (lambda x, w: dense_conv_eqn(eqn, (x, w)), np.ones_like(mask)),
        "sparse": (lambda x, w: masked_conv(x, w, mask, cached, geom, impl="xla"), ~mask),
    }
    for name, (fn, fresh) in paths.items():
        jaxpr = jax.make_jaxpr(fn)(x, w).jaxpr
        convs = [e for e in all_eqns(jaxpr) if e.primitive.name == "conv_general_dilated"]
        assert convs, name
        assert {e.invars[0].aval.shape[-1] for e in convs} == {channels}, name
        out = np.asarray(jax.jit(fn)(x, w))
        np.testing.assert_allclose(out[fresh], want[fresh], rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the fixed rules pad RGB on CPU only")
def test_a_models_lowerings_compute_whole_maps_and_tile_windows_keep_the_fixed_rules() -> None:
    """Inside `lowering.use`, a layer computed over its whole map (`dense_conv_eqn`,
    the tile kernel's dense path) takes the model's choice; its tile windows
    (the sparse path, `dense_conv_eqn(..., whole=False)`) keep the fixed rules',
    here a zero fourth channel. Every path computes the convolution."""
    from dcjax.kernels import dense_conv_eqn, lowering

    geom = ConvGeometry(strides=(2, 2), padding=((1, 1), (1, 1)))
    p = plan((1, 20, 22, 3), (3, 3, 3, 32), geom)
    assert lowering.prior(p) == "rgb"
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, 20, 22, 3)).astype(np.float32)
    w = rng.normal(size=(3, 3, 3, 32)).astype(np.float32)
    mask = np.ones((1, p.ho, p.wo), bool)
    mask[0, 2:5, 3:7] = False
    cached = np.zeros((1, p.ho, p.wo, 32), np.float32)

    def conv(x, w):
        dn = ("NHWC", "HWIO", "NHWC")
        return jax.lax.conv_general_dilated(x, w, (2, 2), geom.padding, dimension_numbers=dn)

    want = np.asarray(conv(x, w))
    eqn = jax.make_jaxpr(conv)(x, w).jaxpr.eqns[0]

    def fns():  # new functions each time: jax keeps the traces of a function it has seen
        return {
            "whole": lambda x, w: dense_conv_eqn(eqn, (x, w)),
            "windows": lambda x, w: dense_conv_eqn(eqn, (x, w), whole=False),
            "kernel": lambda x, w: masked_conv(x, w, mask, cached, geom, impl="xla"),
        }

    def convs(fn):
        jaxpr = jax.make_jaxpr(fn)(x, w).jaxpr
        return [e.invars[0].aval.shape[-1] for e in all_eqns(jaxpr)
                if e.primitive.name == "conv_general_dilated"]  # fmt: skip

    fixed = {name: convs(fn) for name, fn in fns().items()}
    windows = len(fixed["kernel"]) - 1  # one convolution a window step, one the dense path
    assert windows >= 1
    assert fixed == {"whole": [4], "windows": [4], "kernel": [4] * (windows + 1)}
    with lowering.use(lowering.choices([(p, "taps")])):
        assert lowering.chosen(p) == "taps" and lowering.chosen(p, whole=False) == "rgb"
        assert {name: convs(fn) for name, fn in fns().items()} == {
            "whole": [], "windows": [4], "kernel": [4] * windows
        }  # fmt: skip
        for name, fn in fns().items():
            fresh = ~mask if name == "kernel" else np.ones_like(mask)
            out = np.asarray(jax.jit(fn)(x, w))
            np.testing.assert_allclose(out[fresh], want[fresh], rtol=1e-4, atol=1e-4)
        everything = np.zeros_like(mask)  # all dirty: the kernel's dense path
        out = masked_conv(x, w, everything, cached, geom, impl="xla")
        np.testing.assert_allclose(np.asarray(out), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "cin, cout, k, strides, dilation, taps",
    [
        (3, 16, 3, 1, 1, True),  # YOLO-tiny's stem
        (3, 8, 3, 2, 1, True),
        (3, 16, 3, 2, 2, True),
        (1, 4, 5, 1, 1, True),  # 25 terms
        (3, 17, 3, 1, 1, False),  # more outputs
        (4, 16, 3, 1, 1, False),  # 36 terms
        (3, 16, 5, 2, 1, False),  # 75 terms (PilotNet's stem)
        (3, 16, 1, 1, 1, False),  # 1x1: a matrix product
    ],
)
def test_few_channel_layers_with_few_outputs_are_a_sum_of_taps(
    cin, cout, k, strides, dilation, taps
) -> None:
    """Where `taps_pays`, the dense path and the tile kernel's sparse path compute
    the convolution on CPU with no convolution operation (elementwise terms of
    strided slices), and match XLA's convolution."""
    from dcjax.kernels import dense_conv_eqn
    from dcjax.kernels.lowering import taps_pays

    geom = ConvGeometry(
        strides=(strides, strides), padding=((1, 2), (2, 1)), dilation=(dilation,) * 2
    )
    p = plan((1, 19, 23, cin), (k, k, cin, cout), geom)
    assert taps_pays(p) is taps
    rng = np.random.default_rng(cin * 100 + cout + k)
    x = rng.normal(size=(1, 19, 23, cin)).astype(np.float32)
    w = rng.normal(size=(k, k, cin, cout)).astype(np.float32)
    mask = np.ones((1, p.ho, p.wo), bool)
    mask[0, 1:4, 2:6] = False
    mask[0, p.ho - 2 :, :3] = False  # a tile on the padded border
    cached = np.zeros((1, p.ho, p.wo, cout), np.float32)

    def conv(x, w):
        dn = ("NHWC", "HWIO", "NHWC")
        return jax.lax.conv_general_dilated(
            x, w, geom.strides, geom.padding, rhs_dilation=geom.dilation,
            dimension_numbers=dn, precision="highest",
        )  # fmt: skip

    want = np.asarray(conv(x, w))
    eqn = jax.make_jaxpr(conv)(x, w).jaxpr.eqns[0]
    as_taps = taps and jax.default_backend() == "cpu"
    paths = {
        "dense": (lambda x, w: dense_conv_eqn(eqn, (x, w)), np.ones_like(mask)),
        "sparse": (lambda x, w: masked_conv(x, w, mask, cached, geom, impl="xla"), ~mask),
    }
    for name, (fn, fresh) in paths.items():
        names = {e.primitive.name for e in all_eqns(jax.make_jaxpr(fn)(x, w).jaxpr)}
        if k > 1:  # (a 1x1 layer's dense path is a matrix product)
            assert ("conv_general_dilated" in names) is not as_taps, name
        out = np.asarray(jax.jit(fn)(x, w))
        np.testing.assert_allclose(out[fresh], want[fresh], rtol=1e-4, atol=1e-4, err_msg=name)


def test_a_sum_of_taps_accumulates_low_precision_inputs_in_float32() -> None:
    """bfloat16 inputs: the terms are summed in float32 and the result rounded once,
    as XLA's convolution does, so both agree to bfloat16's rounding of the output."""
    from dcjax.kernels.lowering import dense_conv

    geom = ConvGeometry(strides=(1, 1), padding=((1, 1), (1, 1)))
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.normal(size=(1, 12, 12, 3)), jnp.bfloat16)
    w = jnp.asarray(rng.normal(size=(3, 3, 3, 16)), jnp.bfloat16)
    p = plan(x.shape, w.shape, geom)
    out = jax.jit(lambda x, w: dense_conv(x, w, p))(x, w)
    assert out.dtype == jnp.bfloat16
    exact = jax.lax.conv_general_dilated(
        x.astype(jnp.float32), w.astype(jnp.float32), (1, 1), geom.padding,
        dimension_numbers=("NHWC", "HWIO", "NHWC"), precision="highest",
    )  # fmt: skip
    err = np.abs(np.asarray(out, np.float32) - np.asarray(exact))
    # one rounding to bfloat16 (8 bits of mantissa) of each output
    assert (err <= np.abs(np.asarray(exact)) * 2.0**-8 + 1e-6).all()


@settings(max_examples=30, deadline=None)
@given(
    hw=st.tuples(st.integers(1, 11), st.integers(1, 11)),
    mult=st.integers(1, 2),
    k=st.sampled_from([1, 2, 3, 5]),
    strides=st.integers(1, 3),
    dilation=st.integers(1, 2),
    pads=st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
    seed=st.integers(0, 2**31 - 1),
)
def test_edges_computes_a_depthwise_convolution_without_padding_its_input(
    hw, mult, k, strides, dilation, pads, seed
) -> None:
    """``"edges"`` equals `lax.conv_general_dilated` for depthwise layers of any
    strides, dilation, asymmetric padding and channel multiplier, and pads no
    array as large as its input (only the slices of each tap)."""
    from dcjax.kernels.lowering import dense_conv, lowerings

    c = 3
    geom = ConvGeometry(
        strides=(strides, strides),
        padding=((pads[0], pads[1]), (pads[2], pads[3])),
        dilation=(dilation, dilation),
        groups=c,
    )
    span = (k - 1) * dilation + 1
    if hw[0] + pads[0] + pads[1] < span or hw[1] + pads[2] + pads[3] < span:
        assume(False)  # no output
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2, *hw, c)).astype(np.float32)
    w = rng.normal(size=(k, k, 1, c * mult)).astype(np.float32)
    p = plan(x.shape, w.shape, geom)
    assert "edges" in lowerings(p)
    want = np.asarray(reference.conv(x, w, geom))
    fn = functools.partial(dense_conv, p=p, how="edges")
    np.testing.assert_allclose(np.asarray(jax.jit(fn)(x, w)), want, rtol=1e-5, atol=1e-5)
    jaxpr = jax.make_jaxpr(fn)(x, w).jaxpr
    padded = [e.outvars[0].aval.shape for e in all_eqns(jaxpr) if e.primitive.name == "pad"]
    assert all(s[1] * s[2] <= p.ho * p.wo for s in padded), padded
    low = np.asarray(fn(jnp.asarray(x, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16)), np.float32)
    exact = np.asarray(reference.conv(*(np.asarray(jnp.asarray(a, jnp.bfloat16), np.float32)
                                        for a in (x, w)), geom))  # fmt: skip
    # summed in float32, rounded once to bfloat16: within one bfloat16 step
    np.testing.assert_allclose(low, exact, rtol=2**-8, atol=1e-6)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the fixed rules are CPU's")
@pytest.mark.parametrize("strides, how", [((1, 1), "taps"), ((2, 2), "edges"), ((1, 2), "edges")])
def test_the_fixed_rules_take_edges_for_strided_depthwise_layers(strides, how) -> None:
    from dcjax.kernels.lowering import edges_pays, lowerings, prior

    p = plan((1, 16, 16, 8), (3, 3, 1, 8), ConvGeometry(strides=strides, padding="SAME", groups=8))
    assert prior(p) == how and edges_pays(p) is (how == "edges")
    geom = ConvGeometry(strides=(2, 2), padding="SAME", groups=2)
    grouped = plan((1, 16, 16, 8), (3, 3, 4, 8), geom)
    assert "edges" not in lowerings(grouped) and prior(grouped) == "groups"


@contextlib.contextmanager
def _prior_taps(p):
    """The fixed rules taking ``"taps"`` for ``p``: only a measured choice says ``"edges"``."""
    from dcjax.kernels import lowering

    saved = lowering.edges_pays
    lowering.edges_pays = lambda q: False if q == p else saved(q)
    try:
        yield
    finally:
        lowering.edges_pays = saved


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the fixed rules are CPU's")
def test_edges_only_for_an_input_a_kernel_wrote() -> None:
    """`dense_conv_eqn` takes ``"edges"`` for a strided depthwise layer only
    where its input is ``materialized``; else ``"taps"`` (a padded copy, into
    which XLA fuses the input's producer once, where each tap of ``"edges"``
    would recompute it). Both equal XLA's convolution."""
    from dcjax.kernels import dense_conv_eqn

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(1, 12, 16, 6)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(3, 3, 1, 6)), jnp.float32)
    jaxpr = jax.make_jaxpr(
        lambda x, w: lax.conv_general_dilated(
            x, w, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=6
        )
    )(x, w)
    (eqn,) = jaxpr.jaxpr.eqns

    def padded_copies(materialized: bool) -> int:
        fn = functools.partial(
            lambda x, w, m: dense_conv_eqn(eqn, [jnp.maximum(x, 0.0), w], materialized=m),
            m=materialized,
        )
        np.testing.assert_allclose(
            np.asarray(fn(x, w)),
            np.asarray(lax.conv_general_dilated_p.bind(jnp.maximum(x, 0.0), w, **eqn.params)),
            rtol=1e-5,
            atol=1e-5,
        )
        shapes = [e.outvars[0].aval.shape for e in all_eqns(jax.make_jaxpr(fn)(x, w).jaxpr)
                  if e.primitive.name == "pad"]  # fmt: skip
        return sum(s[1] * s[2] >= 12 * 16 for s in shapes)

    assert padded_copies(materialized=False) == 1
    assert padded_copies(materialized=True) == 0
    # a measured choice of "edges" (`lowering.use`, what the tuning keeps) alike
    from dcjax.kernels.lowering import choice_key, chosen, prior, use

    tp = plan(x.shape, w.shape, ConvGeometry.from_params(eqn.params))
    with use({choice_key(tp): "edges"}), _prior_taps(tp):
        assert chosen(tp) == "edges" and prior(tp) == "taps"
        assert padded_copies(materialized=False) == 1
        assert padded_copies(materialized=True) == 0
