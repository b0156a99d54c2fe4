"""The per-frame step (`dcjax.step`): the refresh schedule, a periodic refresh
spread over frames in bands of rows (`Config.refresh_bands`); the program
traced for a GPU (no data-dependent skipping, `dcjax._loops.skipping`), which
reads one predicate on the host a frame and computes what the CPU's does."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dcjax
from dcjax._loops import skipping
from dcjax.step import refresh_band

SHAPE = (24, 32, 3)


class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(8, (3, 3))(x))
        x = nn.relu(nn.Conv(8, (3, 3), strides=(2, 2))(x))
        return nn.Conv(4, (3, 3))(x)


@pytest.fixture(scope="module")
def model():
    net = Net()
    return net, net.init(jax.random.key(0), jnp.zeros((1, *SHAPE)))


def test_the_band_of_each_frame_of_a_period():
    # a period of 10 frames, its last 4 each computing a band
    assert [int(refresh_band(jnp.int32(s), 10, 4)) for s in range(1, 11)] == [-1] * 6 + [0, 1, 2, 3]
    assert [int(refresh_band(jnp.int32(s), 3, 3)) for s in range(1, 4)] == [0, 1, 2]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"refresh_bands": 0}, "refresh_bands must be a positive int"),
        ({"refresh_bands": True}, "refresh_bands must be a positive int"),
        ({"refresh_bands": 2, "refresh_every": None}, "needs refresh_every >= 2"),
        ({"refresh_bands": 5, "refresh_every": 4}, "needs refresh_every >= 5"),
    ],
)  # fmt: skip
def test_bad_band_settings_are_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        dcjax.Config(**kwargs)


def test_a_banded_refresh_recomputes_each_band_once_a_period_and_never_all_at_once(model):
    """Identical frames, every block reusable: after the first frame no frame
    is a full refresh; the last 3 frames of each 6-frame period recompute
    one band of 8 of the 24 rows each, top first; the others are still."""
    net, variables = model
    cfg = dcjax.Config(refresh_every=6, refresh_bands=3, kernel="xla")
    cached = dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg)
    frame = np.random.default_rng(0).integers(0, 256, SHAPE).astype(np.uint8)
    want = net.apply(variables, jnp.asarray(frame, jnp.float32)[None] / 255.0)
    state, infos = cached.init(), []
    for _ in range(13):
        out, state, info = cached.step(state, frame)
        infos.append({k: np.asarray(v) for k, v in info.items()})
        np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-5, atol=1e-5)
    assert [bool(i["refreshed"]) for i in infos] == [True] + [False] * 12
    bands = [int(i["refresh_band"]) for i in infos]
    # the last band falls where the whole refresh would (frames 6 and 12)
    assert bands == [-1, -1, -1, -1, 0, 1, 2, -1, -1, -1, 0, 1, 2]
    for i, b in zip(infos, bands, strict=True):
        if b >= 0:
            assert not i["skipped"] and float(i["input_reuse"]) == pytest.approx(16 / 24)
            assert 0 < float(i["flops_ratio"]) < 1  # a band, not the whole frame
        elif not i["refreshed"]:
            assert i["skipped"]  # a still frame
    # the same frames with the whole refresh at once: every 6th frame in full
    whole = dcjax.transform(net, variables, frame_shape=SHAPE,
                            config=dcjax.Config(refresh_every=6, kernel="xla"))  # fmt: skip
    state, refreshed = whole.init(), []
    for _ in range(13):
        _, state, info = whole.step(state, frame)
        refreshed.append(bool(info["refreshed"]))
        assert int(info["refresh_band"]) == -1
    assert refreshed == [True] + [False] * 5 + [True] + [False] * 5 + [True]


def test_banded_refreshes_under_motion_equal_the_model(model, motion=(2, -3)):
    """Forcing bands dirty only adds recomputation: with exact alignment every
    output equals the model's, streams staggered or not."""
    net, variables = model
    cfg = dcjax.Config(refresh_every=4, refresh_bands=2, kernel="xla", min_match=0.0)
    cached = dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg)
    streams = cached.streams(2, schedule="pooled")
    states = streams.init()
    h, w, c = SHAPE
    canvas = np.random.default_rng(1).integers(0, 256, (h + 64, w + 64, c)).astype(np.uint8)

    def crop(t, stream):  # the camera pans by `motion` a frame; streams start apart
        y, x = 16 + (t + 3 * stream) * motion[0], 40 + (t + 3 * stream) * motion[1]
        return canvas[y : y + h, x : x + w]

    bands = []
    for t in range(9):
        frames = np.stack([crop(t, 0), crop(t, 1)])
        outs, states, infos = streams.step(states, frames)
        bands.append(tuple(int(b) for b in np.asarray(infos["refresh_band"])))
        want = net.apply(variables, jnp.asarray(frames, jnp.float32) / 255.0)
        np.testing.assert_allclose(np.asarray(outs)[:, 0], np.asarray(want), rtol=1e-4, atol=1e-4)
    # stream 1 starts two frames into its period: its bands come two frames early
    assert [b[0] for b in bands][:5] != [b[1] for b in bands][:5]


