"""DeepCache Section 4 on real photos: motion, mask, PSNR, options, errors."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from dcjax.matching import (
    MATCH_SEARCHES,
    Match,
    block_match_planes,
    match,
    planes,
    psnr_peak,
)
from tests.matching.frames import (
    block_ssd_np,
    blocks,
    degrade,
    luma,
    photo,
    psnr_np,
    shifted_pair,
)

SEARCHES = ("diamond", "three_step", "exhaustive")


def _inside_blocks(shape, bs, motion) -> np.ndarray:
    """(nby, nbx) bool: the block displaced by ``motion`` stays inside the frame."""
    h, w = shape
    dy, dx = motion
    nby, nbx = math.ceil(h / bs), math.ceil(w / bs)
    out = np.zeros((nby, nbx), bool)
    for by, bx, y0, x0, bh, bw in blocks(shape, bs):
        out[by, bx] = 0 <= y0 + dy and y0 + dy + bh <= h and 0 <= x0 + dx and x0 + dx + bw <= w
    return out


@pytest.mark.parametrize("search", SEARCHES)
@pytest.mark.parametrize(
    ("name", "motion"),
    [("astronaut", (3, -2)), ("chelsea", (-5, 6)), ("coffee", (7, -7)), ("camera", (0, 4))],
)
def test_pan_with_noise_and_brightness_is_recovered(search, name, motion):
    prev, cur = shifted_pair(photo(name), motion)
    cur = degrade(cur, noise=2.0, brightness=4.0)
    m = match(prev, cur, search=search)
    assert tuple(np.asarray(m.motion)) == motion
    inside = _inside_blocks(prev.shape[:2], 10, motion)
    block_mask = np.asarray(m.mask)[::10, ::10]
    # Every block that stays inside the previous frame matches; no other does.
    np.testing.assert_array_equal(block_mask, inside)
    assert float(m.match_ratio) == pytest.approx(inside.mean())


@pytest.mark.parametrize("search", SEARCHES)
def test_pasted_object_moving_differently_is_not_reused(search):
    background = photo("chelsea")
    obj = photo("coffee")[150:180, 200:230]  # 30x30 textured patch
    motion = (2, -3)
    prev, cur = shifted_pair(background, motion, shape=(64, 84))
    # The object sits at rows 20..50, cols 30..60 of cur and moved by (-4, 5)
    # relative to the background: in prev it is at rows 16..46, cols 35..65.
    cur[20:50, 30:60] = obj
    prev[16:46, 35:65] = obj
    cur = degrade(cur, seed=1)
    m = match(prev, cur, search=search)
    assert tuple(np.asarray(m.motion)) == motion
    mask = np.asarray(m.mask)
    # Blocks covered by the object in cur are not reusable ...
    assert not mask[20:50, 30:60][::10, ::10].any()
    # ... nor are blocks whose source in prev (at + motion) is the object.
    src = np.zeros(mask.shape, bool)
    src[16 - motion[0] : 46 - motion[0], 35 - motion[1] : 65 - motion[1]] = True
    for _, _, y0, x0, bh, bw in blocks(mask.shape, 10):
        if src[y0 : y0 + bh, x0 : x0 + bw].mean() > 0.5:
            assert not mask[y0, x0]
    # Elsewhere almost every block inside the frame matches.
    inside = _inside_blocks(mask.shape, 10, motion)
    clean = inside.copy()
    for by, bx, y0, x0, bh, bw in blocks(mask.shape, 10):
        touched = np.zeros(mask.shape, bool)
        touched[y0 : y0 + bh, x0 : x0 + bw] = True
        obj_cur = np.zeros(mask.shape, bool)
        obj_cur[20:50, 30:60] = True
        if (touched & (obj_cur | src)).any():
            clean[by, bx] = False
    assert mask[::10, ::10][clean].mean() >= 0.95


def test_outliers_do_not_bias_the_global_motion():
    """A large object (about 30% of blocks) moving elsewhere leaves the motion exact."""
    motion = (-3, 2)
    prev, cur = shifted_pair(photo("astronaut"), motion)
    obj = photo("coffee")[100:130, 100:140]
    cur[10:40, 10:50] = obj
    prev[14:44, 16:56] = obj  # the object's own vector is (4, 6)
    m = match(prev, cur, search="exhaustive")
    vecs = np.asarray(m.block_vectors).reshape(-1, 2)
    assert (vecs == (4, 6)).all(-1).sum() >= 8  # the object's blocks did see their own vector
    assert tuple(np.asarray(m.motion)) == motion


@pytest.mark.parametrize("search", SEARCHES)
def test_block_psnr_and_mask_match_a_numpy_reference(search):
    motion = (4, 3)
    prev, cur = shifted_pair(photo("coffee"), motion)
    cur = degrade(cur, noise=4.0, brightness=6.0, seed=3)
    cur[30:50, 40:70] = degrade(cur[30:50, 40:70], noise=40.0, seed=4)  # a badly matching area
    threshold = 25.0
    m = match(prev, cur, search=search, psnr_threshold=threshold)
    assert tuple(np.asarray(m.motion)) == motion
    pl, cl = luma(prev), luma(cur)
    psnr = np.asarray(m.block_psnr)
    mask = np.asarray(m.mask)
    n_matched = 0
    for by, bx, y0, x0, bh, bw in blocks(pl.shape, 10):
        dy, dx = motion
        if not (0 <= y0 + dy and y0 + dy + bh <= pl.shape[0]):
            assert psnr[by, bx] == -np.inf and not mask[y0 : y0 + bh, x0 : x0 + bw].any()
            continue
        if not (0 <= x0 + dx and x0 + dx + bw <= pl.shape[1]):
            assert psnr[by, bx] == -np.inf and not mask[y0 : y0 + bh, x0 : x0 + bw].any()
            continue
        ref = psnr_np(block_ssd_np(pl, cl, y0, x0, bh, bw, dy, dx), bh * bw)
        assert psnr[by, bx] == pytest.approx(ref, abs=1e-3)
        block = mask[y0 : y0 + bh, x0 : x0 + bw]
        assert block.all() == block.any()  # the mask is a union of whole blocks
        if abs(ref - threshold) > 1e-3:
            assert block.all() == (ref > threshold)
        n_matched += block.all()
    assert 0 < n_matched < psnr.size  # the threshold really splits the blocks
    assert float(m.match_ratio) == pytest.approx(n_matched / psnr.size)


def test_mask_never_points_outside_the_previous_frame():
    motion = (-7, 7)
    prev, cur = shifted_pair(photo("camera"), motion)
    m = match(prev, cur, search="diamond", init_motion=motion)
    assert tuple(np.asarray(m.motion)) == motion
    ys, xs = np.nonzero(np.asarray(m.mask))
    assert ys.size > 0
    assert (ys + motion[0] >= 0).all() and (ys + motion[0] < prev.shape[0]).all()
    assert (xs + motion[1] >= 0).all() and (xs + motion[1] < prev.shape[1]).all()


def test_identical_frames_and_infinite_threshold():
    frame = photo("astronaut")[:64, :84]
    m = match(frame, frame)
    assert tuple(np.asarray(m.motion)) == (0, 0)
    assert bool(np.asarray(m.mask).all())
    assert np.isinf(np.asarray(m.block_psnr)).all()
    never = match(frame, frame, psnr_threshold=float("inf"))
    assert not np.asarray(never.mask).any()
    assert float(never.match_ratio) == 0.0


def test_float_frames_match_like_uint8():
    prev, cur = shifted_pair(photo("chelsea"), (2, 5))
    cur = degrade(cur)
    a = match(prev, cur)
    b = match(prev.astype(np.float32) / 255.0, cur.astype(np.float32) / 255.0)
    c = match(prev.astype(np.float32), cur.astype(np.float32), data_range=255.0)
    for other in (b, c):
        np.testing.assert_array_equal(np.asarray(a.motion), np.asarray(other.motion))
        np.testing.assert_array_equal(np.asarray(a.mask), np.asarray(other.mask))
        np.testing.assert_allclose(
            np.asarray(a.block_psnr), np.asarray(other.block_psnr), atol=1e-3
        )


def test_rgb_psnr_option():
    prev, cur = shifted_pair(photo("coffee"), (1, -1))
    cur = degrade(cur)
    m = match(prev, cur, color="rgb", search="exhaustive")
    assert tuple(np.asarray(m.motion)) == (1, -1)
    # The RGB PSNR of one block, in NumPy.
    a = cur[10:20, 10:20].astype(np.float64)
    b = prev[11:21, 9:19].astype(np.float64)
    ref = psnr_np(np.square(a - b).sum(), a.size)
    assert np.asarray(m.block_psnr)[1, 1] == pytest.approx(ref, abs=1e-3)


def test_match_returns_the_pytree_and_search_none_is_static():
    prev, cur = shifted_pair(photo("astronaut"), (0, 0))
    m = match(prev, cur, search="none")
    assert isinstance(m, Match)
    assert tuple(np.asarray(m.motion)) == (0, 0)
    assert m.mask.shape == prev.shape[:2] and m.mask.dtype == jnp.bool_
    d = match(prev, cur)
    assert d.block_vectors.shape == (7, 9, 2) and d.block_vectors.dtype == jnp.int32
    assert d.block_psnr.shape == (7, 9) and d.block_psnr.dtype == jnp.float32
    assert d.motion.dtype == jnp.int32
    assert MATCH_SEARCHES == ("none", "diamond", "three_step", "exhaustive")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"search": "hexagon"}, "search"),
        ({"k_skip": 0}, "k_skip"),
        ({"block_size": 0}, "block_size"),
        ({"search_range": -1}, "search_range"),
        ({"max_steps": -1}, "max_steps"),
        ({"color": "hsv"}, "color"),
        ({"init_motion": (1, 2, 3)}, "init_motion"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, message):
    frame = photo("camera")[:20, :20]
    with pytest.raises(ValueError, match=message):
        match(frame, frame, **kwargs)


def test_frames_of_different_shapes_are_rejected():
    with pytest.raises(ValueError, match="one shape"):
        match(np.zeros((20, 20, 3), np.uint8), np.zeros((20, 21, 3), np.uint8))


def test_early_settling_changes_only_the_vectors_of_moving_blocks():
    """``all_vectors=False`` gives the same motion, mask, PSNRs and ratio as the
    full search on real fixed-camera frames (people walking), where it settles
    early, and on a pan, where it does not (every block moves: the search runs)."""
    from dcjax.eval.harness import load_frames

    frames = load_frames("vtest", (120, 160, 3), frames=10)
    pairs = [(frames[i], frames[i + 1]) for i in range(len(frames) - 1)]
    pairs.append(shifted_pair(photo("astronaut"), (3, -2), shape=(120, 160)))
    settled = 0
    for prev, cur in pairs:
        full = match(prev, cur, psnr_threshold=25.0)
        early = match(prev, cur, psnr_threshold=25.0, all_vectors=False)
        for field in ("motion", "mask", "block_psnr", "match_ratio"):
            np.testing.assert_array_equal(
                np.asarray(getattr(early, field)), np.asarray(getattr(full, field))
            )
        a, b = np.asarray(early.block_vectors), np.asarray(full.block_vectors)
        moved = (b != 0).any(-1)
        np.testing.assert_array_equal(a[~moved], b[~moved])  # the blocks that stay: same
        settled += int((a != b).any())
    assert tuple(np.asarray(full.motion)) == (3, -2)  # the pan: found, nothing skipped
    np.testing.assert_array_equal(a, b)
    assert settled >= 5  # most fixed-camera pairs skipped some moving block's search


@pytest.mark.parametrize("search", SEARCHES)
@pytest.mark.parametrize("color", ["luma", "rgb"])
def test_matching_planes_is_matching_the_frames(search, color):
    """`block_match_planes` on the frames' `planes` (what the transform keeps as
    its key) gives `match`'s result on the frames, for uint8 and float frames."""
    prev, cur = shifted_pair(photo("chelsea"), (2, -3))
    cur = degrade(cur)
    for p, c, data_range in (
        (prev, cur, None),
        (prev.astype(np.float32) / 255.0, cur.astype(np.float32) / 255.0, None),
        (prev.astype(np.float32), cur.astype(np.float32), 255.0),
    ):
        want = match(p, c, search=search, color=color, data_range=data_range)
        got = block_match_planes(
            planes(p, color),
            planes(c, color),
            peak=psnr_peak(c.dtype, data_range),
            search=search,
            color=color,
        )
        assert planes(c, color).shape == ((1,) if color == "luma" else (3,)) + c.shape[:2]
        assert tuple(np.asarray(got.motion)) == (2, -3)
        for field in ("motion", "mask", "block_vectors", "match_ratio"):
            np.testing.assert_array_equal(
                np.asarray(getattr(got, field)), np.asarray(getattr(want, field))
            )
        np.testing.assert_allclose(
            np.asarray(got.block_psnr), np.asarray(want.block_psnr), rtol=1e-6
        )


