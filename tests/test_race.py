"""The race between steps on the same frames (`dcjax.race`)."""

import time

import numpy as np

from dcjax import race


def test_a_race_keeps_the_fastest_only_beyond_its_noise():
    rng = np.random.default_rng(0)
    base = rng.uniform(10e-3, 30e-3, (3, 16, 1))  # frames of unlike cost, shared by all
    noise = rng.normal(0, 1e-3, (3, 16, 3))
    # model 2 is 2 % faster on every frame, beyond the noise of 1 ms a frame? no:
    # a 0.4 ms mean gain under 1 ms of noise over 48 pairs is 0.4 / (1.4 / 7) = 2
    # standard errors at best; a 3 ms gain is far beyond
    clear = base + noise + np.array([3e-3, 3e-3, 0.0])
    assert race.race_winner(clear, preference=[0, 1]) == 2
    tie = base + rng.normal(0, 3e-3, (3, 16, 3)) + np.array([0.0, 0.0, -0.1e-3])
    assert np.argmin(np.median(tie.mean(axis=1), axis=0)) != 0  # some other looks faster
    assert race.race_winner(tie, preference=[0, 1]) == 0  # but ties the preferred
    assert race.race_winner(tie, preference=[1, 0]) == 1
    # the preferred is slower beyond noise, the next one ties the fastest
    mixed = base + noise * 0.1 + np.array([5e-3, 0.0, 0.0])
    assert race.race_winner(mixed, preference=[0, 1, 2]) == 1
    # nothing listed: the fastest, or index order on a tie
    assert race.race_winner(clear, preference=[]) == 2
    assert race.race_winner(np.ones((2, 3, 3)), preference=[]) == 0


class _Sleeper:
    """A stand-in for a cached model whose step takes ``seconds`` (``factor`` times
    as long on call number ``spike``)."""

    def __init__(self, seconds, spike=None, factor=10):
        self.seconds, self.spike, self.factor, self.calls = seconds, spike, factor, 0

    def init(self):
        return 0

    def step(self, state, frame):
        self.calls += 1
        time.sleep(self.seconds * (self.factor if self.calls == self.spike else 1))
        return np.zeros(1), state + 1, {}


def test_race_runs_rounds_until_each_model_is_timed_long_enough():
    fast, slow = _Sleeper(0.001), _Sleeper(0.002)
    times = race.race([fast, slow], np.zeros((4, 2, 2, 3)), rounds=2, min_seconds=0.05,
                          max_rounds=50)  # fmt: skip
    assert times[0] < times[1]
    assert 0.001 <= times[0] < 0.002 <= times[1] < 0.004
    rounds = slow.calls // 4 - 1  # the first pass compiles
    # 0.05 s at 8 ms a round (more per sleep on a loaded machine): about 6 rounds, far below 50
    assert 3 <= rounds <= 8, rounds
    assert fast.calls == slow.calls
    capped = _Sleeper(0.001)
    race.race([capped], np.zeros((4, 2, 2, 3)), rounds=1, min_seconds=10, max_rounds=3)
    assert capped.calls == 4 * (1 + 3)


def test_a_burst_of_load_in_one_round_does_not_decide_the_race():
    """The faster model's step is slowed 60-fold once, in its second timed round:
    the mean over the rounds would rank it last (about 7.9 against 6 ms a frame),
    the median still ranks it first. The gap between the two (2 against 6 ms)
    leaves room for the sleeps' overshoot on a loaded machine."""
    fast, slow = _Sleeper(0.002, spike=4 * 2 + 1, factor=60), _Sleeper(0.006)
    times = race.race([fast, slow], np.zeros((4, 2, 2, 3)), rounds=5, min_seconds=0)
    assert times[0] < times[1]
    assert fast.calls == slow.calls == 4 * 6  # the compiling pass and five rounds
