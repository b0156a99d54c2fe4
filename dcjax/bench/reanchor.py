"""Float32 drift of fully connected layers updated by rows: ``dcjax bench reanchor``.

A fully connected layer updated by the rows of its changed inputs
(`Config.dense_updates`, refinement) keeps a running product ``y_ref`` that
each frame moves by ``d[changed] @ W[changed]``: every update adds its float32
rounding. The step bounds that by computing the product in full every
`dcjax.transforms.refine.DENSE_REANCHOR_EVERY` frames. This program measures
the error it bounds: one fully connected layer ``x.reshape(1, -1) @ W`` on a
stream of random frames in which a fraction of the inputs take new values on
every frame, stepped by a cached model with exact updates
(``refresh_every=None``, ``matcher="none"``) for each re-anchoring period
asked (0: never), against the float64 product. It prints, per period, the
largest relative error (``max |y - x @ W| / max |x @ W|``) over the first 10
frames, over the last 50, and overall, and writes the per-frame errors to
``bench-results/reanchor.json``.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from dcjax.bench.arguments import at_least, program_parser, unit_interval
from dcjax.bench.common import table, write_json

__all__ = ["PERIODS", "main", "run"]

#: Re-anchoring periods measured by default (0: never).
PERIODS: tuple[int, ...] = (0, 256, 128, 64, 32)


def _frames(shape: tuple[int, int, int], count: int, changed: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    frames = [rng.random(shape, dtype=np.float32)]
    for _ in range(count - 1):
        f = frames[-1].copy()
        moved = rng.random(shape) < changed
        f[moved] = rng.random(int(moved.sum()), dtype=np.float32)
        frames.append(f)
    return np.stack(frames)


def run(
    *,
    inputs: int = 2048,
    outputs: int = 2048,
    frames: int = 600,
    changed: float = 0.1,
    periods: Sequence[int] = PERIODS,
    seed: int = 0,
    progress: bool = False,
) -> list[dict]:
    """One record per period: ``period``, ``errors`` (per frame), ``first10``,
    ``last50``, ``max`` and ``dense_reuse`` (the mean fraction of rows not read)."""
    from dcjax import deepcache
    from dcjax.transforms import refine as refine_lib

    if inputs % 2:
        raise ValueError(f"inputs must be even (frames of two channels), got {inputs}")
    shape = (inputs // 2, 1, 2)
    w = jax.random.normal(jax.random.key(seed), (inputs, outputs)) * 0.02
    w64 = np.asarray(w, np.float64)
    stream = _frames(shape, frames, changed, seed)
    exact = stream.reshape(frames, -1).astype(np.float64) @ w64
    records = []
    saved = refine_lib.DENSE_REANCHOR_EVERY
    try:
        for period in periods:
            refine_lib.DENSE_REANCHOR_EVERY = period if period > 0 else frames + 1
            # the step reads the period when it is traced: a transform per period
            config = deepcache.Config(refresh_every=None, matcher="none", kernel="xla")
            cached = deepcache.transform(
                lambda p, x: (x.reshape(1, -1) @ p,), w, frame_shape=shape, config=config
            )
            if not cached.plan.dense[0].exact:
                raise RuntimeError("the layer is not updated by rows on this backend")
            state, errors, reuse = cached.init(), [], []
            steps = range(frames)
            if progress:
                from tqdm.auto import tqdm

                steps = tqdm(steps, desc=f"period {period or 'never'}", unit="frame", leave=False)
            for t in steps:
                (y,), state, info = cached.step(state, stream[t])
                err = np.abs(np.asarray(y, np.float64)[0] - exact[t]).max()
                errors.append(float(err / np.abs(exact[t]).max()))
                reuse.append(float(info["dense_reuse"][0]))
            records.append(
                dict(
                    period=period, errors=errors, first10=max(errors[:10]),
                    last50=max(errors[-50:]), max=max(errors), dense_reuse=float(np.mean(reuse)),
                )
            )  # fmt: skip
    finally:
        refine_lib.DENSE_REANCHOR_EVERY = saved
    return records


def main(argv: Sequence[str] | None = None) -> int:
    """``dcjax bench reanchor``; returns the exit status (bad arguments exit with status 2)."""
    ap = program_parser("reanchor", __doc__)
    ap.add_argument("--inputs", type=at_least(2), default=2048)
    ap.add_argument("--outputs", type=at_least(1), default=2048)
    ap.add_argument("--frames", type=at_least(60), default=600)
    ap.add_argument("--changed", type=unit_interval, default=0.1,
                    help="fraction of the inputs that take a new value each frame")  # fmt: skip
    ap.add_argument("--periods", nargs="+", type=at_least(0), default=list(PERIODS),
                    help="re-anchoring periods in frames (0: never)")  # fmt: skip
    ap.add_argument("--out", default="bench-results/reanchor.json")
    args = ap.parse_args(argv)
    if args.inputs % 2:
        ap.error(f"--inputs: must be even, got {args.inputs}")
    records = run(
        inputs=args.inputs, outputs=args.outputs, frames=args.frames, changed=args.changed,
        periods=args.periods, progress=True,
    )  # fmt: skip
    print(
        f"{args.inputs}x{args.outputs}, {args.frames} frames, {100 * args.changed:g} % of the "
        "inputs new each frame; relative error against the float64 product"
    )
    print(table([
        {"period": str(r["period"] or "never"), "first 10": f"{r['first10']:.2e}",
         "last 50": f"{r['last50']:.2e}", "max": f"{r['max']:.2e}",
         "rows skipped": f"{100 * r['dense_reuse']:.1f} %"}
        for r in records
    ]))  # fmt: skip
    write_json(args.out, {"jax": jax.__version__, "records": records})
    print(f"wrote {args.out}")
    return 0
