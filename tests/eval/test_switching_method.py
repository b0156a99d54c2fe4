"""The ``adaptive`` method (`dcjax.eval.switching_method`)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from dcjax.eval.registry import make_runner
from tests.tuning_fakes import fake_measurements


@pytest.fixture
def fake_timings(monkeypatch, tmp_path):
    costs = {"dense": lambda f: 1e-3, "xla": lambda f: 2e-3 * f, "rows": lambda f: 3e-3}
    fake_measurements(monkeypatch, tmp_path / "tuning.json", costs)


def test_adaptive_runs_its_plans_and_equals_the_model(spec, clip, fake_timings):
    # blocks reused only where identical: the outputs are the model's
    options = {"levels": "0.25|1", "patience": 2, "psnr_threshold": 99.0}
    runner = make_runner(spec, "adaptive", options)
    assert runner.config["levels"] == [0.25, 1.0]
    assert [p["plan"] for p in runner.config["plans"]] == ["cached", "dense"]
    state = runner.init()
    for f in clip[:4]:
        out, state, info = runner.step(state, jnp.asarray(f))
        want = spec.apply(jnp.asarray(f))
        np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-3, atol=1e-3)
        assert int(info["plan"]) in (0, 1)
    timed = runner.timed()
    assert timed.config["statistics"] is False


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"levels": "0.5|0.2"}, "levels=.* must increase"),
        ({"levels": "a|b"}, "numbers separated by"),
        ({"patience": 0}, "patience=0 must be a positive int"),
        ({"kernel": "xla"}, "needs kernel=auto"),
    ],
)
def test_adaptive_options_are_checked(spec, options, message):
    with pytest.raises(ValueError, match=message):
        make_runner(spec, "adaptive", options)
