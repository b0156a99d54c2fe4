"""Kernel choice by measurement (`dcjax.kernels.tuning`): candidates, masks,
expected costs, the measurements' file, and the choice made from them."""

import time

import jax.numpy as jnp
import numpy as np
import pytest

from dcjax.kernels import ConvGeometry, plan
from dcjax.kernels import tuning as kt


def _layer(h=12, cin=8, cout=8, k=3, groups=1):
    return plan(
        (1, h, h, cin),
        (k, k, cin // groups, cout),
        ConvGeometry(strides=(1, 1), padding="SAME", groups=groups),
    )


def test_candidates_are_dense_tiles_and_rows_where_rows_compute_the_layer():
    names = [c.name for c in kt.candidates(_layer(), "cpu")]
    assert names[:2] == ["dense", "xla"] and names[2].startswith("rows")
    narrow = [c.impl for c in kt.candidates(_layer(groups=8), "cpu")]
    assert narrow == ["dense", "xla"]  # depthwise rows of 8 channels: left to xla
    wide = [c.impl for c in kt.candidates(_layer(cin=16, cout=16, groups=16), "cpu")]
    assert wide == ["dense", "xla", "rows"]  # 16 channels: per-tap pixel gathers
    multiplier = [c.impl for c in kt.candidates(_layer(cin=6, cout=12, groups=3), "cpu")]
    assert multiplier == ["dense", "xla"]  # grouped, not depthwise, and narrow
    assert not kt.KernelChoice(impl="dense").keeps_cache
    assert kt.KernelChoice(impl="xla", tile=(4, 8)).name == "xla:4x8"


def test_candidates_on_gpu_read_no_predicate_on_the_host():
    # the tile and row kernels' loops of zero or one trip would: dense and Pallas only
    assert [c.impl for c in kt.candidates(_layer(), "gpu")] == ["dense", "pallas_gpu"]
    # a depthwise layer with a channel multiplier, which the Pallas kernel does not
    # compute: dense alone
    assert [c.impl for c in kt.candidates(_layer(cin=4, cout=8, groups=4), "gpu")] == ["dense"]


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.3, 0.5, 1.0])
def test_blob_mask_is_one_rectangle_of_the_fraction(fraction):
    m = kt.blob_mask(2, 20, 30, fraction)
    assert m.shape == (2, 20, 30) and (m[0] == m[1]).all()
    assert abs((~m).mean() - fraction) <= 0.03
    if 0 < fraction < 1:
        ys, xs = np.nonzero(~m[0])
        assert (~m[0][ys.min() : ys.max() + 1, xs.min() : xs.max() + 1]).all()


def test_expected_cost_interpolates_averages_and_counts_refreshes():
    fr = kt.FRACTIONS
    costs = [1.0 + 4.0 * f for f in fr]  # linear: 1 + 4f
    assert kt.expected_cost(costs, 0.375, None) == pytest.approx(2.5)
    assert kt.expected_cost(costs, None, None) == pytest.approx(3.0)  # the mean over [0, 1]
    # one frame in 10 fully dirty (cost 5)
    assert kt.expected_cost(costs, 0.375, 10) == pytest.approx(0.9 * 2.5 + 0.1 * 5.0)
    assert kt.expected_cost(costs, 2.0, None) == pytest.approx(5.0)  # clipped to [0, 1]
    with pytest.raises(ValueError, match="dirty fraction must be a number"):
        kt.expected_cost(costs, float("nan"), None)


def test_measure_times_every_fraction():
    got = kt.measure(_layer(), kt.KernelChoice(impl="xla"), (0.0, 1.0), repeats=1)
    assert len(got) == 2 and all(0 < t < 10 for t in got)


def test_candidates_of_a_layer_are_timed_in_turns():
    p = _layer()
    calls = []

    def fake_fn(name):
        def fn(x, w, mask, cached):
            calls.append((name, float(mask.mean())))
            return cached

        return fn

    x = w = cached = jnp.zeros(())
    group = {n: (fake_fn(n), x, w, cached) for n in ("a", "b")}
    out = kt._timed(p, group, (0.0, 1.0), repeats=2)
    assert set(out) == {"a", "b"} and all(len(v) == 2 for v in out.values())
    # warm-up round then 2 timed rounds; per fraction, a then b
    assert calls == [("a", 1.0), ("b", 1.0), ("a", 0.0), ("b", 0.0)] * 3


