"""Delta matrix-vector products (`dcjax.kernels.matvec`) against their oracle."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcjax.kernels import matvec


def _case(k: int, n: int, changed: np.ndarray, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(k, n)).astype(np.float32)
    d = rng.normal(size=(k,)).astype(np.float32)
    y = rng.normal(size=(n,)).astype(np.float32)
    return y, w, d, changed


def _numpy(y, w, d, changed):
    return y.astype(np.float64) + np.where(changed, d, 0.0).astype(np.float64) @ w


_kernel = jax.jit(matvec.delta_matvec)


@settings(max_examples=25, deadline=None)
@given(
    k=st.integers(1, 300),
    n=st.sampled_from([1, 7, 64, 5000]),
    fraction=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
)
def test_equals_the_dense_product_of_the_changed_rows(k, n, fraction, seed):
    rng = np.random.default_rng(seed)
    changed = rng.random(k) < fraction
    y, w, d, changed = _case(k, n, changed, seed)
    # what is not changed may hold anything finite: it must not leak in
    d = np.where(changed, d, 1e6).astype(np.float32)
    got = np.asarray(_kernel(y, w, d, changed))
    np.testing.assert_allclose(got, _numpy(y, w, d, changed), rtol=1e-5, atol=1e-4)
    ref = np.asarray(matvec.reference_delta_matvec(y, w, d, changed))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("count", [0, 1, 127, 128, 129, 256, 300])
def test_counts_around_the_chunk_size(count):
    k, n = 300, 8192  # 128 rows a chunk
    assert matvec.chunk_rows(k, n) == 128
    changed = np.zeros(k, bool)
    changed[np.random.default_rng(count).permutation(k)[:count]] = True
    y, w, d, changed = _case(k, n, changed, count)
    got = np.asarray(_kernel(y, w, d, changed))
    np.testing.assert_allclose(got, _numpy(y, w, d, changed), rtol=1e-5, atol=1e-4)
    if count == 0:
        np.testing.assert_array_equal(got, y)  # nothing read, nothing added


def test_chunk_rows_hold_about_a_million_elements():
    assert matvec.chunk_rows(9216, 4096) == 256
    assert matvec.chunk_rows(4096, 1000) == 1024
    assert matvec.chunk_rows(10, 4096) == 16  # no more than k needs, rounded up
    assert matvec.chunk_rows(100, 10**7) == 8  # at least 8
    for k, n in [(9216, 4096), (1164, 100), (5, 3)]:
        rows = matvec.chunk_rows(k, n)
        assert rows & (rows - 1) == 0 and rows >= 8


def test_streams_under_vmap_match_one_by_one():
    k, n = 200, 96
    rng = np.random.default_rng(3)
    ys = rng.normal(size=(3, n)).astype(np.float32)
    w = rng.normal(size=(k, n)).astype(np.float32)
    ds = rng.normal(size=(3, k)).astype(np.float32)
    changed = rng.random((3, k)) < np.array([[0.0], [0.1], [0.9]])
    got = jax.jit(jax.vmap(matvec.delta_matvec, in_axes=(0, None, 0, 0)))(ys, w, ds, changed)
    for i in range(3):
        np.testing.assert_allclose(
            np.asarray(got[i]), _numpy(ys[i], w, ds[i], changed[i]), rtol=1e-5, atol=1e-4
        )


def test_gpu_form_is_the_reference_without_loops(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    y, w, d, changed = _case(64, 32, np.arange(64) % 3 == 0)
    text = jax.jit(matvec.delta_matvec).lower(y, w, d, changed).as_text()
    assert "while" not in text
    got = np.asarray(jax.jit(matvec.delta_matvec)(y, w, d, changed))
    np.testing.assert_allclose(got, _numpy(y, w, d, changed), rtol=1e-5, atol=1e-4)


def test_bad_shapes_are_named():
    y, w, d, changed = _case(8, 4, np.ones(8, bool))
    with pytest.raises(ValueError, match="delta_matvec needs"):
        matvec.delta_matvec(y[:3], w, d, changed)
    with pytest.raises(ValueError, match="delta_matvec needs"):
        matvec.delta_matvec(y, w, jnp.zeros((7,)), changed)
