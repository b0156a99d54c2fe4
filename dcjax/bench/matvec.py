"""Benchmark of `delta_matvec` against the dense product: ``dcjax bench matvec``.

For fully connected shapes of the zoo (AlexNet's ``fc6`` 9216 x 4096 and
``fc7`` 4096 x 4096, YOLO-tiny's detection layer 12544 x 1470 by default) and
fractions of changed inputs, it times the dense product ``x @ W`` and the
delta update ``y + d[changed] @ W[changed]`` (`dcjax.kernels.matvec`), both
jitted, interleaved call by call after a warm-up (`dcjax.bench.common.time_interleaved`),
and checks each update
against its oracle (`reference_delta_matvec`). The changed inputs are drawn
at random (uniformly, a fixed seed): the rows read are scattered over the
matrix, as the inputs a ReLU leaves at zero on both frames are. It prints
medians and minima in ms, the speedup over dense and the break-even hint
(``speedup < 1``: the update loses), and writes the records to
``bench-results/matvec.json``: per (shape, fraction) ``k``, ``n``,
``fraction`` (asked), ``changed`` (drawn), ``dense_ms``, ``delta_ms`` (medians),
``dense_ms_min``, ``delta_ms_min``, ``speedup`` and ``max_rel_err``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dcjax.bench.arguments import at_least, program_parser, unit_interval
from dcjax.bench.common import Timed, table, time_interleaved, write_json
from dcjax.kernels.matvec import delta_matvec, reference_delta_matvec

__all__ = ["SHAPES", "FRACTIONS", "main", "run"]

#: (K, N) of the zoo's large fully connected layers.
SHAPES: tuple[tuple[int, int], ...] = ((9216, 4096), (4096, 4096), (12544, 1470))

#: Fractions of changed inputs.
FRACTIONS: tuple[float, ...] = (0.05, 0.1, 0.2, 0.4, 0.6, 0.8)


def _parse_shape(text: str) -> tuple[int, int]:
    k, sep, n = text.lower().partition("x")
    if not sep or not k.isdigit() or not n.isdigit() or int(k) < 1 or int(n) < 1:
        raise argparse.ArgumentTypeError(f"shape {text!r} must be KxN, e.g. 9216x4096")
    return int(k), int(n)


def run(
    shapes: Sequence[tuple[int, int]] = SHAPES,
    fractions: Sequence[float] = FRACTIONS,
    reps: int = 30,
    seed: int = 0,
) -> list[dict]:
    """One record per (shape, fraction); see the module docstring."""
    dense = jax.jit(lambda x, w: jnp.dot(x, w))
    delta = jax.jit(delta_matvec)
    records = []
    for k, n in shapes:
        rng = np.random.default_rng(seed)
        w = jnp.asarray(rng.normal(size=(k, n)).astype(np.float32))
        x = jnp.asarray(rng.normal(size=(k,)).astype(np.float32))
        y = jnp.asarray(rng.normal(size=(n,)).astype(np.float32))
        for fraction in fractions:
            changed = jnp.asarray(rng.random(k) < fraction)
            got = delta(y, w, x, changed)
            want = reference_delta_matvec(y, w, x, changed)
            scale = float(jnp.max(jnp.abs(want))) or 1.0
            err = float(jnp.max(jnp.abs(got - want))) / scale
            t_dense, t_delta = time_interleaved(
                [
                    Timed(call=dense, prepare=lambda x=x, w=w: (x, w)),
                    Timed(call=delta, prepare=lambda a=(y, w, x, changed): a),
                ],
                reps,
                warmup=1,
            )
            d_med, u_med = t_dense.median_ms, t_delta.median_ms
            records.append(
                dict(
                    k=k,
                    n=n,
                    fraction=fraction,
                    changed=float(jnp.mean(changed)),
                    dense_ms=d_med,
                    delta_ms=u_med,
                    dense_ms_min=t_dense.min_ms,
                    delta_ms_min=t_delta.min_ms,
                    speedup=d_med / u_med,
                    max_rel_err=err,
                )
            )
    return records


def _table(records: list[dict]) -> str:
    return table([
        {"shape": f"{r['k']}x{r['n']}", "changed%": f"{100 * r['changed']:.1f}",
         "dense ms": f"{r['dense_ms']:.3f}", "delta ms": f"{r['delta_ms']:.3f}",
         "speedup": f"{r['speedup']:.2f}", "| min: dense": f"{r['dense_ms_min']:.3f}",
         "min delta": f"{r['delta_ms_min']:.3f}", "rel err": f"{r['max_rel_err']:.1e}"}
        for r in records
    ])  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """``dcjax bench matvec``; returns the exit status (bad arguments exit with status 2)."""
    ap = program_parser("matvec", __doc__)
    ap.add_argument("--shapes", nargs="+", type=_parse_shape, default=list(SHAPES), metavar="KxN")
    ap.add_argument("--fractions", nargs="+", type=unit_interval, default=list(FRACTIONS))
    ap.add_argument("--reps", type=at_least(1), default=30)
    ap.add_argument("--out", default="bench-results/matvec.json")
    args = ap.parse_args(argv)
    records = run(args.shapes, args.fractions, reps=args.reps)
    print(
        f"backend {jax.default_backend()}, times in ms (median and min of {args.reps} "
        "interleaved calls); rel err: against the oracle, relative to its largest value"
    )
    print(_table(records))
    write_json(args.out, {"jax": jax.__version__, "records": records})
    print(f"wrote {args.out}")
    return 0
