"""Shared hypothesis strategies and the numpy oracle for the kernel tests."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from hypothesis import strategies as st

from dcjax.kernels import ConvGeometry, reference
from dcjax.kernels.tiles import TilePlan, plan


@dataclasses.dataclass(frozen=True)
class Case:
    """One convolution problem with a mask and a cache."""

    x: np.ndarray
    w: np.ndarray
    mask: np.ndarray
    cached: np.ndarray
    strides: tuple[int, int]
    padding: object
    dilation: tuple[int, int]
    groups: int
    tile: tuple[int, int] | None

    @property
    def geometry(self) -> ConvGeometry:
        return ConvGeometry(
            strides=self.strides, padding=self.padding, dilation=self.dilation, groups=self.groups
        )


def all_eqns(jaxpr, into_loops: bool = True):
    """Every equation of ``jaxpr``, nested jaxprs included; with ``into_loops=False``
    those inside loops and branches are left out (what runs on every call)."""
    import jax.extend as jex

    for eqn in jaxpr.eqns:
        yield eqn
        if into_loops or eqn.primitive.name not in ("while", "cond"):
            for sub in jex.core.jaxprs_in_params(eqn.params):
                yield from all_eqns(sub, into_loops)


def check_list_built_in_loops(f, x: np.ndarray, cout: int, capacity: int) -> None:
    """A sparse kernel ``f(x, mask, cached)`` builds its dirty list (an integer array
    of ``capacity`` slots, made by `compact`'s scatter) only inside its loops, and
    with nothing dirty returns the cache."""
    import jax
    import jax.numpy as jnp

    n, h, w_, _ = x.shape
    mask = np.ones((n, h, w_), bool)
    jaxpr = jax.make_jaxpr(f)(x, mask, np.zeros((n, h, w_, cout), np.float32)).jaxpr
    top = [v for e in all_eqns(jaxpr, into_loops=False) for v in e.outvars]
    assert not [v for v in top if jnp.issubdtype(v.aval.dtype, jnp.integer)
                and v.aval.shape[:1] == (capacity,)]  # fmt: skip
    assert [e for e in all_eqns(jaxpr) if e.primitive.name == "scatter"
            and e.outvars[0].aval.shape == (capacity,)]  # fmt: skip
    cached = np.full((n, h, w_, cout), 3.0, np.float32)
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(x, mask, cached)), cached)


def dense(case: Case) -> np.ndarray:
    """The oracle: `lax.conv_general_dilated`."""
    return np.asarray(reference.conv(case.x, case.w, case.geometry))


def dirty_tiles_np(mask: np.ndarray, th: int, tw: int) -> np.ndarray:
    """(N, nty, ntx) bool: tiles that nominally cover a false pixel (numpy, independent)."""
    n, ho, wo = mask.shape
    nty, ntx = math.ceil(ho / th), math.ceil(wo / tw)
    out = np.zeros((n, nty, ntx), bool)
    for b in range(n):
        for i in range(nty):
            for j in range(ntx):
                out[b, i, j] = not mask[b, i * th : (i + 1) * th, j * tw : (j + 1) * tw].all()
    return out


def computed_np(mask: np.ndarray, p: TilePlan) -> np.ndarray:
    """(N, Ho, Wo) bool: pixels inside the clamped rectangle of some dirty tile."""
    d = dirty_tiles_np(mask, p.th, p.tw)
    cov = np.zeros(mask.shape, bool)
    for b, i, j in zip(*np.nonzero(d), strict=True):
        oy, ox = min(i * p.th, p.ho - p.th), min(j * p.tw, p.wo - p.tw)
        cov[b, oy : oy + p.th, ox : ox + p.tw] = True
    return cov


def _mask(draw, n: int, ho: int, wo: int) -> np.ndarray:
    kind = draw(st.sampled_from(["all_true", "all_false", "blocks", "pixels", "bernoulli"]))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    m = np.ones((n, ho, wo), bool)
    if kind == "all_false":
        m[:] = False
    elif kind == "blocks":
        for _ in range(int(rng.integers(1, 4))):
            b = int(rng.integers(0, n))
            y0, x0 = int(rng.integers(0, ho)), int(rng.integers(0, wo))
            y1 = y0 + int(rng.integers(1, max(2, ho // 2 + 1)))
            x1 = x0 + int(rng.integers(1, max(2, wo // 2 + 1)))
            m[b, y0:y1, x0:x1] = False
    elif kind == "pixels":
        for _ in range(int(rng.integers(1, 3))):
            m[int(rng.integers(0, n)), int(rng.integers(0, ho)), int(rng.integers(0, wo))] = False
    elif kind == "bernoulli":
        m = rng.random((n, ho, wo)) > rng.uniform(0.05, 0.95)
    return m


@st.composite
def cases(draw, max_k: int = 11, max_hw: int = 24, max_c: int = 6, max_n: int = 2) -> Case:
    """Random convolution problems over the issue's parameter space."""
    k = draw(st.integers(1, max_k))
    kw_ = draw(st.sampled_from([k, max(1, k - 2)]))
    s = draw(st.integers(1, 4))
    sx = draw(st.sampled_from([s, 1]))
    d = draw(st.sampled_from([1, 2]))
    group_kind = draw(st.sampled_from(["1", "2", "depthwise"]))
    cin = draw(st.integers(1, max_c))
    if group_kind == "2":
        cin = 2 * max(1, cin // 2)
        groups, cout = 2, 2 * draw(st.integers(1, 3))
    elif group_kind == "depthwise":
        groups, cout = cin, cin * draw(st.sampled_from([1, 2]))
    else:
        groups, cout = 1, draw(st.integers(1, max_c))
    pad_kind = draw(st.sampled_from(["SAME", "VALID", "explicit"]))
    eky, ekx = (k - 1) * d + 1, (kw_ - 1) * d + 1
    if pad_kind == "explicit":
        padding = tuple((draw(st.integers(0, e)), draw(st.integers(0, e))) for e in (eky, ekx))
    else:
        padding = pad_kind
    if pad_kind == "VALID":
        min_h, min_w = eky, ekx
    elif pad_kind == "SAME":
        min_h, min_w = 1, 1
    else:
        min_h = max(1, eky - padding[0][0] - padding[0][1])
        min_w = max(1, ekx - padding[1][0] - padding[1][1])
    h = draw(st.integers(max(min_h, 1), max(min_h, max_hw)))
    w = draw(st.integers(max(min_w, 1), max(min_w, max_hw)))
    n = draw(st.integers(1, max_n))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, h, w, cin)).astype(np.float32)
    wt = rng.normal(size=(k, kw_, cin // groups, cout)).astype(np.float32)
    p = plan(
        x.shape,
        wt.shape,
        ConvGeometry(strides=(s, sx), padding=padding, dilation=(d, d), groups=groups),
    )
    ho, wo = p.ho, p.wo
    out_shape = (n, ho, wo, cout)
    mask = _mask(draw, n, ho, wo)
    cached = rng.normal(size=out_shape).astype(np.float32) + 100.0
    tile = draw(st.one_of(st.none(), st.tuples(st.integers(1, 8), st.integers(1, 8))))
    return Case(x, wt, mask, cached, (s, sx), padding, (d, d), groups, tile)
