"""The caching interpreter and its policy object: what it calls, what it returns."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import jaxpr_as_fun

from dcjax.transforms import lowering
from dcjax.transforms.analysis import analyze
from dcjax.transforms.interpreter import Policy, evaluate, propagate_masks
from dcjax.transforms.motion import FrameContext
from dcjax.transforms.spatial import Spatial
from dcjax.transforms.trace import trace_model
from tests.transforms.small_models import create

SIZE = 32


def _traced(name: str):
    module, variables = create(name, SIZE)
    traced = trace_model(module, variables, (SIZE, SIZE, 3))
    n = len(traced.leaves)
    frame = Spatial(axes=(1, 2), size=(SIZE, SIZE), stride=(1, 1))
    analysis = analyze(traced.jaxpr, [None] * n + [frame], [False] * n + [True])
    x = jax.random.uniform(jax.random.key(1), (1, SIZE, SIZE, 3))
    return traced, analysis, [*traced.leaves, x]


def _masks(traced, r0):
    return [True] * len(traced.leaves) + [r0]


CTX = FrameContext(jnp.zeros((2,), jnp.int32), "exact")


def test_the_base_policy_computes_the_model():
    for name in ("plain", "resnet", "inception"):
        traced, analysis, args = _traced(name)
        ev = evaluate(analysis, args, _masks(traced, jnp.ones((SIZE, SIZE), bool)), CTX, Policy())
        want = jaxpr_as_fun(traced.jaxpr)(*args)
        for got, ref in zip(ev.outputs, want, strict=True):
            np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5, atol=1e-5)
        # every reused layer and fully connected layer reported, none twice
        assert sorted(ev.layers) == list(range(len(analysis.layers)))
        assert sorted(ev.dense) == list(range(len(analysis.dense_layers)))
        assert ev.refined == {} and ev.records == {}


class _Tagging(Policy):
    """Reuse results name the layer and carry its mask; dense results the product's shape."""

    def reuse(self, layer, eqn, invals, mask, epilogue):
        out, _ = super().reuse(layer, eqn, invals, mask, epilogue)
        return out, ("layer", layer, mask, epilogue is not None)

    def dense(self, index, eqn, invals):
        y = lowering.bind(eqn, invals)[0]
        return y, ("dense", index, y.shape)


def test_results_are_returned_per_layer_with_the_layers_output_mask():
    traced, analysis, args = _traced("plain")
    r0 = jnp.zeros((SIZE, SIZE), bool).at[:, : SIZE // 2].set(True)
    ev = evaluate(analysis, args, _masks(traced, r0), CTX, _Tagging())
    assert [ev.layers[i][:2] for i in range(2)] == [("layer", 0), ("layer", 1)]
    first = np.asarray(ev.layers[0][2])
    assert first.shape == analysis.layers[0].out_shape[1:3]
    # half the input reusable: the first layer reuses part of its output, not all
    assert 0 < first.mean() < 1
    assert ev.dense == {0: ("dense", 0, (1, 5))}
    assert not any(r[3] for r in ev.layers.values())  # `fuses` is false by default


class _Fusing(_Tagging):
    def fuses(self, layer):
        return True


def test_fused_layers_get_their_epilogue_and_give_the_same_outputs():
    traced, analysis, args = _traced("resnet")
    masks = _masks(traced, jnp.ones((SIZE, SIZE), bool))
    plain = evaluate(analysis, args, masks, CTX, _Tagging())
    fused = evaluate(analysis, args, masks, CTX, _Fusing())
    assert all(r[3] for r in fused.layers.values())
    for a, b in zip(fused.outputs, plain.outputs, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


class _AllReusable(Policy):
    """Refinement that declares every input pixel reusable, and records it."""

    refines = True

    def refine(self, layer, x, in_mask):
        return jnp.ones(x.shape[1:3], bool), ("refined", layer, x.shape)

    def reuse(self, layer, eqn, invals, mask, epilogue):
        out, _ = super().reuse(layer, eqn, invals, mask, epilogue)
        return out, mask


def test_refine_is_called_only_when_the_policy_refines_and_its_mask_is_used():
    traced, analysis, args = _traced("plain")
    nothing = jnp.zeros((SIZE, SIZE), bool)
    ev = evaluate(analysis, args, _masks(traced, nothing), CTX, _AllReusable())
    assert ev.refined == {i: ("refined", i, lay.in_shape) for i, lay in enumerate(analysis.layers)}
    # with no motion, an all-reusable input gives an all-reusable output
    assert all(bool(np.asarray(m).all()) for m in ev.layers.values())
    off = type("NoRefine", (_AllReusable,), {"refines": False})()
    ev = evaluate(analysis, args, _masks(traced, nothing), CTX, off)
    assert ev.refined == {} and not any(bool(np.asarray(m).any()) for m in ev.layers.values())


def test_propagate_masks_records_every_spatial_variable_that_depends_on_the_frame():
    traced, analysis, args = _traced("plain")
    outs, recorded = propagate_masks(
        analysis, args, _masks(traced, jnp.ones((SIZE, SIZE), bool)), CTX
    )
    want = jaxpr_as_fun(traced.jaxpr)(*args)
    np.testing.assert_allclose(np.asarray(outs[0]), np.asarray(want[0]), rtol=1e-5, atol=1e-5)
    sigs = [sig for sig, _, _ in recorded.values()]
    assert sigs and all(isinstance(s, Spatial) for s in sigs)
    # the two convolutions' outputs are among them, at strides 2 and 4
    strides = {tuple(s.stride) for s in sigs}
    assert {(2, 2), (4, 4)} <= strides