def test_matching_planes_rejects_frames_and_mismatched_planes():
    frame = photo("camera")[:20, :20]
    luma_planes = planes(frame)
    with pytest.raises(ValueError, match="planes"):
        block_match_planes(frame, frame, peak=255.0)  # (H, W, C) frames, not planes
    with pytest.raises(ValueError, match="planes"):
        block_match_planes(luma_planes, luma_planes[:, :19], peak=255.0)
    with pytest.raises(ValueError, match="search"):
        block_match_planes(luma_planes, luma_planes, peak=255.0, search="hexagon")


def test_zero_motion_prejudgement_is_the_same_position_test_where_it_holds():
    """``prejudge=True`` on fixed-camera frames (vtest, most blocks pass at zero):
    motion zero, every block's vector zero, and the mask, PSNRs and ratio of the
    same-position test (`static_match`, computed separately); on a pan (few
    blocks pass at zero) and from a nonzero start it is the search's result."""
    from dcjax.eval.harness import load_frames

    frames = load_frames("vtest", (120, 160, 3), frames=6)
    for prev, cur in zip(frames[:-1], frames[1:], strict=True):
        judged = match(prev, cur, psnr_threshold=25.0, prejudge=True, all_vectors=False)
        same = match(prev, cur, psnr_threshold=25.0, search="none")
        assert tuple(np.asarray(judged.motion)) == (0, 0)
        assert not np.asarray(judged.block_vectors).any()
        np.testing.assert_array_equal(np.asarray(judged.mask), np.asarray(same.mask))
        assert float(judged.match_ratio) == float(same.match_ratio) > 0.5
        np.testing.assert_allclose(
            np.asarray(judged.block_psnr), np.asarray(same.block_psnr), rtol=1e-5
        )
    pan = shifted_pair(photo("astronaut"), (3, -2), shape=(120, 160))
    starts = [(pan, (0, 0)), ((frames[0], frames[1]), (1, 0))]
    for (prev, cur), start in starts:
        judged = match(prev, cur, prejudge=True, init_motion=start)
        searched = match(prev, cur, init_motion=start)
        for field in ("motion", "mask", "block_vectors", "block_psnr", "match_ratio"):
            np.testing.assert_array_equal(
                np.asarray(getattr(judged, field)), np.asarray(getattr(searched, field))
            )
    assert tuple(np.asarray(match(*pan, prejudge=True).motion)) == (3, -2)


