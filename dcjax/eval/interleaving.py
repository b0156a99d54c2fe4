"""Interleaved timing of stateful methods on the same frames: warm-up, order, timed step.

Every measurement that compares methods frame by frame (`dcjax.eval.harness`,
``dcjax bench streams``) runs them in one process on the same frames, and
follows the same rules (docs/performance-notes.md):

- `warm_up`: each method in turn is stepped from a fresh state over the first
  frames, which compiles it; then every method is called once more, untimed,
  from a fresh state on the first frame. A method's first call after the
  others have compiled and warmed up is slow (performance-notes, "The command
  maps no blocks and runs executables on the calling thread", its streams
  paragraphs); this round keeps that call out of the timed frames.
- `frame_orders`: the methods of each frame run in an order drawn afresh
  (seeded), so that no method always runs right after the same one.
- `timed_step`: a timed call waits for everything the step returns (output,
  state and info), so no work of one method spills into the next one's time.

A method here is a pair ``(init, step)``: ``init()`` makes a fresh state,
``step(state, frame)`` returns a tuple whose first two items are the output
and the next state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

Method = tuple[Callable[[], Any], Callable[[Any, Any], tuple]]

__all__ = ["Method", "frame_orders", "timed_step", "warm_up"]


def warm_up(
    methods: Mapping[str, Method],
    frames: Sequence[Any],
    *,
    steps: int = 2,
    desc: str | None = None,
) -> dict[str, float]:
    """Compile each of ``methods``, then call every one once more (module docstring).

    Args:
        methods: name -> ``(init, step)``, warmed up in this order.
        frames: what the methods step over; the first ``steps`` are used (at
            least one).
        steps: frames each method is stepped over from a fresh state to compile.
        desc: a progress bar's label over the methods; none without it.

    Returns:
        name -> seconds of its first pass (its compiling and ``steps`` steps).

    Raises:
        ValueError: no frames, or ``steps`` below 1.
    """
    if len(frames) == 0:
        raise ValueError("dcjax: warm_up needs at least one frame")
    if steps < 1:
        raise ValueError(f"dcjax: warm_up's steps must be at least 1, got {steps}")
    items: Any = methods.items()
    if desc is not None:
        from tqdm.auto import tqdm

        items = tqdm(items, total=len(methods), desc=desc, unit="method", leave=False)
    seconds = {}
    for name, (init, step) in items:
        t0 = time.perf_counter()
        state = init()
        for f in frames[:steps]:
            state = timed_step(step, state, f)[1][1]
        seconds[name] = time.perf_counter() - t0
    for init, step in methods.values():  # the round: every method once more, from afresh
        timed_step(step, init(), frames[0])
    return seconds


def timed_step(step: Callable[[Any, Any], tuple], state: Any, frame: Any) -> tuple[float, tuple]:
    """``(seconds, result)`` of ``result = step(state, frame)``, timed until every
    array in ``result`` is ready (``jax.block_until_ready``)."""
    t0 = time.perf_counter()
    result = jax.block_until_ready(step(state, frame))
    return time.perf_counter() - t0, result


def frame_orders(names: Sequence[str], count: int, *, seed: int = 0) -> Iterator[list[str]]:
    """``count`` orders of ``names``, one a frame, each a permutation drawn afresh
    from a generator seeded with ``seed`` (the same orders on every run)."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        yield [names[i] for i in rng.permutation(len(names))]
