"""`dcjax.bench.common`: the warnings the benchmark commands print beside their tables."""

from __future__ import annotations

from dcjax.bench import common


def test_only_speedups_above_their_ideal_are_warned_on_stderr(capsys):
    rows = [
        ("a", 1.62, 1.55), ("b", 1.40, 1.55), ("c", 1.00, 1.00), ("d", 2.0, None),
        ("e", 1.004, 1.00, 0.01),  # within the run's noise
    ]  # fmt: skip
    notes = common.warn_above_ideal(iter(rows))
    err = capsys.readouterr().err.splitlines()
    assert len(notes) == 1 and "a ran 1.62x" in notes[0] and "ideal 1.55x" in notes[0]
    assert err == [f"dcjax: {notes[0]}"]


def test_the_baselines_records_are_not_warned_about(capsys):
    records = [
        {"model": "m", "method": "plain", "speedup_vs_dense": 1.3, "ideal_speedup": 1.0},
        {"model": "m", "method": "nocache", "speedup_vs_dense": 1.0, "ideal_speedup": 1.0},
        {"model": "m", "method": "deepcache", "speedup_vs_dense": 2.1, "ideal_speedup": 2.0},
        {"model": "m", "method": "mil", "speedup_vs_dense": 1.9, "ideal_speedup": 2.0},
        {"model": "m", "method": "dense plan", "speedup_vs_dense": 1.01, "ideal_speedup": 1.0,
         "speedup_vs_dense_se": 0.01},
    ]  # fmt: skip
    notes = common.warn_records(records, lambda r: f"{r['model']} {r['method']}")
    assert len(notes) == 1 and "m deepcache ran 2.10x" in notes[0]
    assert capsys.readouterr().err.count("dcjax: warning:") == 1


def test_methods_timed_with_many_page_faults_are_warned_baselines_too(capsys):
    from dcjax.eval.metrics import FAULTS_WARNED

    records = [
        {"method": "plain", "speedup_vs_dense": 0.1, "ideal_speedup": 1.0,
         "page_faults": 41725.0},
        {"method": "nocache", "speedup_vs_dense": 1.0, "ideal_speedup": 1.0,
         "page_faults": float(FAULTS_WARNED)},
        {"method": "deepcache", "speedup_vs_dense": 1.4, "ideal_speedup": 2.0,
         "page_faults": None},
    ]  # fmt: skip
    notes = common.warn_records(records)
    assert len(notes) == 1 and "plain faulted 41725 pages" in notes[0]
    assert capsys.readouterr().err.count("dcjax: warning:") == 1
    assert common.warn_page_faults([("a", FAULTS_WARNED + 1.0), ("b", 0.0)]) == [
        notes[0].replace("plain", "a").replace("41725", str(FAULTS_WARNED + 1))
    ]
