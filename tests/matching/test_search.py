"""The per-block searches against a brute-force NumPy reference and each other."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcjax import _loops
from dcjax.matching import block as B
from dcjax.matching import match, steady
from dcjax.matching import search as S
from dcjax.matching.grid import searched_blocks
from tests.kernels._strategies import all_eqns
from tests.matching.frames import blocks, brute_force, degrade, luma, photo, shifted_pair, smooth

R = 7  # the default search range


def _textured(prev: np.ndarray, cur: np.ndarray, min_std: float = 12.0) -> np.ndarray:
    """(nby, nbx) bool: blocks of ``cur`` with enough texture for a unique best vector."""
    cl = luma(cur)
    out = np.zeros((7, 9), bool)
    for by, bx, y0, x0, bh, bw in blocks(cl.shape, 10):
        out[by, bx] = cl[y0 : y0 + bh, x0 : x0 + bw].std() > min_std
    return out


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(["astronaut", "chelsea", "coffee", "camera"]),
    dy=st.integers(-R, R),
    dx=st.integers(-R, R),
    oy=st.integers(20, 200),
    ox=st.integers(20, 200),
    seed=st.integers(0, 2**16),
)
def test_exhaustive_equals_brute_force(name, dy, dx, oy, ox, seed):
    prev, cur = shifted_pair(photo(name), (dy, dx), origin=(oy, ox))
    cur = degrade(cur, noise=3.0, seed=seed)
    m = match(prev, cur, search="exhaustive", k_skip=1)
    ref = brute_force(prev, cur, 10, R)
    vecs = np.asarray(m.block_vectors)
    same = 0
    for (by, bx), costs in ref.items():
        best = min(costs.values())
        got = tuple(int(v) for v in vecs[by, bx])
        # The chosen vector is admissible and optimal up to float32 rounding.
        assert got in costs
        assert costs[got] <= best * (1 + 1e-5) + 1e-3
        # Ties (within rounding) aside, it is the reference's first minimum in
        # the documented order: shorter vectors first.
        order = sorted(costs, key=lambda v: (abs(v[0]) + abs(v[1]), v[0], v[1]))
        first = next(v for v in order if costs[v] <= best * (1 + 1e-5) + 1e-3)
        same += got == first
    assert same >= len(ref) - 1


def _diamond_np(costs: dict, start, max_steps: int):
    """Diamond search on one block's cost table, sequentially, as in Zhu & Ma."""
    cost = lambda v: costs.get(v, np.inf)
    v, moves = start, 0
    while True:
        cands = [v] + [(v[0] + a, v[1] + b) for a, b in S.LARGE_DIAMOND]
        best = min(cands, key=cost)  # the first minimum: the centre wins ties
        if best == v:
            break
        v, moves = best, moves + 1
        if moves >= max_steps:
            break
    return min([v] + [(v[0] + a, v[1] + b) for a, b in S.SMALL_DIAMOND], key=cost)


def _three_step_np(costs: dict, start, steps):
    cost = lambda v: costs.get(v, np.inf)
    v = start
    for s in steps:
        cands = [v] + [(v[0] + a * s, v[1] + b * s) for a in (-1, 0, 1) for b in (-1, 0, 1)]
        cands = [v] + [c for c in cands[1:] if c != v]
        v = min(cands, key=cost)
    return v


def _local_minima(costs: dict) -> int:
    """How many vectors are no worse than all their 8 admissible neighbours."""
    n = 0
    for (y, x), c in costs.items():
        nb = [
            costs[(y + a, x + b)]
            for a in (-1, 0, 1)
            for b in (-1, 0, 1)
            if (a, b) != (0, 0) and (y + a, x + b) in costs
        ]
        n += all(c <= d for d in nb)
    return n


