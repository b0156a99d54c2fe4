"""The caching interpreter: evaluate a traced model, reusing cached layer outputs.

`evaluate` runs the equations of an analysed jaxpr (see `analysis.analyze`)
with `jax` primitives, carrying next to every value its reuse mask (see
`regions`). Equations that do not depend on the frame run as they are and carry
the static mask ``True``; call-like primitives are interpreted in place, so
layers inside `jit`, `remat` or custom-derivative calls are reused too.
Primitives are bound through `lowering.bind`, which computes max pooling and
constant powers in forms that XLA:CPU runs faster, with the same results.

Each equation is evaluated inside a `jax.named_scope` of its name in the
traced model (Flax's module path, ``AlexNet/conv3/conv``), so the compiled
program's operations carry the layer they belong to (`dcjax.eval.profile`
charges their time to layers).

What happens at the equations where binding the primitive is not the whole
story is one `Policy` object's business:

- every reused layer (a convolution) goes to `Policy.reuse` with its output
  mask (and, where `Policy.fuses` says so, the `Epilogue` of the elementwise
  chain after it); it returns the layer's output
  (``where(R_out, shift(cache_{t-1}, M/s), op(x_t))``, computed sparsely by
  the kernels) and a result of the policy's choosing (the new cache);
- with `Policy.refines`, `Policy.refine` may widen a reused layer's input mask
  (refinement) and return a result (the new reference);
- fully connected layers (`DenseLayer`) go to `Policy.dense`, which may update
  their products by the changed inputs and return a result.

The interpreter collects those results per layer and returns them with the
outputs (`Evaluation`): it holds no state between evaluations, and a policy
returns what it computed rather than writing it somewhere. With
`Policy.records`, every frame-dependent spatial variable's signature, value
and mask is returned too (`propagate_masks`, a diagnostic). The base `Policy`
computes every layer in full.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import core as jcore

from dcjax.kernels import Epilogue, dense_conv_eqn
from dcjax.kernels import lowering as conv_lowering
from dcjax.transforms import lowering, regions
from dcjax.transforms.calls import sub_jaxpr
from dcjax.transforms.motion import FrameContext
from dcjax.transforms.patterns import elementwise_call
from dcjax.transforms.records import Analysis, EqnInfo

__all__ = [
    "DensePolicy",
    "Env",
    "Evaluation",
    "Policy",
    "dense_forward",
    "evaluate",
    "propagate_masks",
    "run_eqns",
]


class Policy:
    """What the interpreter does at reused layers, refined inputs and fully
    connected layers (see the module docstring). Override what you need; the
    base class computes everything in full and returns no results.

    Attributes:
        refines: whether `refine` is called at reused layers' inputs.
        records: whether `evaluate` returns every spatial variable's value and
            mask (`Evaluation.records`).
        lowerings: the model's dense lowerings, in force while `evaluate`
            runs (a mapping for `dcjax.kernels.lowering.use`); None: those of
            the caller's context (the fixed rules outside any).
    """

    refines: bool = False
    records: bool = False
    lowerings: Mapping[str, str] | None = None

    def reuse(
        self,
        layer: int,
        eqn: jcore.JaxprEqn,
        invals: list,
        mask: regions.Mask,
        epilogue: Epilogue | None,
    ) -> tuple[jax.Array, Any]:
        """``(output, result)`` of reused layer ``layer`` given its output mask;
        ``epilogue`` is the fused chain (`fuses`) to apply to its output, or None."""
        out = lowering.bind(eqn, invals)[0]
        return (out if epilogue is None else epilogue(out)), None

    def fuses(self, layer: int) -> bool:
        """Whether ``layer`` is evaluated with its epilogue (`EqnInfo.epilogue`)."""
        return False

    def refine(self, layer: int, x: jax.Array, in_mask: regions.Mask) -> tuple[regions.Mask, Any]:
        """``(mask, result)``: the input mask reused layer ``layer`` uses for its
        input ``x`` (called only when `refines`)."""
        return in_mask, None

    def dense(self, index: int, eqn: jcore.JaxprEqn, invals: list) -> tuple[jax.Array, Any]:
        """``(product, result)`` of fully connected layer ``index`` (`DenseLayer`)."""
        return lowering.bind(eqn, invals)[0], None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Evaluation:
    """What `evaluate` returns.

    Attributes:
        outputs: the jaxpr's outputs.
        masks: their reuse masks.
        layers: reused layer -> its `Policy.reuse` result.
        dense: fully connected layer -> its `Policy.dense` result.
        refined: reused layer -> its `Policy.refine` result (with `Policy.refines`).
        records: with `Policy.records`, ``(path, var name) -> (signature, value,
            mask)`` for every frame-dependent spatial variable, ``path`` the
            indices of the equations leading to it (through nested jaxprs).
    """

    outputs: list
    masks: list
    layers: dict[int, Any]
    dense: dict[int, Any]
    refined: dict[int, Any]
    records: dict[tuple, tuple] = dataclasses.field(default_factory=dict)


def _position_test(
    ctx: FrameContext, eqn: jcore.JaxprEqn, info: EqnInfo, mask: regions.Mask, out_sig
) -> regions.Mask:
    """``mask`` ANDed with what the equation does to positions.

    A spatial output of an equation that may move content (every primitive but
    the position-preserving ones of `regions.PASSTHROUGH` with an operand of
    the output's signature) keeps only pixels whose shifted position is aligned
    and inside the map (`FrameContext.valid`); an output whose H or W carries
    content anchored to positions (`EqnInfo.anchored`) keeps only pixels where
    the shift along that axis is zero.
    """
    if out_sig is None:
        return mask
    moves = eqn.primitive not in regions.PASSTHROUGH or all(s != out_sig for s in info.in_sigs)
    if moves:
        mask = mask & ctx.valid(out_sig)
    for anchored, zero in zip(info.anchored, ctx.zero_shift(out_sig)):
        if anchored:
            mask = mask & zero
    return mask


class Env:
    """Values and masks of a jaxpr's variables during one evaluation, and the
    per-layer results collected so far.

    `evaluate` is `Env.of` + `run_eqns` over all equations + `result`; the
    pieces are public so that a caller can evaluate a jaxpr segment by segment
    (the semantic early exits run the rest of the network inside `lax.cond`,
    each branch on its own `copy`).
    """

    def __init__(self, analysis: Analysis, path: tuple[int, ...] = ()) -> None:
        self.analysis = analysis
        self.path = path
        self.values: dict[Any, Any] = {}
        self.masks: dict[Any, Any] = {}
        # fused layers waiting for the end of their epilogue: last eqn -> call
        self.pending: dict[int, tuple] = {}
        self.layers: dict[int, Any] = {}
        self.dense: dict[int, Any] = {}
        self.refined: dict[int, Any] = {}
        self.records: dict[tuple, tuple] = {}

    @classmethod
    def of(
        cls,
        analysis: Analysis,
        args: Sequence[Any],
        masks: Sequence[regions.Mask],
        path: tuple[int, ...] = (),
    ) -> Env:
        env = cls(analysis, path)
        closed = analysis.jaxpr
        for v, c in zip(closed.jaxpr.constvars, closed.consts):
            env.write(v, c, True)
        for v, a, m in zip(closed.jaxpr.invars, args, masks):
            env.write(v, a, m)
        return env

    def copy(self) -> Env:
        env = Env(self.analysis, self.path)
        env.values, env.masks = dict(self.values), dict(self.masks)
        env.pending = dict(self.pending)
        env.layers, env.dense = dict(self.layers), dict(self.dense)
        env.refined, env.records = dict(self.refined), dict(self.records)
        return env

    def write(self, v, value, mask) -> None:
        self.values[v], self.masks[v] = value, mask

    def read(self, v) -> tuple[Any, regions.Mask]:
        if isinstance(v, jcore.Literal):
            return v.val, True
        return self.values[v], self.masks[v]

    def outputs(self) -> tuple[list, list]:
        results = [self.read(v) for v in self.analysis.jaxpr.jaxpr.outvars]
        return [r[0] for r in results], [r[1] for r in results]

    def result(self) -> Evaluation:
        """The outputs and everything collected, as an `Evaluation`."""
        outs, masks = self.outputs()
        return Evaluation(
            outputs=outs, masks=masks, layers=dict(self.layers), dense=dict(self.dense),
            refined=dict(self.refined), records=dict(self.records),
        )  # fmt: skip

    def absorb(self, sub: Evaluation) -> None:
        """Take the per-layer results of a nested evaluation (a call's sub-jaxpr)."""
        self.layers.update(sub.layers)
        self.dense.update(sub.dense)
        self.refined.update(sub.refined)
        self.records.update(sub.records)


def evaluate(
    analysis: Analysis,
    args: Sequence[Any],
    masks: Sequence[regions.Mask],
    ctx: FrameContext,
    policy: Policy,
    path: tuple[int, ...] = (),
) -> Evaluation:
    """Evaluate ``analysis.jaxpr`` on ``args``, propagating reuse masks.

    Args:
        analysis: the result of `analysis.analyze` for this jaxpr.
        args: one value per invar.
        masks: one mask per invar (``True`` for parameters).
        ctx: the frame's motion and alignment.
        policy: what to do at reused, refined and fully connected layers.
        path: the equations leading to this jaxpr (for `Evaluation.records`).

    Returns:
        The `Evaluation`: outputs, their masks and the per-layer results.
    """
    if policy.lowerings is not None and not path:  # the top level: the model's lowerings
        with conv_lowering.use(policy.lowerings):
            return _evaluate(analysis, args, masks, ctx, policy, path)
    return _evaluate(analysis, args, masks, ctx, policy, path)


def _evaluate(analysis, args, masks, ctx, policy, path) -> Evaluation:
    env = Env.of(analysis, args, masks, path)
    run_eqns(env, 0, len(analysis.eqns), ctx, policy)
    return env.result()


def run_eqns(env: Env, start: int, stop: int, ctx: FrameContext, policy: Policy) -> None:
    """Evaluate equations ``start:stop`` of ``env.analysis`` into ``env``."""
    eqns = env.analysis.jaxpr.jaxpr.eqns
    for i in range(start, stop):
        pending = env.pending.get(i)  # a fused layer runs in its own scope
        with _scope(eqns[i] if pending is None else pending[1]):
            _run_eqn(env, i, ctx, policy)


def _scope(eqn: jcore.JaxprEqn):
    """The equation's name scope in the traced model (a no-op where it has none)."""
    name = str(eqn.source_info.name_stack)
    return jax.named_scope(name) if name else contextlib.nullcontext()


def _record(env: Env, policy: Policy, i: int, var, sig, value, mask) -> None:
    if policy.records and sig is not None:
        env.records[(env.path + (i,), str(var))] = (sig, value, mask)


def _run_eqn(env: Env, i: int, ctx: FrameContext, policy: Policy) -> None:
    """Evaluate equation ``i`` of ``env.analysis`` into ``env`` (see `run_eqns`)."""
    analysis = env.analysis
    eqn, info = analysis.jaxpr.jaxpr.eqns[i], analysis.eqns[i]
    if info.fused_into is not None and _fused(analysis, info.fused_into, policy):
        if i == analysis.eqns[info.fused_into].epilogue[-1]:
            layer, leqn, linvals, mask = env.pending.pop(i)
            chain = analysis.eqns[info.fused_into].epilogue
            epilogue, pixel_masks = _epilogue(env, leqn, chain)
            mask = regions.and_all([mask, *pixel_masks])
            out, env.layers[layer] = policy.reuse(layer, leqn, linvals, mask, epilogue)
            env.write(eqn.outvars[0], out, mask)
            _record(env, policy, i, eqn.outvars[0], info.out_sigs[0], out, mask)
        return
    invals, inmasks = zip(*(env.read(v) for v in eqn.invars)) if eqn.invars else ((), ())
    if not info.dynamic:
        outs, omasks = lowering.bind(eqn, invals), [True] * len(eqn.outvars)
    elif info.sub is not None:
        sub = evaluate(info.sub, invals, inmasks, ctx, policy, env.path + (i,))
        env.absorb(sub)
        outs, omasks = sub.outputs, sub.masks
    else:
        if policy.refines and info.layer is not None:
            refined, env.refined[info.layer] = policy.refine(info.layer, invals[0], inmasks[0])
            inmasks = (refined, *inmasks[1:])
        if info.supported:
            rule = regions.MASK_RULES.get(eqn.primitive)
            omasks = (
                rule(
                    ctx,
                    eqn,
                    info.in_sigs,
                    info.out_sigs,
                    list(inmasks),
                    **eqn.params,
                    operands=info.in_consts,
                )  # fmt: skip
                if rule is not None and any(s is not None for s in info.in_sigs)
                else [regions.and_all(inmasks)] * len(eqn.outvars)
            )
        else:
            omasks = regions.unsupported(ctx, eqn, info.in_sigs, info.out_sigs, inmasks)
        omasks = [_position_test(ctx, eqn, info, m, o) for m, o in zip(omasks, info.out_sigs)]
        if info.layer is not None and info.epilogue and _fused(analysis, i, policy):
            env.pending[info.epilogue[-1]] = (info.layer, eqn, list(invals), omasks[0])
            return  # evaluated where the epilogue ends
        if info.layer is not None:
            out, env.layers[info.layer] = policy.reuse(
                info.layer, eqn, list(invals), omasks[0], None
            )
            outs = [out]
        elif info.dense is not None:
            out, env.dense[info.dense] = policy.dense(info.dense, eqn, list(invals))
            outs = [out]
        else:
            outs = lowering.bind(eqn, invals)
    for v, val, m, sig in zip(eqn.outvars, outs, omasks, info.out_sigs):
        env.write(v, val, m)
        if info.dynamic:
            _record(env, policy, i, v, sig, val, m)


def _fused(analysis: Analysis, index: int, policy: Policy) -> bool:
    """Whether the layer at equation ``index`` is evaluated with its epilogue."""
    info = analysis.eqns[index]
    return bool(info.epilogue) and policy.fuses(info.layer)


def _epilogue(
    env: Env, layer_eqn: jcore.JaxprEqn, region: Sequence[int]
) -> tuple[Epilogue, list[regions.Mask]]:
    """The equations ``region`` as an `Epilogue`, and its pixel operands' masks.

    Operands with a spatial signature that are not values of the epilogue are
    pixel operands (a residual branch); the others are per-channel, passed as
    ``(C,)`` vectors or scalars.
    """
    analysis = env.analysis
    eqns = analysis.jaxpr.jaxpr.eqns
    inside = {layer_eqn.outvars[0]}
    steps, channel, pixel, pixel_masks = [], [], [], []
    for j in region:
        e = eqns[j]
        slots = []
        for u, sig in zip(e.invars, analysis.eqns[j].in_sigs):
            if not isinstance(u, jcore.Literal) and u in inside:
                slots.append(("in", u))
                continue
            val, mask = env.read(u)
            if sig is not None:
                pixel.append(val)
                pixel_masks.append(mask)
                slots.append(("pixel", len(pixel) - 1))
            else:
                val = jnp.asarray(val)
                channel.append(val.reshape(-1) if val.size > 1 else val.reshape(()))
                slots.append(("channel", len(channel) - 1))
        steps.append((e, elementwise_call(e), tuple(slots)))
        inside.add(e.outvars[0])
    n_channel = len(channel)
    first, last = layer_eqn.outvars[0], eqns[region[-1]].outvars[0]

    def fn(y, *ops):
        vals = {first: y}

        def arg(slot):
            kind, k = slot
            if kind == "in":
                return vals[k]
            if kind == "pixel":
                return ops[n_channel + k]
            return jnp.broadcast_to(ops[k], y.shape)

        for e, sub, slots in steps:
            args = [arg(slot) for slot in slots]
            # an elementwise call runs its body on y's shape
            out = _eval_elementwise(sub, *args) if sub is not None else lowering.bind(e, args)[0]
            vals[e.outvars[0]] = out
        return vals[last]

    return Epilogue(fn, tuple(channel), tuple(pixel)), pixel_masks


def _eval_elementwise(closed: jcore.ClosedJaxpr, *args: jax.Array) -> jax.Array:
    """Run an `elementwise_call` body on ``args`` of any shape (calls inlined)."""
    jaxpr = closed.jaxpr
    vals = dict(zip(jaxpr.invars, args))
    for e in jaxpr.eqns:
        ins = [u.val if isinstance(u, jcore.Literal) else vals[u] for u in e.invars]
        sub = sub_jaxpr(e)
        outs = [_eval_elementwise(sub, *ins)] if sub is not None else lowering.bind(e, ins)
        vals.update(zip(e.outvars, outs))
    return vals[jaxpr.outvars[0]]


def propagate_masks(
    analysis: Analysis,
    args: Sequence[Any],
    masks: Sequence[regions.Mask],
    ctx: FrameContext,
) -> tuple[list, dict]:
    """Evaluate the model densely and return every spatial variable's mask.

    A diagnostic: ``(outputs, {(path, var_name): (signature, value, mask)})``
    where ``path`` holds the indices of the equations leading to the variable
    (through nested jaxprs). Used by the soundness tests and the notebooks.
    """
    result = evaluate(analysis, args, masks, ctx, _Recording())
    return result.outputs, result.records


class _Recording(Policy):
    """The dense policy, recording every spatial variable (`propagate_masks`)."""

    records = True


class DensePolicy(Policy):
    """Every reused layer computed in full the way the sparse kernels' dense
    path computes it (`dcjax.kernels.dense_conv_eqn`: XLA:CPU's slow grouped
    convolutions rewritten), no result; with the dense ``lowerings`` given."""

    def __init__(self, lowerings: Mapping[str, str] | None = None) -> None:
        self.lowerings = lowerings

    def reuse(self, layer, eqn, invals, mask, epilogue):
        out = dense_conv_eqn(eqn, invals)
        return (out if epilogue is None else epilogue(out)), None


def dense_forward(
    analysis: Analysis,
    leaves: Sequence[Any],
    x: jax.Array,
    lowerings: Mapping[str, str] | None = None,
) -> list:
    """The model's outputs on input ``x`` (batch of one) computed in full by
    `DensePolicy` with the dense ``lowerings`` (None: the caller's, else the
    fixed rules), no mask propagated: the dense lowering of the model."""
    k = len(leaves)
    ctx = FrameContext(jnp.zeros((2,), jnp.int32), "exact")
    policy = DensePolicy(lowerings)
    return list(evaluate(analysis, [*leaves, x], [True] * (k + 1), ctx, policy).outputs)
