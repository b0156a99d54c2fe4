"""The per-frame step's refresh schedule (`dcjax.step`): a periodic refresh
spread over frames in bands of rows (`Config.refresh_bands`)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dcjax
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
        ({"refresh_bands": 2, "refine": dcjax.RefineConfig()}, "cannot be combined with refine"),
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
