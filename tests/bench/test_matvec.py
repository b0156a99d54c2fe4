"""The delta matvec benchmark (`dcjax bench matvec`) on small shapes."""

from __future__ import annotations

import json

import pytest

from dcjax.bench import matvec


def test_records_every_shape_and_fraction_with_checked_results(tmp_path, capsys):
    out = tmp_path / "sub" / "m.json"
    matvec.main(
        ["--shapes", "300x40", "64x8", "--fractions", "0", "0.5", "1", "--reps", "2",
         "--out", str(out)]
    )  # fmt: skip
    records = json.loads(out.read_text())["records"]
    assert [(r["k"], r["n"], r["fraction"]) for r in records] == [
        (k, n, f) for k, n in ((300, 40), (64, 8)) for f in (0.0, 0.5, 1.0)
    ]
    for r in records:
        assert r["max_rel_err"] < 1e-5
        assert r["dense_ms"] > 0 and r["delta_ms"] > 0
        assert r["dense_ms_min"] <= r["dense_ms"] and r["delta_ms_min"] <= r["delta_ms"]
        assert r["speedup"] == pytest.approx(r["dense_ms"] / r["delta_ms"])
    by = {(r["k"], r["fraction"]): r["changed"] for r in records}
    assert by[(300, 0.0)] == 0.0 and by[(300, 1.0)] == 1.0
    assert 0.35 < by[(300, 0.5)] < 0.65  # drawn at random around the fraction asked
    text = capsys.readouterr().out
    assert "300x40" in text and f"wrote {out}" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--shapes", "9216"], "must be KxN"),
        (["--shapes", "0x5"], "must be KxN"),
        (["--fractions", "1.5"], "must be a number in"),
        (["--reps", "0"], "--reps: must be at least 1"),
    ],
)
def test_bad_arguments_are_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        matvec.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err
