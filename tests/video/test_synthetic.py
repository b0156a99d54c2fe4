"""dcjax.video.synthetic.camera_motion: frames against their own ground truth."""

from __future__ import annotations

import numpy as np
import pytest

from dcjax.video import SyntheticVideo, camera_motion


def _shift_prev(prev: np.ndarray, dy: int, dx: int) -> tuple[np.ndarray, np.ndarray]:
    """``prev[y + dy, x + dx]`` for every (y, x), and where that lies inside prev."""
    height, width = prev.shape[:2]
    ys, xs = np.mgrid[0:height, 0:width]
    sy, sx = ys + dy, xs + dx
    inside = (sy >= 0) & (sy < height) & (sx >= 0) & (sx < width)
    out = np.zeros_like(prev)
    out[inside] = prev[sy[inside], sx[inside]]
    return out, inside


def _best_shift(prev: np.ndarray, cur: np.ndarray, radius: int) -> tuple[int, int]:
    """Exhaustive search of the global shift minimising mean |cur - prev shifted|."""
    best, best_err = (0, 0), np.inf
    for dy in range(-radius, radius + 1):
        for dx in range(-radius, radius + 1):
            shifted, inside = _shift_prev(prev.astype(np.float64), dy, dx)
            err = np.abs(cur.astype(np.float64) - shifted)[inside].mean()
            if err < best_err:
                best, best_err = (dy, dx), err
    return best


def test_shapes_and_dtypes() -> None:
    clip = camera_motion(5, (48, 64), objects=1)
    assert isinstance(clip, SyntheticVideo) and len(clip) == 5
    assert clip.frames.shape == (5, 48, 64, 3) and clip.frames.dtype == np.uint8
    assert clip.motion.shape == (5, 2) and np.issubdtype(clip.motion.dtype, np.integer)
    assert clip.moved.shape == clip.in_view.shape == (5, 48, 64)
    assert clip.moved.dtype == clip.in_view.dtype == np.bool_
    assert clip.gain.shape == clip.scale.shape == (5,)
    assert tuple(clip.motion[0]) == (0, 0)
    assert not clip.reusable[0].any()


@pytest.mark.parametrize(("pan", "jitter"), [((0, 2), 0), ((1, -3), 0), ((2, 1), 3)])
def test_pan_and_jitter_are_exact_on_background(pan: tuple[int, int], jitter: int) -> None:
    clip = camera_motion(12, (64, 80), pan=pan, jitter=jitter, seed=7)
    if jitter == 0:
        assert (clip.motion[1:] == np.array(pan)).all()
    else:
        assert len({tuple(m) for m in clip.motion[1:]}) > 1  # shaken
    for t in range(1, len(clip)):
        dy, dx = (int(v) for v in clip.motion[t])
        shifted, inside = _shift_prev(clip.frames[t - 1], dy, dx)
        np.testing.assert_array_equal(inside, clip.in_view[t])
        reuse = clip.reusable[t]
        assert reuse.mean() > 0.8
        np.testing.assert_array_equal(clip.frames[t][reuse], shifted[reuse])
        # The convention's sign matters: the opposite shift does not match.
        if (dy, dx) != (0, 0):
            opposite, inside2 = _shift_prev(clip.frames[t - 1], -dy, -dx)
            both = reuse & inside2
            assert (clip.frames[t][both] != opposite[both]).any(axis=-1).mean() > 0.3


def test_motion_is_what_an_exhaustive_search_finds() -> None:
    clip = camera_motion(6, (48, 64), pan=(1, -2), jitter=2, seed=11)
    for t in range(1, len(clip)):
        found = _best_shift(clip.frames[t - 1], clip.frames[t], radius=5)
        assert found == tuple(int(v) for v in clip.motion[t])


