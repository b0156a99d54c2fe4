"""DESIGN.md's transform invariants for every model of the zoo, at reduced sizes.

For each model (built small: `tests.models._zoo.SMALL_SIZE`, width multiplier
`SMALL_WIDTH`), with uint8 frames and the model's own per-pixel `preprocess`:

* never reuse (a forced refresh every N frames, a match with no reusable block, and
  for two models ``refresh_every=1`` with ``psnr_threshold=inf``): the output equals
  the model's, even when a lying match claims every pixel is reusable;
* a frame identical to the previous one: the output equals the model's and every
  reused convolution is fully reused;
* a frame that is an exact translation of the previous one by the model's total
  stride, new content only in the uncovered strip, ``alignment="exact"``: the
  cached output equals a full recompute, and reuse was actually taken;
* the model traces with no primitive falling to the conservative default.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dcjax import deepcache, models
from tests.models._zoo import SMALL_SIZE, SMALL_WIDTH, TOTAL_STRIDE

ALL = models.names()


class _Case:
    """One small model, its frames and their uncached outputs."""

    def __init__(self, name: str) -> None:
        self.name = name
        h, w = SMALL_SIZE[name]
        self.frame_shape = (h, w, 3)
        self.module, self.variables = models.create(
            name, input_size=(h, w), width=SMALL_WIDTH, seed=1
        )
        self.preprocess = functools.partial(models.preprocess, name)
        rng = np.random.default_rng(7)
        s = TOTAL_STRIDE[name]
        self.f0 = rng.integers(0, 256, (h, w, 3), np.uint8)
        # frame_1[y, x] = frame_0[y + My, x + Mx] wherever that pixel exists; new random
        # content in the uncovered strip(s). Diagonal motion where the frame is large
        # enough compared with the stride, otherwise horizontal.
        self.motion = (s, -s) if min(h, w) >= 4 * s else (0, s)
        my, mx = self.motion
        ys, xs = np.arange(h)[:, None] + my, np.arange(w)[None, :] + mx
        self.r0 = (ys >= 0) & (ys < h) & (xs >= 0) & (xs < w)
        self.f1 = rng.integers(0, 256, (h, w, 3), np.uint8)
        self.f1[self.r0] = self.f0[np.clip(ys, 0, h - 1), np.clip(xs, 0, w - 1)][self.r0]
        apply = jax.jit(self.module.apply)
        self.ref0 = np.asarray(apply(self.variables, self.preprocess(self.f0)[None]))
        self.ref1 = np.asarray(apply(self.variables, self.preprocess(self.f1)[None]))
        assert not np.allclose(self.ref0, self.ref1)

    def transform(self, **config) -> deepcache.CachedModel:
        cfg = deepcache.Config(kernel="reference", alignment="exact", **config)
        return deepcache.transform(
            self.module,
            self.variables,
            frame_shape=self.frame_shape,
            config=cfg,
            preprocess=self.preprocess,
        )

    def match(self, mask: np.ndarray | None = None) -> deepcache.Match:
        return deepcache.Match(
            motion=jnp.asarray(self.motion, jnp.int32),
            mask=jnp.asarray(self.r0 if mask is None else mask),
        )


@functools.cache
def _case(name: str) -> _Case:
    return _Case(name)


def _assert_close(got, want, name: str) -> None:
    got = np.asarray(got).reshape(want.shape)
    scale = max(float(np.max(np.abs(want))), 1e-6)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * scale, err_msg=name)


@pytest.mark.parametrize("name", ["dave", "alexnet"])
def test_never_reuse_config_equals_model(name):
    # Config-level "never reuse" (one compile per model, so only two cheap models;
    # every model goes through forced refreshes in the stream test below).
    case = _case(name)
    cached = case.transform(refresh_every=1, psnr_threshold=float("inf"))
    state = cached.init()
    out, state, info = cached.step(state, case.f0)
    _assert_close(out, case.ref0, name)
    # Built-in matcher, threshold +inf: nothing matches, even on an identical frame.
    out, state, info = cached.step(state, case.f0)
    _assert_close(out, case.ref0, name)
    assert float(info["match_ratio"]) == 0.0
    # A match claiming every pixel reusable is overridden by refresh_every=1.
    out, state, info = cached.step(state, case.f1, match=case.match(np.ones_like(case.r0)))
    _assert_close(out, case.ref1, name)
    assert bool(info["refreshed"])
    assert float(jnp.max(info["reuse_fraction"])) == 0.0


@pytest.mark.parametrize("name", ALL)
def test_stream_invariants(name):
    """One compiled step per model runs every invariant on a five-frame stream.

    Every step gets an explicit match (the matchers are tested on their own), so the
    step is compiled once.
    """
    case = _case(name)
    cached = case.transform(refresh_every=3, psnr_threshold=20.0)
    assert cached.unsupported_primitives == ()
    assert len(cached.layers) > 0
    everything = np.ones_like(case.r0)
    still = deepcache.Match(motion=jnp.zeros((2,), jnp.int32), mask=jnp.asarray(everything))
    state = cached.init()
    out, state, info = cached.step(state, case.f0, match=still)
    _assert_close(out, case.ref0, name)
    assert bool(info["refreshed"])  # first frame: nothing to reuse yet

    # Identical frame: everything is reused and the output is unchanged.
    out, state, info = cached.step(state, case.f0, match=still)
    _assert_close(out, case.ref0, name)
    assert not bool(info["refreshed"])
    np.testing.assert_allclose(np.asarray(info["reuse_fraction"]), 1.0, rtol=0, atol=1e-6)

    # Exact translation by the total stride, new content only in the uncovered strip.
    out, state, info = cached.step(state, case.f1, match=case.match())
    _assert_close(out, case.ref1, name)
    reuse = np.asarray(info["reuse_fraction"])
    assert reuse[0] > 0.3, reuse  # the first convolution reuses most of its output
    assert float(info["flops_ratio"]) < 1.0

    # Third frame since the refresh: refresh_every=3 forces a full recompute (never
    # reuse), even under a match that claims every pixel reusable.
    out, state, info = cached.step(state, case.f0, match=case.match(everything))
    _assert_close(out, case.ref0, name)
    assert bool(info["refreshed"])
    assert float(jnp.max(info["reuse_fraction"])) == 0.0

    # A match with no reusable block (below min_match, as for a scene cut or a
    # threshold no block meets): full recompute, the model's output.
    out, state, info = cached.step(state, case.f1, match=case.match(~everything))
    _assert_close(out, case.ref1, name)
    assert bool(info["refreshed"])
    assert float(jnp.max(info["reuse_fraction"])) == 0.0
    assert cached.trace_count == 1
