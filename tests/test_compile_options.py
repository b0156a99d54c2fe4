"""The XLA options dcjax compiles its own programs with (`dcjax.compile_options`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from dcjax import compile_options as co
from dcjax.kernels import measurements as km

cpu_only = pytest.mark.skipif(jax.default_backend() != "cpu", reason="the options are CPU's")


def _dot_and_conv(x, w, y, k):
    nhwc = ("NHWC", "HWIO", "NHWC")
    conv = lax.conv_general_dilated(y, k, (1, 1), "SAME", dimension_numbers=nhwc)
    return x @ w, conv


def _library_ops(compiled) -> tuple[bool, bool]:
    """Whether the dot and the convolution of `_dot_and_conv` went to YNNPACK."""
    fusions = [line for line in compiled.as_text().splitlines() if "__ynn_fusion" in line]
    return any("dot_general" in f for f in fusions), any("conv_general" in f for f in fusions)


@cpu_only
def test_dots_leave_the_library_and_convolutions_stay():
    rng = np.random.default_rng(0)
    shapes = ((64, 32), (32, 16), (1, 32, 32, 16), (3, 3, 16, 32))
    args = tuple(jnp.asarray(rng.standard_normal(s), jnp.float32) for s in shapes)
    default = jax.jit(_dot_and_conv).lower(*args).compile()
    ours = co.jit(_dot_and_conv).lower(*args).compile()
    if not co.compile_options():
        pytest.skip("this XLA does not know the option")
    # XLA's default hands both to YNNPACK; dcjax's options only the convolution
    assert _library_ops(default) == (True, True)
    assert _library_ops(ours) == (False, True)
    for a, b in zip(default(*args), ours(*args), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def test_the_environment_restores_xla_defaults(monkeypatch):
    monkeypatch.setenv(co.DEFAULTS_ENV, "1")
    assert co.compile_options() == {}
    monkeypatch.setenv(co.DEFAULTS_ENV, "0")
    expected = {} if jax.default_backend() != "cpu" else co._cpu_options()
    assert co.compile_options() == expected


@cpu_only
def test_measurements_made_with_other_options_are_kept_apart(monkeypatch):
    monkeypatch.setenv(co.DEFAULTS_ENV, "0")
    ours = km.machine_key()
    monkeypatch.setenv(co.DEFAULTS_ENV, "1")
    defaults = km.machine_key()
    if co._cpu_options():
        assert ours != defaults
        assert co.CPU_LIBRARY_FUSIONS in ours and co.CPU_LIBRARY_FUSIONS not in defaults
    else:
        assert ours == defaults


def test_an_option_xla_rejects_leaves_the_defaults(monkeypatch):
    co._cpu_options.cache_clear()
    monkeypatch.setattr(co, "CPU_LIBRARY_FUSIONS", "LIBRARY_FUSION_TYPE_NOT_A_TYPE")
    try:
        assert co._cpu_options() == {}
    finally:
        co._cpu_options.cache_clear()


def test_a_jitted_function_runs_inside_other_transformations():
    f = co.jit(lambda x: jnp.tanh(x @ x.T))
    x = jnp.asarray(np.random.default_rng(1).standard_normal((8, 4)), jnp.float32)
    top = f(x)
    # inside a user's jit (traced and constant arguments) and under vmap
    np.testing.assert_allclose(jax.jit(lambda y: f(y))(x), top, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jax.jit(lambda: f(x))(), top, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jax.vmap(f)(x[None])[0], top, rtol=1e-5, atol=1e-6)
    assert f.lower(x).compile() is not None