@pytest.mark.parametrize(
    ("search", "init"), [("diamond", (0, 0)), ("diamond", (-2, 3)), ("three_step", (0, 0))]
)
@pytest.mark.parametrize("name", ["chelsea", "coffee"])
def test_fast_searches_follow_a_numpy_reference(search, init, name):
    prev, cur = shifted_pair(photo(name), (3, -4))
    cur = degrade(cur, noise=3.0, seed=7)
    m = match(prev, cur, search=search, init_motion=init)
    ref = brute_force(prev, cur, 10, R)
    vecs = np.asarray(m.block_vectors)
    agree = 0
    for (by, bx), costs in ref.items():
        # The start is clipped into the block's admissible box, as documented.
        ys = [v[0] for v in costs]
        xs = [v[1] for v in costs]
        start = (int(np.clip(init[0], min(ys), max(ys))), int(np.clip(init[1], min(xs), max(xs))))
        if search == "diamond":
            want = _diamond_np(costs, start, 8)
        else:
            want = _three_step_np(costs, start, S.three_step_steps(R))
        agree += tuple(int(v) for v in vecs[by, bx]) == want
    # float32 against float64 SSDs may break a rare near-tie differently.
    assert agree >= len(ref) - 2


def test_diamond_agrees_with_exhaustive_on_smooth_blocks():
    """On blocks whose SSD surface has a single local minimum, the diamond search
    (a local descent) ends on the exhaustive optimum for 9 blocks in 10 and
    next to it almost always: its final small-diamond step can still move to a
    4-neighbour that is not a minimum, as in Zhu & Ma. Enough steps are allowed
    that a zigzag descent is not cut short."""
    total = exact = near = 0
    for name in ("astronaut", "chelsea", "coffee"):
        for motion in ((2, -1), (-3, 3)):
            prev, cur = shifted_pair(smooth(photo(name), 3.0), motion)
            cur = degrade(cur, noise=1.0, brightness=0.0)
            ex = match(prev, cur, search="exhaustive")
            ds = match(prev, cur, search="diamond", max_steps=4 * R)
            assert tuple(np.asarray(ds.motion)) == tuple(np.asarray(ex.motion)) == motion
            diff = np.abs(np.asarray(ds.block_vectors) - np.asarray(ex.block_vectors)).max(-1)
            for (by, bx), costs in brute_force(prev, cur, 10, R).items():
                if _local_minima(costs) == 1:
                    total += 1
                    exact += diff[by, bx] == 0
                    near += diff[by, bx] <= 1
    assert total >= 100
    assert exact / total >= 0.9
    assert near / total >= 0.95


@pytest.mark.parametrize("name", ["astronaut", "coffee"])
def test_three_step_agrees_with_exhaustive_on_the_motion(name):
    prev, cur = shifted_pair(smooth(photo(name)), (5, -6))
    ex = match(prev, cur, search="exhaustive")
    ts = match(prev, cur, search="three_step")
    assert tuple(np.asarray(ts.motion)) == tuple(np.asarray(ex.motion)) == (5, -6)
    np.testing.assert_array_equal(np.asarray(ts.mask), np.asarray(ex.mask))


@pytest.mark.parametrize("search", ["diamond", "exhaustive"])
def test_k_skip_changes_results_only_through_the_global_motion(search):
    """Per-block searches are independent, so skipping blocks keeps the searched
    blocks' vectors; Step 4 then re-checks every block, so with the same global
    motion the mask and PSNRs are those of the full search."""
    prev, cur = shifted_pair(photo("chelsea"), (-4, 2))
    cur = degrade(cur)
    full = match(prev, cur, search=search, k_skip=1, reuse_scores=False)
    skip = match(prev, cur, search=search, k_skip=2, reuse_scores=False)
    np.testing.assert_array_equal(
        np.asarray(skip.block_vectors)[::2, ::2], np.asarray(full.block_vectors)[::2, ::2]
    )
    # Blocks that were not searched report the global motion.
    unsearched = np.ones((7, 9), bool)
    unsearched[::2, ::2] = False
    assert (np.asarray(skip.block_vectors)[unsearched] == np.asarray(skip.motion)).all()
    np.testing.assert_array_equal(np.asarray(skip.motion), np.asarray(full.motion))
    np.testing.assert_array_equal(np.asarray(skip.mask), np.asarray(full.mask))
    np.testing.assert_allclose(np.asarray(skip.block_psnr), np.asarray(full.block_psnr), atol=1e-3)