def _fake_timings(monkeypatch, costs):
    """Measurements by candidate impl: ``costs[impl](fraction)``; counts the calls."""
    calls = []
    monkeypatch.setattr(kt, "_compiled", lambda p, c, *inputs: c)

    def timed(p, group, fractions, repeats):
        calls.extend(group)
        return {name: tuple(costs[c.impl](f) for f in fractions) for name, c in group.items()}

    monkeypatch.setattr(kt, "_timed", timed)
    return calls


def test_tune_chooses_the_least_expected_cost_and_measures_once(monkeypatch, tmp_path):
    calls = _fake_timings(
        monkeypatch,
        {"dense": lambda f: 1.0, "xla": lambda f: 0.1 + 1.5 * f, "rows": lambda f: 0.3 + 0.8 * f},
    )
    layers = [_layer(), _layer(), _layer(h=10)]
    cache = kt.TuningCache(tmp_path / "t.json")
    out = kt.tune(layers, "cpu", cache=cache, fractions=[0.05, 0.5, 0.95])
    assert [t.choice.impl for t in out] == ["xla", "rows", "dense"]
    assert len(calls) == 6  # two geometries, three candidates each
    assert out[1].expected["rows:" + str(out[1].choice.chunk)] == pytest.approx(0.7)
    again = kt.tune(layers, "cpu", cache=kt.TuningCache(tmp_path / "t.json"), fractions=[0.05] * 3)
    assert len(calls) == 6  # read from the file
    assert [t.choice.impl for t in again] == ["xla"] * 3
    # without fractions every fraction counts alike, a refresh every 2 frames included
    uniform = kt.tune(layers[:1], "cpu", cache=cache, refresh_every=2)[0]
    assert uniform.expected["xla"] == pytest.approx(0.5 * 0.85 + 0.5 * 1.6)


def test_the_dense_candidate_costs_the_least_of_its_timings(monkeypatch, tmp_path):
    """The dense candidate reads no mask: a slow timing at one fraction (a burst
    of load) does not make it dearer there, nor a sparse kernel look cheaper."""
    noisy = {0.0: 1.0, 0.125: 2.1, 0.25: 1.9, 0.5: 2.2, 1.0: 2.0}
    _fake_timings(monkeypatch, {"dense": noisy.get, "xla": lambda f: 0.2 + 2.4 * f,
                                "rows": lambda f: 5.0})  # fmt: skip
    cache = kt.TuningCache(tmp_path / "t.json")
    t = kt.tune([_layer()], "cpu", cache=cache, fractions=[0.5])[0]
    assert t.costs["dense"] == (1.0,) * len(kt.FRACTIONS)
    assert t.expected["dense"] == 1.0 and t.choice.impl == "dense"  # xla: 1.4 at a half
    # the file keeps what was timed
    key = kt.layer_key(_layer(), jnp.float32)
    assert cache.get(kt.machine_key(), key, "dense") == (1.0, 2.1, 1.9, 2.2, 2.0)


@pytest.mark.parametrize("prune, compiles_first", [(False, 6), (True, 3)])
def test_every_compile_ends_before_any_timing_and_a_layers_candidates_share_inputs(
    monkeypatch, tmp_path, prune, compiles_first
):
    """The caller's compiles (``precompile``) and the candidates' run on the
    pool, all finished before the first timed call; one input per layer. With
    pruning the class's probe is compiled and timed first, then the rest: no
    compile runs beside a timing either way."""
    log, inputs = [], {}

    def compiled(p, c, x, w):
        time.sleep(0.02)  # let the pool's threads interleave
        inputs.setdefault(kt.layer_key(p), set()).add((id(x), id(w)))
        log.append("compile")
        return c

    def timed(p, group, fractions, repeats):
        log.append("time")
        return {name: tuple(1.0 for _ in fractions) for name in group}

    monkeypatch.setattr(kt, "_compiled", compiled)
    monkeypatch.setattr(kt, "_timed", timed)
    jobs = [lambda: (time.sleep(0.05), log.append("job")) for _ in range(2)]
    kt.tune([_layer(), _layer(h=10)], "cpu", cache=kt.TuningCache(tmp_path / "t.json"),
            precompile=jobs, prune=prune)  # fmt: skip
    # every kind ties on the probe, so every kind is measured on the other layer
    assert log.count("compile") == 6 and log.count("job") == 2 and log.count("time") == 2
    first, last = log.index("time"), len(log) - 1 - log[::-1].index("time")
    assert log[:first].count("compile") == compiles_first and log[:first].count("job") == 2
    assert log[first + 1 : last].count("compile") == 6 - compiles_first
    assert last == len(log) - 1  # nothing compiles after the last timing
    assert all(len(v) == 1 for v in inputs.values()) and len(inputs) == 2


