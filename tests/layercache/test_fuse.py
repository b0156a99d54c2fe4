"""Shared stems: models on the same frame compute their common first layers once."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import dcjax
from dcjax import layercache as lc


class Net(nn.Module):
    head: int
    depth: int = 2

    @nn.compact
    def __call__(self, x):
        for i in range(self.depth):
            x = nn.relu(nn.Conv(8, (3, 3), strides=1 + (i % 2), name=f"stem{i}")(x))
        y = nn.relu(nn.Conv(8, (3, 3), name="own")(x))
        return nn.Dense(self.head, name="fc")(y.mean((1, 2)))


class Unstrided(nn.Module):
    head: int

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(8, (3, 3), name="stem0")(x))
        x = nn.relu(nn.Conv(8, (3, 3), name="stem1")(x))
        y = nn.relu(nn.Conv(8, (3, 3), name="own")(x))
        return nn.Dense(self.head, name="fc")(y.mean((1, 2)))


def _family(n, shared=2):
    x = jnp.asarray(np.random.default_rng(0).normal(size=(1, 32, 32, 3)), jnp.float32)
    nets = [Net(head=4 + i) for i in range(n)]
    params = [net.init(jax.random.key(i), x) for i, net in enumerate(nets)]
    for p in params[1:]:  # transfer learning: the first `shared` layers frozen
        for i in range(shared):
            p["params"][f"stem{i}"] = params[0]["params"][f"stem{i}"]
    return x, nets, params


def _convs(fn, *args) -> int:
    return str(jax.make_jaxpr(fn)(*args)).count("conv_general_dilated")


def test_fused_models_equal_each_model_and_compute_the_stem_once():
    x, nets, params = _family(3)
    fused = lc.fuse([(n.apply, p) for n, p in zip(nets, params, strict=True)], x)
    assert fused.stem_segments == 2 and fused.stem_layers == ("stem0", "stem1")
    outs = jax.jit(fused.fn)(fused.params, x)
    for net, p, out in zip(nets, params, outs, strict=True):
        np.testing.assert_allclose(
            np.asarray(out), np.asarray(net.apply(p, x)), rtol=1e-5, atol=1e-6
        )
    assert _convs(fused.fn, fused.params, x) == 2 + 3  # the stem once, each own conv
    assert sum(_convs(n.apply, p, x) for n, p in zip(nets, params, strict=True)) == 9


def test_the_stem_stops_at_the_first_layer_that_differs():
    x, nets, params = _family(2, shared=1)
    fused = lc.fuse([(n.apply, p) for n, p in zip(nets, params, strict=True)], x)
    assert fused.stem_layers == ("stem0",)
    out = fused.fn(fused.params, x)
    np.testing.assert_allclose(np.asarray(out[1]), np.asarray(nets[1].apply(params[1], x)),
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    # the same weights in another computation (stem1 without its stride) are not shared
    p3 = jax.tree_util.tree_map(lambda a: a, params[0])
    fused = lc.fuse([(nets[0].apply, params[0]), (Unstrided(head=4).apply, p3)], x)
    assert fused.stem_layers == ("stem0",)
    want = Unstrided(head=4).apply(p3, x)
    np.testing.assert_allclose(np.asarray(fused.fn(fused.params, x)[1]), np.asarray(want),
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    # a deeper model computes the first two layers the same way: they are shared
    deeper = Net(head=4, depth=3)
    p4 = deeper.init(jax.random.key(7), x)
    p4["params"]["stem0"] = params[0]["params"]["stem0"]
    p4["params"]["stem1"] = params[0]["params"]["stem1"]
    fused = lc.fuse([(nets[0].apply, params[0]), (deeper.apply, p4)], x)
    assert fused.stem_layers == ("stem0", "stem1")
    np.testing.assert_allclose(np.asarray(fused.fn(fused.params, x)[1]),
                               np.asarray(deeper.apply(p4, x)), rtol=1e-5, atol=1e-6)  # fmt: skip


def test_models_with_nothing_in_common_fuse_to_their_own_outputs():
    x, nets, params = _family(2, shared=0)
    fused = lc.fuse([(n.apply, p) for n, p in zip(nets, params, strict=True)], x)
    assert fused.stem_segments == 0
    for net, p, out in zip(nets, params, fused.fn(fused.params, x), strict=True):
        np.testing.assert_allclose(
            np.asarray(out), np.asarray(net.apply(p, x)), rtol=1e-5, atol=1e-6
        )


def test_deepcache_transform_of_the_fused_models_caches_the_stem_once():
    x, nets, params = _family(3)
    fused = lc.fuse([(n.apply, p) for n, p in zip(nets, params, strict=True)], x)
    cached = dcjax.transform(
        fused.fn, fused.params, frame_shape=(32, 32, 3),
        preprocess=lambda f: f.astype(jnp.float32) / 255.0, progress=False,
    )  # fmt: skip
    assert len(cached.layers) == 2 + 3  # the stem's convolutions once, then each own
    rng = np.random.default_rng(1)
    base = rng.integers(0, 256, (40, 40, 3)).astype(np.uint8)
    state = cached.init()
    for t in range(3):  # a panning view: the cache reuses shifted features
        frame = base[t : t + 32, 2 * t : 2 * t + 32]
        outs, state, _ = cached.step(state, frame)
        want = [n.apply(p, jnp.asarray(frame, jnp.float32)[None] / 255.0)
                for n, p in zip(nets, params, strict=True)]  # fmt: skip
        for out, w in zip(outs, want, strict=True):
            np.testing.assert_allclose(np.asarray(out), np.asarray(w), rtol=2e-4, atol=2e-5)
