"""Data-dependent skipping of work as loops of zero or more trips.

Contract:

- `pinned(operands, i)` returns ``operands`` unchanged, routed through an
  optimization barrier tied to the loop counter ``i``. Inside a loop body this
  keeps XLA from hoisting work that does not depend on the counter out of the
  loop, where it would run even when the loop runs zero trips.
- `run_if(pred, fn, operands, init)` returns ``fn(*operands)`` where ``pred``
  holds and ``init`` where it does not; ``fn``'s result has ``init``'s
  structure, shapes and dtypes.
- `halving_sizes(smallest, limit)` returns the static step sizes of a sparse
  kernel: ``smallest * 2**j`` for j = J..0, largest first, J the least with
  ``smallest * (2**(J + 1) - 1) >= limit``. Any count of ``units`` (in
  ``smallest``-sized units) up to ``limit / smallest`` is the sum of the sizes
  whose bit j is set in ``units``, so a kernel runs at most J + 1 steps of
  static sizes and pads less than one ``smallest`` step. `halving_schedule`
  turns a dynamic count into ``(dense, units)`` for those steps.
- `shifted(a, dy, dx, axes)` returns ``a`` rolled so that ``out[i, j] =
  a[i + dy, j + dx]`` along ``axes`` (wrapping: callers mask what leaves the
  map); a zero shift returns ``a`` untouched, the roll sitting in a loop of
  zero or one trip (on CPU), so a cache shifted by a still camera keeps its
  buffer and is updated in place by the kernels. Under `jax.vmap` the loop
  runs once for all streams when any of them moved (a roll by zero leaves
  the others as they are).
- `skipping_pays()` says whether such data-dependent skipping is worth it on
  the default backend. On CPU it is. On GPU a loop with a dynamic trip count
  copies its predicate to the host at every test (and a conditional once),
  which stalls the stream for longer than the small pieces of work that the
  callers skip (a roll of a cache, a fallback search) take there; so on GPU
  and TPU callers do the work unconditionally, or in loops of static length.
  The one exception is the step's skip of a whole still frame
  (`dcjax.deepcache.Config.skip_unchanged`), which saves a network per predicate
  read. Inside ``with skipping(pays):`` it returns ``pays`` whatever the
  backend, so that the program of another backend can be traced and run here
  (`dcjax.transforms.host_syncs` lists what such a program reads on the host).

Why loops and not `lax.cond`: XLA:CPU copies the operand a conditional's branch
passes through into the conditional's result buffer, where a loop carry keeps
its buffer (see `dcjax.kernels.xla.sparse_or_dense`); and under `jax.vmap` a
conditional with a batched predicate becomes a select that runs both branches
for every stream, where a loop with a batched trip count runs its body only
while some stream still needs it, and selects per stream.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

__all__ = [
    "halving_schedule",
    "halving_sizes",
    "pinned",
    "run_if",
    "shifted",
    "skipping",
    "skipping_pays",
]

_SKIPPING: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
    "dcjax_skipping", default=None
)


def pinned(operands: Any, i: jax.Array) -> Any:
    """``operands``, made to depend on the loop counter ``i`` (see the module docstring)."""
    ops, _ = lax.optimization_barrier((operands, i))
    return ops


def run_if(pred: jax.Array, fn: Callable[..., Any], operands: tuple, init: Any) -> Any:
    """``fn(*operands)`` if ``pred`` else ``init``, as a loop of zero or one trip."""
    return lax.fori_loop(
        0, jnp.asarray(pred).astype(jnp.int32), lambda i, _: fn(*pinned(operands, i)), init
    )


def halving_sizes(smallest: int, limit: int) -> tuple[int, ...]:
    """Step sizes ``smallest * 2**j``, largest first, covering ``limit`` (see above)."""
    if smallest < 1:
        raise ValueError(f"dcjax: the smallest step must be positive, got {smallest}")
    j = 0
    while smallest * ((2 << j) - 1) < limit:
        j += 1
    return tuple(smallest << i for i in range(j, -1, -1))


def halving_schedule(
    count: jax.Array, threshold: int, smallest: int
) -> tuple[jax.Array, jax.Array]:
    """``(dense, units)``: whether ``count`` exceeds ``threshold`` (the dense path),
    else ``ceil(count / smallest)``, whose binary digits pick the `halving_sizes`."""
    dense = count > threshold
    units = jnp.where(dense, 0, (count + smallest - 1) // smallest)
    return dense, units.astype(jnp.int32)


def skipping_pays() -> bool:
    """Whether data-dependent loops and conditionals pay on the default backend
    (or what the innermost `skipping` says)."""
    pays = _SKIPPING.get()
    return jax.default_backend() == "cpu" if pays is None else pays


@contextlib.contextmanager
def skipping(pays: bool) -> Iterator[None]:
    """Within, `skipping_pays` returns ``pays`` (see the module docstring).

    It acts when a program is traced: a step traced inside keeps the choice.
    """
    token = _SKIPPING.set(bool(pays))
    try:
        yield
    finally:
        _SKIPPING.reset(token)


def shifted(a: jax.Array, dy: jax.Array, dx: jax.Array, axes: tuple[int, int]) -> jax.Array:
    """``out[i, j] = a[i + dy, j + dx]`` along ``axes``, wrapping (see above).

    On CPU the roll runs in a loop of zero trips when the shift is zero: a
    ``lax.cond`` with an identity branch would copy ``a`` into its result
    buffer (XLA:CPU copies a conditional's pass-through operand), where a loop
    carry keeps it. Off CPU the roll runs unconditionally (`skipping_pays`).
    """
    if not skipping_pays():  # on GPU a roll costs less than the loop's test
        return jnp.roll(a, (-dy, -dx), axis=axes)
    moved = _any_trip((dy != 0) | (dx != 0))
    return lax.fori_loop(0, moved, lambda _, a: jnp.roll(a, (-dy, -dx), axis=axes), a)


@jax.custom_batching.custom_vmap
def _any_trip(pred: jax.Array) -> jax.Array:
    """1 if ``pred`` else 0: the trip count of a loop of zero or one trip.

    Under `jax.vmap` the count is 1 when ``pred`` holds for any stream, for
    all of them, and unbatched: callers whose body is the identity where
    ``pred`` is false (`shifted`: a roll by zero) then need no per-stream
    select of the carry, which a batched trip count makes on every trip (a
    copy of the whole carry).
    """
    return pred.astype(jnp.int32)


@_any_trip.def_vmap
def _any_trip_vmap(axis_size, in_batched, pred):
    del axis_size
    return (jnp.any(pred) if in_batched[0] else pred).astype(jnp.int32), False
