"""The exit ceiling against hand-built cases with known answers."""

import numpy as np
import pytest

from dcjax.semantic import exit_ceiling


def _clusters(rng, labels, dim, spread):
    centres = np.eye(dim)[: labels.max() + 1] * 10.0
    return centres[labels] + spread * rng.standard_normal((labels.size, dim))


def _split(seed, n_ev, spreads):
    """Labels and 4-d and 6-d cluster vectors: 60 calibration and ``n_ev`` evaluation frames."""
    rng = np.random.default_rng(seed)
    cal = rng.integers(0, 3, 60)
    ev = rng.integers(0, 3, n_ev)
    vec_cal = [_clusters(rng, cal, d, s) for d, s in zip((4, 6), spreads)]
    vec_ev = [_clusters(rng, ev, d, s) for d, s in zip((4, 6), spreads)]
    return cal, ev, vec_cal, vec_ev


def test_separable_classes_exit_everywhere():
    cal, ev, vec_cal, vec_ev = _split(0, 40, (0.1, 0.1))
    res = exit_ceiling(vec_cal, cal, vec_ev, ev, names=["a", "b"], skipped=[0.8, 0.3])
    assert [p["name"] for p in res["points"]] == ["a", "b"]
    for p in res["points"]:
        assert p["accuracy"] == 1.0 and p["coverage"] == 1.0
    assert res["points"][0]["ideal_speedup"] == pytest.approx(1 / 0.2)
    assert res["points"][1]["ideal_speedup"] == pytest.approx(1 / 0.7)
    assert res["known_classes"] == 1.0
    assert res["stability"] == pytest.approx(np.mean(ev[1:] == ev[:-1]))


def test_uninformative_vectors_cannot_exit():
    """Vectors independent of the labels: no threshold keeps 97 % agreement."""
    rng = np.random.default_rng(1)
    cal = np.arange(200) % 4
    ev = np.arange(200) % 4
    vec_cal = [rng.standard_normal((200, 8)) + 5.0]
    vec_ev = [rng.standard_normal((200, 8)) + 5.0]
    res = exit_ceiling(vec_cal, cal, vec_ev, ev)
    (p,) = res["points"]
    assert p["accuracy"] < 0.5
    assert p["coverage"] < 0.1
    assert res["stability"] == 0.0


def test_coverage_takes_the_most_confident_frames():
    """Half the frames sit on a centre, half in between: only the first half can exit."""
    cal = np.array([0, 1])
    vec_cal = [np.array([[1.0, 0.0], [0.0, 1.0]])]
    ev = np.array([0, 1, 0, 1, 0, 1, 0, 1])
    near = np.array([[1.0, 0.0], [0.0, 1.0]] * 2)
    between = np.array([[1.0, 1.05], [1.05, 1.0]] * 2)  # the wrong class is closer
    vec_ev = [np.concatenate([near, between])]
    res = exit_ceiling(vec_cal, cal, vec_ev, ev, target=1.0)
    (p,) = res["points"]
    assert p["accuracy"] == 0.5
    assert p["coverage"] == 0.5
    assert np.isfinite(p["tau"]) and p["tau"] > 0.04


def test_unknown_classes_and_bad_arguments():
    cal = np.array([0, 0, 1, 1])
    vec = [np.eye(4)[[0, 0, 1, 1]]]
    ev = np.array([2, 2, 0, 1])
    res = exit_ceiling(vec, cal, [np.eye(4)[[2, 2, 0, 1]]], ev)
    assert res["known_classes"] == 0.5
    assert res["points"][0]["accuracy"] == 0.5
    with pytest.raises(ValueError, match="exit points"):
        exit_ceiling(vec, cal, [], ev)
    with pytest.raises(ValueError, match="target"):
        exit_ceiling(vec, cal, vec, cal, target=0.0)


def test_ac_quantiles_and_the_automatic_tau_sweep():
    from dcjax.bench.semantic import auto_taus

    cal, ev, vec_cal, vec_ev = _split(2, 50, (2.0, 0.5))
    res = exit_ceiling(vec_cal, cal, vec_ev, ev)
    for p in res["points"]:
        q10, q50, q90 = p["ac_quantiles"]
        assert 0 <= q10 <= q50 <= q90
    taus = auto_taus(res, count=5)
    assert len(taus) == 5 and list(taus) == sorted(taus)
    lo = min(p["ac_quantiles"][0] for p in res["points"])
    hi = max(p["ac_quantiles"][2] for p in res["points"])
    assert taus[0] == pytest.approx(max(lo, hi * 1e-4), rel=1e-2)
    assert taus[-1] == pytest.approx(4 * hi, rel=1e-2)
    # one class only: AC is -inf everywhere, the sweep falls back to fixed values
    one = exit_ceiling([np.ones((4, 2))], np.zeros(4, int), [np.ones((3, 2))], np.zeros(3, int))
    assert auto_taus(one) == (0.05, 0.1, 0.2, 0.5, 1.0)
