"""The planning pass: per-layer decisions from the analysis and the config, made once."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dcjax.config import Config, RefineConfig, SemanticConfig
from dcjax.kernels import chain as chain_lib
from dcjax.plan import make_plan
from dcjax.transforms.analysis import analyze
from dcjax.transforms.spatial import Spatial
from dcjax.transforms.trace import trace_model
from tests.transforms.small_models import create


def _analysis(model, variables, size: int = 32, channels: int = 3):
    traced = trace_model(model, variables, (size, size, channels))
    n = len(traced.leaves)
    frame = Spatial(axes=(1, 2), size=(size, size), stride=(1, 1))
    return analyze(traced.jaxpr, [None] * n + [frame], [False] * n + [True])


def _zoo(name: str, size: int = 32):
    return _analysis(*create(name, size), size)


def _conv(x, w):
    return jax.lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def test_a_plan_is_pure_and_frozen():
    an = _zoo("resnet")
    a, b = make_plan(an, Config(), "cpu"), make_plan(an, Config(), "cpu")
    assert a == b
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.layers[0].keeps_cache = False  # type: ignore[misc]
    assert [lp.layer.index for lp in a.layers] == list(range(len(an.layers)))
    assert a.total_flops == sum(lay.flops for lay in an.layers) + an.other_flops


def test_the_kernel_decides_which_layers_keep_a_cache():
    an = _zoo("resnet")
    assert not any(make_plan(an, Config(kernel="dense"), "cpu").keeps_cache)
    assert all(make_plan(an, Config(kernel="reference"), "cpu").keeps_cache)
    # semantic exits that never reuse keep no cache whatever the kernel
    never = Config(kernel="reference", psnr_threshold=float("inf"), semantic=SemanticConfig())
    plan = make_plan(an, never, "cpu")
    assert plan.semantic_dense and not any(plan.keeps_cache)


def test_refined_layers_keep_a_cache_and_layers_reading_one_map_share_its_test():
    an = _zoo("inception")
    cfg = Config(kernel="reference", refine=RefineConfig(layers="all"))
    plan = make_plan(an, cfg, "cpu")
    assert plan.refines and all(plan.refined)
    # branch 1's 1x1 and branch 2's first 1x1 read the stem's output: one owner
    inputs = [lp.layer.in_shape for lp in plan.layers]
    assert inputs[1] == inputs[2] and plan.layers[2].ref_owner == 1
    assert plan.layers[1].owns_reference and not plan.layers[2].owns_reference
    owners = [lp.ref_owner for lp in plan.layers]
    assert all(owners[o] == o for o in owners)  # an owner owns itself
    # a layer computed in full has nothing to reuse: no test
    dense = make_plan(an, dataclasses.replace(cfg, kernel="dense"), "cpu")
    assert not any(dense.refined) and all(lp.ref_owner == lp.layer.index for lp in dense.layers)
    assert not any(make_plan(an, Config(kernel="reference"), "cpu").refined)


def test_epilogues_follow_fuse_epilogues_the_tpu_kernel_and_exits():
    an = _zoo("resnet")
    fused = make_plan(an, Config(kernel="reference"), "cpu")
    # bias; batch norm and relu; batch norm, the residual add and relu
    assert fused.epilogues[0] == ("add",)
    assert fused.epilogues[1] == ("sub", "mul", "add", "custom_jvp_call")
    assert fused.epilogues[2] == ("sub", "mul", "add", "add", "custom_jvp_call")
    assert all(fused.epilogues)
    assert not any(make_plan(an, Config(kernel="reference", fuse_epilogues=False), "cpu").epilogues)
    # the Pallas TPU kernel takes no epilogue, named or chosen on a TPU
    assert not any(make_plan(an, Config(kernel="pallas_tpu"), "cpu").epilogues)
    assert not any(make_plan(an, Config(kernel="pallas"), "tpu").epilogues)
    assert all(make_plan(an, Config(kernel="pallas"), "gpu").epilogues)
    assert not any(
        make_plan(an, Config(kernel="reference", semantic=SemanticConfig()), "cpu").epilogues
    )


def test_inverted_residual_chains_are_planned_only_with_fuse_blocks(monkeypatch):
    monkeypatch.setattr(chain_lib, "chain_pays", lambda hw: True)
    an = _zoo("mobilenet")
    assert not make_plan(an, Config(), "cpu").chains
    plan = make_plan(an, Config(fuse_blocks=True), "cpu")
    chain = (1, 2, 3)  # the block's expansion, depthwise and projection
    assert {i: plan.chains[i] for i in chain} == dict.fromkeys(chain, chain)
    assert [plan.layers[i].deferred for i in chain] == [True, True, False]
    assert [plan.layers[i].keeps_cache for i in chain] == [False, False, True]
    assert all(plan.layers[i].epilogue for i in chain)


def _wide_dense_model():
    """A conv, then a fully connected layer of 2048 x 2048 (4 Mi weights) and a head."""
    w = jax.random.normal(jax.random.key(0), (1, 1, 3, 2))
    big = jax.random.normal(jax.random.key(1), (2048, 2048)) / 64
    head = jax.random.normal(jax.random.key(2), (2048, 8))

    def fn(params, x):
        w, big, head = params
        y = jax.nn.relu(_conv(x, w)).reshape(1, -1)
        return jax.nn.relu(y @ big) @ head

    return fn, (w, big, head)


def test_fully_connected_layers_are_updated_by_rows_where_planned():
    an = _analysis(*_wide_dense_model())
    assert [(d.in_features, d.out_features) for d in an.dense_layers] == [(2048, 2048), (2048, 8)]
    cpu = make_plan(an, Config(), "cpu")
    assert cpu.updated_dense == (True, False) and cpu.dense[0].exact and cpu.keeps_dense_state
    assert cpu.dense[0].delta == 0.0
    # on GPU the masked product would cost the full one; without dense_updates none
    for plan in (make_plan(an, Config(), "gpu"), make_plan(an, Config(dense_updates=False), "cpu")):
        assert plan.updated_dense == (False, False) and not plan.keeps_dense_state
    refined = make_plan(an, Config(refine=RefineConfig(delta=0.1)), "gpu")
    assert refined.updated_dense == (True, False) and refined.dense[0].delta == 0.1
    assert not refined.dense[0].exact and refined.keeps_dense_state


def test_still_frames_skip_the_network_unless_exits_or_an_unsupported_primitive():
    an = _zoo("plain")
    assert make_plan(an, Config(), "cpu").skips_still
    assert not make_plan(an, Config(skip_unchanged=False), "cpu").skips_still
    assert not make_plan(an, Config(semantic=SemanticConfig()), "cpu").skips_still
    perm = jnp.asarray(np.random.default_rng(0).permutation(16))

    def fn(w, x):
        return _conv(jnp.take(_conv(x, w), perm, axis=2), w)  # a gather no rule covers

    w = jax.random.normal(jax.random.key(0), (3, 3, 4, 4))
    odd = make_plan(_analysis(fn, w, 16, 4), Config(), "cpu")
    assert odd.unsupported == ("gather",) and not odd.skips_still
