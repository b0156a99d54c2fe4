"""Plots of metrics records (matplotlib, Agg backend), after DeepCache's Section 7.

Every function takes records (`dcjax.eval.metrics`) and returns a
`matplotlib.figure.Figure`, or None when the records hold nothing to plot:

- `latency_by_method`: per model, mean time per frame of each method (Figure 10);
- `per_layer`: per model, the reuse fraction and FLOPs of each layer (Figure 12);
- `sweep`: latency and top-1 agreement against a swept ``config`` key, e.g.
  ``psnr_threshold`` (Figure 16) or ``block_size`` (Figure 17);
- `pareto`: speedup against top-1 agreement of every variant of the reuse
  methods, with each method's Pareto front (the ``delta`` sweep of refinement);
- `matchers`: match ratio and matching time of each matcher (Table 4), from
  `dcjax.bench.evaluation.compare_matchers` rows;
- `cache_memory`: cache bytes per model and method (Figure 18);
- `timeline`: per-frame latency and FLOPs ratio of an `Evaluation`;
- `mask_strip`: frames with the reuse mask drawn over them.

`save` writes a figure as PNG and returns its bytes.

Figures are built as `matplotlib.figure.Figure` objects without pyplot, so
nothing depends on (or changes) the global backend: saving renders with Agg,
and in Jupyter a figure that ends a cell is displayed inline.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from dcjax.eval.metrics import BASELINES

__all__ = [
    "cache_memory",
    "latency_by_method",
    "mask_strip",
    "matchers",
    "pareto",
    "per_layer",
    "save",
    "sweep",
    "timeline",
]

Record = Mapping[str, Any]


def _subplots(nrows: int = 1, ncols: int = 1, *, figsize=None, **kwargs):
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def save(fig: Figure, path: str | None = None, dpi: int = 100) -> bytes:
    """PNG bytes of ``fig`` (rendered with Agg), also written to ``path`` when given."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    data = buf.getvalue()
    if path is not None:
        with open(path, "wb") as f:
            f.write(data)
    return data


def _short(name: str, width: int = 28) -> str:
    return name if len(name) <= width else "…" + name[-(width - 1) :]


def latency_by_method(records: Sequence[Record]) -> Figure | None:
    """Grouped bars: per (model, video), the mean time per frame of each method variant."""
    if not records:
        return None
    groups = list(dict.fromkeys((r["model"], r["video"]) for r in records))
    variants = list(dict.fromkeys(r["variant"] for r in records))
    fig, ax = _subplots(figsize=(min(18.0, max(6.0, 0.35 * len(groups) * len(variants))), 4))
    width = 0.8 / len(variants)
    for j, v in enumerate(variants):
        ys, errs = [], []
        for g in groups:
            r = next((r for r in records if (r["model"], r["video"]) == g and r["variant"] == v),
                     None)  # fmt: skip
            ys.append(np.nan if r is None else r["mean_ms"])
            errs.append(0 if r is None else max(r["p99_ms"] - r["mean_ms"], 0.0))
        x = np.arange(len(groups)) + (j - (len(variants) - 1) / 2) * width
        ax.bar(x, ys, width, yerr=[np.zeros(len(errs)), errs], label=v, capsize=2)
    ax.set_xticks(np.arange(len(groups)))
    ax.set_xticklabels([f"{m}\n{_video_name(v)}" for m, v in groups], fontsize=8)
    ax.set_ylabel("time per frame (ms, mean; bar to p99)")
    ax.set_title("Latency by method (cf. DeepCache Fig. 10)")
    ax.legend(fontsize=7)
    return fig


