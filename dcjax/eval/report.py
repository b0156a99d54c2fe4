"""A self-contained HTML report of metrics records, with its plots as PNG files too.

`write_report(path, records, ...)` renders the standard plots (`dcjax.eval.plots`)
of the records, plus any extra figures, into PNG files next to the HTML
(``<name>.png`` in the report's directory) and writes ``path``: a summary
table (time per frame, throughput, p99, speedups against the plain model and
dcjax's dense lowering, ideal, efficiency, still fraction, agreement, match
ratio, refreshes, cache),
a per-layer table per (model, video, method), where the records were profiled
(`dcjax.bench.evaluation.add_profiles`) a table per (model, video) of where each
method's time went, layer by layer, and every plot embedded as a base64 PNG
that links to its file. The HTML needs nothing else to display.
"""

from __future__ import annotations

import base64
import html
import os
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.figure import Figure

from dcjax.eval import plots
from dcjax.eval import profile as profile_lib
from dcjax.eval.metrics import BASELINES, speedup_cell

__all__ = [
    "SHORT_COLUMNS",
    "computed_cells",
    "standard_figures",
    "summary_rows",
    "write_report",
]

#: The columns of `summary_rows` the command line prints (``dcjax demo``, ``run``, ``bench``).
SHORT_COLUMNS = (
    "method", "mean ms", "fps", "p99 ms", "vs plain", "vs dense", "ideal", "still",
    "top-1 agree", "match", "refreshes",
)  # fmt: skip

_CSS = """
body { font-family: sans-serif; margin: 2em; max-width: 1200px; }
table { border-collapse: collapse; margin: 1em 0; font-size: 13px; }
th, td { border: 1px solid #bbb; padding: 3px 8px; text-align: right; }
th { background: #eee; } td.l, th.l { text-align: left; }
img { max-width: 100%; border: 1px solid #ddd; }
details { margin: 0.5em 0; } .note { color: #555; font-size: 13px; }
"""


