"""The exits' guard: bounded staleness, checked exits, and a stream's exits switched off.

An exit returns a class from memory without running the rest of the network;
a memory that has gone wrong (a scene unlike the calibration, centres drifted
to a near-tied class) would keep returning it. The guard bounds that, per
stream, with fixed-shape counters (`ExitGuard`, part of
`dcjax.semantic.SemanticState`):

- **bounded staleness**: after ``max_exits`` consecutive exits the next frame
  runs the full network (`allows` is false), and its top-1 is compared with
  the last exit's class: a *check*;
- a check that disagrees (a *mismatch*) starts a cool-down of ``max_exits``
  full frames, in which the memory learns from full inferences only;
- **switched off**: once the mismatches exceed one and the share that
  ``min_agreement`` allows of the checks so far, the stream runs without exits
  for good (``enabled`` false; the step's ``info["exits_enabled"]`` says so).

`dcjax.semantic.check` switches a memory off before the stream starts, when
exits on held-back calibration images do not agree with the full model.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

__all__ = ["ExitGuard", "after_frame", "allows", "fresh"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True, kw_only=True)
class ExitGuard:
    """The guard's counters of one stream (int32 and bool scalars).

    Attributes:
        streak: consecutive exits so far; negative: full frames of cool-down left.
        last_exit: the class the last exit returned (-1 before the first).
        checks: full frames run after ``max_exits`` exits.
        mismatches: checks whose top-1 was not the last exit's class.
        enabled: whether the stream may exit at all.
    """

    streak: jax.Array
    last_exit: jax.Array
    checks: jax.Array
    mismatches: jax.Array
    enabled: jax.Array


def fresh(enabled: bool = True) -> ExitGuard:
    """The guard of a stream that has not run yet."""
    return ExitGuard(
        streak=jnp.int32(0),
        last_exit=jnp.int32(-1),
        checks=jnp.int32(0),
        mismatches=jnp.int32(0),
        enabled=jnp.bool_(enabled),
    )


def allows(guard: ExitGuard, max_exits: int) -> jax.Array:
    """Whether this frame may exit: exits on, no cool-down, fewer than ``max_exits`` in a row."""
    return guard.enabled & (guard.streak >= 0) & (guard.streak < max_exits)


def after_frame(
    guard: ExitGuard,
    *,
    exited: jax.Array,
    exit_class: jax.Array,
    predicted: jax.Array,
    max_exits: int,
    min_agreement: float,
) -> ExitGuard:
    """The guard after a frame that exited (``exit_class``) or ran in full (top-1 ``predicted``)."""
    check = ~exited & (guard.streak >= max_exits)
    mismatch = check & (predicted != guard.last_exit)
    checks = guard.checks + check.astype(jnp.int32)
    mismatches = guard.mismatches + mismatch.astype(jnp.int32)
    allowed = jnp.maximum(1.0, (1.0 - min_agreement) * checks.astype(jnp.float32))
    streak = jnp.where(
        exited,
        guard.streak + 1,
        jnp.where(mismatch, -max_exits, jnp.where(guard.streak < 0, guard.streak + 1, 0)),
    )
    return ExitGuard(
        streak=streak.astype(jnp.int32),
        last_exit=jnp.where(exited, exit_class, guard.last_exit).astype(jnp.int32),
        checks=checks,
        mismatches=mismatches,
        enabled=guard.enabled & (mismatches.astype(jnp.float32) <= allowed),
    )
