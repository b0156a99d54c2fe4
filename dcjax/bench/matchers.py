"""Benchmark of the block matchers: ``dcjax bench matchers``.

Frames of 227x227 with 10x10 blocks, as in DeepCache Section 7.6. The footage
is real photos from scikit-image panned by a camera whose velocity drifts (a
random walk of up to 4 pixels a frame), with sensor noise, a flickering
brightness and a pasted object that moves on its own: motion in every
direction and at every speed, which the bundled clips lack (vtest's camera is
fixed). ``dcjax bench --matchers ...`` compares the matchers on real video,
end to end (DeepCache's Table 4).

For each search (``diamond``, ``three_step``, ``exhaustive``) with and without
the paper's accelerations (``k_skip=2`` and reused scores against
``k_skip=1`` without reuse), plus the same-position matcher and DeepMon's
histogram matcher, it reports:

- single stream: frames per second, from the median latency of one jitted
  call per frame (``jax.block_until_ready``) after warm-up, the previous
  frame's motion fed back as ``init_motion`` as the transform does;
- batched: frames per second of ``vmap`` over ``--streams`` streams;
- the mean match ratio over the clip;
- the median CPU time of this process per single-stream call
  (``time.process_time``), which other processes' load inflates less than
  wall time (it still includes cache and scheduling effects).

Configurations are timed in interleaved rounds so that load from other
processes spreads over all of them. Results go to a JSON file and a table.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dcjax.bench.arguments import positive_int, program_parser
from dcjax.bench.common import machine, table, write_json
from dcjax.matching import histogram_match, match

__all__ = ["PHOTOS", "SIZE", "format_table", "main", "make_clip", "run"]

SIZE = 227
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "camera")


def _photo(name: str) -> np.ndarray:
    from skimage import data

    img = getattr(data, name)()
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, -1)
    return np.ascontiguousarray(img[..., :3])


def make_clip(name: str, frames: int, *, seed: int = 0, size: int = SIZE) -> np.ndarray:
    """A (T, size, size, 3) uint8 clip: a real photo panned by a drifting camera.

    Args:
        name: a scikit-image photo.
        frames: number of frames.
        seed: random seed of the camera path, noise and object.
        size: frame side.

    Returns:
        The clip.
    """
    from skimage.transform import resize

    rng = np.random.default_rng(seed)
    img = _photo(name)
    scale = (size + 8 * frames + 64) / min(img.shape[:2])
    if scale > 1:
        shape = (int(img.shape[0] * scale) + 1, int(img.shape[1] * scale) + 1)
        img = (resize(img, shape, preserve_range=True, anti_aliasing=False)).astype(np.uint8)
    h, w = img.shape[:2]
    obj = _photo("coffee")[150:190, 250:290].astype(np.float64)
    y, x = (h - size) / 2, (w - size) / 2
    vy, vx = rng.integers(-3, 4, 2).astype(float)
    oy, ox = rng.integers(20, size - 60, 2).astype(float)
    ovy, ovx = rng.integers(-4, 5, 2).astype(float)
    out = []
    for _ in range(frames):
        iy = int(np.clip(round(y), 0, h - size))
        ix = int(np.clip(round(x), 0, w - size))
        frame = img[iy : iy + size, ix : ix + size].astype(np.float64)
        py, px = int(np.clip(oy, 0, size - 40)), int(np.clip(ox, 0, size - 40))
        frame[py : py + 40, px : px + 40] = obj
        frame = frame * rng.uniform(0.98, 1.02) + rng.normal(0.0, 2.0, frame.shape)
        out.append(np.clip(np.round(frame), 0, 255).astype(np.uint8))
        vy = float(np.clip(vy + rng.integers(-1, 2), -4, 4))
        vx = float(np.clip(vx + rng.integers(-1, 2), -4, 4))
        y, x = y + vy, x + vx
        oy, ox = oy + ovy, ox + ovx
        if not 0 <= oy <= size - 40:
            ovy = -ovy
        if not 0 <= ox <= size - 40:
            ovx = -ovx
    return np.stack(out)


def _configs() -> dict[str, dict]:
    configs = {}
    for search in ("diamond", "three_step", "exhaustive"):
        configs[f"{search}"] = {"search": search, "k_skip": 1, "reuse_scores": False}
        configs[f"{search}+accel"] = {"search": search, "k_skip": 2, "reuse_scores": True}
    configs["none (static)"] = {"search": "none"}
    configs["histogram (DeepMon)"] = {"histogram": True}
    return configs


def _stepper(options: dict) -> Callable:
    """jit(prev, cur, init_motion) -> (motion, match_ratio) for one config."""
    options = dict(options)
    if options.pop("histogram", False):

        def step(prev, cur, motion):
            m = histogram_match(prev, cur)
            return m.motion, m.match_ratio

    else:

        def step(prev, cur, motion):
            m = match(prev, cur, init_motion=motion, **options)
            return m.motion, m.match_ratio

    return step


def run(
    *,
    frames: int = 40,
    streams: int = 8,
    rounds: int = 5,
    clips: tuple[str, ...] = PHOTOS,
    out: str | None = "bench-results/matching.json",
) -> dict:
    """Run the benchmark; returns (and optionally writes) the results.

    Args:
        frames: frames per clip.
        streams: streams in the batched measurement.
        rounds: interleaved timing rounds over every clip.
        clips: scikit-image photos to pan.
        out: JSON path, or ``None``.

    Returns:
        The results as a dict.
    """
    videos = [jnp.asarray(make_clip(name, frames, seed=i)) for i, name in enumerate(clips)]
    batch = jnp.stack([v for v in videos] * (-(-streams // len(videos))))[:streams]
    configs = _configs()
    single = {k: jax.jit(_stepper(o)) for k, o in configs.items()}
    batched = {k: jax.jit(jax.vmap(_stepper(o))) for k, o in configs.items()}

    lat: dict[str, list[float]] = {k: [] for k in configs}
    cpu: dict[str, list[float]] = {k: [] for k in configs}
    blat: dict[str, list[float]] = {k: [] for k in configs}
    ratios: dict[str, list[float]] = {k: [] for k in configs}
    zero = jnp.zeros((2,), jnp.int32)
    bzero = jnp.zeros((streams, 2), jnp.int32)
    for k in configs:  # warm-up: compile and run once
        jax.block_until_ready(single[k](videos[0][0], videos[0][1], zero))
        jax.block_until_ready(batched[k](batch[:, 0], batch[:, 1], bzero))
    for r in range(rounds):
        for k in configs:
            for v in videos:
                motion = zero
                for t in range(1, v.shape[0]):
                    t0, c0 = time.perf_counter(), time.process_time()
                    motion, ratio = jax.block_until_ready(single[k](v[t - 1], v[t], motion))
                    lat[k].append(time.perf_counter() - t0)
                    cpu[k].append(time.process_time() - c0)
                    if r == 0:
                        ratios[k].append(float(ratio))
            motion = bzero
            for t in range(1, batch.shape[1]):
                t0 = time.perf_counter()
                motion, _ = jax.block_until_ready(batched[k](batch[:, t - 1], batch[:, t], motion))
                blat[k].append(time.perf_counter() - t0)

    host = machine()
    results = {
        "frame": [SIZE, SIZE, 3],
        "block_size": 10,
        "clips": list(clips),
        "frames_per_clip": frames,
        "streams": streams,
        "rounds": rounds,
        **{k: host[k] for k in ("jax", "device", "cpu_count", "load_average", "machine", "memory")},
        "configs": {},
    }
    for k, o in configs.items():
        med = float(np.median(lat[k]))
        bmed = float(np.median(blat[k]))
        results["configs"][k] = {
            "options": o,
            "single_median_ms": med * 1e3,
            "single_p10_ms": float(np.percentile(lat[k], 10)) * 1e3,
            "single_fps": 1.0 / med,
            "single_cpu_median_ms": float(np.median(cpu[k])) * 1e3,
            "batched_median_ms": bmed * 1e3,
            "batched_fps": streams / bmed,
            "match_ratio": float(np.mean(ratios[k])),
        }
    if out:
        write_json(out, results, indent=2)
    return results


def format_table(results: dict) -> str:
    """The results as a text table."""
    rows = [
        {"matcher": k, "1-stream fps": f"{r['single_fps']:.0f}",
         "median ms": f"{r['single_median_ms']:.3f}", "p10 ms": f"{r['single_p10_ms']:.3f}",
         "CPU ms": f"{r['single_cpu_median_ms']:.3f}",
         "batched fps": f"{r['batched_fps']:.0f}", "match ratio": f"{r['match_ratio']:.3f}"}
        for k, r in results["configs"].items()
    ]  # fmt: skip
    lines = [table(rows)]
    c = results["configs"]
    ds, ex = c["diamond+accel"], c["exhaustive"]
    lines.append("")
    lines.append(
        f"diamond+accel vs exhaustive: {ds['single_fps'] / ex['single_fps']:.1f}x faster "
        f"(single stream), match ratio {100 * (ds['match_ratio'] - ex['match_ratio']):+.1f} points"
    )
    load = results.get("load_average")
    if load:
        lines.append(f"load average during the run: {load[0]:.1f} on {results['cpu_count']} CPUs")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``dcjax bench matchers``; returns the exit status (bad arguments exit with status 2)."""
    parser = program_parser("matchers", __doc__)
    parser.add_argument("--frames", type=positive_int, default=40, help="frames per clip")
    parser.add_argument("--streams", type=positive_int, default=8,
                        help="streams in the batched run")  # fmt: skip
    parser.add_argument("--rounds", type=positive_int, default=5,
                        help="interleaved timing rounds")  # fmt: skip
    parser.add_argument("--out", default="bench-results/matching.json", help="JSON output path")
    parser.add_argument("--quick", action="store_true", help="2 clips, 12 frames, 2 rounds")
    args = parser.parse_args(argv)
    kw = dict(frames=args.frames, streams=args.streams, rounds=args.rounds, out=args.out)
    if args.quick:
        kw.update(frames=12, rounds=2, clips=PHOTOS[:2])
    results = run(**kw)
    print(format_table(results))
    if args.out:
        print(f"\nwrote {args.out}")
    return 0
