"""Exit marks, jaxpr splitting and the nested conditionals of the compiled step."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dcjax
from dcjax import deepcache
from dcjax.transforms import exits
from tests.semantic import models

SHAPE = (models.SIZE, models.SIZE, 3)


def _convs(jaxpr) -> int:
    """conv_general_dilated equations in ``jaxpr`` and all its sub-jaxprs."""
    n = 0
    for eqn in jaxpr.eqns:
        n += eqn.primitive.name == "conv_general_dilated"
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            n += _convs(sub)
    return n


def _conds(jaxpr) -> list:
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "cond":
            out.append(eqn)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            out.extend(_conds(sub))
    return out


def test_exit_point_is_an_identity_mark():
    x = jnp.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(np.asarray(dcjax.exit_point(x, "a")), np.asarray(x))
    jaxpr = jax.make_jaxpr(lambda v: jnp.sin(dcjax.exit_point(v, "mid")))(x)
    names = [exits.mark_name(e) for e in jaxpr.jaxpr.eqns]
    assert names == ["mid", None]
    with pytest.raises(ValueError, match="non-empty string"):
        dcjax.exit_point(x, "")


def test_flax_submodules_are_marked_and_default_skips_the_last_block():
    module, variables = models.create()
    cached = deepcache.transform(
        module, variables, frame_shape=SHAPE,
        config=deepcache.Config(semantic=deepcache.SemanticConfig()),
    )  # fmt: skip
    # block3 is followed only by pooling and the dense head; fc is not a feature map
    assert cached.exit_points == ("block0", "block1", "block2")
    plan = cached._semantic.plan
    assert [len(s) for s in plan.segment_layers] == [1, 1, 1, 1]
    assert plan.flops_after[0] > plan.flops_after[1] > plan.flops_after[2] > 0


def test_named_and_nested_exit_points_and_errors():
    module, variables = models.create()
    cfg = deepcache.Config(semantic=deepcache.SemanticConfig(exit_points=("block2", "block0")))
    cached = deepcache.transform(module, variables, frame_shape=SHAPE, config=cfg)
    assert cached.exit_points == ("block0", "block2")  # in network order
    cfg = deepcache.Config(semantic=deepcache.SemanticConfig(exit_points=("block1/Conv_0",)))
    cached = deepcache.transform(module, variables, frame_shape=SHAPE, config=cfg)
    assert cached.exit_points == ("block1/Conv_0",)
    cfg = deepcache.Config(semantic=deepcache.SemanticConfig(exit_points=("nope",)))
    with pytest.raises(ValueError, match="'nope'.*not found"):
        deepcache.transform(module, variables, frame_shape=SHAPE, config=cfg)


def test_plain_function_marks():
    module, variables = models.create()
    params = variables["params"]

    def fn(v, x):
        block = lambda name, y, s: nn.relu(  # noqa: E731
            jax.lax.conv_general_dilated(
                y, v[name]["Conv_0"]["kernel"], (s, s), "SAME",
                dimension_numbers=("NHWC", "HWIO", "NHWC"),
            ) + v[name]["Conv_0"]["bias"]
        )  # fmt: skip
        x = dcjax.exit_point(block("block0", x, 2), "first")
        x = dcjax.exit_point(block("block1", x, 1), "second")
        x = block("block3", block("block2", x, 2), 1)
        return x.mean(axis=(1, 2)) @ v["fc"]["kernel"] + v["fc"]["bias"]

    cfg = deepcache.Config(semantic=deepcache.SemanticConfig(tau=float("inf")))
    cached = deepcache.transform(fn, params, frame_shape=SHAPE, config=cfg)
    assert cached.exit_points == ("first", "second")
    f = models.frames(1, 2)[0]
    out, _, info = cached.step(cached.init(), f)
    np.testing.assert_allclose(
        np.asarray(out), np.asarray(module.apply(variables, f[None])), rtol=1e-5, atol=1e-5
    )
    assert int(info["exit"]) == -1


def test_compiled_step_nests_the_remaining_layers_in_false_branches():
    module, variables = models.create()
    # the reference kernel (dense + select) adds no conditionals of its own
    cfg = deepcache.Config(kernel="reference", semantic=deepcache.SemanticConfig(tau=0.5))
    cached = deepcache.transform(module, variables, frame_shape=SHAPE, config=cfg)
    state = cached.init()
    jaxpr = jax.make_jaxpr(cached.step)(state, models.frames(1)[0]).jaxpr
    # the conditionals that hold layers (the matcher may add layer-free ones)
    conds = [c for c in _conds(jaxpr) if any(_convs(b.jaxpr) for b in c.params["branches"])]
    assert len(conds) == 3  # one per exit point, nested
    outer = next(c for c in conds if _convs(c.params["branches"][0].jaxpr) == 3)
    exit_branch, rest = outer.params["branches"][1].jaxpr, outer.params["branches"][0].jaxpr
    # lax.cond(pred, exit, rest): branches = (rest, exit); the exit computes no layer
    assert _convs(exit_branch) == 0
    assert _convs(rest) == 3  # block1, block2, block3
    inner = [c for c in _conds(rest) if any(_convs(b.jaxpr) for b in c.params["branches"])]
    assert len(inner) == 2
    assert sorted(_convs(c.params["branches"][0].jaxpr) for c in inner) == [1, 2]
    assert all(_convs(c.params["branches"][1].jaxpr) == 0 for c in inner)
    assert _convs(jaxpr) == 4  # block0 runs outside every conditional


def test_non_semantic_step_has_no_conditional_on_exits():
    module, variables = models.create()
    cached = deepcache.transform(module, variables, frame_shape=SHAPE)
    assert cached.exit_points == ()
    jaxpr = jax.make_jaxpr(cached.step)(cached.init(), models.frames(1)[0]).jaxpr
    assert not any(exits.mark_name(e) for e in jaxpr.eqns)
    assert cached.init().semantic is None
    with pytest.raises(ValueError, match="calibrate needs semantic exits"):
        cached.calibrate(models.frames(2))
