"""``dcjax bench layers`` end to end, on a family of random-weight networks with
the real family's layout (the fine-tuned one takes minutes to build)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from dcjax import layercache as lc
from dcjax import models
from dcjax.bench import layers
from dcjax.layercache import family


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """head-*: one backbone with five heads; full-*: five backbones."""
    root = tmp_path_factory.mktemp("family")
    _, base = models.create(family.MODEL, num_classes=2, seed=0)
    rng = np.random.default_rng(0)
    for i, task in enumerate(family.TASKS):
        head = jax.tree_util.tree_map(lambda a: a, base)
        head["params"]["fc"]["kernel"] = rng.normal(size=(1280, 2)).astype(np.float32)
        lc.save(head, root, f"head-{task}")
        _, full = models.create(family.MODEL, num_classes=2, seed=100 + i)
        full["batch_stats"] = jax.tree_util.tree_map(lambda a, i=i: a + 0.01 * (i + 1),
                                                     full["batch_stats"])  # fmt: skip
        lc.save(full, root, f"full-{task}")
    return root


def test_records_have_the_papers_fields_and_similar_networks_share_loads(store, tmp_path, capsys):
    out = tmp_path / "layers.json"
    argv = ["--store", str(store), "--modes", "linear", "partial", "--similar", "0", "5",
            "--storage", "warm", "--repeats", "1", "--json", str(out), "--no-progress"]  # fmt: skip
    assert layers.main(argv) == 0
    records = json.loads(out.read_text())["records"]
    runs = [(r["similar"], r["mode"]) for r in records]
    assert runs == [(0, "linear"), (0, "partial"), (5, "linear"), (5, "partial")]
    for r in records:
        assert r["error"] is None and r["storage"] == "warm" and r["memory_limit_mb"] is None
        assert r["total_s"] >= r["exec_s"] > 0 and r["load_s"] > 0 and r["peak_rss_mb"] > 50
    by = {(r["similar"], r["mode"]): r for r in records}

    def distinct(similar):
        names = family.networks(similar)
        return {lay.key for n in names for lay in lc.Manifest.read(store, n).layers}

    # each distinct layer is read once: five similar networks share all but their heads
    for similar in (0, 5):
        for mode in ("linear", "partial"):
            assert by[(similar, mode)]["loads"] == len(distinct(similar))
    backbone = {lay.key for lay in lc.Manifest.read(store, "head-clip").layers if lay.name != "fc"}
    assert len(distinct(5)) == len(backbone) + 5 < len(distinct(0))
    assert by[(5, "linear")]["hits"] > by[(0, "linear")]["hits"]
    assert "total s" in capsys.readouterr().out


def test_a_memory_limit_is_enforced_and_says_how(store, tmp_path):
    job = {"store": str(store), "mode": "linear", "similar": 5, "storage": "cold",
           "budget_mb": None, "repeats": 1}  # fmt: skip
    record = layers._spawn(job, 4096)
    assert record["limit_by"] in ("cgroup", "budget") and record["memory_limit_mb"] == 4096
    assert record["error"] is None and record["total_s"] > 0
    if record["limit_by"] == "cgroup":  # a limit below what JAX itself needs kills the run
        starved = layers._spawn(job, 40)
        assert starved["total_s"] is None and starved["error"]
    # the store's budget bounds the layers alone: below one network's bytes, the
    # layers the five share are evicted before the next network asks for them
    tight = layers._spawn(job, 8, "budget")
    assert tight["limit_by"] == "budget" and tight["error"] is None
    names = family.networks(5)
    distinct = {lay.key for n in names for lay in lc.Manifest.read(store, n).layers}
    assert record["loads"] == len(distinct) < tight["loads"]


def _record(mode, similar, limit, storage="cold", total=1.0):
    return {"mode": mode, "similar": similar, "memory_limit_mb": limit,
            "limit_by": None if limit is None else "cgroup",
            "storage": storage, "total_s": total, "load_s": total / 2, "exec_s": total / 2,
            "peak_rss_mb": 500.0, "loads": 1, "hits": 0, "error": None}  # fmt: skip


def test_report_draws_the_papers_figures_from_the_records(tmp_path):
    records = [_record(m, s, lim, total=1 + s + (lim or 0) / 1000 + i)
               for i, m in enumerate(lc.MODES) for s in (0, 5) for lim in (None, 512)]  # fmt: skip
    records.append(_record("linear", 3, 256) | {"total_s": None, "error": "killed"})
    figs = layers.figures(records)
    assert set(figs) == {"runtime_by_similar", "runtime_by_memory_limit",
                         "modes_by_memory_limit", "load_and_exec"}  # fmt: skip
    (ax,) = figs["runtime_by_similar"].axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert set(lines) == set(lc.MODES)
    assert list(lines["partial"].get_xdata()) == [0, 5]
    assert list(lines["partial"].get_ydata()) == [1 + 0 + 3, 1 + 5 + 3]  # no limit
    layers.write_report(str(tmp_path / "r.html"), records)
    page = (tmp_path / "r.html").read_text()
    for name in figs:
        assert (tmp_path / f"{name}.png").stat().st_size > 1000 and f"{name}.png" in page
    assert page.count("<tr>") == 1 + len(records) and "killed" in page
