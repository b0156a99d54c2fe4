"""``dcjax bench layers``: the layer cache across models (EdgeCaffe's measurements).

Five networks from `dcjax.layercache.family` (EdgeCaffe's setting: of the five,
``similar`` share every layer but their last; with ``--frozen K``, the stem and
the first K blocks) run one after another on one real frame, layer by layer
from a shared `dcjax.layercache.LayerStore`, in each of the modes
(`dcjax.layercache.MODES`). One record per run, each in a fresh process (so
that storage, memory and peak RSS are its own), with the fields ``mode``,
``similar``, ``frozen``, ``memory_limit_mb`` (null: none), ``limit_by``
(``cgroup``, ``budget`` or null), ``storage`` (``cold``: the layer files'
pages dropped from the page cache with ``posix_fadvise(DONTNEED)`` before the
run; ``warm``: read once before it), ``total_s`` (the five networks, wall),
``load_s``, ``exec_s``, ``peak_rss_mb`` (the process's peak resident memory
during the run), ``loads`` and ``hits`` (the store's reads from storage and
from memory), and ``error`` (e.g. killed by the memory limit). Times are the
median of ``--repeats`` runs; each run starts with an empty store. Memory
limits use a cgroup-v1 memory controller (``memory.limit_in_bytes``, and
``memory.memsw.limit_in_bytes`` where swap accounting exists) when this
process may create one, else (or with ``--limit-by budget``) the store's byte
budget, which bounds the layers alone.

With ``--fuse``, also the five head-only networks fused at their shared stem
(`dcjax.layercache.fuse`) on one frame against one network alone, both
``jax.jit`` of the plain function (median of interleaved calls).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dcjax.bench.arguments import at_least, program_parser
from dcjax.bench.common import table, write_json

__all__ = ["main", "run_one"]

_CGROUP_ROOT = Path("/sys/fs/cgroup/memory")


def _default_store() -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "dcjax", "layer-family")


def _frozen(text: str) -> int | str:
    if text == "all":
        return "all"
    k = int(text)
    if not 0 <= k <= 16:
        raise ValueError(text)
    return k


def _memory_limit(text: str) -> int | None:
    if text.lower() in ("none", "null", "-"):
        return None
    mb = int(text)
    if mb <= 0:
        raise ValueError(text)
    return mb


def _own_cgroup() -> Path | None:
    """This process's cgroup-v1 memory folder, if it may create children there."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                folder = _CGROUP_ROOT / path.lstrip("/")
                return folder if os.access(folder, os.W_OK) else None
    except OSError:
        return None
    return None


def _cgroup(limit_mb: int) -> Path | None:
    parent = _own_cgroup()
    if parent is None:
        return None
    folder = parent / f"dcjax-layers-{os.getpid()}-{limit_mb}"
    try:
        folder.mkdir(exist_ok=True)
        (folder / "memory.limit_in_bytes").write_text(str(limit_mb << 20))
        memsw = folder / "memory.memsw.limit_in_bytes"
        if memsw.exists():  # no more swap than memory: the limit holds with swap too
            memsw.write_text(str(2 * limit_mb << 20))
    except OSError:
        return None
    return folder