def _video_name(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def per_layer(records: Sequence[Record], method: str | None = None) -> Figure | None:
    """Per model (its first record of the variant ``method``, or with None of
    any method but the baselines, `dcjax.eval.metrics.BASELINES`), reuse
    fraction and FLOPs share by layer."""
    chosen: dict[str, Record] = {}
    for r in records:
        wanted = r["method"] not in BASELINES if method is None else r["variant"] == method
        if wanted and r["per_layer"] and r["model"] not in chosen:
            chosen[r["model"]] = r
    if not chosen:
        return None
    fig, axes = _subplots(len(chosen), 1, figsize=(10, 2.8 * len(chosen)), squeeze=False)
    for ax, (model, r) in zip(axes[:, 0], chosen.items(), strict=True):
        layers = r["per_layer"]
        reuse = np.array([lay["reuse_fraction"] for lay in layers])
        flops = np.array([lay["flops"] for lay in layers], np.float64)
        share = flops / max(flops.sum(), 1)
        x = np.arange(len(layers))
        ax.bar(x, share, color="0.75", label="FLOPs share")
        ax.bar(x, share * reuse, color="tab:green", label="FLOPs saved")
        ax2 = ax.twinx()
        ax2.plot(x, reuse, "o-", color="tab:blue", ms=3, label="reuse fraction")
        ax2.set_ylim(0, 1.05)
        ax2.set_ylabel("reuse fraction")
        ax.set_ylabel("FLOPs share")
        ax.set_title(
            f"{model} on {_video_name(r['video'])}: ideal {r['ideal_speedup']:.2f}x, "
            f"measured {r['speedup_vs_dense']:.2f}x over dense (cf. Fig. 12)",
            fontsize=9,
        )
        step = max(1, len(layers) // 30)
        ax.set_xticks(x[::step])
        ax.set_xticklabels([_short(lay["name"], 22) for lay in layers][::step], rotation=90,
                           fontsize=6)  # fmt: skip
        lines = ax.get_legend_handles_labels()
        lines2 = ax2.get_legend_handles_labels()
        ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


def _same_except(a: Mapping[str, Any], b: Mapping[str, Any], key: str) -> bool:
    keys = (set(a) | set(b)) - {key}
    return all(a.get(k) == b.get(k) for k in keys)


def sweep(records: Sequence[Record], key: str, method: str = "deepcache") -> Figure | None:
    """Latency, top-1 agreement and output error against ``config[key]`` of ``method``.

    One line per (model, video), through the records whose config differs from
    the default variant (``variant == method``) in ``key`` only; needs at least
    two distinct values.
    """
    rows = [r for r in records if r["method"] == method and key in r["config"]]
    groups = list(dict.fromkeys((r["model"], r["video"]) for r in rows))
    lines = {}
    for g in groups:
        rs = [r for r in rows if (r["model"], r["video"]) == g]
        base = next((r for r in rs if r["variant"] == method), rs[0])
        rs = [r for r in rs if _same_except(r["config"], base["config"], key)]
        if len({str(r["config"][key]) for r in rs}) >= 2:
            lines[g] = sorted(rs, key=lambda r: float(r["config"][key]))
    if not lines:
        return None
    fig, (ax1, ax2, ax3) = _subplots(1, 3, figsize=(13, 3.6))
    for g, rs in lines.items():
        xs = [float(r["config"][key]) for r in rs]
        label = f"{g[0]} / {_video_name(g[1])}"
        ax1.plot(xs, [r["mean_ms"] for r in rs], "o-", label=label)
        ax1.plot(xs, [r["dense_mean_ms"] for r in rs], ":", color="0.5")
        agree = [r["top1_agreement"] for r in rs]
        if all(a is not None for a in agree):
            ax2.plot(xs, [100 * a for a in agree], "o-", label=label)
        ax3.plot(xs, [max(r["output_rel_mse"] or 0.0, 1e-12) for r in rs], "o-", label=label)
    ax1.set_xlabel(key)
    ax1.set_ylabel("mean time per frame (ms); dotted: dense")
    ax2.set_xlabel(key)
    ax2.set_ylabel("top-1 agreement with no cache (%)")
    ax3.set_xlabel(key)
    ax3.set_ylabel("output MSE / output variance")
    ax3.set_yscale("log")
    ax1.legend(fontsize=7)
    fig.suptitle(f"{method}: effect of {key} (cf. DeepCache Figs. 16-17)", fontsize=10)
    fig.tight_layout()
    return fig


#: The methods `pareto` draws, in legend order: DeepCache's variants, and the
#: approximate baselines (``mil`` trades accuracy for speed through its
#: threshold, so it is compared at equal accuracy here, not at one setting).
PARETO_METHODS = ("deepcache", "delta", "deepcache+refine", "mil", "deepmon")


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats in both coordinates (higher is better).

    Sorted by the first coordinate; ties keep the first.
    """
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], -points[i][1], i))
    front, best = [], -np.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return sorted(front, key=lambda i: points[i][0])


def pareto(records: Sequence[Record], methods: Sequence[str] = PARETO_METHODS) -> Figure | None:
    """Speedup against accuracy, one panel per (model, video) (the ``delta`` sweep).

    Accuracy is the top-1 agreement with no cache for pretrained classifiers;
    otherwise (no classes, as PilotNet's steering angle, or random weights,
    whose top-1 barely moves) the output MSE relative to the output's variance,
    lower being better. Every variant of
    each of ``methods`` is a point (e.g. ``deepcache+refine`` at several
    ``delta``, labelled with it); each method's Pareto front is a line. Needs
    at least two variants in some panel.
    """
    rows = [r for r in records if r["method"] in methods]
    groups = list(dict.fromkeys((r["model"], r["video"]) for r in rows))
    groups = [g for g in groups if sum((r["model"], r["video"]) == g for r in rows) >= 2]
    if not groups:
        return None
    fig, axes = _subplots(1, len(groups), figsize=(4.6 * len(groups), 3.8), squeeze=False)
    for ax, g in zip(axes[0], groups, strict=True):
        panel = [r for r in rows if (r["model"], r["video"]) == g]
        classes = all(r["top1_agreement"] is not None and r.get("pretrained", False) for r in panel)

        def accuracy(r, classes=classes):
            if classes:
                return 100.0 * float(r["top1_agreement"])
            return max(float(r["output_rel_mse"] or 0.0), 1e-12)

        for m in methods:
            rs = [r for r in panel if r["method"] == m]
            if not rs:
                continue
            pts = [(float(r["speedup_vs_dense"]), accuracy(r)) for r in rs]
            (line,) = ax.plot(*zip(*pts, strict=True), "o", alpha=0.6)
            front = pareto_front(pts if classes else [(x, -y) for x, y in pts])
            ax.plot(
                [pts[i][0] for i in front], [pts[i][1] for i in front], "-",
                color=line.get_color(), label=m,
            )  # fmt: skip
            for (x, y), r in zip(pts, rs, strict=True):
                label = _pareto_label(r)
                if label:
                    ax.annotate(label, (x, y), fontsize=6, xytext=(2, 2),
                                textcoords="offset points")  # fmt: skip
        ax.axvline(1.0, color="0.6", lw=0.8, ls=":")
        ax.set_xlabel("speedup over dcjax's dense lowering (mean time per frame)")
        if classes:
            ax.set_ylabel("top-1 agreement with no cache (%)")
        else:
            ax.set_ylabel("output MSE / output variance (lower is better)")
            ax.set_yscale("log")
        ax.set_title(f"{g[0]} / {_video_name(g[1])}", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(
        "speed against accuracy; point labels: refinement delta, mil's PSNR threshold",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def _pareto_label(record: Record) -> str:
    """A point's label: refinement's ``delta``, or ``mil``'s threshold in dB."""
    delta = (record["config"].get("refine") or {}).get("delta")
    if delta is not None:
        return f"{delta:g}"
    if record["method"] == "mil" and "psnr_threshold" in record["config"]:
        return f"{float(record['config']['psnr_threshold']):g} dB"
    return ""


def matchers(rows: Sequence[Mapping[str, Any]]) -> Figure | None:
    """Match ratio and time per matcher (rows of `bench.compare_matchers`), cf. Table 4."""
    if not rows:
        return None
    videos = list(dict.fromkeys(r["video"] for r in rows))
    names = list(dict.fromkeys(r["matcher"] for r in rows))
    fig, (ax1, ax2) = _subplots(1, 2, figsize=(10, 3.6))
    width = 0.8 / len(videos)
    for j, v in enumerate(videos):
        x = np.arange(len(names)) + (j - (len(videos) - 1) / 2) * width
        sel = {r["matcher"]: r for r in rows if r["video"] == v}
        ax1.bar(x, [100 * sel[n]["match_ratio"] if n in sel else np.nan for n in names], width,
                label=_video_name(v))  # fmt: skip
        ax2.bar(x, [sel[n]["ms"] if n in sel else np.nan for n in names], width,
                label=_video_name(v))  # fmt: skip
    for ax in (ax1, ax2):
        ax.set_xticks(np.arange(len(names)))
        ax.set_xticklabels(names, fontsize=8)
        ax.legend(fontsize=7)
    ax1.set_ylabel("match ratio (%)")
    ax2.set_ylabel("matching time per frame (ms, median)")
    fig.suptitle("Matchers (cf. DeepCache Table 4)", fontsize=10)
    fig.tight_layout()
    return fig


def cache_memory(records: Sequence[Record]) -> Figure | None:
    """Cache bytes per model for each caching method (Figure 18)."""
    rows = [r for r in records if r["cache_bytes"] > 0]
    if not rows:
        return None
    models = list(dict.fromkeys(r["model"] for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    fig, ax = _subplots(figsize=(max(6, 1.2 * len(models)), 3.6))
    width = 0.8 / len(variants)
    for j, v in enumerate(variants):
        ys = []
        for m in models:
            r = next((r for r in rows if r["model"] == m and r["variant"] == v), None)
            ys.append(np.nan if r is None else r["cache_bytes"] / 2**20)
        ax.bar(np.arange(len(models)) + (j - (len(variants) - 1) / 2) * width, ys, width, label=v)
    ax.set_xticks(np.arange(len(models)))
    ax.set_xticklabels(models, fontsize=8)
    ax.set_ylabel("per-stream cache (MiB)")
    ax.set_title("Cache memory (cf. DeepCache Fig. 18)")
    ax.legend(fontsize=7)
    return fig


def timeline(
    latencies_ms: Mapping[str, np.ndarray], infos: Mapping[str, Mapping[str, np.ndarray]]
) -> Figure | None:
    """Per-frame latency of each method, and each method's FLOPs ratio."""
    if not latencies_ms:
        return None
    fig, (ax1, ax2) = _subplots(2, 1, figsize=(9, 5), sharex=True)
    for v, ms in latencies_ms.items():
        ax1.plot(np.asarray(ms), label=v, lw=1)
        ax2.plot(np.asarray(infos[v]["flops_ratio"]).reshape(-1), label=v, lw=1)
    ax1.set_ylabel("step latency (ms)")
    ax1.set_yscale("log")
    ax2.set_ylabel("FLOPs computed / full")
    ax2.set_xlabel("frame")
    ax2.set_ylim(0, 1.05)
    ax1.legend(fontsize=7)
    fig.tight_layout()
    return fig


def mask_strip(
    frames: np.ndarray,
    masks: np.ndarray,
    indices: Sequence[int],
    titles: Sequence[str] | None = None,
) -> Figure:
    """Frames with their reuse mask over them: reused pixels tinted green, recomputed red."""
    fig, axes = _subplots(1, len(indices), figsize=(2.6 * len(indices), 2.8), squeeze=False)
    for k, (ax, t) in enumerate(zip(axes[0], indices, strict=True)):
        img = frames[t].astype(np.float32) / 255.0
        m = masks[t].astype(bool)
        tint = np.where(m[..., None], [0.0, 0.8, 0.0], [0.9, 0.0, 0.0])
        ax.imshow(0.65 * img + 0.35 * tint)
        ax.set_title(titles[k] if titles else f"frame {t}: {100 * m.mean():.0f}% reused",
                     fontsize=8)  # fmt: skip
        ax.axis("off")
    fig.tight_layout()
    return fig
