"""Benchmark of `masked_conv` against the dense convolution: ``dcjax bench kernels``.

For representative layers (AlexNet conv1 and conv2, ResNet-50's stem, 3x3
and 1x1, YOLO-tiny's stem, MobileNetV2 depthwise and pointwise, CenterFace's
stem and depthwise layers at 576x768, EfficientNet-Lite0's stem and first
pointwise layers) and dirty fractions 0 to 100 %, with
blocky masks like a block matcher produces (one contiguous blob of 10x10-pixel
matcher blocks, seen at the layer's resolution), it times the dense
convolution the way the dense paths compute it (`dcjax.kernels.lowering.dense_conv`:
XLA's convolution, or a matrix product or a sum of taps where that is faster
on CPU) and each
implementation (medians of interleaved
runs after warm-up), and reports ideal = dense x pixel dirty fraction and
efficiency = ideal / measured. Results go to ``bench-results/kernels.json`` and
a printed table. Pallas kernels are timed only on GPU or TPU backends
(on CPU they run only in interpret mode, which is not a timing).

``--tiles`` sweeps tile sizes for the `xla` implementation (used to set the
tile-size rule); ``--layers`` and ``--fractions`` select a subset.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dcjax.bench.arguments import comma_list, positive_int, program_parser, unit_interval
from dcjax.bench.common import Timed, table, time_interleaved, write_json
from dcjax.kernels import auto as _auto
from dcjax.kernels import pallas_gpu
from dcjax.kernels import rows as _rows
from dcjax.kernels import tiles as _tiles
from dcjax.kernels.geometry import ConvGeometry
from dcjax.kernels.lowering import dense_conv
from dcjax.kernels.masked import masked_conv
from dcjax.kernels.reference import conv

__all__ = ["FRACTIONS", "LAYERS", "blocky_mask", "main", "run"]

#: name -> (H, W, Cin, Cout, k, stride, groups, padding, total input stride of the layer)
LAYERS: dict[str, tuple] = {
    "alexnet_conv1": (227, 227, 3, 96, 11, 4, 1, "VALID", 1),
    "alexnet_conv2": (27, 27, 96, 256, 5, 1, 2, ((2, 2), (2, 2)), 8),
    "resnet50_stem": (224, 224, 3, 64, 7, 2, 1, ((3, 3), (3, 3)), 1),
    "yolo_stem": (448, 448, 3, 16, 3, 1, 1, ((1, 1), (1, 1)), 1),
    "resnet50_3x3": (56, 56, 64, 64, 3, 1, 1, ((1, 1), (1, 1)), 4),
    "resnet50_1x1": (56, 56, 64, 256, 1, 1, 1, "VALID", 4),
    "resnet50_1x1_64": (56, 56, 64, 64, 1, 1, 1, "VALID", 4),
    "resnet50_3x3_28": (28, 28, 128, 128, 3, 1, 1, ((1, 1), (1, 1)), 8),
    "resnet50_3x3_14": (14, 14, 256, 256, 3, 1, 1, ((1, 1), (1, 1)), 16),
    "resnet50_3x3_7": (7, 7, 512, 512, 3, 1, 1, ((1, 1), (1, 1)), 32),
    "mbv2_dw_s2": (112, 112, 96, 96, 3, 2, 96, ((0, 1), (0, 1)), 2),
    "mbv2_pw_expand": (56, 56, 24, 144, 1, 1, 1, "VALID", 4),
    "centerface_stem": (576, 768, 3, 32, 3, 2, 1, ((1, 1), (1, 1)), 1),
    "centerface_dw_288": (288, 384, 32, 32, 3, 1, 32, ((1, 1), (1, 1)), 2),
    "centerface_dw_s2": (288, 384, 96, 96, 3, 2, 96, ((1, 1), (1, 1)), 2),
    "centerface_dw_144": (144, 192, 144, 144, 3, 1, 144, ((1, 1), (1, 1)), 4),
    "enet_stem": (224, 224, 3, 32, 3, 2, 1, ((0, 1), (0, 1)), 1),
    "enet_b0_project": (112, 112, 32, 16, 1, 1, 1, "VALID", 2),
    "enet_b1_expand": (112, 112, 16, 96, 1, 1, 1, "VALID", 2),
}
FRACTIONS = (0.0, 0.05, 0.10, 0.25, 0.50, 0.75, 1.0)


def blocky_mask(shape: tuple[int, int], fraction: float, block: int, seed: int = 0) -> np.ndarray:
    """Reuse mask (H, W): false on one contiguous elliptic blob of blocks.

    The map is cut into ``block x block`` pixel blocks (the matcher's 10x10 input
    blocks seen at the layer's stride); the ``round(fraction * blocks)`` blocks
    nearest a random centre (anisotropic distance) are dirty.
    """
    h, w = shape
    gy, gx = math.ceil(h / block), math.ceil(w / block)
    rng = np.random.default_rng(seed)
    cy, cx = rng.uniform(0, gy), rng.uniform(0, gx)
    ay = rng.uniform(0.6, 1.6)
    yy, xx = np.meshgrid(np.arange(gy) + 0.5, np.arange(gx) + 0.5, indexing="ij")
    dist = ((yy - cy) * ay) ** 2 + (xx - cx) ** 2 + rng.uniform(0, 1e-3, (gy, gx))
    k = round(fraction * gy * gx)
    dirty = np.zeros(gy * gx, bool)
    dirty[np.argsort(dist.reshape(-1))[:k]] = True
    dirty = dirty.reshape(gy, gx).repeat(block, 0).repeat(block, 1)[:h, :w]
    return ~dirty


def _work(impl: str, mask: jax.Array, p: _tiles.TilePlan) -> float:
    """Fraction of the dense work the implementation runs on this mask."""
    impl = impl.removeprefix("auto:")
    if impl == "dense":
        return 1.0
    if impl == "rows" and _rows.computes(p.cin, p.groups):
        rp = _rows.row_plan(p)
        dense, units = _rows.row_schedule((~mask).sum(), rp)
        return 1.0 if bool(dense) else min(1.0, int(units) * rp.chunk / rp.rows)
    return float(_tiles.work_fraction(mask, p))


def run(
    layers: Sequence[str],
    fractions: Sequence[float],
    impls: Sequence[str],
    reps: int = 30,
    tiles: Sequence[tuple[int, int] | None] = (None,),
    batch: int = 1,
    seed: int = 0,
    donate: bool = True,
    precision: str = "highest",
    calls: int = 1,
) -> list[dict]:
    """Time every (layer, fraction, impl, tile); returns one record per combination.

    With ``donate`` the cache buffer is donated to the call (a fresh copy is made
    before each timed call, untimed), as in a jitted step that carries its
    caches in donated state or a `lax.scan`: the kernel then updates the cache
    in place. Without it every call also copies the whole cache.

    ``precision`` is the matmul precision every implementation is compiled
    under (`jax.default_matmul_precision`): on GPU ``"default"`` lets XLA and
    the Pallas kernel use TF32 tensor cores, ``"highest"`` asks for float32.
    ``calls`` queues that many calls per timed sample (see `time_interleaved`;
    the command line's default on GPU and TPU is 20). Before timing, each
    implementation's output is checked against the dense convolution computed
    at ``"highest"``: ``max_rel_err`` is the largest error
    on the non-reusable pixels over the output's largest magnitude.
    """
    rng = np.random.default_rng(seed)
    records = []
    backend = jax.default_backend()
    for name in layers:
        h, w_, cin, cout, k, s, g, pad, total_stride = LAYERS[name]
        x = jnp.asarray(rng.normal(size=(batch, h, w_, cin)), jnp.float32)
        w = jnp.asarray(rng.normal(size=(k, k, cin // g, cout)) / k, jnp.float32)
        geom = ConvGeometry(strides=(s, s), padding=pad, groups=g)
        with jax.default_matmul_precision("highest"):
            exact = np.asarray(jax.jit(lambda x, w, geom=geom: conv(x, w, geom))(x, w))
        with jax.default_matmul_precision(precision):
            dense_plan = _tiles.plan(x.shape, w.shape, geom)
            dense_fn = jax.jit(lambda x, w, p=dense_plan: dense_conv(x, w, p))
            cached = dense_fn(x, w) + 1.0  # so that reused pixels differ from fresh ones
        _, ho, wo, _ = cached.shape
        scale = float(np.abs(exact).max())
        block = max(1, round(10 / (total_stride * s)))
        compiled = {}
        for impl in impls:
            for t in tiles:
                with jax.default_matmul_precision(precision):
                    compiled[(impl, t)] = jax.jit(
                        lambda x, w, m, c, impl=impl, t=t, geom=geom: masked_conv(
                            x, w, m, c, geom, impl=impl, tile=t
                        ),
                        donate_argnums=(3,) if donate else (),
                    )
        for frac in fractions:
            m = np.stack([blocky_mask((ho, wo), frac, block, seed + i) for i in range(batch)])
            mask = jnp.asarray(m)
            pix = float((~m).mean())
            keys = list(compiled)

            def prepare(a=(x, w, mask, cached)):
                if not donate:
                    return a
                return (*a[:3], jnp.array(a[3], copy=True))

            errors = {}
            for key in keys:
                out = np.asarray(compiled[key](*prepare()))
                errors[key] = float(np.abs(out - exact)[~m].max(initial=0.0)) / scale
            fns = [Timed(call=dense_fn, prepare=lambda a=(x, w): a)] + [
                Timed(call=compiled[key], prepare=prepare, feeds_back=True) for key in keys
            ]
            times = time_interleaved(fns, reps, calls=calls)
            dense_ms, dense_min = times[0].median_ms, times[0].min_ms
            for key, timing in zip(keys, times[1:], strict=True):
                t_ms, t_min = timing.median_ms, timing.min_ms
                impl, t = key
                p = _tiles.plan(x.shape, w.shape, geom, tile=t)
                auto_impl = _auto.choose(p, backend)[0]
                if impl.startswith("pallas") and backend != "tpu":
                    p = pallas_gpu.tile_plan(x.shape, w.shape, geom, tile=t)
                if impl == "auto":
                    impl = "auto:" + auto_impl
                ideal = dense_ms * pix
                rec = dict(
                    backend=backend,
                    layer=name,
                    batch=batch,
                    fraction=frac,
                    pixel_dirty=pix,
                    tile_dirty=float(_tiles.dirty_fraction(mask, p=p)),
                    work=_work(impl, mask, p),
                    impl=impl,
                    precision=precision,
                    max_rel_err=errors[key],
                    donated=donate,
                    calls=calls,
                    auto=auto_impl,
                    tile=[p.th, p.tw],
                    dense_ms=dense_ms,
                    ms=t_ms,
                    ideal_ms=ideal,
                    speedup=dense_ms / t_ms,
                    efficiency=(ideal / t_ms) if pix > 0 else float("nan"),
                    dense_ms_min=dense_min,
                    ms_min=t_min,
                    speedup_min=dense_min / t_min,
                    efficiency_min=(dense_min * pix / t_min) if pix > 0 else float("nan"),
                )
                records.append(rec)
    return records


def _table(records: list[dict]) -> str:
    def eff(value: float) -> str:
        return "" if value != value else f"{value:.2f}"

    return table([
        {"layer": r["layer"], "impl": r["impl"], "tile": f"{r['tile'][0]}x{r['tile'][1]}",
         "dirty%": f"{100 * r['pixel_dirty']:.1f}", "tiles%": f"{100 * r['tile_dirty']:.1f}",
         "work%": f"{100 * r['work']:.0f}", "dense ms": f"{r['dense_ms']:.3f}",
         "ms": f"{r['ms']:.3f}", "ideal": f"{r['ideal_ms']:.3f}",
         "speedup": f"{r['speedup']:.2f}", "eff": eff(r["efficiency"]),
         "| min: dense": f"{r['dense_ms_min']:.3f}", "min ms": f"{r['ms_min']:.3f}",
         "min speedup": f"{r['speedup_min']:.2f}", "min eff": eff(r["efficiency_min"]),
         "rel err": f"{r['max_rel_err']:.1e}"}
        for r in records
    ])  # fmt: skip


def _targets(records: list[dict]) -> str:
    """The issue's CPU targets per (layer, impl), from medians and from minima."""
    rows = []
    keys = sorted({(r["layer"], r["impl"], tuple(r["tile"])) for r in records})
    for layer, impl, tile in keys:
        rs = [
            r for r in records if (r["layer"], r["impl"], tuple(r["tile"])) == (layer, impl, tile)
        ]
        by = {round(r["fraction"], 2): r for r in rs}
        mid = [by[f] for f in (0.1, 0.25, 0.5) if f in by]

        def fmt(a: float, b: float, ok: bool) -> str:
            return f"{a:.2f}/{b:.2f} {'ok' if ok else 'MISS'}"

        s25 = (
            fmt(by[0.25]["speedup"], by[0.25]["speedup_min"], by[0.25]["speedup_min"] >= 2.5)
            if 0.25 in by
            else "-"
        )
        if mid:
            e_med = min(r["efficiency"] for r in mid)
            e_min = min(r["efficiency_min"] for r in mid)
            eff = fmt(e_med, e_min, e_min >= 0.7)
        else:
            eff = "-"
        if 1.0 in by:
            sl_med, sl_min = 1 / by[1.0]["speedup"], 1 / by[1.0]["speedup_min"]
            slow = fmt(sl_med, sl_min, sl_min <= 1.05)
        else:
            slow = "-"
        rows.append({
            "layer": layer, "impl": impl, "tile": f"{tile[0]}x{tile[1]}",
            "auto": rs[0].get("auto", ""), "x@25% med/min": s25,
            "eff10-50 med/min": eff, "slow@100 med/min": slow,
        })  # fmt: skip
    return (
        "targets: speedup at 25 % >= 2.5 | efficiency >= 0.7 for 10-50 % | "
        "at 100 % <= 5 % slower (slowdown <= 1.05)\n" + table(rows)
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``dcjax bench kernels``; returns the exit status (bad arguments exit with status 2)."""
    ap = program_parser("kernels", __doc__)
    ap.add_argument("--layers", type=comma_list(tuple(LAYERS)), default=list(LAYERS),
                    help="comma list of layers (default: all)")  # fmt: skip
    ap.add_argument("--fractions", type=comma_list(unit_interval), default=list(FRACTIONS),
                    help="comma list of dirty fractions in [0, 1]")  # fmt: skip
    ap.add_argument("--impls", type=comma_list(str), default=None,
                    help="comma list; default xla,rows (+pallas off CPU)")  # fmt: skip
    ap.add_argument("--tiles", type=comma_list(positive_int), default=None,
                    help="comma list of square tile sides to sweep")  # fmt: skip
    ap.add_argument("--reps", type=positive_int, default=30)
    ap.add_argument("--batch", type=positive_int, default=1)
    ap.add_argument("--out", default="bench-results/kernels.json")
    ap.add_argument("--calls", type=positive_int, default=None,
                    help="calls queued per timed sample (default 1 on CPU, 20 on GPU "
                         "and TPU)")  # fmt: skip
    ap.add_argument("--precision", default="highest", choices=("default", "high", "highest"),
                    help="matmul precision of every implementation (GPU: default and high "
                         "use TF32)")  # fmt: skip
    ap.add_argument("--no-donate", action="store_true",
                    help="do not donate the cache buffer (every call then also copies "
                         "the cache)")  # fmt: skip
    args = ap.parse_args(argv)
    impls = args.impls or (
        ["xla", "rows"] if jax.default_backend() == "cpu" else ["xla", "rows", "pallas"]
    )
    tiles = [None] if not args.tiles else [(t, t) for t in args.tiles]
    records = run(
        args.layers,
        args.fractions,
        impls,
        reps=args.reps,
        tiles=tiles,
        batch=args.batch,
        donate=not args.no_donate,
        precision=args.precision,
        calls=args.calls or (1 if jax.default_backend() == "cpu" else 20),
    )
    print(
        f"backend {jax.default_backend()}, devices {jax.devices()}, cache donated: "
        f"{not args.no_donate}, precision {args.precision}, times in ms (median and min of "
        f"{args.reps} interleaved runs); rel err: against float32 on the fresh pixels"
    )
    print(_table(records))
    print()
    print(_targets(records))
    write_json(args.out, {"jax": jax.__version__, "records": records})
    print(f"wrote {args.out}")
    return 0
