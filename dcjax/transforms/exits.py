"""Exit points: marking them while tracing, splitting the jaxpr, nested `lax.cond`.

Contract:

- A mark is an identity wrapped in `jax.jit` whose jit ``name`` parameter is
  ``"dcjax_exit_point:" + name``. It needs no lowering rule, every JAX
  transformation already knows it, and it compiles to a call of an identity
  function (free). `exit_point` marks a value in a plain function; `marked`
  wraps a Flax module so that the outputs of chosen submodules are marked
  through `flax.linen.intercept_methods`.
- `plan` finds the marks among the top-level equations of an analysed jaxpr
  (marks inside nested jits are not split points) and cuts the equations into
  segments: segment ``e`` ends with mark ``e``; the last segment runs to the
  end. Every reused layer belongs to the segment of its top-level equation.
- `evaluate_with_exits` runs segment 0, calls ``test`` on the first marked
  value and evaluates everything after it inside the false branch of
  ``lax.cond(take, exit, rest)``, nested mark by mark, so a taken exit really
  skips the remaining layers. Branches are pure: they return the outputs, the
  results of the layers they own (from ``reuse``) or the placeholders of the
  layers they skip (from ``skipped``), the exit index and the carry.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax import lax
from jax.extend import core as jcore

from dcjax.transforms.analysis import conv_flops, dot_flops
from dcjax.transforms.interpreter import Env, Policy, run_eqns
from dcjax.transforms.motion import FrameContext
from dcjax.transforms.records import Analysis
from dcjax.transforms.spatial import Spatial

__all__ = [
    "MARK_PREFIX",
    "ExitPlan",
    "evaluate_with_exits",
    "exit_point",
    "mark_name",
    "marked",
    "plan",
]

MARK_PREFIX = "dcjax_exit_point:"


@functools.cache
def _marker(name: str) -> Callable[[Any], Any]:
    def identity(x):
        return x

    identity.__name__ = identity.__qualname__ = MARK_PREFIX + name
    return jax.jit(identity)


def exit_point(x: Any, name: str) -> Any:
    """Mark ``x`` as the exit point ``name`` (an identity).

    Use it in a plain model function ``fn(variables, x)`` to place semantic
    exits (`dcjax.deepcache.SemanticConfig`); the rest of the function after
    the mark can then be skipped. Only marks at the top level of the traced
    function (not inside a nested `jax.jit`) are split points.

    Args:
        x: an array (the exit point's feature map, e.g. ``(1, H, W, C)``).
        name: the exit point's name; unique within the model.

    Returns:
        ``x`` unchanged.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"dcjax: exit_point name must be a non-empty string, got {name!r}")
    return _marker(name)(x)


def mark_name(eqn: jcore.JaxprEqn) -> str | None:
    """The exit point's name if ``eqn`` is a mark, else None."""
    if eqn.primitive.name not in ("jit", "pjit"):
        return None
    name = str(eqn.params.get("name", ""))
    if not name.startswith(MARK_PREFIX) or len(eqn.invars) != 1 or len(eqn.outvars) != 1:
        return None
    return name[len(MARK_PREFIX) :]


