"""Interleaved timing of stateful methods on the same frames: warm-up, order, timed step.

Every measurement that compares methods frame by frame (`dcjax.eval.harness`,
``dcjax bench streams``) runs them in one process on the same frames, and
follows the same rules (docs/performance-notes.md):

- `warm_up`: each method in turn is stepped from a fresh state over the first
  frames, which compiles it; then every method is called once more, untimed,
  from a fresh state on the first frame. A method's first call after the
  others have compiled and warmed up is slow (performance-notes, "The command
  maps no blocks and runs executables on the calling thread", its streams
  paragraphs); this round keeps that call out of the timed frames. Last, the
  heap's later growth is faulted in (`dcjax.allocator.reserve`, where the
  process keeps freed memory): interleaved programs fragment the heap, and
  the largest temporary block otherwise grows it on a few timed calls, at
  the cost of faulting its pages in (performance-notes, "The heap's growth is
  faulted in before the timed frames").
- `frame_orders`: the methods of each frame run in an order drawn afresh
  (seeded), so that no method always runs right after the same one.
- `timed_step`: a timed call waits for everything the step returns (output,
  state and info), so no work of one method spills into the next one's time,
  and counts the page faults it took, which the records carry.

A method here is a pair ``(init, step)``: ``init()`` makes a fresh state,
``step(state, frame)`` returns a tuple whose first two items are the output
and the next state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from dcjax import allocator

Method = tuple[Callable[[], Any], Callable[[Any, Any], tuple]]

__all__ = ["Method", "Timed", "frame_orders", "timed_step", "warm_up"]


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
            state = timed_step(step, state, f).result[1]
        seconds[name] = time.perf_counter() - t0
    for init, step in methods.values():  # the round: every method once more, from afresh
        timed_step(step, init(), frames[0])
    allocator.reserve()
    return seconds


class Timed(NamedTuple):
    """One timed call: its seconds, the page faults it took, what it returned."""

    seconds: float
    faults: int
    result: tuple


def timed_step(step: Callable[[Any, Any], tuple], state: Any, frame: Any) -> Timed:
    """``step(state, frame)`` timed until every array it returns is ready
    (``jax.block_until_ready``), with the minor page faults the process took
    meanwhile."""
    faults = allocator.page_faults()
    t0 = time.perf_counter()
    result = jax.block_until_ready(step(state, frame))
    seconds = time.perf_counter() - t0
    return Timed(seconds, allocator.page_faults() - faults, result)


def frame_orders(names: Sequence[str], count: int, *, seed: int = 0) -> Iterator[list[str]]:
    """``count`` orders of ``names``, one a frame, each a permutation drawn afresh
    from a generator seeded with ``seed`` (the same orders on every run)."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        yield [names[i] for i in rng.permutation(len(names))]
