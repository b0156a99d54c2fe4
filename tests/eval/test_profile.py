"""`dcjax.eval.profile`: HLO parsing, grouping, and per-layer times of real runs."""
# ruff: noqa: E501

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dcjax.eval import profile as P
from dcjax.eval.registry import ModelSpec, make_runner

HLO = """HloModule jit_step, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]{0}) parameter(0)
  ROOT %t = (s32[], f32[4]{0}) tuple(%p), metadata={op_name="jit(step)/Net/conv2/conv/while/body/add"}
}

%c (p0: f32[4]) -> f32[4] {
  %p0 = f32[4]{0} parameter(0)
  ROOT %cv = f32[4]{0} convolution(%p0, %p0), dim_labels=b0f_0io->b0f
}

%h (p1: f32[4]) -> f32[4] {
  %p1 = f32[4]{0} parameter(0)
  %ix = s32[] constant(0)
  ROOT %ds = f32[4]{0} dynamic-slice(%p1, %ix), dynamic_slice_sizes={4}
}

ENTRY %main.1 (x.1: f32[4], w.1: f32[4,4]) -> f32[4] {
  %x.1 = f32[4]{0} parameter(0), metadata={op_name="x"}
  %w.1 = f32[4,4]{1,0} parameter(1), metadata={op_name="leaves[0]"}
  %conv_fusion = f32[4]{0} fusion(%x.1), kind=kLoop, calls=%c, metadata={op_name="jit(step)/Net/conv1/conv/conv_general_dilated"}
  %copy.3 = f32[4]{0} copy(%conv_fusion)
  %while.7 = (s32[], f32[4]{0}) while(%tuple.2), condition=%cond, body=%body, metadata={op_name="jit(step)/Net/conv2/conv/while"}
  %dot.1 = f32[4]{0} dot(%conv_fusion, %w.1), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  %hoisted = f32[4]{0} fusion(%x.1), kind=kLoop, calls=%h, metadata={op_name="jit(step)/dcjax.match/jit(_search)/while/body/mul"}
  %lone = f32[4]{0} copy(%x.1)
  ROOT %out = f32[4]{0} add(%dot.1, %hoisted), metadata={op_name="jit(step)/Net/add"}
}
"""


def test_top_level_ops_and_groups_from_hlo_text():
    module, ops = P.top_level_ops(HLO)
    assert module == "jit_step"
    assert list(ops) == ["conv_fusion", "copy.3", "while.7", "dot.1", "hoisted", "lone", "out"]
    layers = ["Net/conv1/conv", "Net/conv2/conv"]
    groups = {op: P.group_of(name, layers) for op, name in ops.items()}
    assert groups == {
        "conv_fusion": "Net/conv1/conv",
        "copy.3": "Net/conv1/conv",  # no metadata: its operand's
        "while.7": "Net/conv2/conv",  # a loop, tuple-typed, goes to its layer
        "dot.1": "(dot)",  # a matrix product without metadata is a group of its own
        "hoisted": "dcjax.match",  # hoisted out of the matcher's loop
        "lone": "(copy)",  # nothing named upstream
        "out": "Net",
    }
    assert P.group_of("jit(step)/leaves[0]", layers) == P.OUTSIDE


def test_executed_ops_list_loop_bodies_and_set_the_loops_apart():
    module, ops, control = P.executed_ops(HLO)
    assert module == "jit_step"
    _, top = P.top_level_ops(HLO)
    assert top.items() <= ops.items()
    # the loop body's operation is listed, under its own scope
    assert ops["t"] == "jit(step)/Net/conv2/conv/while/body/add"
    assert P.group_of(ops["t"], ["Net/conv1/conv", "Net/conv2/conv"]) == "Net/conv2/conv"
    assert control == {"while.7"}


def test_op_kinds_from_what_each_operation_computes():
    kinds = P.op_kinds(HLO)
    assert {
        op: kinds[op] for op in ("conv_fusion", "copy.3", "dot.1", "hoisted", "lone", "out", "t")
    } == {
        "conv_fusion": "products",  # a fusion of a convolution
        "copy.3": "copies",
        "dot.1": "products",
        "hoisted": "gathers, scatters, slices",  # its fused computation slices at a dynamic index
        "lone": "copies",
        "out": "other",
        "t": "other",  # inside the loop body
    }
    assert "while.7" not in kinds  # a loop's time is its operations'
    assert set(kinds.values()) <= set(P.KINDS)


def test_union_of_spans():
    assert P._union([]) == 0.0
    assert P._union([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0), (5.5, 5.7)]) == 4.0


class _Lopsided(nn.Module):
    """A light 1x1 convolution from 3 to 4 channels, then a heavy 5x5 one with 128.

    The light layer comes first: whatever XLA fuses into a layer's group (the
    activation, a pool) then reads a 4-channel map, not the heavy one's output,
    so the two groups differ by ~1000x in work and the ordering is robust to a
    loaded machine.
    """

    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(4, (1, 1), name="light")(x))
        x = nn.Conv(128, (5, 5), padding="SAME", name="heavy")(x)
        return nn.max_pool(x, (2, 2), strides=(2, 2))


@pytest.fixture(scope="module")
def lopsided() -> ModelSpec:
    module = _Lopsided()
    variables = module.init(jax.random.key(0), jnp.zeros((1, 96, 96, 3)))
    return ModelSpec(name="lopsided", module=module, variables=variables, frame_shape=(96, 96, 3))


