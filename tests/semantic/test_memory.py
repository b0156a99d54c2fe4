"""SMTM Equations 1 and 3 to 7 against small hand-computed examples."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from dcjax.semantic import memory as mem


def test_cosine_similarity_eq1():
    v = jnp.array([1.0, 0.0])
    centres = jnp.array([[2.0, 0.0], [0.0, 3.0], [1.0, 1.0], [0.0, 0.0]])
    s = np.asarray(mem.cosine_similarity(v, centres))
    np.testing.assert_allclose(s, [1.0, 0.0, 1 / np.sqrt(2), 0.0], atol=1e-6)


def test_cumulative_similarity_eq3_weights_powers_of_two():
    # s^1 = [0.5, 0.2], s^2 = [0.4, 0.9], s^3 = [0.1, 0.3]
    # SA^1 = [0.5, 0.2]; SA^2 = SA^1 + 2 s^2 = [1.3, 2.0]; SA^3 = SA^2 + 4 s^3 = [1.7, 3.2]
    sa = jnp.zeros(2)
    expected = [[0.5, 0.2], [1.3, 2.0], [1.7, 3.2]]
    for level, (s, want) in enumerate(
        zip([[0.5, 0.2], [0.4, 0.9], [0.1, 0.3]], expected, strict=True), start=1
    ):
        sa = mem.cumulative_similarity(sa, jnp.array(s), level)
        np.testing.assert_allclose(np.asarray(sa), want, rtol=1e-6)


def test_accumulated_confidence_eq4():
    ac, index = mem.accumulated_confidence(jnp.array([1.7, 3.2, 0.4]))
    assert float(ac) == pytest.approx((3.2 - 1.7) / 1.7, rel=1e-6)
    assert int(index) == 1
    # negative second-highest: the denominator is |SA_SH| (the separation stays positive)
    ac, _ = mem.accumulated_confidence(jnp.array([1.0, -0.5]))
    assert float(ac) == pytest.approx(1.5 / 0.5, rel=1e-6)
    # fewer than two candidates: no exit
    ac, _ = mem.accumulated_confidence(jnp.array([2.0, -jnp.inf, -jnp.inf]))
    assert float(ac) == -np.inf


def test_replacement_scores_eq5():
    ft = jnp.array([8.0, 8.0, 3.0, 0.0])
    ts = jnp.array([0, 10, 25, 0], jnp.int32)
    # W = 10: decays 0.25**0, 0.25**1, 0.25**2, -
    score = np.asarray(mem.replacement_scores(ft, ts, window=10))
    np.testing.assert_allclose(score, [8.0, 2.0, 3.0 / 16, 0.0], rtol=1e-6)


def test_fast_memory_eq6_smallest_k_reaching_confidence():
    # scores [8, 2, 0.1875, 0, 0.5, 0.3125]: total 11.0
    ft = jnp.array([8.0, 8.0, 3.0, 0.0, 0.5, 5.0])
    ts = jnp.array([0, 10, 25, 0, 0, 20], jnp.int32)
    prior = jnp.zeros(6)
    classes, active, k = mem.fast_memory(ft, ts, prior, window=10, confidence=0.95, max_fast=5)
    # ranked: 0 (8), 1 (2), 4 (0.5), 5 (0.3125), 2 (0.1875); shares .727 .909 .955 ...
    np.testing.assert_array_equal(np.asarray(classes), [0, 1, 4, 5, 2])
    assert int(k) == 3
    np.testing.assert_array_equal(np.asarray(active), [True, True, True, False, False])
    _, _, k = mem.fast_memory(ft, ts, prior, window=10, confidence=0.7, max_fast=5)
    assert int(k) == 2  # one class reaches 0.727, but AC needs a second-highest
    _, _, k = mem.fast_memory(ft, ts, prior, window=10, confidence=0.999, max_fast=4)
    assert int(k) == 4  # capped at max_fast


def test_fast_memory_ties_use_prior_and_empty_tables_fill_it():
    ft = jnp.zeros(4)
    ts = jnp.zeros(4, jnp.int32)
    prior = jnp.array([0.1, 0.0, 0.6, 0.3])
    classes, active, k = mem.fast_memory(ft, ts, prior, window=5, confidence=0.95, max_fast=3)
    np.testing.assert_array_equal(np.asarray(classes), [2, 3, 0])
    assert int(k) == 3 and bool(active.all())


def test_update_tables():
    ft, ts = mem.update_tables(jnp.array([1.0, 0.0, 2.0]), jnp.array([0, 4, 1]), jnp.int32(2))
    np.testing.assert_array_equal(np.asarray(ft), [1.0, 0.0, 3.0])
    np.testing.assert_array_equal(np.asarray(ts), [1, 5, 0])


def test_update_centres_eq7_only_up_to_the_exit_taken():
    centres = (jnp.array([[0.0, 0.0], [1.0, 3.0]]), jnp.array([[5.0], [2.0]]))
    counts = jnp.array([[1.0, 2.0], [1.0, 2.0]])
    vectors = (jnp.array([4.0, 0.0]), jnp.array([8.0]))
    new, m = mem.update_centres(centres, counts, vectors, jnp.int32(1), jnp.array([True, False]))
    # exit 1 of class 1: (SC * m + SV) / (m + 1) = ([1, 3] * 2 + [4, 0]) / 3 = [2, 2]
    np.testing.assert_allclose(np.asarray(new[0]), [[0.0, 0.0], [2.0, 2.0]])
    np.testing.assert_allclose(np.asarray(new[1]), [[5.0], [2.0]])  # not reached
    np.testing.assert_array_equal(np.asarray(m), [[1.0, 3.0], [1.0, 2.0]])
    # a class without a centre (m = 0) takes the vector itself
    new, m = mem.update_centres(centres, counts * 0, vectors, jnp.int32(0), jnp.array([True, True]))
    np.testing.assert_allclose(np.asarray(new[0])[0], [4.0, 0.0])
    np.testing.assert_allclose(np.asarray(new[1])[0], [8.0])


def test_update_outputs_running_mean_only_when_asked():
    means, counts = (jnp.array([[1.0, 1.0], [0.0, 0.0]]),), jnp.array([1.0, 0.0])
    new, c = mem.update_outputs(
        means, counts, [jnp.array([3.0, 5.0])], jnp.int32(0), jnp.bool_(True)
    )
    np.testing.assert_allclose(np.asarray(new[0])[0], [2.0, 3.0])
    assert float(c[0]) == 2.0
    new, c = mem.update_outputs(
        means, counts, [jnp.array([3.0, 5.0])], jnp.int32(0), jnp.bool_(False)
    )
    np.testing.assert_allclose(np.asarray(new[0])[0], [1.0, 1.0])
    assert float(c[0]) == 1.0


def test_memory_bytes_counts_every_table():
    state = mem.empty_state(10, (4, 8), ((1, 10),))
    # centres 10*(4+8), counts 2*10, FT 10, TS 10, prior 10, out means 10*10, out counts 10, tau;
    # the guard: four int32 counters and a bool
    assert mem.memory_bytes(state) == 4 * (120 + 20 + 10 + 10 + 10 + 100 + 10 + 1) + 4 * 4 + 1