def test_objects_mark_exactly_the_pixels_that_break_the_match() -> None:
    clip = camera_motion(10, (96, 96), pan=(0, 2), objects=2, object_size=(24, 24), seed=5)
    assert clip.moved[1:].any(axis=(1, 2)).all()
    assert 0.02 < clip.moved[1:].mean() < 0.4
    mismatched_inside_mask = []
    for t in range(1, len(clip)):
        dy, dx = (int(v) for v in clip.motion[t])
        shifted, _ = _shift_prev(clip.frames[t - 1], dy, dx)
        differs = (clip.frames[t] != shifted).any(axis=-1) & clip.in_view[t]
        assert not (differs & ~clip.moved[t]).any()  # every mismatch is marked
        moved = clip.moved[t] & clip.in_view[t]
        mismatched_inside_mask.append(differs[moved].mean())
    assert np.mean(mismatched_inside_mask) > 0.5  # and marked pixels mostly do differ


def test_zoom_marks_off_centre_pixels_and_keeps_centre() -> None:
    clip = camera_motion(6, (64, 64), pan=(0, 0), zoom=0.03, seed=2)
    assert clip.scale[-1] == pytest.approx(1.03**5)
    for t in range(1, len(clip)):
        moved = clip.moved[t]
        assert not moved[28:36, 28:36].any()  # centre: displacement < 0.5 px
        assert moved[0, 0] and moved[-1, -1]  # corners: about 0.03 * 31.5 px
        diff = np.abs(clip.frames[t].astype(float) - clip.frames[t - 1]).mean(axis=-1)
        assert diff[~moved].mean() < diff[moved].mean()


def test_brightness_drift_and_noise() -> None:
    plain = camera_motion(8, (48, 64), seed=4)
    drift = camera_motion(8, (48, 64), brightness=-0.05, seed=4)
    noisy = camera_motion(8, (48, 64), noise=4.0, seed=4)
    np.testing.assert_allclose(drift.gain, 1 - 0.05 * np.arange(8))
    ratio = drift.frames[7].astype(float).mean() / plain.frames[7].astype(float).mean()
    assert ratio == pytest.approx(0.65, abs=0.02)
    residual = noisy.frames.astype(float) - plain.frames
    assert 3.0 < residual.std() < 5.0
    # Noise draws from its own stream: the ground truth is unchanged.
    np.testing.assert_array_equal(noisy.motion, plain.motion)
    np.testing.assert_array_equal(noisy.moved, plain.moved)


def test_deterministic_given_seed() -> None:
    kwargs = dict(num_frames=6, size=(48, 64), jitter=2, objects=2, noise=2.0, zoom=0.005)
    a = camera_motion(seed=9, **kwargs)
    b = camera_motion(seed=9, **kwargs)
    c = camera_motion(seed=10, **kwargs)
    for field in ("frames", "motion", "moved", "in_view"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert not np.array_equal(a.frames, c.frames)
    assert not np.array_equal(a.motion, c.motion)


def test_long_path_upscales_the_photo_instead_of_failing() -> None:
    clip = camera_motion(40, (128, 128), image="chelsea", pan=(3, 12), seed=1)  # 480 px by 117
    assert clip.frames.shape == (40, 128, 128, 3)
    t = 39
    dy, dx = (int(v) for v in clip.motion[t])
    shifted, _ = _shift_prev(clip.frames[t - 1], dy, dx)
    np.testing.assert_array_equal(clip.frames[t][clip.reusable[t]], shifted[clip.reusable[t]])


def test_array_and_grey_images() -> None:
    grey = (np.arange(200 * 300) % 251).astype(np.uint8).reshape(200, 300)
    clip = camera_motion(3, (32, 32), image=grey)
    assert clip.frames.shape == (3, 32, 32, 3)
    assert (clip.frames[..., 0] == clip.frames[..., 1]).all()


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"num_frames": 0}, "num_frames"),
        ({"size": (2, 64)}, "size"),
        ({"pan": (0.5, 1)}, "pan"),
        ({"jitter": -1}, "jitter"),
        ({"zoom": 0.9}, "zoom"),
        ({"objects": 1, "object_size": (64, 8)}, "object_size"),
        ({"object_speed": 0}, "object_speed"),
        ({"noise": -1.0}, "noise"),
        ({"image": "not_a_photo"}, "image"),
        ({"image": np.zeros((10, 10, 3), np.float32)}, "image"),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], argument: str) -> None:
    base: dict[str, object] = {"num_frames": 2, "size": (32, 64)}
    base.update(kwargs)
    with pytest.raises(ValueError, match=argument):
        camera_motion(**base)  # type: ignore[arg-type]