def test_profile_charges_layers_by_their_work(lopsided):
    from dcjax.eval.harness import load_frames

    frames = load_frames("vtest", lopsided.frame_shape, frames=6)
    runner = make_runner(lopsided, "nocache")
    light, heavy = (layer.name for layer in runner.layers)
    nocache = P.profile(runner, frames, warmup=2)
    assert nocache.frames == 4 and nocache.wall_ms > 0
    assert nocache.groups[heavy] > 3 * nocache.groups[light] > 0
    # the operations cover the step: at least half its wall time, less than 4 threads' worth
    assert 0.5 * nocache.wall_ms < nocache.total_ms < 4 * nocache.wall_ms
    # the kinds split the same operations: convolutions, and no dynamic indexing
    # without a cache (the pool is static slices)
    assert sum(nocache.kinds.values()) == pytest.approx(nocache.total_ms)
    assert nocache.kinds["products"] > 0 and nocache.kinds["gathers, scatters, slices"] == 0
    assert 0 < nocache.busy_ms <= nocache.total_ms * (1 + 1e-9)
    # vtest's first frames at 96x96 match whole: the step would skip the network on
    # them (`skip_unchanged`), the profile runs it to see every layer
    runner = make_runner(lopsided, "deepcache")
    assert runner.cached.config.skip_unchanged
    cached = P.profile(runner, frames, warmup=2)
    assert cached.groups["dcjax.match"] > 0 and heavy in cached.groups
    assert set(cached.as_dict()) >= {"method", "wall_ms", "groups", "total_ms", "kinds", "busy_ms"}
    assert sum(cached.kinds.values()) == pytest.approx(cached.total_ms)


def test_profile_charges_the_work_inside_loops_to_their_layer():
    """The sparse kernels run their work in loops of data-dependent trip counts;
    XLA:CPU records a loop's body as operations of their own (possibly on
    another thread, after the loop's own event has ended), and those go to the
    layer whose scope they carry, not to the loop's event."""
    from dcjax.eval.registry import LayerFlops, Runner

    w = jax.random.normal(jax.random.key(0), (384, 384), jnp.float32) / 20

    @jax.jit
    def step(state, frame):
        trips = (frame[0, 0, 0] < 255).astype(jnp.int32) * 12  # a dynamic trip count
        with jax.named_scope("Net/heavy/conv"):
            y = jax.lax.fori_loop(0, trips, lambda i, y: jnp.tanh(y @ w), state)
        with jax.named_scope("Net/light/conv"):
            out = jnp.sum(y) + jnp.mean(frame.astype(jnp.float32))
        return out, y, {}

    runner = Runner(
        method="loop", init=lambda: jnp.ones((384, 384), jnp.float32), step=step,
        layers=(LayerFlops(name="Net/heavy/conv", flops=1), LayerFlops(name="Net/light/conv", flops=1)),
        config={},
    )  # fmt: skip
    frames = np.zeros((6, 8, 8, 3), np.uint8)
    prof = P.profile(runner, frames, warmup=2)
    heavy, light = prof.groups["Net/heavy/conv"], prof.groups.get("Net/light/conv", 0.0)
    # twelve 384x384 products take most of the frame; the loop's own bookkeeping is not them
    assert heavy > 0.5 * prof.wall_ms and heavy > 10 * light
    assert prof.ops["Net/heavy/conv"] >= 12  # each product counted, inside the loop


def test_profile_needs_timed_frames_and_a_jitted_step(lopsided):
    from dcjax.eval.harness import load_frames

    frames = load_frames("vtest", lopsided.frame_shape, frames=3)
    runner = make_runner(lopsided, "nocache")
    with pytest.raises(ValueError, match="more than 3 frames"):
        P.profile(runner, frames, warmup=3)
    unjitted = type(runner)(**{**runner.__dict__, "step": lambda s, f: runner.step(s, f)})
    with pytest.raises(ValueError, match="no jitted step"):
        P.profile(unjitted, frames, warmup=1)


def test_table_rows_align_groups_across_profiles():
    a = {"groups": {"Net/conv1": 1.0, "dcjax.match": 0.25}, "total_ms": 1.25, "wall_ms": 1.5}
    long = "Net/" + "x" * 60
    b = {"groups": {"Net/conv1": 0.5, long: 2.0}, "total_ms": 2.5, "wall_ms": 2.0}
    rows = P.table_rows([("deepcache", a), ("nocache", b)])
    assert [r["group"] for r in rows] == [
        "Net/conv1", "dcjax.match", "…" + long[-39:], "all operations", "wall time (median)",
    ]  # fmt: skip
    assert [(r["deepcache"], r["nocache"]) for r in rows] == [
        ("1.00", "0.50"), ("0.25", "-"), ("-", "2.00"), ("1.25", "2.50"), ("1.50", "2.00"),
    ]  # fmt: skip
    counted = {**a, "ops": {"Net/conv1": 12.0, "dcjax.match": 30.5}}
    rows = P.table_rows([("deepcache", counted), ("nocache", b)])
    assert rows[-1] == {"group": "operations a frame", "deepcache": "42", "nocache": "-"}
    kinds = dict(zip(P.KINDS, (1.0, 0.125, 0.0, 0.125), strict=True))
    rows = P.table_rows([("deepcache", {**a, "kinds": kinds, "busy_ms": 1.25}), ("nocache", b)])
    assert [(r["group"], r["deepcache"], r["nocache"]) for r in rows[3:]] == [
        ("all operations", "1.25", "2.50"),
        ("  products", "1.00", "-"), ("  gathers, scatters, slices", "0.12", "-"),
        ("  copies", "0.00", "-"), ("  other", "0.12", "-"),
        ("wall time (median)", "1.50", "2.00"),
        ("  between operations", "0.25", "-"),
    ]  # fmt: skip
