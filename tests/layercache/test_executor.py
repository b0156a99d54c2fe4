"""Running saved models layer by layer: every mode gives the model's outputs,
loads are shared through the store, and models the split cannot enter run whole."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dcjax import layercache as lc
from dcjax import models


@pytest.fixture(scope="module")
def mobilenet():
    module, variables = models.create(
        "mobilenet_v2", width=0.25, num_classes=10, input_size=(48, 48), seed=3
    )
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 48, 48, 3)), jnp.float32)
    return module, variables, x


def test_split_cuts_at_every_layer_in_order(mobilenet):
    module, variables, x = mobilenet
    sp = lc.split(module.apply, variables, x)
    assert sp.whole is None
    layers = [s.layers for s in sp.segments if s.layers]
    assert all(len(s) == 1 for s in layers)  # one layer a segment
    names = [s[0] for s in layers]
    assert names[:3] == ["stem/conv", "stem/bn", "block0/depthwise/conv"] and names[-1] == "fc"
    assert len(names) == len(set(names)) == 2 * (1 + 17 * 3 - 1 + 1) + 1  # convs and BNs, fc
    assert sp.segments[-1].is_dense and not sp.segments[0].is_dense


@pytest.mark.parametrize("mode", lc.MODES)
def test_every_mode_gives_the_models_outputs(mobilenet, tmp_path, mode):
    module, variables, x = mobilenet
    manifest = lc.save(variables, tmp_path, "mbv2")
    store = lc.LayerStore()
    model = lc.LayerwiseModel(module.apply, manifest, variables, x, store=store)
    held = []  # values computed and still held after each segment
    run_segment = model._exec

    def counted(k, env, arrays):
        seconds = run_segment(k, env, arrays)
        held.append(len(env) - len(model.split.consts) - len(model.split.input_ids))
        return seconds

    model._exec = counted
    out, times = model.run(x, mode=mode)
    np.testing.assert_allclose(np.asarray(out), np.asarray(module.apply(variables, x)),
                               rtol=1e-4, atol=1e-4)  # fmt: skip
    # a value is dropped after its last reader: a residual block holds its input
    # beside the current value, never the ~100 values a run computes
    assert len(held) == len(model.split.segments) and max(held) <= 3
    assert times.mode == mode and times.whole is None
    assert len(times.segments) == len(model.split.segments)
    assert times.exec_s > 0 and times.load_s > 0 and times.total_s > 0
    distinct = len({lay.key for lay in manifest.layers})
    assert store.stats.loads == distinct  # each distinct layer read once
    # a second run finds every layer resident (no budget)
    _, again = model.run(x, mode=mode)
    assert store.stats.loads == distinct
    assert all(s.resident for s in again.segments)


def test_linear_mode_holds_little_under_a_tight_budget(mobilenet, tmp_path):
    module, variables, x = mobilenet
    manifest = lc.save(variables, tmp_path, "mbv2")
    largest = max(lay.nbytes for lay in manifest.layers)
    store = lc.LayerStore(budget_bytes=largest)
    model = lc.LayerwiseModel(module.apply, manifest, variables, x, store=store)
    for mode in ("linear", "partial"):
        out, _ = model.run(x, mode=mode)
        np.testing.assert_allclose(np.asarray(out), np.asarray(module.apply(variables, x)),
                                   rtol=1e-4, atol=1e-4)  # fmt: skip
        assert store.resident_bytes <= largest
    assert store.stats.peak_bytes <= largest
    # the bulk mode holds every distinct layer at once
    bulk = lc.LayerStore()
    lc.LayerwiseModel(module.apply, manifest, variables, x, store=bulk).run(x, mode="bulk")
    distinct = {lay.key: lay.nbytes for lay in manifest.layers}
    assert bulk.stats.peak_bytes == sum(distinct.values()) > store.stats.peak_bytes


def test_a_budget_below_the_largest_layer_fails_before_running(mobilenet, tmp_path):
    module, variables, x = mobilenet
    manifest = lc.save(variables, tmp_path, "mbv2")
    with pytest.raises(ValueError, match="more than the store's budget"):
        lc.LayerwiseModel(module.apply, manifest, variables, x,
                          store=lc.LayerStore(budget_bytes=1000))  # fmt: skip


def test_a_manifest_of_another_model_is_refused(mobilenet, tmp_path):
    module, variables, x = mobilenet
    other, other_vars = models.create("squeezenet", width=0.25, input_size=(48, 48))
    manifest = lc.save(other_vars, tmp_path, "squeezenet")
    with pytest.raises(ValueError, match="saved from another model|where the model has"):
        lc.LayerwiseModel(module.apply, manifest, variables, x)
    with pytest.raises(ValueError, match="unknown mode 'eager'"):
        lc.LayerwiseModel(module.apply, lc.save(variables, tmp_path, "m"), variables, x).run(
            x, mode="eager"
        )


def test_a_damaged_layer_stops_the_run(mobilenet, tmp_path):
    module, variables, x = mobilenet
    manifest = lc.save(variables, tmp_path, "mbv2")
    fc = {lay.name: lay for lay in manifest.layers}["fc"]
    data = bytearray(manifest.path(fc.key).read_bytes())
    data[-3] ^= 1
    manifest.path(fc.key).write_bytes(bytes(data))
    model = lc.LayerwiseModel(module.apply, manifest, variables, x)
    for mode in lc.MODES:
        with pytest.raises(lc.CorruptLayerError, match="layer fc"):
            model.run(x, mode=mode)


class Stacked(nn.Module):
    """Four dense layers applied by a scan over stacked weights: one operation
    reads every layer, so the split cannot enter it."""

    @nn.compact
    def __call__(self, x):
        ws = [self.param(f"w{i}", nn.initializers.lecun_normal(), (8, 8)) for i in range(4)]

        def body(h, w):
            return jnp.tanh(h @ w), None

        return jax.lax.scan(body, x, jnp.stack(ws))[0]


def test_a_model_the_split_cannot_enter_runs_whole_and_says_so(tmp_path):
    net = Stacked()
    x = jnp.ones((2, 8))
    variables = net.init(jax.random.key(0), x)
    manifest = lc.save(variables, tmp_path, "stacked")
    model = lc.LayerwiseModel(net.apply, manifest, variables, x)
    out, times = model.run(x, mode="linear")
    assert times.whole is not None and "one group of operations" in times.whole
    np.testing.assert_allclose(
        np.asarray(out), np.asarray(net.apply(variables, x)), rtol=1e-5, atol=1e-6
    )


def test_an_imported_onnx_model_runs_layer_by_layer(tmp_path):
    """Any model `transform` takes: MTCNN's P-Net from its ONNX file, whose
    initialisers are named TensorFlow-style (``conv2d/kernel:0``)."""
    pytest.importorskip("onnx")
    fn, params = models.from_onnx(models.onnx_file("pnet"), input_shape=(1, 48, 64, 3))
    x = jnp.asarray(np.random.default_rng(0).uniform(0, 1, (1, 48, 64, 3)), jnp.float32)
    manifest = lc.save(params, tmp_path, "pnet")
    assert [lay.name for lay in manifest.layers][:2] == ["conv2d", "conv2d_1"]
    assert {"kernel:0", "bias:0"} <= set(manifest.layers[0].tensors)
    model = lc.LayerwiseModel(fn, manifest, params, x)
    for mode in lc.MODES:
        out, times = model.run(x, mode=mode)
        assert times.whole is None and len(times.segments) >= len(manifest.layers)
        for got, want in zip(out, fn(params, x), strict=True):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
