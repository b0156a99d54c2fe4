"""``dcjax bench layers``: the layer cache across models (EdgeCaffe's measurements).

Five networks from `dcjax.layercache.family` (EdgeCaffe's setting: of the five,
``similar`` share every layer but their last) run one after another on one real
frame, layer by layer from a shared `dcjax.layercache.LayerStore`, in each of
the modes (`dcjax.layercache.MODES`). One record per run, each in a fresh
process (so that storage, memory and peak RSS are its own), with the fields
``mode``, ``similar``, ``memory_limit_mb`` (null: none), ``limit_by``
(``cgroup``, ``budget`` or null), ``storage`` (``cold``: the layer files'
pages dropped from the page cache with ``posix_fadvise(DONTNEED)`` before the
run; ``warm``: read once before it), ``total_s`` (the five networks, wall),
``load_s``, ``exec_s``, ``peak_rss_mb`` (the process's peak resident memory
during the run), ``loads`` and ``hits`` (the store's reads from storage and
from memory), and ``error`` (e.g. killed by the memory limit). Times are the
median of ``--repeats`` runs; each run starts with an empty store. Memory
limits use a cgroup-v1 memory controller (``memory.limit_in_bytes``, and
``memory.memsw.limit_in_bytes`` where swap accounting exists) when this
process may create one, else the store's byte budget (layers only).

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

from dcjax.bench.common import at_least, program_parser, table, write_json

__all__ = ["main", "run_one"]

_CGROUP_ROOT = Path("/sys/fs/cgroup/memory")


def _default_store() -> str:
    return os.path.join(os.path.expanduser("~"), ".cache", "dcjax", "layer-family")


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
    names = family.networks(job["similar"])
    manifests = [lc.Manifest.read(root, n) for n in names]
    module, _ = models.create(family.MODEL, num_classes=2)
    x = _frame()
    like = jax.eval_shape(module.init, jax.random.PRNGKey(0), x)
    budget = None if job.get("budget_mb") is None else int(job["budget_mb"]) << 20

    def networks(store):
        return [lc.LayerwiseModel(module.apply, m, like, x, store=store) for m in manifests]

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


def _spawn(job: dict[str, Any], limit_mb: int | None) -> dict[str, Any]:
    """``run_one(job)`` in a child process, inside a memory cgroup of ``limit_mb``
    where one can be made."""
    record = {"mode": job["mode"], "similar": job["similar"], "memory_limit_mb": limit_mb,
              "limit_by": None, "storage": job["storage"]}  # fmt: skip
    group = _cgroup(limit_mb) if limit_mb is not None else None
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
    ap.add_argument("--repeats", type=at_least(1), default=3)
    ap.add_argument("--steps", type=at_least(1), default=30,
                    help="fine-tuning steps per network when the family is built")  # fmt: skip
    ap.add_argument("--fuse", action="store_true", help="also time the five heads fused")
    ap.add_argument("--json", default="bench-results/layers.json")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    from tqdm.auto import tqdm

    from dcjax.layercache import family

    root = Path(args.store)
    family.build(root, steps=args.steps, progress=not args.no_progress)
    jobs = [(storage, limit, similar, mode) for storage in args.storage
            for limit in args.memory_limits for similar in args.similar
            for mode in args.modes]  # fmt: skip
    records = []
    for storage, limit, similar, mode in tqdm(jobs, desc="dcjax: layer runs", unit="run",
                                              disable=args.no_progress):  # fmt: skip
        job = {"store": str(root), "mode": mode, "similar": similar, "storage": storage,
               "budget_mb": None, "repeats": args.repeats}  # fmt: skip
        records.append(_spawn(job, limit))
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
