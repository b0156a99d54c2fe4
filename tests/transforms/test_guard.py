"""Guarded regions (`dcjax.transforms.guard`): the config's checks, the map's
stride, the region at every stride against a brute-force reference, and the
step: a guard over every cell is a dense recompute, a guard over none changes
nothing, a partial guard makes its cells exact, and a still frame stays skipped."""

import dataclasses
import math
from fractions import Fraction

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dcjax
from dcjax.eval import methods, registry
from dcjax.transforms import guard as guard_lib
from dcjax.transforms.guard import GuardConfig

SHAPE = (32, 48, 3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"threshold": float("nan")}, "threshold must be a finite number"),
        ({"threshold": True}, "threshold must be a finite number"),
        ({"threshold": 0.1, "margin": -1}, "margin must be an int >= 0"),
        ({"threshold": 0.1, "output": 1.5}, "output must be an int >= 0"),
        ({"threshold": 0.1, "layout": "HWC"}, "layout must be one of"),
    ],
)
def test_a_bad_guard_config_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GuardConfig(**kwargs)
    with pytest.raises(ValueError, match="Config.guard must be a GuardConfig"):
        dcjax.Config(guard=0.1)


def test_the_map_stride_and_what_does_not_fit():
    nchw = GuardConfig(threshold=0.1, layout="NCHW", channel=1)
    shapes = [(1, 2, 8, 12), (1, 10)]
    assert guard_lib.map_stride(nchw, shapes, (32, 48)) == 4
    assert guard_lib.map_stride(GuardConfig(threshold=0.1), [(16, 24, 1)], (32, 48)) == 2
    cases = [
        (dataclasses.replace(nchw, output=2), "the model has 2 output leaves"),
        (dataclasses.replace(nchw, output=1), r"is of shape \(1, 10\)"),
        (dataclasses.replace(nchw, channel=2), "has 2 channels"),
        (dataclasses.replace(nchw, layout="NHWC", channel=0), "does not divide the frame"),
    ]
    for guard, message in cases:
        with pytest.raises(ValueError, match=message):
            guard_lib.map_stride(guard, shapes, (32, 48))


def test_cells_take_the_channel_over_the_threshold():
    x = np.zeros((1, 4, 6, 2), np.float32)
    x[0, 1, 2, 1], x[0, 3, 5, 0] = 0.5, 0.5
    hot = guard_lib.cells([x], GuardConfig(threshold=0.2, channel=1))
    assert np.argwhere(np.asarray(hot)).tolist() == [[1, 2]]
    nchw = np.moveaxis(x, 3, 1)
    hot = guard_lib.cells([None, nchw], GuardConfig(threshold=0.2, output=1, layout="NCHW"))
    assert np.argwhere(np.asarray(hot)).tolist() == [[3, 5]]