def _fmt(value: Any, spec: str = ".3g") -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def summary_rows(records: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """One row of formatted cells per record (also used by the CLI's table)."""
    rows = []
    for r in records:
        rows.append({
            "model": r["model"],
            "video": os.path.basename(r["video"]),
            "method": r["variant"],
            "frames": str(r["frames"]),
            "mean ms": _fmt(r["mean_ms"], ".1f"),
            "fps": _fmt(r["throughput_fps"], ".1f"),
            "p50 ms": _fmt(r["p50_ms"], ".1f"),
            "p99 ms": _fmt(r["p99_ms"], ".1f"),
            "vs plain": _fmt(r["speedup_vs_plain"], ".2f") + "x",
            "plain form": r["plain_form"],
            "vs dense": speedup_cell(r["speedup_vs_dense"], r.get("speedup_vs_dense_se")),
            "ideal": _fmt(r["ideal_speedup"], ".2f") + "x",
            "efficiency": _fmt(r["efficiency"], ".2f"),
            "still": f"{100 * r['still_fraction']:.0f}%",
            "top-1 agree": "–" if r["top1_agreement"] is None
            else f"{100 * r['top1_agreement']:.1f}%",
            "top-1 stable": "–" if r.get("top1_stability") is None
            else f"{100 * r['top1_stability']:.1f}%",
            "rel. MSE": _fmt(r["output_rel_mse"], ".2g"),
            "match": "–" if r["match_ratio"] is None else f"{100 * r['match_ratio']:.1f}%",
            "refreshes": str(r["refreshes"]),
            "refresh ms": _fmt(r.get("refresh_frame_ms"), ".1f"),
            "other-frame ms": _fmt(r.get("other_frame_ms"), ".1f"),
            "static-frame ms": _fmt(r.get("static_frame_ms"), ".1f"),
            "cache MiB": _fmt(r["cache_bytes"] / 2**20, ".2f"),
            "box F1": _fmt(r.get("box_f1"), ".3f"),
            "boxes": _fmt(r.get("boxes")),
            "heat err": _fmt(r.get("heatmap_max_err"), ".3g"),
        })  # fmt: skip
    return rows


def _table(rows: Sequence[Mapping[str, str]], left: Sequence[str] = ()) -> str:
    if not rows:
        return "<p class='note'>(nothing)</p>"
    cols = list(rows[0])
    head = "".join(f"<th class='{'l' if c in left else ''}'>{html.escape(c)}</th>" for c in cols)
    body = "".join(
        "<tr>"
        + "".join(
            f"<td class='{'l' if c in left else ''}'>{html.escape(str(row[c]))}</td>" for c in cols
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def computed_cells(layers: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Per ``per_layer`` entry its ``computed`` cell: "sparse" (skipping what it
    can reuse), "in full" (every frame) or "–" where its method does not say;
    no cell at all when no entry says."""
    if all(lay.get("sparse") is None for lay in layers):
        return [{} for _ in layers]
    return [{"computed": _COMPUTED[lay.get("sparse")]} for lay in layers]


_COMPUTED = {True: "sparse", False: "in full", None: "–"}


def _computed_fraction(layer: Mapping[str, Any]) -> float:
    """What of a layer its method computed: all of it when computed in full,
    else what it could not reuse."""
    return 1.0 if layer.get("sparse") is False else 1.0 - layer["reuse_fraction"]


def _per_layer_table(r: Mapping[str, Any]) -> str:
    total = sum(lay["flops"] for lay in r["per_layer"]) or 1
    rows = [
        {
            "layer": lay["name"],
            "GFLOPs": f"{lay['flops'] / 1e9:.3f}",
            "share": f"{100 * lay['flops'] / total:.1f}%",
            "reuse": f"{100 * lay['reuse_fraction']:.1f}%",
            "computed share": f"{100 * lay['flops'] * _computed_fraction(lay) / total:.1f}%",
            **cell,
            **({"ms": _fmt(lay["ms"], ".2f")} if "ms" in lay else {}),
        }
        for lay, cell in zip(r["per_layer"], computed_cells(r["per_layer"]), strict=True)
    ]
    return _table(rows, left=("layer",))


def _time_sections(records: Sequence[Mapping[str, Any]]) -> str:
    """Per (model, video), ms a frame by group for every profiled method."""
    pairs: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in records:
        if "groups" in (r.get("profile") or {}):
            pairs.setdefault((r["model"], r["video"]), []).append(r)
    out = []
    for (model, video), rs in pairs.items():
        rows = profile_lib.table_rows([(r["variant"], r["profile"]) for r in rs])
        out.append(
            f"<h3>{html.escape(model)} / {html.escape(os.path.basename(video))}</h3>"
            + _table(rows, left=("group",))
        )
    if not out:
        return ""
    note = html.escape(profile_lib.TABLE_NOTE)
    return f"<h2>Where the time went</h2><p class='note'>{note}.</p>" + "".join(out)


def standard_figures(
    records: Sequence[Mapping[str, Any]],
    matcher_rows: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Figure]:
    """The plots of DeepCache's Section 7 that ``records`` hold data for."""
    figs = {
        "latency_by_method": plots.latency_by_method(records),
        "per_layer": plots.per_layer(records),
        "threshold_sweep": plots.sweep(records, "psnr_threshold"),
        "block_size_sweep": plots.sweep(records, "block_size"),
        "delta_pareto": plots.pareto(records),
        "matchers": plots.matchers(matcher_rows),
        "cache_memory": plots.cache_memory(records),
    }
    return {k: v for k, v in figs.items() if v is not None}


def write_report(
    path: str,
    records: Sequence[Mapping[str, Any]],
    *,
    title: str = "dcjax benchmark",
    intro: str = "",
    figures: Mapping[str, Figure | bytes] | None = None,
    matcher_rows: Sequence[Mapping[str, Any]] = (),
) -> dict[str, str]:
    """Write the HTML report and its PNGs.

    Args:
        path: the HTML file; PNGs go to the same directory.
        records: metrics records.
        title: page title.
        intro: an HTML-escaped paragraph under the title.
        figures: extra figures (or PNG bytes) by name, shown first.
        matcher_rows: rows of `dcjax.bench.evaluation.compare_matchers`.

    Returns:
        name -> PNG path of every plot written.
    """
    out_dir = os.path.dirname(os.path.abspath(path))
    os.makedirs(out_dir, exist_ok=True)
    all_figs: dict[str, Figure | bytes] = dict(figures or {})
    all_figs.update(standard_figures(records, matcher_rows))
    pngs: dict[str, str] = {}
    sections = []
    for name, fig in all_figs.items():
        png_path = os.path.join(out_dir, f"{name}.png")
        if isinstance(fig, bytes):
            data = fig
            with open(png_path, "wb") as f:
                f.write(data)
        else:
            data = plots.save(fig, png_path)
        pngs[name] = png_path
        b64 = base64.b64encode(data).decode("ascii")
        sections.append(
            f"<h3>{html.escape(name.replace('_', ' '))}</h3>"
            f"<a href='{html.escape(name)}.png'><img alt='{html.escape(name)}' "
            f"src='data:image/png;base64,{b64}'></a>"
        )
    layer_sections = "".join(
        f"<details><summary>{html.escape(r['model'])} / "
        f"{html.escape(os.path.basename(r['video']))} / {html.escape(r['variant'])}: "
        f"per layer</summary>{_per_layer_table(r)}</details>"
        for r in records
        if r["method"] not in BASELINES and r["per_layer"]
    )
    matcher_table = ""
    if matcher_rows:
        matcher_table = "<h2>Matchers</h2>" + _table(
            [
                {
                    "video": os.path.basename(m["video"]),
                    "matcher": m["matcher"],
                    "match": f"{100 * m['match_ratio']:.1f}%",
                    "ms": f"{m['ms']:.2f}",
                }
                for m in matcher_rows
            ],  # fmt: skip
            left=("video", "matcher"),
        )
    doc = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_CSS}</style></head><body>
<h1>{html.escape(title)}</h1>
<p>{html.escape(intro)}</p>
<p class="note">Time per frame: the wall time of one <code>step</code> (matching
included, after compilation), every frame counted (refresh and still frames too), all
methods interleaved frame by frame in one process; fps = frames over their total time.
"vs plain" = mean time of the plain model, <code>jax.jit(model.apply)</code> in its faster
form (variables as arguments or closed over as constants, "plain form") / the method's;
"vs dense" = mean time of dcjax's own dense lowering (<code>nocache</code>) / the
method's, &plusmn; its standard error from the paired per-frame times. Ideal = 1 /
mean fraction of convolution and matrix-product FLOPs computed, still frames counting
as none; efficiency = vs dense / ideal; "still" = frames skipped
whole as still. Agreement is with the <code>nocache</code> output on the same frames.
Where the time goes: "refresh ms" and "other-frame ms" are the mean times of the frames
recomputed in full and of the others; "static-frame ms" is the mean time of a frame
identical to the previous one (everything reusable), the floor set by matching and cache
bookkeeping.</p>
<h2>Summary</h2>
{_table(summary_rows(records), left=("model", "video", "method"))}
{matcher_table}
<h2>Plots</h2>
{"".join(sections)}
<h2>Per layer</h2>
{layer_sections}
{_time_sections(records)}
</body></html>
"""
    with open(path, "w", encoding="utf-8") as f:
        f.write(doc)
    return pngs