class Pointwise(nn.Module):
    """1x1 convolutions: each output pixel reads its own input pixel alone."""

    @nn.compact
    def __call__(self, x):
        return nn.Conv(4, (1, 1))(nn.relu(nn.Conv(8, (1, 1))(x)))


@pytest.mark.parametrize("bands", [1, 3])
def test_a_banded_refresh_restarts_refinements_references_band_by_band(bands):
    """A change under refinement's threshold is reused frame after frame; the
    periodic refresh is what brings it in. Spread over 3 bands of 8 rows, each
    band frame brings in its own rows, at every layer: a pointwise network's
    output equals the model's on the rows refreshed so far and keeps the stale
    value on the others, until the period's last band."""
    net = Pointwise()
    variables = net.init(jax.random.key(1), jnp.zeros((1, *SHAPE)))
    refine = dcjax.RefineConfig(delta=0.05, layers="all")
    cfg = dcjax.Config(refresh_every=6, refresh_bands=bands, refine=refine, kernel="xla")
    cached = dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg)
    base = np.random.default_rng(3).integers(0, 255, SHAPE).astype(np.uint8)
    frames = [base] + [base + 1] * 6  # a brightening under the threshold, then still

    def model(frame):
        return np.asarray(net.apply(variables, jnp.asarray(frame, jnp.float32)[None] / 255.0))

    stale, fresh = model(base), model(base + 1)
    assert np.abs(fresh - stale).max() > 1e-3  # the change is there to miss
    state = cached.init()
    for t, frame in enumerate(frames):
        out, state, info = cached.step(state, frame)
        out = np.asarray(out)
        if bands == 1:  # the whole refresh on frame 6
            done = 0 if t < 6 else 24
            assert bool(info["refreshed"]) == (t in (0, 6))
        else:  # bands of rows 0-7, 8-15, 16-23 on frames 4, 5, 6
            done = 0 if t < 4 else 8 * (t - 3)
            assert int(info["refresh_band"]) == (t - 4 if t >= 4 else -1)
            assert bool(info["refreshed"]) == (t == 0)
        if t == 0:
            np.testing.assert_allclose(out, stale, rtol=1e-5, atol=1e-6)
            continue
        np.testing.assert_allclose(out[:, :done], fresh[:, :done], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out[:, done:], stale[:, done:], rtol=1e-5, atol=1e-6)


def _pan(n, motion=(1, 1), still=(3,)):
    """``n`` frames of a camera panning by ``motion`` a frame over a random
    canvas, frames ``still`` repeating the one before."""
    h, w, c = SHAPE
    canvas = np.random.default_rng(2).integers(0, 256, (h + 64, w + 64, c)).astype(np.uint8)
    frames, t = [], 0
    for i in range(n):
        t += i not in still
        y, x = 16 + t * motion[0], 40 + t * motion[1]
        frames.append(canvas[y : y + h, x : x + w])
    return frames


GPU_CONFIGS = {
    "deepcache": {},
    "refine": {"refine": dcjax.RefineConfig(delta=0.05)},
    "refine_bands": {"refine": dcjax.RefineConfig(delta=0.05), "refresh_bands": 2},
    "cap": {"max_pixel_change": 0.1, "color": "rgb"},
}