def marked(model: Any, names: Sequence[str] | None) -> Callable[[Any, jax.Array], Any]:
    """``fn(variables, x)`` that runs ``model`` with its exit points marked.

    Args:
        model: a `flax.linen.Module` or a callable ``fn(variables, x)`` (whose
            marks come from `exit_point`).
        names: submodule paths (``"block3"``, ``"block3/project"``) to mark;
            ``None`` marks every top-level submodule of a Flax model.
    """
    import flax.linen as nn

    if not isinstance(model, nn.Module):
        if not callable(model):
            raise TypeError(
                "dcjax: model must be a flax.linen.Module or a callable fn(variables, x), "
                f"got {type(model).__name__}"
            )
        return model
    wanted = None if names is None else frozenset(names)

    def interceptor(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        path = tuple(context.module.path)
        if context.method_name != "__call__" or not path:
            return out
        name = "/".join(path)
        hit = len(path) == 1 if wanted is None else name in wanted
        if hit and isinstance(out, jax.Array) and out.ndim >= 1:
            out = exit_point(out, name)
        return out

    def fn(variables, x):
        with nn.intercept_methods(interceptor):
            return model.apply(variables, x)

    return fn


@dataclasses.dataclass(frozen=True)
class ExitPlan:
    """Where the top-level jaxpr is cut.

    Attributes:
        names: the exit points, in order.
        marks: top-level equation index of each mark.
        variables: each mark's output variable (the exit point's value).
        signatures: each marked value's spatial signature (None if not spatial).
        bounds: ``(start, stop)`` equation range of each segment (one more
            than there are exit points).
        segment_layers: the reused layers of each segment.
        flops_after: per exit point, the FLOPs of convolutions and matrix
            products that an exit there skips.
        other_after: per exit point, the part of ``flops_after`` outside the
            reused layers (convolutions that are not reused, matrix products).
    """

    names: tuple[str, ...]
    marks: tuple[int, ...]
    variables: tuple[Any, ...]
    signatures: tuple[Spatial | None, ...]
    bounds: tuple[tuple[int, int], ...]
    segment_layers: tuple[tuple[int, ...], ...]
    flops_after: tuple[int, ...]
    other_after: tuple[int, ...]

    @property
    def num_exits(self) -> int:
        return len(self.names)


def _layers_of(info) -> list[int]:
    out = [] if info.layer is None else [info.layer]
    if info.sub is not None:
        for sub in info.sub.eqns:
            out.extend(_layers_of(sub))
    return out


def _flops_of(eqn: jcore.JaxprEqn, info, layers: bool = True, dots: bool = True) -> int:
    """FLOPs of the frame-dependent convolutions and matrix products in ``eqn``
    (recursively); without ``layers`` only those outside the reused layers,
    without ``dots`` only convolutions."""
    if info.sub is not None:
        sub = info.sub
        return sum(
            _flops_of(e, i, layers, dots)
            for e, i in zip(sub.jaxpr.jaxpr.eqns, sub.eqns, strict=True)
        )
    if not info.dynamic:
        return 0
    if eqn.primitive.name == "conv_general_dilated":
        return conv_flops(eqn) if layers or info.layer is None else 0
    if dots and eqn.primitive.name == "dot_general":
        return dot_flops(eqn)
    return 0


def plan(analysis: Analysis, names: Sequence[str] | None = None) -> ExitPlan:
    """Find the exit points of ``analysis.jaxpr`` and cut it into segments.

    Args:
        analysis: the analysed traced model (`dcjax.transforms.analysis.analyze`).
        names: the exit points to use, in any order; ``None``: every mark that
            depends on the frame and is followed by more convolutions.

    Raises:
        ValueError: a named exit point is not among the top-level marks, or
            there is no usable exit point.
    """
    eqns = analysis.jaxpr.jaxpr.eqns
    layer_eqn = {}
    for i, info in enumerate(analysis.eqns):
        for layer in _layers_of(info):
            layer_eqn[layer] = i
    eqn_flops = [_flops_of(e, i) for e, i in zip(eqns, analysis.eqns, strict=True)]
    eqn_other = [_flops_of(e, i, False) for e, i in zip(eqns, analysis.eqns, strict=True)]
    eqn_conv = [_flops_of(e, i, dots=False) for e, i in zip(eqns, analysis.eqns, strict=True)]
    found: list[tuple[int, str]] = []
    for i, eqn in enumerate(eqns):
        name = mark_name(eqn)
        if name is not None and analysis.eqns[i].dynamic:
            found.append((i, name))
    available = [n for _, n in found]
    if names is not None:
        missing = [n for n in names if n not in available]
        if missing:
            raise ValueError(
                f"dcjax: exit point(s) {missing} not found; the model's top-level exit points "
                f"are {available} (submodule paths such as 'block3', or dcjax.exit_point marks)"
            )
        chosen = [(i, n) for i, n in found if n in set(names)]
    else:
        chosen = [(i, n) for i, n in found if sum(eqn_conv[i + 1 :]) > 0]
    # one exit per name (a module called twice marks twice: keep the first)
    seen: set[str] = set()
    chosen = [(i, n) for i, n in chosen if not (n in seen or seen.add(n))]
    if not chosen:
        raise ValueError(
            "dcjax: no semantic exit point: the model has no top-level submodule or "
            "dcjax.exit_point mark followed by more convolutions (marks found: "
            f"{available}); name exit points with SemanticConfig(exit_points=...)"
        )
    marks = tuple(i for i, _ in chosen)
    starts = (0, *(m + 1 for m in marks))
    stops = (*(m + 1 for m in marks), len(eqns))
    bounds = tuple(zip(starts, stops, strict=True))
    segment_layers = tuple(
        tuple(sorted(layer for layer, e in layer_eqn.items() if a <= e < b)) for a, b in bounds
    )
    flops_after = tuple(sum(eqn_flops[m + 1 :]) for m in marks)
    other_after = tuple(sum(eqn_other[m + 1 :]) for m in marks)
    return ExitPlan(
        names=tuple(n for _, n in chosen),
        marks=marks,
        variables=tuple(eqns[i].outvars[0] for i in marks),
        signatures=tuple(analysis.eqns[i].out_sigs[0] for i in marks),
        bounds=bounds,
        segment_layers=segment_layers,
        flops_after=flops_after,
        other_after=other_after,
    )


def evaluate_with_exits(
    exit_plan: ExitPlan,
    analysis: Analysis,
    args: Sequence[Any],
    masks: Sequence[Any],
    ctx: FrameContext,
    policy: Policy,
    skipped: Callable[[int], Any],
    test: Callable[[int, jax.Array, Any], tuple[jax.Array, Any]],
    exit_outputs: Callable[[int, Any], list],
    carry: Any,
) -> tuple[list, dict[int, Any], jax.Array, Any]:
    """Evaluate the model with an early exit after each exit point.

    Args:
        exit_plan: from `plan`.
        analysis: the analysed traced model.
        args, masks: one value and one reuse mask per invar.
        ctx: the frame's motion and alignment.
        policy: the interpreter's `Policy`; its `Policy.reuse` must be pure
            (it runs inside `lax.cond` branches), its result is what the
            caller wants back for each layer.
        skipped: ``skipped(layer) -> result`` for a layer an exit skipped
            (the same structure as the policy's reuse result).
        test: ``test(e, value, carry) -> (take, carry)`` at exit point ``e``
            with its marked value; ``take`` is a boolean scalar.
        exit_outputs: ``exit_outputs(e, carry)`` the model's flat outputs when
            the exit at ``e`` is taken (the same shapes and dtypes).
        carry: a pytree threaded through the tests and returned.

    Returns:
        ``(outputs, results, exit, carry)``: ``results`` maps every layer to its
        result, ``exit`` is the exit taken (int32, -1 when none).
    """
    env = Env.of(analysis, args, masks)
    outs, results, exit_index, carry = _segment(
        exit_plan, env, 0, ctx, policy, skipped, test, exit_outputs, carry
    )
    order = [layer for seg in exit_plan.segment_layers for layer in seg]
    return outs, dict(zip(order, results, strict=True)), exit_index, carry


def _segment(exit_plan, env, k, ctx, policy, skipped, test, exit_outputs, carry):
    """Run segment ``k`` and, nested in conds, everything after it."""
    start, stop = exit_plan.bounds[k]
    run_eqns(env, start, stop, ctx, policy)
    own = [env.layers[layer] for layer in exit_plan.segment_layers[k]]
    if k == exit_plan.num_exits:
        outs, _ = env.outputs()
        return list(outs), own, jax.numpy.int32(-1), carry
    value, _ = env.read(exit_plan.variables[k])
    take, carry = test(k, value, carry)
    later = [layer for seg in exit_plan.segment_layers[k + 1 :] for layer in seg]
    out_avals = [v.aval for v in env.analysis.jaxpr.jaxpr.outvars]

    def exit_branch(c):
        outs = [
            jax.numpy.asarray(o).astype(a.dtype).reshape(a.shape)
            for o, a in zip(exit_outputs(k, c), out_avals, strict=True)
        ]
        return outs, [skipped(layer) for layer in later], jax.numpy.int32(k), c

    def rest_branch(c):
        return _segment(exit_plan, env.copy(), k + 1, ctx, policy, skipped, test, exit_outputs, c)

    outs, rest, exit_index, carry = lax.cond(take, exit_branch, rest_branch, carry)
    return outs, own + list(rest), exit_index, carry
