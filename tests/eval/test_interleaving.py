"""`dcjax.eval.interleaving`: the warm-up's calls, the per-frame orders and the timed step."""

import itertools
import mmap
import platform
import time

import jax.numpy as jnp
import numpy as np
import pytest

from dcjax.eval import interleaving


def _method(name, log):
    """A counting method: its state counts its steps since ``init``."""

    def init():
        log.append((name, "init"))
        return jnp.int32(0)

    def step(state, frame):
        log.append((name, int(state), int(frame)))
        return frame * 2, state + 1, {"n": state}

    return init, step


def test_each_method_compiles_in_turn_then_all_run_once_more_from_afresh():
    log = []
    methods = {m: _method(m, log) for m in ("b", "a", "c")}
    seconds = interleaving.warm_up(methods, [jnp.int32(7), jnp.int32(8), jnp.int32(9)], steps=2)
    assert list(seconds) == ["b", "a", "c"] and all(s >= 0 for s in seconds.values())
    warm = [e for m in ("b", "a", "c") for e in [(m, "init"), (m, 0, 7), (m, 1, 8)]]
    round_ = [e for m in ("b", "a", "c") for e in [(m, "init"), (m, 0, 7)]]
    assert log == warm + round_


def test_warm_up_uses_the_frames_it_has():
    log = []
    interleaving.warm_up({"a": _method("a", log)}, [jnp.int32(3)], steps=5)
    assert log == [("a", "init"), ("a", 0, 3), ("a", "init"), ("a", 0, 3)]


@pytest.mark.parametrize(
    ("frames", "steps", "match"),
    [([], 2, "at least one frame"), ([1], 0, "steps must be at least 1")],
)
def test_warm_up_rejects_nothing_to_step(frames, steps, match):
    with pytest.raises(ValueError, match=match):
        interleaving.warm_up({"a": _method("a", [])}, frames, steps=steps)


def test_orders_are_permutations_drawn_afresh_and_repeatable():
    names = ["p", "q", "r", "s"]
    orders = list(interleaving.frame_orders(names, 200, seed=3))
    assert len(orders) == 200 and all(sorted(o) == names for o in orders)
    # every method follows every other one somewhere, and leads somewhere
    follows = {(o[i - 1], o[i]) for o in orders for i in range(1, len(o))}
    assert follows == set(itertools.permutations(names, 2))
    assert {o[0] for o in orders} == set(names)
    assert orders == list(interleaving.frame_orders(names, 200, seed=3))
    assert orders != list(interleaving.frame_orders(names, 200, seed=4))
    # a generator: the first k orders do not depend on how many are asked for
    assert list(interleaving.frame_orders(names, 5, seed=3)) == orders[:5]
    assert np.unique([tuple(o) for o in orders], axis=0).shape[0] == 24  # all 4! seen


class _Slow:
    """A leaf that becomes ready only after ``delay`` seconds of its
    ``block_until_ready``, and says whether it was waited for."""

    def __init__(self, delay):
        self.delay, self.waited = delay, False

    def block_until_ready(self):
        time.sleep(self.delay)
        self.waited = True
        return self


@pytest.mark.parametrize("where", [0, 1, 2])
def test_a_timed_step_waits_for_every_item_it_returns(where):
    slow = _Slow(0.05)

    def step(state, frame):
        items = [frame + 1, state + 1, {"n": state}]
        items[where] = {"slow": slow}
        return tuple(items)

    seconds, _, result = interleaving.timed_step(step, jnp.int32(4), jnp.int32(9))
    assert slow.waited and seconds >= 0.05
    assert result[where] == {"slow": slow}
    if where != 0:
        assert int(result[0]) == 10


@pytest.mark.skipif(platform.system() != "Linux", reason="page faults counted by getrusage")
def test_a_timed_step_counts_the_page_faults_of_its_call():
    """A step that writes 16 MB of fresh anonymous memory faults its 4,096 pages in."""
    size = 16 << 20

    def step(state, frame):
        block = mmap.mmap(-1, size)
        for offset in range(0, size, mmap.PAGESIZE):
            block[offset] = 1
        block.close()
        return frame, state

    timed = interleaving.timed_step(step, jnp.int32(0), jnp.int32(1))
    assert timed.faults >= size // mmap.PAGESIZE, timed.faults
    assert timed.seconds > 0 and int(timed.result[0]) == 1


def test_the_warm_up_reserves_heap_after_its_calls(monkeypatch):
    log = []
    monkeypatch.setattr(interleaving.allocator, "reserve", lambda: log.append("reserve"))
    interleaving.warm_up({"a": _method("a", log)}, [jnp.int32(3)], steps=1)
    assert log[-1] == "reserve" and log.count("reserve") == 1
    assert ("a", 0, 3) in log[:-1]  # the method ran before it
