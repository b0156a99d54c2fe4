"""The dense lowerings chosen by measurement (`dcjax.kernels.lowering_tuning`): every
lowering equals XLA's convolution, the fastest measured is the one every path
traces, and a geometry is measured once per machine."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dcjax.kernels import ConvGeometry, dense_conv_eqn, masked_conv, plan
from dcjax.kernels import lowering as lw
from dcjax.kernels import tuning as kt
from dcjax.kernels.lowering_tuning import tune_lowerings
from dcjax.kernels.tiles import layer_key, pad_input
from tests.kernels._strategies import all_eqns

_DN = ("NHWC", "HWIO", "NHWC")

# (x shape, w shape, strides, padding, dilation, groups): every lowering applies to one
GEOMETRIES = [
    ((1, 13, 11, 3), (3, 3, 3, 24), (2, 2), ((1, 1), (1, 1)), (1, 1), 1),  # conv dot taps rgb
    ((1, 9, 9, 16), (1, 1, 16, 8), (1, 1), ((0, 0), (0, 0)), (1, 1), 1),  # 1x1
    ((1, 12, 10, 1), (5, 5, 1, 4), (1, 1), ((2, 1), (1, 2)), (1, 1), 1),  # 25 taps
    ((1, 14, 14, 16), (3, 3, 16, 8), (1, 1), ((2, 2), (2, 2)), (2, 2), 1),  # dilated
    ((2, 12, 12, 6), (3, 3, 1, 6), (2, 2), ((1, 1), (1, 1)), (1, 1), 6),  # depthwise, batch 2
    ((1, 10, 10, 8), (3, 3, 4, 6), (1, 1), ((1, 1), (1, 1)), (1, 1), 2),  # two groups
]


def _case(xs, ws, strides, padding, dilation, groups):
    geom = ConvGeometry(strides=strides, padding=padding, dilation=dilation, groups=groups)
    rng = np.random.default_rng(sum(xs) + sum(ws))
    x = rng.normal(size=xs).astype(np.float32)
    w = rng.normal(size=ws).astype(np.float32)
    want = np.asarray(
        jax.lax.conv_general_dilated(
            x,
            w,
            strides,
            padding,
            rhs_dilation=dilation,
            dimension_numbers=_DN,
            feature_group_count=groups,
            precision="highest",
        )
    )
    return geom, plan(xs, ws, geom), x, w, want


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_every_lowering_equals_the_convolution(geometry) -> None:
    """Each lowering of `lowerings`, as the whole convolution (`dense_conv`) and on
    the padded input (`valid_conv`, the tile kernel's batched form), equals XLA's
    convolution."""
    geom, p, x, w, want = _case(*geometry)
    ways = lw.lowerings(p)
    assert ways[0] == "conv" and len(ways) >= 2 and set(ways) <= set(lw.LOWERINGS)
    assert lw.prior(p) in ways
    for how in ways:
        got = jax.jit(lambda x, w, how=how: lw.dense_conv(x, w, p, how))(x, w)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4, err_msg=how)

        def valid(x, w, how=how):
            return lw.valid_conv(pad_input(x, p), lw.group_weights(w, p, how), p, how)

        got = np.asarray(jax.jit(valid)(x, w))[:, : p.ho, : p.wo]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=how)


def test_a_choice_the_layer_cannot_take_is_refused() -> None:
    _, p, *_ = _case(*GEOMETRIES[4])  # depthwise: no matrix product of patches
    with pytest.raises(ValueError, match="lowering 'dot' cannot compute .* one of"):
        lw.choices([(p, "dot")])


def test_choices_hold_inside_their_block_only_and_for_every_batch() -> None:
    """`use` sets the lowerings of the layers it names for its block (and for
    the same layer at another batch: pooled streams); nested blocks restore the
    outer one, and outside every block the fixed rules decide."""
    _, p, *_ = _case(*GEOMETRIES[1])  # 1x1: the fixed rules' "dot"
    pooled = dataclasses.replace(p, n=4)
    assert lw.chosen(p) == lw.prior(p)
    with lw.use(lw.choices([(p, "conv")])):
        assert lw.chosen(p) == lw.chosen(pooled) == "conv"
        with lw.use({}):
            assert lw.chosen(p) == lw.prior(p)
        assert lw.chosen(p) == "conv"
        assert lw.chosen(p, jnp.bfloat16) == lw.prior(p)  # measured in float32 only
    assert lw.chosen(p) == lw.prior(p)


def _conv_eqn(geom, x, w):
    def conv(x, w):
        return jax.lax.conv_general_dilated(
            x, w, geom.strides, geom.padding, rhs_dilation=geom.dilation,
            dimension_numbers=_DN, feature_group_count=geom.groups,
        )  # fmt: skip

    return jax.make_jaxpr(conv)(x, w).jaxpr.eqns[0]


def _primitives(fn, *args) -> set[str]:
    return {e.primitive.name for e in all_eqns(jax.make_jaxpr(fn)(*args).jaxpr)}


def test_the_fastest_measured_lowering_is_chosen_and_the_dense_path_takes_it(tmp_path) -> None:
    """Measurements in the file decide (nothing is measured again): inside `use`
    the dense path traces the fastest and the tile kernel's windows the fixed
    rules' (the measurements time whole maps), outside it both the fixed rules'."""
    geom, p, x, w, want = _case(*GEOMETRIES[0])
    cache = kt.TuningCache(tmp_path / "t.json")
    machine, key = kt.machine_key(), layer_key(p)
    costs = {"conv": 3e-3, "dot": 2e-3, "taps": 1e-3, "rgb": 4e-3}
    for how, s in costs.items():
        cache.put(machine, key, kt.LOWERING_PREFIX + how, (s,))
    cache.save()
    before = cache.puts
    (got,) = tune_lowerings([p], cache=cache)
    assert cache.puts == before  # read, not measured
    assert got.choice == "taps" and got.costs == costs
    assert got.prior == lw.prior(p) and lw.chosen(p) == got.prior  # nothing recorded
    eqn = _conv_eqn(geom, x, w)
    mask = np.ones((1, p.ho, p.wo), bool)
    mask[0, 1:3, 2:5] = False
    cached = np.zeros((1, p.ho, p.wo, 24), np.float32)
    paths = {
        "dense": (lambda x, w: dense_conv_eqn(eqn, (x, w)), np.ones_like(mask)),
        "sparse": (lambda x, w: masked_conv(x, w, mask, cached, geom, impl="xla"), ~mask),
    }
    for name, (fn, fresh) in paths.items():
        with lw.use(lw.choices([(p, got.choice)])):
            summed = "conv_general_dilated" not in _primitives(fn, x, w)  # a sum of taps
            assert summed is (name == "dense"), name
            out = np.asarray(jax.jit(fn)(x, w))
        np.testing.assert_allclose(out[fresh], want[fresh], rtol=1e-4, atol=1e-4, err_msg=name)
    on_cpu = jax.default_backend() == "cpu"  # the fixed rules: a zero fourth channel on CPU
    fresh = jax.make_jaxpr(lambda x, w: dense_conv_eqn(eqn, (x, w)))(x, w)  # traced anew
    convs = [e for e in all_eqns(fresh.jaxpr) if e.primitive.name == "conv_general_dilated"]
    assert [e.invars[0].aval.shape[-1] for e in convs] == [4 if on_cpu else 3]


def test_a_geometry_is_measured_once_per_machine(tmp_path) -> None:
    """With an empty file every lowering of each distinct geometry is timed once
    (positive seconds), the least is chosen, and a second tuning reads the file."""
    _, p, *_ = _case(*GEOMETRIES[1])
    _, q, *_ = _case(*GEOMETRIES[5])
    path = tmp_path / "t.json"
    cache = kt.TuningCache(path)
    first = tune_lowerings([p, q, p], cache=cache)
    assert cache.puts == len(lw.lowerings(p)) + len(lw.lowerings(q))
    for t, layer in zip(first, (p, q, p), strict=True):
        assert set(t.costs) == set(lw.lowerings(layer))
        assert all(0 < s < 1 for s in t.costs.values())
        assert t.choice == min(t.costs, key=t.costs.get)
    again = kt.TuningCache(path)
    assert [t.costs for t in tune_lowerings([p, q], cache=again)] == [t.costs for t in first[:2]]
    assert again.puts == 0


def test_tune_compiles_every_candidate_by_the_fixed_rules(monkeypatch, tmp_path) -> None:
    """The kernel candidates, the dense one included, are traced with the fixed
    lowering rules even inside a block that names another lowering: the rules a
    step that reuses takes. Their measurements keep the candidates' own names."""
    compiled = []

    def fake_compiled(p, c, *inputs):
        compiled.append((c.impl, lw.chosen(p)))  # what its trace would take
        return c

    monkeypatch.setattr(kt, "_compiled", fake_compiled)
    monkeypatch.setattr(
        kt, "_timed", lambda p, group, fractions, repeats: {
            name: tuple(0.5 if c.impl == "dense" else 1.0 for _ in fractions)
            for name, c in group.items()
        },
    )  # fmt: skip
    _, p, *_ = _case(*GEOMETRIES[1])  # 1x1: the fixed rules' "dot"
    cache = kt.TuningCache(tmp_path / "t.json")
    with lw.use(lw.choices([(p, "conv")])):
        assert lw.chosen(p) == "conv"
        (t,) = kt.tune([p], "cpu", cache=cache, fractions=[0.5])
    cands = kt.candidates(p, "cpu")
    assert sorted(compiled) == sorted((c.impl, "dot") for c in cands)
    assert t.choice.impl == "dense" and t.costs["dense"] == (0.5,) * len(kt.FRACTIONS)
    assert set(cache._data[kt.machine_key()][layer_key(p)]) == {c.name for c in cands}
