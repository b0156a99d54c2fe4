"""Pallas GPU and TPU masked convolutions against the dense oracle.

On CPU both run in interpret mode; on a GPU backend the GPU kernel is compiled
(Triton), so the same tests check the real kernel there. Lowering the GPU
kernel to Triton IR needs no GPU, so every layer geometry of the zoo is lowered
here too.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from dcjax.kernels import ConvGeometry, masked_conv, pallas_gpu, plan
from dcjax.kernels.pallas_gpu import DEFAULT_TILE
from dcjax.kernels.pallas_tpu import DEFAULT_TILE as TPU_DEFAULT_TILE
from tests.kernels._strategies import Case, cases, dense, dirty_tiles_np

SETTINGS = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: The GPU kernel is compiled where there is a GPU, interpreted elsewhere.
GPU_INTERPRET = jax.default_backend() != "gpu"


def test_default_tiles_are_the_same_power_of_two() -> None:
    assert DEFAULT_TILE == TPU_DEFAULT_TILE
    assert all(t & (t - 1) == 0 and t % 8 == 0 for t in DEFAULT_TILE)


def _nominal(case: Case, p) -> np.ndarray:
    """(N, Ho, Wo) bool: pixels of the dirty tiles' nominal rectangles, cropped."""
    d = dirty_tiles_np(case.mask, p.th, p.tw)
    return d.repeat(p.th, 1).repeat(p.tw, 2)[:, : p.ho, : p.wo]


def _check(case: Case, out: np.ndarray, computed: np.ndarray | None) -> None:
    """Fresh pixels hold the convolution; the ``computed`` pixels too, every other
    pixel the cache bit for bit (``None``: each reusable pixel holds either)."""
    ref = dense(case)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    fresh = ~case.mask
    np.testing.assert_allclose(out[fresh], ref[fresh], rtol=1e-4, atol=1e-4)
    if computed is None:
        kept = out == case.cached
        near = np.isclose(out, ref, rtol=1e-4, atol=1e-4)
        assert (kept | near).all()
        return
    np.testing.assert_array_equal(out[~computed], case.cached[~computed])
    np.testing.assert_allclose(out[computed], ref[computed], rtol=1e-4, atol=1e-4)


def _run(case: Case, impl: str, interpret: bool) -> np.ndarray:
    """``masked_conv`` on the case, products in float32."""
    with jax.default_matmul_precision("highest"):
        out = masked_conv(
            case.x, case.w, case.mask, case.cached, case.geometry, impl=impl, tile=case.tile,
            interpret=interpret,
        )  # fmt: skip
    return np.asarray(out)


def _gpu(case: Case) -> None:
    out = _run(case, "pallas_gpu", GPU_INTERPRET)
    computed = None  # a channel multiplier goes to the xla kernel
    if pallas_gpu.supports(case.w.shape, case.groups):
        computed = _nominal(
            case, pallas_gpu.tile_plan(case.x.shape, case.w.shape, case.geometry, tile=case.tile)
        )
    _check(case, out, computed)


@SETTINGS
@given(cases(max_k=5, max_hw=12, max_c=4))
def test_pallas_gpu(case: Case) -> None:
    _gpu(case)


@SETTINGS
@given(cases(max_k=5, max_hw=12, max_c=4))
def test_pallas_tpu_interpret(case: Case) -> None:
    out = _run(case, "pallas_tpu", True)
    tile = case.tile if case.tile is not None else TPU_DEFAULT_TILE
    _check(
        case,
        out,
        _nominal(case, plan(case.x.shape, case.w.shape, case.geometry, tile=tile)),
    )


def _large_cases():
    """11x11 stride 4 (AlexNet conv1 geometry) and a dilated depthwise layer."""
    rng = np.random.default_rng(0)
    for k, s, d, g, cin, cout, pad in [
        (11, 4, 1, 1, 3, 4, "VALID"),
        (3, 2, 2, 4, 4, 8, "SAME"),
    ]:
        x = rng.normal(size=(1, 27, 23, cin)).astype(np.float32)
        w = rng.normal(size=(k, k, cin // g, cout)).astype(np.float32)
        p = plan(
            x.shape, w.shape, ConvGeometry(strides=(s, s), padding=pad, dilation=(d, d), groups=g)
        )
        mask = np.ones((1, p.ho, p.wo), bool)
        mask[0, 1, 2] = False
        mask[0, -1, -1] = False
        cached = rng.normal(size=(1, p.ho, p.wo, cout)).astype(np.float32) + 100
        yield Case(x, w, mask, cached, (s, s), pad, (d, d), g, (2, 3))


def test_pallas_gpu_large_kernel_stride_dilation() -> None:
    for case in _large_cases():
        _gpu(case)


def test_pallas_tpu_large_kernel_stride_dilation() -> None:
    for case in _large_cases():
        p = plan(case.x.shape, case.w.shape, case.geometry, tile=case.tile)
        _check(case, _run(case, "pallas_tpu", True), _nominal(case, p))


#: (N, H, W, Cin, Cout, k, stride, groups, padding): layer geometries of the zoo
#: and the cases Triton's shape rules make hard (3 or 24 channels, 7x7 maps).
ZOO_LAYERS = [
    (1, 227, 227, 3, 96, 11, 4, 1, "VALID"),  # AlexNet conv1
    (1, 27, 27, 96, 256, 5, 1, 2, ((2, 2), (2, 2))),  # AlexNet conv2, groups 2
    (1, 56, 56, 64, 256, 1, 1, 1, "VALID"),  # ResNet-50 1x1
    (2, 7, 7, 512, 512, 3, 1, 1, ((1, 1), (1, 1))),  # ResNet-50 layer4, two streams
    (1, 112, 112, 96, 96, 3, 2, 96, ((0, 1), (0, 1))),  # depthwise, stride 2
    (1, 28, 28, 40, 24, 1, 1, 1, "VALID"),  # EfficientNet projection
    (1, 3, 5, 8, 8, 3, 1, 2, "SAME"),  # a map smaller than a tile
]


@pytest.mark.parametrize("layer", ZOO_LAYERS, ids=lambda layer: "x".join(map(str, layer[:8])))
def test_pallas_gpu_lowers_to_triton(layer) -> None:
    """The compiled kernel's Triton lowering (block shapes, dot extents, loops) holds."""
    n, h, w, cin, cout, k, s, g, pad = layer
    geom = ConvGeometry(strides=(s, s), padding=pad, groups=g)
    p = pallas_gpu.tile_plan((n, h, w, cin), (k, k, cin // g, cout), geom)
    args = (
        jax.ShapeDtypeStruct((n, h, w, cin), jnp.float32),
        jax.ShapeDtypeStruct((k, k, cin // g, cout), jnp.float32),
        jax.ShapeDtypeStruct((n, p.ho, p.wo), jnp.bool_),
        jax.ShapeDtypeStruct((n, p.ho, p.wo, cout), jnp.float32),
    )
    fn = jax.jit(functools.partial(pallas_gpu.pallas_gpu_masked_conv, geometry=geom))
    text = fn.trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert "xla.gpu.triton" in text
