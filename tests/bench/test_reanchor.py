"""The re-anchoring drift benchmark (`dcjax bench reanchor`) on a small layer."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dcjax.bench import reanchor
from dcjax.transforms import refine as refine_lib


def test_records_each_period_with_errors_against_float64(tmp_path, capsys, monkeypatch):
    # a small layer, updated by rows as the large ones are
    monkeypatch.setattr(refine_lib, "AUTO_MIN_DENSE_WEIGHTS", 1)
    out = tmp_path / "r.json"
    reanchor.main(
        ["--inputs", "64", "--outputs", "16", "--frames", "60", "--periods", "0", "8",
         "--out", str(out)]
    )  # fmt: skip
    records = json.loads(out.read_text())["records"]
    assert [r["period"] for r in records] == [0, 8]
    for r in records:
        errors = np.asarray(r["errors"])
        assert errors.shape == (60,) and np.isfinite(errors).all()
        assert errors.max() < 1e-5  # float32 rounding, not a wrong product
        assert r["max"] == errors.max() and r["first10"] == errors[:10].max()
        assert r["last50"] == errors[-50:].max()
        # 10 % of the inputs change: rows are skipped
        assert 0.6 < r["dense_reuse"] < 0.95
    # the full products every 8 frames read every row
    assert records[1]["dense_reuse"] < records[0]["dense_reuse"]
    assert refine_lib.DENSE_REANCHOR_EVERY == 64  # restored
    text = capsys.readouterr().out
    assert "never" in text and f"wrote {out}" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--inputs", "63"], "must be even"),
        (["--frames", "10"], "--frames: must be at least 60"),
        (["--periods", "-1"], "--periods: must be at least 0"),
    ],
)
def test_bad_arguments_are_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        reanchor.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err
