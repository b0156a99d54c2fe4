"""`dcjax.bench.common`: the warnings the benchmark commands print beside their tables."""

from __future__ import annotations

from dcjax.bench import common


def test_only_speedups_above_their_ideal_are_warned_on_stderr(capsys):
    rows = [("a", 1.62, 1.55), ("b", 1.40, 1.55), ("c", 1.00, 1.00), ("d", 2.0, None)]
    notes = common.warn_above_ideal(iter(rows))
    err = capsys.readouterr().err.splitlines()
    assert len(notes) == 1 and "a ran 1.62x" in notes[0] and "ideal 1.55x" in notes[0]
    assert err == [f"dcjax: {notes[0]}"]