@pytest.mark.parametrize("name", GPU_CONFIGS)
def test_the_gpu_program_reads_one_predicate_a_frame_and_computes_what_the_cpu_program_does(
    model, name
):
    net, variables = model
    cfg = dcjax.Config(kernel="pallas", min_match=0.0, refresh_every=5, **GPU_CONFIGS[name])
    frames = _pan(7)

    def run(cached):  # traced on the first step, under the caller's `skipping`
        state, outs, infos = cached.init(), [], []
        for frame in frames:
            out, state, info = cached.step(state, frame)
            outs.append(np.asarray(out))
            infos.append(jax.device_get(info))
        return outs, infos

    with skipping(True):  # the program a CPU runs, on any backend
        cpu = dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg)
        assert len(cpu.host_syncs()) > 1  # it skips work per layer and matcher step
        want, want_infos = run(cpu)
    with skipping(False):  # the program a GPU runs, on any backend
        gpu = dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg)
        (sync,) = gpu.host_syncs()
        assert sync.primitive == "while" and "_still_or_forward" in sync.where
        got, infos = run(gpu)
    for t in range(len(frames)):
        np.testing.assert_allclose(got[t], want[t], atol=2e-5)
        for key in ("motion", "skipped", "refreshed", "match_ratio", "input_reuse"):
            np.testing.assert_array_equal(infos[t][key], want_infos[t][key])
    assert [bool(i["skipped"]) for i in infos] == [t == 3 for t in range(len(frames))]
    assert max(float(i["input_reuse"]) for i in infos[1:3]) > 0.5  # moving frames reused


def test_the_gpu_programs_other_reads_the_still_frame_skip_and_the_tile_kernels(model):
    net, variables = model
    with skipping(False):
        never = dcjax.Config(kernel="pallas", skip_unchanged=False)
        assert dcjax.transform(net, variables, frame_shape=SHAPE, config=never).host_syncs() == ()
        pooled = dcjax.transform(
            net, variables, frame_shape=SHAPE, config=dcjax.Config(kernel="pallas")
        ).streams(3, schedule="pooled")
        states = jax.eval_shape(pooled.init)
        frames = jax.ShapeDtypeStruct((3, *SHAPE), jnp.uint8)
        step = pooled._step_fn(False, jitted=False)
        jaxpr = jax.make_jaxpr(step)(pooled.cached._traced.leaves, states, frames, None)
        # under vmap the streams share the one loop (a trip while any stream moves)
        assert len(dcjax.transforms.host_syncs.host_syncs(jaxpr)) == 1
        # the tile kernel's loops of zero or one trip, per layer and step size
        tiles = dcjax.transform(
            net, variables, frame_shape=SHAPE, config=dcjax.Config(kernel="xla")
        ).host_syncs()
        assert sum("sparse_or_dense" in s.where for s in tiles) >= 3


def test_a_scheduled_refresh_is_not_matched_and_the_next_frame_searches_from_the_last_motion(
    model,
):
    """On CPU a frame that refreshes by schedule runs no matcher (a conditional
    in the step's program), reports no match on every backend, and keeps the
    motion the search found: the frame after it reuses the panned pixels."""
    net, variables = model
    cfg = dcjax.Config(kernel="xla", min_match=0.0, refresh_every=3)
    frames = _pan(8, motion=(2, 1), still=())
    for program in (True, False):
        with skipping(program):
            cached = dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg)
            state, infos = cached.init(), []
            for frame in frames:
                out, state, info = cached.step(state, frame)
                infos.append(jax.device_get(info))
                want = net.apply(variables, jnp.asarray(frame, jnp.float32)[None] / 255.0)
                np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=1e-4)
        refreshed = [bool(i["refreshed"]) for i in infos]
        assert refreshed == [t % 3 == 0 for t in range(len(frames))]
        for t, info in enumerate(infos):
            if refreshed[t]:
                assert float(info["match_ratio"]) == 0.0
                np.testing.assert_array_equal(info["motion"], [0, 0])
            else:  # the camera moved by (2, 1): the key is (-2, -1) away
                np.testing.assert_array_equal(info["motion"], [2, 1])
                assert float(info["input_reuse"]) > 0.5
    with skipping(True):
        cached = dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg)
        jaxpr = jax.make_jaxpr(cached._step)(
            cached._traced.leaves, cached.init(), jnp.asarray(frames[0]), None
        )
    # the matcher's conditional: one branch computes nothing but zeros
    conds = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "cond"]
    assert any(
        all(q.primitive.name in ("broadcast_in_dim", "convert_element_type") for q in b.jaxpr.eqns)
        and len(b.jaxpr.outvars) >= 2
        for e in conds
        for b in e.params["branches"]
    )
