"""Pallas GPU and TPU masked convolutions in interpret mode against the dense oracle."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from dcjax.kernels import masked_conv, plan
from dcjax.kernels.pallas_gpu import DEFAULT_TILE
from dcjax.kernels.pallas_tpu import DEFAULT_TILE as TPU_DEFAULT_TILE
from tests.kernels._strategies import Case, cases, computed_np, dense

SETTINGS = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_default_tiles_are_the_same_power_of_two() -> None:
    assert DEFAULT_TILE == TPU_DEFAULT_TILE
    assert all(t & (t - 1) == 0 and t % 8 == 0 for t in DEFAULT_TILE)


def _check(case: Case, out: np.ndarray, whole_tiles: bool) -> None:
    ref = dense(case)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    fresh = ~case.mask
    np.testing.assert_allclose(out[fresh], ref[fresh], rtol=1e-4, atol=1e-4)
    tile = case.tile if case.tile is not None else DEFAULT_TILE
    p = plan(case.x.shape, case.w.shape, tile=tile, **case.kwargs)
    if whole_tiles:  # TPU: nominal (unclamped) tiles
        from tests.kernels._strategies import dirty_tiles_np

        d = dirty_tiles_np(case.mask, p.th, p.tw)
        computed = d.repeat(p.th, 1).repeat(p.tw, 2)[:, : p.ho, : p.wo]
    else:
        computed = computed_np(case.mask, p)
    np.testing.assert_array_equal(out[~computed], case.cached[~computed])
    np.testing.assert_allclose(out[computed], ref[computed], rtol=1e-4, atol=1e-4)


@SETTINGS
@given(cases(max_k=5, max_hw=12, max_c=4))
def test_pallas_gpu_interpret(case: Case) -> None:
    out = masked_conv(
        case.x,
        case.w,
        case.mask,
        case.cached,
        impl="pallas_gpu",
        tile=case.tile,
        interpret=True,
        **case.kwargs,
    )
    _check(case, np.asarray(out), whole_tiles=False)


@SETTINGS
@given(cases(max_k=5, max_hw=12, max_c=4))
def test_pallas_tpu_interpret(case: Case) -> None:
    out = masked_conv(
        case.x,
        case.w,
        case.mask,
        case.cached,
        impl="pallas_tpu",
        tile=case.tile,
        interpret=True,
        **case.kwargs,
    )
    _check(case, np.asarray(out), whole_tiles=True)


@pytest.mark.parametrize("impl", ["pallas_gpu", "pallas_tpu"])
def test_pallas_large_kernel_stride_dilation(impl: str) -> None:
    """11x11 stride 4 (AlexNet conv1 geometry) and a dilated depthwise layer."""
    rng = np.random.default_rng(0)
    for k, s, d, g, cin, cout, pad in [
        (11, 4, 1, 1, 3, 4, "VALID"),
        (3, 2, 2, 4, 4, 8, "SAME"),
    ]:
        x = rng.normal(size=(1, 27, 23, cin)).astype(np.float32)
        w = rng.normal(size=(k, k, cin // g, cout)).astype(np.float32)
        p = plan(x.shape, w.shape, strides=(s, s), padding=pad, dilation=(d, d), groups=g)
        mask = np.ones((1, p.ho, p.wo), bool)
        mask[0, 1, 2] = False
        mask[0, -1, -1] = False
        cached = rng.normal(size=(1, p.ho, p.wo, cout)).astype(np.float32) + 100
        case = Case(x, w, mask, cached, (s, s), pad, (d, d), g, (2, 3))
        out = masked_conv(x, w, mask, cached, impl=impl, tile=(2, 3), interpret=True, **case.kwargs)
        _check(case, np.asarray(out), whole_tiles=impl == "pallas_tpu")