def _drop_page_cache(paths: Sequence[Path]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak_rss() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _frame(size=(224, 224)):
    from dcjax import models, video
    from dcjax.layercache.family import MODEL

    frame = next(iter(video.read(video.clip_path("vtest"), size=size, max_frames=1)))
    return models.preprocess(MODEL, frame[None])


def run_one(job: dict[str, Any]) -> dict[str, Any]:
    """One record (module docstring), in this process: ``job`` has ``store``,
    ``mode``, ``similar``, ``storage``, ``budget_mb`` and ``repeats``."""
    import jax

    from dcjax import layercache as lc
    from dcjax import models
    from dcjax.layercache import family

    root = Path(job["store"])
    names = family.networks(job["similar"], job.get("frozen", "all"))
    manifests = [lc.Manifest.read(root, n) for n in names]
    module, _ = models.create(family.MODEL, num_classes=2)
    x = _frame()
    like = jax.eval_shape(module.init, jax.random.PRNGKey(0), x)
    budget = None if job.get("budget_mb") is None else int(job["budget_mb"]) << 20
    split = lc.split(module.apply, like, x)  # one architecture: traced once

    def networks(store):
        return [lc.LayerwiseModel(module.apply, m, like, x, store=store, split=split)
                for m in manifests]  # fmt: skip

    for net in networks(lc.LayerStore()):  # compiles every segment, warms storage
        net.run(x, mode="linear")
    files = sorted({m.path(lay.key) for m in manifests for lay in m.layers})
    runs = []
    for _ in range(job["repeats"]):
        if job["storage"] == "cold":
            _drop_page_cache(files)
        store = lc.LayerStore(budget_bytes=budget)
        nets = networks(store)
        _reset_peak_rss()
        start = time.perf_counter()
        load = execute = 0.0
        for net in nets:
            _, t = net.run(x, mode=job["mode"])
            load += t.load_s
            execute += t.exec_s
        runs.append({"total_s": time.perf_counter() - start, "load_s": load, "exec_s": execute,
                     "peak_rss_mb": _peak_rss_mb(), "loads": store.stats.loads,
                     "hits": store.stats.hits})  # fmt: skip
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    return {**med, "total_s_runs": [r["total_s"] for r in runs]}


def _spawn(job: dict[str, Any], limit_mb: int | None, limit_by: str = "cgroup") -> dict[str, Any]:
    """``run_one(job)`` in a child process, inside a memory cgroup of ``limit_mb``
    where one can be made and ``limit_by`` is ``"cgroup"``, else with the store's
    budget set to it."""
    record = {"mode": job["mode"], "similar": job["similar"], "memory_limit_mb": limit_mb,
              "limit_by": None, "storage": job["storage"],
              "frozen": job.get("frozen", "all")}  # fmt: skip
    use_cgroup = limit_mb is not None and limit_by == "cgroup"
    group = _cgroup(limit_mb) if use_cgroup else None
    if limit_mb is not None:
        record["limit_by"] = "cgroup" if group is not None else "budget"
        if group is None:
            job = {**job, "budget_mb": limit_mb}
    cmd = [sys.executable, "-m", "dcjax.bench.layers", "--one", json.dumps(job)]
    if group is not None:
        cmd = ["sh", "-c", f'echo $$ > "{group}/cgroup.procs" && exec "$0" "$@"', *cmd]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    finally:
        if group is not None:
            try:
                group.rmdir()
            except OSError:
                pass
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        why = "killed (out of memory?)" if done.returncode in (-9, 137) else done.stderr[-300:]
        return {**record, "total_s": None, "load_s": None, "exec_s": None,
                "peak_rss_mb": None, "error": why.strip()}  # fmt: skip
    return {**record, **json.loads(lines[-1]), "error": None}


def _fuse_records(root: Path, repeats: int) -> list[dict[str, Any]]:
    import jax

    from dcjax import layercache as lc
    from dcjax import models
    from dcjax.bench.common import Timed, time_interleaved
    from dcjax.layercache import family

    module, _ = models.create(family.MODEL, num_classes=2)
    x = _frame()
    like = jax.eval_shape(module.init, jax.random.PRNGKey(0), x)
    store = lc.LayerStore()
    params = []
    for name in family.networks(len(family.TASKS)):
        m = lc.Manifest.read(root, name)
        params.append(lc.params_of(m, store, jax.tree_util.tree_structure(like)))
    fused = lc.fuse([(module.apply, p) for p in params], x)
    one = jax.jit(module.apply)
    both = jax.jit(fused.fn)
    timed = [Timed(call=lambda: one(params[0], x)), Timed(call=lambda: both(fused.params, x))]
    t = time_interleaved(timed, repeats, warmup=1)
    return [{"kind": "fuse", "models": len(params), "stem_layers": len(fused.stem_layers),
             "one_ms": t[0].median_ms, "fused_ms": t[1].median_ms,
             "ratio": t[1].median_ms / t[0].median_ms}]  # fmt: skip


def _limit_label(limit: int | None) -> str:
    return "none" if limit is None else f"{limit} MiB"


def figures(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The paper's plots that ``records`` hold data for, by name: runtime against
    the number of similar networks per mode (cold and warm storage, no limit;
    its Figure 1), against the memory limit (Figure 2), per mode against the
    similar networks at each limit (Figures 3-6), and load against execution
    time (Figure 7); the memory plots once for cgroup limits and once for the
    store's budget, whichever the records hold."""
    from matplotlib.figure import Figure

    from dcjax.layercache import MODES

    runs = [r for r in records if r.get("kind") != "fuse" and r.get("total_s") is not None]
    out: dict[str, Any] = {}

    def series(rows, x_key):
        pts = sorted((r[x_key], r["total_s"]) for r in rows)
        return [p[0] for p in pts], [p[1] for p in pts]

    free = [r for r in runs if r["memory_limit_mb"] is None]
    storages = sorted({r["storage"] for r in free})
    if free:
        fig = Figure(figsize=(5 * len(storages), 3.6))
        for ax, storage in zip(fig.subplots(1, len(storages), squeeze=False)[0], storages,
                               strict=True):  # fmt: skip
            for mode in MODES:
                xs, ys = series([r for r in free if r["storage"] == storage and r["mode"] == mode],
                                "similar")  # fmt: skip
                if xs:
                    ax.plot(xs, ys, marker="o", label=mode)
            ax.set(title=f"{storage} storage, no memory limit", xlabel="similar networks (of 5)",
                   ylabel="five networks, s")  # fmt: skip
            ax.legend()
        out["runtime_by_similar"] = fig
    for by, what in (("cgroup", "memory_limit"), ("budget", "layer_budget")):
        limited = [r for r in runs if r["storage"] == "cold"
                   and (r["memory_limit_mb"] is None or r["limit_by"] == by)]  # fmt: skip
        limits = {r["memory_limit_mb"] for r in limited if r["memory_limit_mb"] is not None}
        if not limits:
            continue
        order = [None, *sorted(limits, reverse=True)]
        label = "memory limit (cgroup)" if by == "cgroup" else "the store's layer budget"
        fig = Figure(figsize=(5.5, 3.6))
        ax = fig.subplots()
        for mode in MODES:
            for similar in sorted({r["similar"] for r in limited}):
                pts = sorted((order.index(r["memory_limit_mb"]), r["total_s"]) for r in limited
                             if r["mode"] == mode and r["similar"] == similar)  # fmt: skip
                if len(pts) > 1:
                    ax.plot(*zip(*pts, strict=True), marker="o", label=f"{mode}, {similar} similar")
        ax.set_xticks(range(len(order)), [_limit_label(v) for v in order])
        ax.set(title="cold storage", xlabel=label, ylabel="five networks, s")
        ax.legend(fontsize="small")
        out[f"runtime_by_{what}"] = fig
        fig = Figure(figsize=(10, 7))
        for ax, mode in zip(fig.subplots(2, 2).flat, MODES, strict=True):
            for limit in order:
                xs, ys = series([r for r in limited if r["mode"] == mode
                                 and r["memory_limit_mb"] == limit], "similar")  # fmt: skip
                if xs:
                    ax.plot(xs, ys, marker="o", label=_limit_label(limit))
            ax.set(title=f"{mode} mode, cold storage, by {label}",
                   xlabel="similar networks (of 5)", ylabel="five networks, s")  # fmt: skip
            ax.legend(fontsize="small")
        out[f"modes_by_{what}"] = fig
    split = [r for r in free if r["storage"] == "cold" and r["similar"] in (0, 5)]
    if split:
        fig = Figure(figsize=(7, 3.6))
        ax = fig.subplots()
        labels = [f"{r['mode']}\n{r['similar']} similar" for r in split]
        ax.bar(labels, [r["load_s"] for r in split], label="loading")
        ax.bar(labels, [r["exec_s"] for r in split], bottom=[r["load_s"] for r in split],
               label="executing")  # fmt: skip
        ax.set(title="cold storage, no limit: summed over the layers", ylabel="s")
        ax.tick_params(axis="x", labelsize="small")
        ax.legend()
        out["load_and_exec"] = fig
    return out


def write_report(path: str, records: Sequence[dict[str, Any]]) -> None:
    """An HTML page with `figures` and the records' table; PNGs beside it."""
    import html

    from dcjax.eval import plots

    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    parts = []
    for name, fig in figures(records).items():
        plots.save(fig, os.path.join(folder, f"{name}.png"))
        parts.append(f"<h3>{html.escape(name.replace('_', ' '))}</h3><img src='{name}.png'>")
    keys = ["storage", "memory_limit_mb", "limit_by", "similar", "mode", "total_s", "load_s",
            "exec_s", "peak_rss_mb", "loads", "hits", "error"]  # fmt: skip
    head = "".join(f"<th>{k}</th>" for k in keys)
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(r.get(k, '')))}</td>" for k in keys) + "</tr>"
        for r in records if r.get("kind") != "fuse"
    )  # fmt: skip
    doc = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>dcjax bench layers"
           f"</title></head><body><h1>The layer cache across models</h1>"
           f"<p>{html.escape(__doc__.split(chr(10) + chr(10))[1])}</p>{''.join(parts)}"
           f"<table border='1'><tr>{head}</tr>{rows}</table></body></html>")  # fmt: skip
    Path(path).write_text(doc)