@pytest.mark.parametrize("k_skip", [1, 2])
def test_reused_scores_equal_recomputed_ones(k_skip):
    prev, cur = shifted_pair(photo("coffee"), (3, 3))
    cur = degrade(cur, noise=8.0, seed=5)  # PSNRs spread around the threshold
    a = match(prev, cur, k_skip=k_skip, reuse_scores=True, init_motion=(3, 3))
    b = match(prev, cur, k_skip=k_skip, reuse_scores=False, init_motion=(3, 3))
    np.testing.assert_array_equal(np.asarray(a.motion), np.asarray(b.motion))
    pa, pb = np.asarray(a.block_psnr), np.asarray(b.block_psnr)
    np.testing.assert_allclose(pa, pb, atol=1e-3)
    far = np.abs(pb - 20.0) > 1e-3
    np.testing.assert_array_equal(
        np.asarray(a.mask)[::10, ::10][far], np.asarray(b.mask)[::10, ::10][far]
    )


def test_max_steps_bounds_the_walk():
    prev, cur = shifted_pair(photo("astronaut"), (6, -6))
    m = match(prev, cur, search="diamond", max_steps=1, k_skip=1)
    vecs = np.asarray(m.block_vectors).reshape(-1, 2)
    # One large-diamond move (at most 2 per axis), then the small diamond (1).
    assert np.abs(vecs).max() <= 3


def test_search_order_helpers():
    assert S.three_step_steps(7) == (4, 2, 1)
    assert S.three_step_steps(15) == (8, 4, 2, 1)
    assert S.three_step_steps(3) == (2, 1)
    order = S.exhaustive_order(2)
    assert order.shape == (25, 2) and tuple(order[0]) == (0, 0)
    lengths = np.abs(order).sum(-1)
    assert (np.diff(lengths) >= 0).all()
    assert {tuple(v) for v in order} == {(a, b) for a in range(-2, 3) for b in range(-2, 3)}
    for n in (1, 16, 144, 529):
        assert 1 <= S.tail_capacity(n) <= n


