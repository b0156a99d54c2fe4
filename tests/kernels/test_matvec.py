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
    k=st.sampled_from([1, 31, 32, 33, 300]),  # around the rows per trip; few programs to compile
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


@pytest.mark.parametrize("count", [0, 1, 31, 32, 33, 64, 299, 300])
def test_counts_around_the_rows_per_trip(count):
    k, n = 300, 4100
    assert matvec.ROWS_PER_TRIP == 32
    changed = np.zeros(k, bool)
    changed[np.random.default_rng(count).permutation(k)[:count]] = True
    y, w, d, changed = _case(k, n, changed, count)
    got = np.asarray(_kernel(y, w, d, changed))
    np.testing.assert_allclose(got, _numpy(y, w, d, changed), rtol=1e-5, atol=1e-4)
    if count == 0:
        np.testing.assert_array_equal(got, y)  # nothing read, nothing added


def test_trips_follow_the_changed_count():
    """The loop runs ceil(count / ROWS_PER_TRIP) trips: rows never listed are never read."""
    k, n = 100, 16
    y, w, d, changed = _case(k, n, np.arange(k) < 40)
    w = w.copy()
    w[40:] = np.nan  # rows of unchanged inputs: a read of any of them would show
    got = np.asarray(_kernel(y, w, d, changed))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, _numpy(y, w[:40], d[:40], changed[:40]), rtol=1e-5, atol=1e-4)


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