def main(argv: Sequence[str] | None = None) -> int:
    """``dcjax bench layers``; returns the exit status (bad arguments exit with status 2)."""
    from dcjax.layercache import MODES

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--one"]:  # a child run
        print(json.dumps(run_one(json.loads(argv[1]))))
        return 0
    ap = program_parser("layers", __doc__)
    ap.add_argument("--store", default=_default_store(),
                    help="the family's layer store (built once; default %(default)s)")  # fmt: skip
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--similar", nargs="+", type=int, choices=range(6), default=[0, 1, 2, 3, 4, 5])
    ap.add_argument("--storage", nargs="+", choices=("cold", "warm"), default=["cold", "warm"])
    ap.add_argument("--memory-limits", nargs="+", type=_memory_limit, default=[None],
                    metavar="MB", help="limits to run under, MiB ('none': no limit)")  # fmt: skip
    ap.add_argument("--limit-by", choices=("cgroup", "budget"), default="cgroup",
                    help="enforce --memory-limits on the whole process with a cgroup (where "
                         "one can be made, else the budget) or on the layers alone with the "
                         "store's budget")  # fmt: skip
    ap.add_argument("--repeats", type=at_least(1), default=3)
    ap.add_argument("--frozen", type=_frozen, default="all", metavar="K",
                    help="the similar networks share all but their last layer ('all', the "
                         "default) or the stem and the first K blocks (0-16)")  # fmt: skip
    ap.add_argument("--steps", type=at_least(1), default=30,
                    help="fine-tuning steps per network when the family is built")  # fmt: skip
    ap.add_argument("--fuse", action="store_true", help="also time the five heads fused")
    ap.add_argument("--json", default="bench-results/layers.json")
    ap.add_argument("--report", metavar="PATH", help="HTML report with the paper's plots")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    from tqdm.auto import tqdm

    from dcjax.layercache import family

    root = Path(args.store)
    family.build(root, steps=args.steps, frozen=args.frozen, progress=not args.no_progress)
    jobs = [(storage, limit, similar, mode) for storage in args.storage
            for limit in args.memory_limits for similar in args.similar
            for mode in args.modes]  # fmt: skip
    records = []
    for storage, limit, similar, mode in tqdm(jobs, desc="dcjax: layer runs", unit="run",
                                              disable=args.no_progress):  # fmt: skip
        job = {"store": str(root), "mode": mode, "similar": similar, "storage": storage,
               "budget_mb": None, "repeats": args.repeats, "frozen": args.frozen}  # fmt: skip
        records.append(_spawn(job, limit, args.limit_by))
    if args.fuse:
        records += _fuse_records(root, args.repeats * 10)
    print(table([
        {"storage": r["storage"], "limit MiB": str(r["memory_limit_mb"] or "-"),
         "similar": str(r["similar"]), "mode": r["mode"],
         "total s": "-" if r["total_s"] is None else f"{r['total_s']:.3f}",
         "load s": "-" if r["load_s"] is None else f"{r['load_s']:.3f}",
         "exec s": "-" if r["exec_s"] is None else f"{r['exec_s']:.3f}",
         "peak RSS MiB": "-" if r["peak_rss_mb"] is None else f"{r['peak_rss_mb']:.0f}",
         "error": r["error"] or ""}
        for r in records if r.get("kind") != "fuse"
    ]))  # fmt: skip
    for r in records:
        if r.get("kind") == "fuse":
            print(f"five heads fused at a {r['stem_layers']}-layer stem: {r['fused_ms']:.1f} ms "
                  f"against {r['one_ms']:.1f} ms for one network ({r['ratio']:.2f}x)")  # fmt: skip
    write_json(args.json, {"records": records, "tasks": family.TASKS})
    print(f"wrote {args.json}")
    if args.report:
        write_report(args.report, records)
        print(f"wrote {args.report}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