def test_a_kind_that_loses_on_its_class_probe_is_not_measured_on_the_class(monkeypatch, tmp_path):
    """The tile kernel loses every fraction below 1 on the 3x3 class's largest
    layer: the class's other layers measure the dense candidate and the row
    kernel only, and the file records the tile kernel as passed over for them,
    so that a second tuning measures nothing. A 1x1 layer is its own class."""
    costs = {"dense": lambda f: 1.0, "xla": lambda f: 0.1 + 1.5 * f,
             "rows": lambda f: 0.05 + 0.5 * f}  # fmt: skip
    calls = _fake_timings(monkeypatch, costs)
    big, small, pointwise = _layer(h=16), _layer(h=10), _layer(h=12, k=1)
    layers = [small, big, pointwise, small]
    path = tmp_path / "t.json"
    out = kt.tune(layers, "cpu", cache=kt.TuningCache(path), fractions=[0.1] * 4)
    assert len(calls) == 3 + 2 + 3  # the 3x3 probe, the smaller 3x3 layer, the 1x1 probe
    assert [t.choice.impl for t in out] == ["rows"] * 4
    assert "xla" not in out[0].costs and "xla" in out[1].costs and "xla" in out[2].costs
    key = kt.layer_key(small, jnp.float32)
    cache = kt.TuningCache(path)
    assert cache.get(kt.machine_key(), key, "xla") == () and cache.puts == 0
    again = kt.tune(layers, "cpu", cache=cache, fractions=[0.1] * 4)
    assert len(calls) == 8 and cache.puts == 0  # nothing measured the second time
    assert [t.choice for t in again] == [t.choice for t in out]
    # without pruning every candidate of every layer is measured
    kt.tune(layers, "cpu", cache=kt.TuningCache(tmp_path / "all.json"), prune=False)
    assert len(calls) == 8 + 9
    # where the tile kernel wins at the lowest fractions on the probe, it is kept
    costs["xla"] = lambda f: 0.01 + 1.5 * f
    kt.tune(layers, "cpu", cache=kt.TuningCache(tmp_path / "both.json"))
    assert len(calls) == 17 + 9


def test_layers_of_one_geometry_measure_every_candidate_any_of_them_has(monkeypatch, tmp_path):
    """A scattered layer's row kernel takes another smallest step than a blob
    layer's of the same geometry: both are measured, each layer chooses among
    its own."""
    calls = _fake_timings(monkeypatch, {"dense": lambda f: 1.0, "xla": lambda f: 0.9,
                                        "rows": lambda f: 0.1})  # fmt: skip
    p = _layer(h=56, cin=64, cout=64)
    blob, scattered = (kt.candidates(p, "cpu", sc)[-1].name for sc in (False, True))
    assert blob != scattered  # e.g. "rows:64" and "rows"
    out = kt.tune([p, p], "cpu", cache=kt.TuningCache(tmp_path / "t.json"),
                  scattered=[False, True])  # fmt: skip
    assert sorted(calls) == sorted(["dense", "xla", blob, scattered])
    assert [t.choice.name for t in out] == [blob, scattered]


def test_resolve_tuning(monkeypatch):
    monkeypatch.delenv(kt.TUNING_ENV, raising=False)
    assert kt.resolve_tuning(None) == "measure"
    monkeypatch.setenv(kt.TUNING_ENV, "prior")
    assert kt.resolve_tuning(None) == "prior"
    assert kt.resolve_tuning("measure") == "measure"
    monkeypatch.setenv(kt.TUNING_ENV, "fast")
    with pytest.raises(ValueError, match=r"\$DCJAX_TUNING must be one of"):
        kt.resolve_tuning(None)