def _region_reference(hot, cell_stride, size, stride, margin):
    """Each position's input pixels, the cells they fall in, then a square of
    ceil(margin / s) positions around each hot one, by loops."""
    h, w = hot.shape
    covered = np.zeros(size, bool)
    for i in range(size[0]):
        for j in range(size[1]):
            ys = range(
                math.floor(i * stride[0]),
                max(math.ceil((i + 1) * stride[0]), 1 + math.floor(i * stride[0])),
            )
            xs = range(
                math.floor(j * stride[1]),
                max(math.ceil((j + 1) * stride[1]), 1 + math.floor(j * stride[1])),
            )
            cy = {min(y // cell_stride, h - 1) for y in ys}
            cx = {min(x // cell_stride, w - 1) for x in xs}
            covered[i, j] = any(hot[a, b] for a in cy for b in cx)
    ry, rx = (math.ceil(margin / Fraction(s)) for s in stride)
    out = np.zeros(size, bool)
    for i, j in np.argwhere(covered):
        out[max(i - ry, 0) : i + ry + 1, max(j - rx, 0) : j + rx + 1] = True
    return out


@pytest.mark.parametrize(
    ("size", "stride"),
    [((32, 48), (1, 1)), ((16, 24), (2, 2)), ((4, 6), (8, 8)), ((2, 3), (16, 16)),
     ((64, 96), (Fraction(1, 2), Fraction(1, 2))), ((11, 16), (3, 3))],
)  # fmt: skip
@pytest.mark.parametrize("margin", [0, 5, 16])
def test_the_region_at_each_stride_matches_a_brute_force_one(size, stride, margin):
    rng = np.random.default_rng(sum(size) + margin)
    hot = rng.random((8, 12)) > 0.85
    g = GuardConfig(threshold=0.0, margin=margin)
    stride = tuple(Fraction(s) for s in stride)
    got = np.asarray(guard_lib.region(jnp.asarray(hot), 4, size, stride, g))
    np.testing.assert_array_equal(got, _region_reference(hot, 4, size, stride, margin))


class ScoreNet(nn.Module):
    """A small network with a score map at stride 2 (NHWC) and a second output."""

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(8, (3, 3))(x))
        x = nn.relu(nn.Conv(8, (3, 3), strides=(2, 2))(x))
        return nn.sigmoid(nn.Conv(1, (3, 3))(x)), jnp.mean(x, axis=(1, 2))


@pytest.fixture(scope="module")
def score_net():
    net = ScoreNet()
    return net, net.init(jax.random.key(0), jnp.zeros((1, *SHAPE)))


def _frames():
    """A frame, then one changed a little everywhere (below the matcher's
    threshold) and much in one block (so that it is not a still frame)."""
    rng = np.random.default_rng(0)
    f0 = rng.random(SHAPE).astype(np.float32)
    f1 = np.clip(f0 + 0.03 * rng.standard_normal(SHAPE).astype(np.float32), 0, 1)
    f1[:10, :10] = rng.random((10, 10, 3))
    return jnp.asarray(f0), jnp.asarray(f1)


def _run(model, config, frames):
    cached = dcjax.transform(*model, frame_shape=SHAPE, config=config, progress=False)
    state, outs, infos = cached.init(), [], []
    for f in frames:
        out, state, info = cached.step(state, f)
        outs.append(jax.device_get(out))
        infos.append(jax.device_get(info))
    return outs, infos, state


BASE = dict(kernel="xla", tuning="prior", refresh_every=None, psnr_threshold=20.0)


def test_a_guard_over_every_cell_recomputes_the_frame(score_net):
    frames = _frames()
    dense = [jax.device_get(score_net[0].apply(score_net[1], f[None])) for f in frames]
    plain, plain_infos, _ = _run(score_net, dcjax.Config(**BASE), frames)
    assert 0.0 < plain_infos[1]["input_reuse"] < 1.0
    assert np.abs(plain[1][0] - dense[1][0]).max() > 1e-3  # reuse changed the map
    everything = GuardConfig(threshold=-1.0)  # a sigmoid's every cell is over -1
    outs, infos, state = _run(score_net, dcjax.Config(**BASE, guard=everything), frames)
    assert state.guard.shape == (16, 24) and bool(np.all(state.guard))
    assert float(infos[1]["guarded"]) == 1.0 and float(infos[1]["input_reuse"]) == 0.0
    for got, want in zip(outs, dense, strict=True):
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_a_guard_over_no_cell_changes_nothing(score_net):
    frames = _frames()
    plain, _, _ = _run(score_net, dcjax.Config(**BASE), frames)
    outs, infos, _ = _run(score_net, dcjax.Config(**BASE, guard=GuardConfig(threshold=2.0)), frames)
    assert float(infos[1]["guarded"]) == 0.0
    for got, want in zip(outs, plain, strict=True):
        for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("refine", [None, dcjax.RefineConfig(delta=0.5)])
def test_the_guarded_cells_are_exact(score_net, refine):
    frames = _frames()
    dense = [np.asarray(score_net[0].apply(score_net[1], f[None])[0])[0, :, :, 0] for f in frames]
    # the first frame's highest cells are guarded on the second
    threshold = float(np.quantile(dense[0], 0.99))
    hot = dense[0] > threshold
    # the dense-and-select kernel: every position not recomputed keeps its cache
    cfg = dcjax.Config(**{**BASE, "kernel": "reference"}, refine=refine)
    plain, _, _ = _run(score_net, cfg, frames)
    guard = GuardConfig(threshold=threshold, margin=6)  # past the network's receptive field
    outs, infos, _ = _run(score_net, dataclasses.replace(cfg, guard=guard), frames)
    assert 0.0 < float(infos[1]["guarded"]) < 1.0
    err_plain = np.abs(plain[1][0][0, :, :, 0] - dense[1])
    err = np.abs(outs[1][0][0, :, :, 0] - dense[1])
    assert err_plain[hot].max() > 1e-3  # without the guard these cells were reused
    assert err[hot].max() < 1e-5
    assert err[~hot].max() > 1e-3  # and the guard did not recompute everything


def test_a_still_frame_stays_skipped_under_a_guard(score_net):
    f0, _ = _frames()
    outs, infos, _ = _run(
        score_net, dcjax.Config(**BASE, guard=GuardConfig(threshold=-1.0)), [f0, f0, f0]
    )
    assert [bool(i["skipped"]) for i in infos] == [False, True, True]
    np.testing.assert_array_equal(outs[2][0], outs[0][0])


def test_a_guard_that_does_not_fit_the_model_fails_at_transform(score_net):
    with pytest.raises(ValueError, match="GuardConfig.channel=1"):
        dcjax.transform(
            *score_net, frame_shape=SHAPE, progress=False,
            config=dcjax.Config(**BASE, guard=GuardConfig(threshold=0.5, channel=1)),
        )  # fmt: skip


def test_the_method_options_resolve_the_model_s_guard():
    spec = registry.ModelSpec(
        name="det", module=None, variables=None, frame_shape=SHAPE,
        guard=GuardConfig(threshold=0.1, layout="NCHW", output=0, margin=32),
    )  # fmt: skip
    assert methods.deepcache_config({"guard": True}, spec).guard == spec.guard
    cfg = methods.deepcache_config({"guard": 0.15, "guard_margin": 8}, spec)
    assert cfg.guard == dataclasses.replace(spec.guard, threshold=0.15, margin=8)
    assert methods.deepcache_config({"guard": False}, spec).guard is None
    bare = dataclasses.replace(spec, guard=None)
    with pytest.raises(ValueError, match="det has no score map to guard"):
        methods.deepcache_config({"guard": True}, bare)
    with pytest.raises(ValueError, match="guard_margin needs guard"):
        methods.deepcache_config({"guard": False, "guard_margin": 8}, spec)
    with pytest.raises(ValueError, match="guard must be True, False or a threshold"):
        methods.deepcache_config({"guard": "yes"}, spec)
    with pytest.raises(ValueError, match="margin must be an int"):
        registry.check_method("deepcache:guard=0.1,guard_margin=-2")


def test_pooled_streams_guard_each_stream_as_it_would_alone(score_net):
    f0, f1 = _frames()
    g = GuardConfig(
        threshold=float(
            np.quantile(np.asarray(score_net[0].apply(score_net[1], f0[None])[0]), 0.95)
        ),
        margin=4,
    )
    cfg = dcjax.Config(**BASE, guard=g)
    cached = dcjax.transform(*score_net, frame_shape=SHAPE, config=cfg, progress=False)
    streams = cached.streams(2, stagger=False, schedule="pooled")
    states = streams.init()
    # stream 0 sees f0 then f1; stream 1 sees f1 then f0
    pairs = [jnp.stack([f0, f1]), jnp.stack([f1, f0])]
    pooled = []
    for frames in pairs:
        out, states, _ = streams.step(states, frames)
        pooled.append(jax.device_get(out))
    for i, frames in enumerate([(f0, f1), (f1, f0)]):
        alone, _, _ = _run(score_net, cfg, frames)
        for t in range(2):
            np.testing.assert_allclose(pooled[t][0][i], alone[t][0], rtol=1e-5, atol=1e-6)