def test_zero_motion_prejudgement_off_cpu_selects_instead_of_skipping():
    """Where skipping does not pay (GPU), the prejudgement runs the search too and
    selects, with no data-dependent loop, and the result is the CPU path's."""
    import jax

    from dcjax import _loops
    from dcjax.matching import block as B
    from tests.kernels._strategies import all_eqns

    still = shifted_pair(photo("coffee"), (0, 0), shape=(64, 84))
    still = (still[0], degrade(still[1], noise=2.0, seed=5))
    pan = shifted_pair(photo("coffee"), (2, 3), shape=(64, 84))
    static = dict(block_size=10, search="diamond", max_steps=8, k_skip=1, reuse_scores=True,
                  color="luma", search_range=7, all_vectors=False, prejudge=True)  # fmt: skip

    def run(prev, cur, skipping):
        return B._block_match(
            planes(prev), planes(cur), jnp.zeros(2, jnp.int32), jnp.float32(25.0),
            jnp.float32(255.0), given_planes=True, skipping=skipping, **static,
        )  # fmt: skip

    cpu = [run(*pair, True) for pair in (still, pan)]
    with _loops.skipping(False):  # the program a GPU runs
        jaxpr = jax.make_jaxpr(lambda p, c: run(p, c, False))(*still)
        gpu = [run(*pair, False) for pair in (still, pan)]
    assert "while" not in [e.primitive.name for e in all_eqns(jaxpr.jaxpr)]
    for want, got in zip(cpu, gpu, strict=True):
        for field in ("motion", "mask", "match_ratio"):
            np.testing.assert_array_equal(
                np.asarray(getattr(got, field)), np.asarray(getattr(want, field))
            )
        np.testing.assert_allclose(
            np.asarray(got.block_psnr), np.asarray(want.block_psnr), rtol=1e-5
        )
    assert tuple(np.asarray(cpu[0].motion)) == (0, 0) and tuple(np.asarray(cpu[1].motion)) == (2, 3)


def test_prejudge_must_be_a_bool():
    frame = photo("camera")[:20, :20]
    with pytest.raises(ValueError, match="prejudge"):
        match(frame, frame, prejudge="yes")
