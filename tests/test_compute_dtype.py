"""`Config.compute_dtype`: the model runs in bfloat16 (or float16) end to end,
its caches too, and returns float32; the measured tuning times the kernels in
that type."""

from __future__ import annotations

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dcjax
from dcjax.kernels import tuning as kt
from dcjax.transforms.trace import COMPUTE_DTYPES, trace_model
from tests.translated import panning_frames
from tests.tuning_fakes import fake_measurements

SHAPE = (24, 24, 3)


class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(8, (3, 3))(x))
        x = nn.relu(nn.Conv(16, (3, 3), strides=(2, 2))(x))
        x = nn.Conv(8, (1, 1))(x)
        return {"map": x, "pooled": x.mean(axis=(1, 2))}


@pytest.fixture(scope="module")
def model():
    net = Net()
    return net, net.init(jax.random.key(0), jnp.zeros((1, *SHAPE)))


def test_trace_casts_floating_variables_and_input_and_returns_float32():
    def fn(v, x):
        return {"y": (x * v["w"]).sum() + v["n"], "k": v["n"]}

    variables = {"w": jnp.ones((3,), jnp.float32), "n": jnp.int32(2)}
    traced = trace_model(fn, variables, (4, 4, 3), compute_dtype="bfloat16")
    dtypes = {str(v.aval.dtype) for v in traced.jaxpr.jaxpr.invars}
    assert dtypes == {"bfloat16", "int32"}  # the int leaf kept
    assert traced.input_dtype == jnp.bfloat16
    assert [str(v.aval.dtype) for v in traced.jaxpr.jaxpr.outvars] == ["int32", "float32"]
    uint = trace_model(fn, variables, (4, 4, 3), jnp.uint8, compute_dtype="bfloat16")
    assert uint.input_dtype == jnp.uint8  # an integer input keeps its type
    with pytest.raises(ValueError, match="compute_dtype must be None or one of"):
        trace_model(fn, variables, (4, 4, 3), compute_dtype="float64")
    with pytest.raises(ValueError, match="Config.compute_dtype must be None or one of"):
        dcjax.Config(compute_dtype="int8")
    assert set(COMPUTE_DTYPES) == {"float32", "bfloat16", "float16"}


@pytest.mark.parametrize("kernel", ["xla", "rows"])
def test_a_bfloat16_step_keeps_bfloat16_caches_and_matches_the_bfloat16_model(model, kernel):
    """The step runs in bfloat16: its caches are bfloat16, its outputs float32,
    equal to the bfloat16 model computed in full up to bfloat16 rounding, and
    measurably not the float32 model's."""
    net, variables = model
    cfg = dcjax.Config(kernel=kernel, tuning="prior", compute_dtype="bfloat16")
    cached = dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg, progress=False)
    state = cached.init()
    leaves = jax.tree_util.tree_leaves(state.caches)
    caches = [c for c in leaves if jnp.issubdtype(c.dtype, jnp.floating)]
    assert caches and {c.dtype for c in caches} == {jnp.dtype(jnp.bfloat16)}
    bf = jax.tree_util.tree_map(lambda a: a.astype(jnp.bfloat16), variables)
    reused = []
    for f in panning_frames(SHAPE, 6):
        out, state, info = cached.step(state, f)
        reused.append(float(info["reuse_fraction"].mean()))
        x = jnp.asarray(f, jnp.float32)[None] / 255.0
        want16 = net.apply(bf, x.astype(jnp.bfloat16))
        want32 = net.apply(variables, x)
        for k in ("map", "pooled"):
            assert out[k].dtype == jnp.float32
            got, w16, w32 = (np.asarray(a[k], np.float32) for a in (out, want16, want32))
            scale = np.abs(w32).max()
            assert np.abs(got - w16).max() <= 0.03 * scale  # bfloat16 rounding
            assert np.abs(got - w32).max() > 1e-4 * scale  # it did run in bfloat16
    assert min(reused[1:]) > 0.1  # the later frames reused work


def test_measured_tuning_times_the_kernels_in_the_compute_dtype(model, monkeypatch, tmp_path):
    costs = {"dense": lambda f: 1e-3, "xla": lambda f: 1e-4 + 5e-4 * f, "rows": lambda f: 2e-3}
    dtypes = []
    fake_measurements(monkeypatch, tmp_path / "tuning.json", costs)
    real_inputs = kt._inputs

    def inputs(p, dtype=jnp.float32):
        dtypes.append(jnp.dtype(dtype))
        return real_inputs(p, dtype)

    monkeypatch.setattr(kt, "_inputs", inputs)
    net, variables = model
    cfg = dcjax.Config(tuning="measure", compute_dtype="bfloat16")
    cached = dcjax.transform(net, variables, frame_shape=SHAPE, config=cfg, progress=False)
    assert cached.tuning.plan == "cached"
    assert dtypes and set(dtypes) == {jnp.dtype(jnp.bfloat16)}
    stored = json.loads((tmp_path / "tuning.json").read_text())["machines"]
    keys = [k for layers in stored.values() for k in layers if k.startswith("n1 ")]
    assert keys and all(k.endswith(" bfloat16") for k in keys)