def _random_blocks(n: int, seed: int):
    """Blocks of a random plane against a smoothed copy: many blocks wander."""
    rng = np.random.default_rng(seed)
    size = 10
    side = int(np.ceil(np.sqrt(n))) * size
    pad = R + 2
    plane = rng.normal(size=(side + 2 * pad, side + 2 * pad)).astype(np.float32)
    plane = np.asarray(smooth(np.repeat(((plane - plane.min()) * 40)[..., None], 3, -1), 1.5))
    plane = plane[..., 0].astype(np.float32)[None]
    ys, xs = np.divmod(np.arange(n), side // size)
    y0, x0 = ys * size, xs * size
    cur = np.stack(
        [
            plane[0, pad + y + 1 : pad + y + 1 + size, pad + x - 2 : pad + x - 2 + size]
            for y, x in zip(y0, x0, strict=True)
        ],
        -1,
    )[None]
    lo = np.stack([np.maximum(-R, -y0), np.maximum(-R, -x0)]).astype(np.int32)
    hi = np.stack([np.minimum(R, side - y0 - size), np.minimum(R, side - x0 - size)]).astype(
        np.int32
    )
    corners = np.stack([y0 + pad, x0 + pad]).astype(np.int32)
    b = S.Blocks(jnp.asarray(cur), None, jnp.asarray(corners), jnp.asarray(lo), jnp.asarray(hi))
    return jnp.asarray(plane), b


def test_diamond_straggler_compaction_is_exact(monkeypatch):
    """Stepping only the stragglers gives the result of stepping every block."""
    prev_p, b = _random_blocks(100, seed=0)
    start = jnp.zeros((2, 100), jnp.int32)
    run = jax.jit(lambda p, s: S.diamond_search(p, b, s, max_steps=8))
    compacted = run(prev_p, start)
    monkeypatch.setattr(S, "tail_capacity", lambda n: n)
    plain = jax.jit(lambda p, s: S.diamond_search(p, b, s, max_steps=8))(prev_p, start)
    assert S.tail_capacity(100) == 100
    np.testing.assert_array_equal(np.asarray(compacted.vectors), np.asarray(plain.vectors))
    np.testing.assert_array_equal(np.asarray(compacted.ssd), np.asarray(plain.ssd))
    # The true vector of every block is (1, -2); most blocks find it.
    found = (np.asarray(plain.vectors) == np.array([[1], [-2]])).all(0)
    assert found.mean() > 0.5


def _moving_patch(name: str, seed: int, noise: float = 1.0):
    """(prev, cur): a still photo crop in which one 24x24 patch moves by (2, -3)."""
    prev, _ = shifted_pair(photo(name), (0, 0))
    cur = prev.copy()
    cur[20:44, 30:54] = photo(name)[120 + 22 : 120 + 46, 140 + 27 : 140 + 51]
    return prev, degrade(cur, noise=noise, brightness=0.0, seed=seed)


def _window_only_match():
    """`match`'s diamond search with the steady path always overflowing, i.e.
    every block searched by gathered windows (a fresh jit: the patch is seen)."""
    real = steady.steady_diamond_search

    def overflowing(*args, **kwargs):
        res, _ = real(*args, **kwargs)
        return res, jnp.bool_(True)

    return jax.jit(
        lambda *a, **k: B._block_match.__wrapped__(*a, **k),  # not jax's trace cache
        static_argnames=("block_size", "search", "max_steps", "k_skip", "reuse_scores",
                         "color", "search_range"),
    ), overflowing  # fmt: skip


def _call(fn, prev, cur, init=(0, 0), color="luma"):
    return fn(
        jnp.asarray(prev), jnp.asarray(cur), jnp.asarray(init, jnp.int32),
        jnp.float32(30.0), jnp.float32(255.0), block_size=10, search="diamond",
        max_steps=8, k_skip=1, reuse_scores=True, color=color, search_range=R,
    )  # fmt: skip


@pytest.mark.parametrize("color", ["luma", "rgb"])
def test_plane_ssd_equals_gathered_block_ssd(color):
    """Whole-plane SSDs equal the per-block SSDs of gathered windows, edge blocks
    (partly outside the frame) included."""
    prev, cur = _moving_patch("coffee", seed=1, noise=4.0)
    pl = lambda f: B.planes(jnp.asarray(f), color)  # noqa: E731
    bs, pad = 10, R + 2
    (nby, nbx), _, corners, _, _ = searched_blocks(64, 84, bs, 1, R, pad)
    eh, ew = nby * bs - 64, nbx * bs - 84
    prev_p = jnp.pad(pl(prev), ((0, 0), (pad, pad + eh), (pad, pad + ew)))
    cur_p = jnp.pad(pl(cur), ((0, 0), (0, eh), (0, ew)))
    inside = np.zeros((nby * bs, nbx * bs), np.float32)
    inside[:64, :84] = 1.0
    got = np.asarray(steady.plane_ssd(cur_p, prev_p, pad, bs, inside))
    assert got.shape == (13, nby * nbx)
    cur_b = S.windows(cur_p, jnp.asarray(corners) - pad, bs)
    weights = S.windows(jnp.asarray(inside)[None], jnp.asarray(corners) - pad, bs)
    for k, (dy, dx) in enumerate(steady.PLANE_OFFSETS):
        ref = S.windows(prev_p, jnp.asarray(corners) + np.array([[dy], [dx]]), bs)
        want = np.asarray(S.block_ssd(cur_b, ref, weights))
        np.testing.assert_allclose(got[k], want, rtol=1e-5, atol=1e-2)
    # Not vacuous: the moving patch makes some costs large, the still part small.
    assert got[0].max() > 100 * np.median(got[0]) > 0


@pytest.mark.parametrize("name", ["coffee", "chelsea", "astronaut"])
def test_steady_search_equals_the_window_search(name, monkeypatch):
    """From a zero start, the plane-cost search finds what the window search finds."""
    prev, cur = _moving_patch(name, seed=3)
    plane_path = _call(B._block_match, prev, cur)
    fn, overflowing = _window_only_match()
    monkeypatch.setattr(steady, "steady_diamond_search", overflowing)
    windows = _call(fn, prev, cur)
    a, b = np.asarray(plane_path.block_vectors), np.asarray(windows.block_vectors)
    assert (a != 0).any()  # the patch's blocks moved: the compacted part ran
    # float32 SSDs summed in another order may break a rare near-tie differently.
    assert (a != b).any(-1).sum() <= 1
    same = (a == b).all(-1)
    np.testing.assert_allclose(
        np.asarray(plane_path.block_psnr)[same], np.asarray(windows.block_psnr)[same], rtol=1e-5
    )
    assert int(plane_path.motion.sum() != windows.motion.sum()) == 0


def test_steady_search_runs_only_from_a_zero_start_and_falls_back_on_overflow(monkeypatch):
    """Corrupted plane costs change the result from a zero start only; with one
    slot for moving blocks the search overflows to the window search."""
    prev, cur = _moving_patch("coffee", seed=5)
    good0, good1 = _call(B._block_match, prev, cur), _call(B._block_match, prev, cur, (1, 0))
    movers = np.flatnonzero((np.asarray(good0.block_vectors) != 0).any(-1))
    assert 2 <= len(movers) <= steady.steady_capacity(63)
    real_planes = steady.plane_ssd
    # A zero cost at their start: the blocks that move can no longer leave it.
    monkeypatch.setattr(steady, "plane_ssd", lambda *a: real_planes(*a).at[0, movers].set(0.0))
    fn, _ = _window_only_match()
    bad0, bad1 = _call(fn, prev, cur), _call(fn, prev, cur, (1, 0))
    stuck = (np.asarray(bad0.block_vectors) != np.asarray(good0.block_vectors)).any(-1)
    np.testing.assert_array_equal(np.flatnonzero(stuck), movers)
    # From another start the plane costs are not used.
    np.testing.assert_array_equal(np.asarray(bad1.block_vectors), np.asarray(good1.block_vectors))
    # A cost below zero at (1, 0) for the blocks that stay: the small diamond
    # of the plane path takes it, unless more blocks move than there are
    # slots, and the window search runs instead.
    still = np.setdiff1d(np.arange(63), movers)
    monkeypatch.setattr(steady, "plane_ssd", lambda *a: real_planes(*a).at[10, still].set(-1.0))
    assert steady.PLANE_OFFSETS[10] == (1, 0)
    fn, _ = _window_only_match()
    lured = np.asarray(_call(fn, prev, cur).block_vectors).reshape(-1, 2)
    assert (lured[still[still < 54]] == (1, 0)).all()  # the last row cannot move down
    monkeypatch.setattr(steady, "steady_capacity", lambda n: 1)
    fn, _ = _window_only_match()
    over = _call(fn, prev, cur)
    np.testing.assert_array_equal(np.asarray(over.block_vectors), np.asarray(good0.block_vectors))


def test_diamond_search_under_vmap_matches_single_streams():
    """Streams with a zero and a nonzero start in one batch (one takes the plane
    path, the other the window path) match their single-stream results."""
    pairs = [_moving_patch("coffee", seed=7), _moving_patch("chelsea", seed=8)]
    inits = [(0, 0), (1, -1)]
    single = [_call(B._block_match, p, c, i) for (p, c), i in zip(pairs, inits, strict=True)]
    batched = jax.vmap(lambda p, c, i: _call(B._block_match, p, c, i))(
        jnp.stack([p for p, _ in pairs]), jnp.stack([c for _, c in pairs]), jnp.asarray(inits)
    )
    for k, one in enumerate(single):
        np.testing.assert_array_equal(
            np.asarray(batched.block_vectors[k]), np.asarray(one.block_vectors)
        )
        np.testing.assert_allclose(np.asarray(batched.block_psnr[k]), np.asarray(one.block_psnr))


def test_settled_search_under_vmap_matches_single_streams():
    """A stream that settles early (a moving patch on a still photo) and one that
    does not (a pan: every block moves) in one batch: each equals its own
    single-stream result, vectors included."""
    pairs = [_moving_patch("coffee", seed=9), shifted_pair(photo("chelsea"), (2, -3))]

    def settled(p, c):
        return B.block_match(p, c, psnr_threshold=30.0, all_vectors=False)

    single = [settled(jnp.asarray(p), jnp.asarray(c)) for p, c in pairs]
    full = B.block_match(jnp.asarray(pairs[0][0]), jnp.asarray(pairs[0][1]), psnr_threshold=30.0)
    assert (np.asarray(single[0].block_vectors) != np.asarray(full.block_vectors)).any()
    batched = jax.vmap(settled)(jnp.stack([p for p, _ in pairs]), jnp.stack([c for _, c in pairs]))
    for k, one in enumerate(single):
        for field in ("motion", "mask", "block_vectors", "block_psnr", "match_ratio"):
            np.testing.assert_array_equal(
                np.asarray(getattr(batched, field)[k]), np.asarray(getattr(one, field))
            )
    assert tuple(np.asarray(single[1].motion)) == (2, -3)


@pytest.mark.parametrize("start", [(0, 0), (2, -1)])
def test_fixed_step_diamond_equals_the_stopping_one(start):
    """The loop of static length (GPU) finds exactly what stepping until every
    block stops finds, stragglers compacted or not."""
    prev_p, b = _random_blocks(100, seed=1)
    s = jnp.broadcast_to(jnp.asarray(start, jnp.int32)[:, None], (2, 100))

    def run(fixed):
        return jax.jit(lambda p, s: S.diamond_search(p, b, s, max_steps=8, fixed_steps=fixed))(
            prev_p, s
        )

    stopping, fixed = run(False), run(True)
    np.testing.assert_array_equal(np.asarray(fixed.vectors), np.asarray(stopping.vectors))
    np.testing.assert_array_equal(np.asarray(fixed.ssd), np.asarray(stopping.ssd))
    assert (np.asarray(stopping.vectors) != np.asarray(s)).any()  # blocks did move


def test_matcher_off_cpu_has_no_data_dependent_loops():
    """Where skipping does not pay (GPU), the diamond matcher searches every block
    by windows in one loop of static length, and finds what the CPU path finds."""
    prev, cur = _moving_patch("coffee", seed=4)
    cpu = _call(B._block_match, prev, cur)
    args = (jnp.asarray(prev), jnp.asarray(cur), jnp.zeros(2, jnp.int32))
    static = dict(block_size=10, search="diamond", max_steps=8, k_skip=1, reuse_scores=True,
                  color="luma", search_range=R, skipping=False)  # fmt: skip
    with _loops.skipping(False):  # the program a GPU runs
        jaxpr = jax.make_jaxpr(
            lambda p, c, i: B._block_match(p, c, i, jnp.float32(30.0), jnp.float32(255.0), **static)
        )(*args)
        gpu = _call(functools.partial(B._block_match, skipping=False), prev, cur)
    names = [e.primitive.name for e in all_eqns(jaxpr.jaxpr)]
    assert "while" not in names and names.count("scan") == 1  # the steps, a static loop
    a, b = np.asarray(cpu.block_vectors), np.asarray(gpu.block_vectors)
    assert (a != 0).any() and (a != b).any(-1).sum() <= 1  # as the steady-search test
    np.testing.assert_array_equal(np.asarray(cpu.motion), np.asarray(gpu.motion))


def test_steady_search_holds_an_eighth_of_the_blocks_moving():
    """`steady_diamond_search` overflows only past `steady_capacity` moving blocks
    (an eighth of the grid), and finds the window search's vectors up to there."""
    assert [steady.steady_capacity(n) for n in (63, 529, 2025)] == [16, 72, 256]
    rng = np.random.default_rng(0)
    bs, n_side = 10, 24  # 576 blocks: 72 slots
    h = w = bs * n_side
    prev = rng.uniform(0, 255, (h + 8, w + 8)).astype(np.float32)
    # blocks above the last row (whose source rows 2 lower are inside the frame)
    order = rng.permutation(n_side * (n_side - 1))

    def search(moving):
        cur = prev[4 : 4 + h, 4 : 4 + w].copy()
        for b in order[:moving]:  # these blocks come from 2 rows lower
            y, x = divmod(int(b), n_side)
            cur[y * bs : (y + 1) * bs, x * bs : (x + 1) * bs] = prev[
                4 + y * bs + 2 : 4 + (y + 1) * bs + 2, 4 + x * bs : 4 + (x + 1) * bs
            ]
        pad = R + 2
        (_, _), _, corners, lo, hi = searched_blocks(h, w, bs, 1, R, pad)
        prev_p = jnp.pad(
            jnp.asarray(prev[4 : 4 + h, 4 : 4 + w])[None], ((0, 0), (pad, pad), (pad, pad))
        )
        cur_p = jnp.asarray(cur)[None]
        blocks = S.Blocks(None, None, *map(jnp.asarray, (corners, lo, hi)))
        costs = steady.plane_ssd(cur_p, prev_p, pad, bs, None)
        res, overflow = steady.steady_diamond_search(
            prev_p, cur_p, blocks, costs, pad=pad, block_size=bs, max_steps=8
        )
        return np.asarray(res.vectors).T, bool(overflow)

    cap = steady.steady_capacity(n_side * n_side)
    vectors, overflow = search(cap)
    assert not overflow
    moved = order[:cap]
    assert (vectors[moved] == (2, 0)).all() and (np.delete(vectors, moved, 0) == 0).all()
    assert search(cap + 8)[1]  # past the slots: the window search runs instead


@pytest.mark.parametrize("n_movers", [20, 30])
def test_settled_steady_search_leaves_the_moving_blocks_at_their_first_step(n_movers):
    """With ``decided`` true the blocks that move keep their first step's best
    (no further steps, and no overflow past the 24 slots); with it false the
    search is the full one. ``decided`` gets exactly the blocks that end at zero
    without moving."""
    rng = np.random.default_rng(1)
    bs, n_side = 10, 12  # 144 blocks: 24 slots
    assert steady.steady_capacity(n_side * n_side) == 24
    h = w = bs * n_side
    # a smooth photo: the cost falls towards the true vector, so the search walks
    prev = luma(smooth(photo("astronaut"), 3.0))[100 : 100 + h + 16, 150 : 150 + w + 16]
    prev = prev.astype(np.float32)
    movers = rng.permutation(n_side * (n_side - 1))[:n_movers]
    cur = prev[8 : 8 + h, 8 : 8 + w].copy()
    for b in movers:  # these blocks come from 4 rows lower: (2, 0) first, then (4, 0)
        y, x = divmod(int(b), n_side)
        cur[y * bs : (y + 1) * bs, x * bs : (x + 1) * bs] = prev[
            8 + y * bs + 4 : 8 + (y + 1) * bs + 4, 8 + x * bs : 8 + (x + 1) * bs
        ]
    pad = R + 2
    _, _, corners, lo, hi = searched_blocks(h, w, bs, 1, R, pad)
    prev_p = jnp.pad(
        jnp.asarray(prev[8 : 8 + h, 8 : 8 + w])[None], ((0, 0), (pad, pad), (pad, pad))
    )
    cur_p = jnp.asarray(cur)[None]
    blocks = S.Blocks(None, None, *map(jnp.asarray, (corners, lo, hi)))
    costs = steady.plane_ssd(cur_p, prev_p, pad, bs, None)
    staying = jnp.asarray(~np.isin(np.arange(n_side * n_side), movers))  # end at zero

    def run(decided):
        res, overflow = jax.jit(
            lambda c: steady.steady_diamond_search(
                prev_p, cur_p, blocks, c, pad=pad, block_size=bs, max_steps=8, decided=decided
            )
        )(costs)
        return np.asarray(res.vectors).T, np.asarray(res.ssd), bool(overflow)

    full = run(None)
    assert full[2] == (n_movers > 24)
    if not full[2]:  # a valid result: the movers reached (4, 0)
        assert (full[0][movers] == (4, 0)).all() and (np.delete(full[0], movers, 0) == 0).all()
    for out in [run(lambda z: jnp.bool_(False)), run(lambda z: (z != staying).any())]:
        for a, b in zip(out, full, strict=True):
            np.testing.assert_array_equal(a, b)
    v, ssd, over = run(lambda z: (z == staying).all())  # true only for the right flags
    assert not over
    assert (np.delete(v, movers, 0) == 0).all()
    np.testing.assert_array_equal(np.delete(ssd, movers), np.delete(full[1], movers))
    # each mover at the best point of its first step: the large diamond around 0
    first = [steady.PLANE_OFFSETS.index(o) for o in ((0, 0), *S.LARGE_DIAMOND)]
    c = np.asarray(costs)
    for b in movers:
        assert tuple(v[b]) in S.LARGE_DIAMOND
        assert ssd[b] == c[steady.PLANE_OFFSETS.index(tuple(v[b])), b] == c[first, b].min()
    if not full[2]:
        assert (v[movers] != full[0][movers]).any(-1).all()  # none got to (4, 0)
