"""The caching interpreter: evaluate a traced model, reusing cached layer outputs.

`evaluate` runs the equations of an analysed jaxpr (see `signatures.analyze`)
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

Every reused layer (a convolution by default) is handed to a ``reuse``
callback with its output mask; the callback returns the layer's output
(``where(R_out, shift(cache_{t-1}, M/s), op(x_t))``, computed sparsely by the
kernels) and records the new cache. The interpreter itself holds no state.
Fully connected layers (`signatures.DenseLayer`) go to a ``dense`` callback
when one is given (refinement updates their products by the changed inputs).

`FrameContext` is the per-frame view the mask rules use: the global motion
``M = (My, Mx)`` and the alignment policy. For a variable of stride
``s = p/q`` the shift is ``M * q / p``. Under ``alignment="exact"`` a variable
whose shift is not an integer is not reusable at all; under ``"round"`` the
shift is rounded half up.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend import core as jcore

from dcjax.kernels import Epilogue
from dcjax.transforms import lowering, regions
from dcjax.transforms.calls import sub_jaxpr
from dcjax.transforms.patterns import elementwise_call
from dcjax.transforms.records import Analysis
from dcjax.transforms.spatial import Spatial

ReuseFn = Callable[..., jax.Array]
RefineFn = Callable[[int, jax.Array, regions.Mask], regions.Mask]
DenseFn = Callable[[int, jcore.JaxprEqn, list], jax.Array]


class FrameContext:
    """The frame's motion, as the mask rules and the reuse step see it.

    Args:
        motion: int32 ``(2,)``, the global motion ``(My, Mx)`` in input pixels.
        alignment: ``"exact"`` or ``"round"``.
    """

    def __init__(self, motion: jax.Array, alignment: str) -> None:
        self.motion = jnp.asarray(motion, jnp.int32)
        self.alignment = alignment
        self._shifts: dict[Any, tuple] = {}
        self._valid: dict[Any, jax.Array] = {}
        self.zero_motion = jnp.all(self.motion == 0)

    def shift(self, sig: Spatial) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``(dy, dx, aligned)``: the shift at a variable of signature ``sig``."""
        key = sig.stride
        if key not in self._shifts:
            out = []
            aligned = jnp.bool_(True)
            for k in range(2):
                p, q = sig.stride[k].numerator, sig.stride[k].denominator
                num = self.motion[k] * q
                if self.alignment == "exact":
                    aligned = aligned & (num % p == 0)
                    out.append(num // p)
                else:
                    out.append((2 * num + p) // (2 * p))
            self._shifts[key] = (out[0], out[1], aligned)
        return self._shifts[key]

    def zero_shift(self, sig: Spatial) -> tuple[jax.Array, jax.Array]:
        dy, dx, _ = self.shift(sig)
        return dy == 0, dx == 0

    def valid(self, sig: Spatial) -> jax.Array:
        """(H_v, W_v): aligned, and the shifted position lies inside the map."""
        key = (sig.size, sig.stride)
        if key not in self._valid:
            dy, dx, aligned = self.shift(sig)
            iy = jnp.arange(sig.size[0])[:, None] + dy
            ix = jnp.arange(sig.size[1])[None, :] + dx
            inside = (iy >= 0) & (iy < sig.size[0]) & (ix >= 0) & (ix < sig.size[1])
            self._valid[key] = inside & aligned
        return self._valid[key]

    def collapse(self, mask: regions.Mask) -> regions.Mask:
        if mask is True:
            return True
        return jnp.all(mask) & self.zero_motion


def _needs_valid(in_sigs: Sequence, out_sig: Spatial | None) -> bool:
    return out_sig is not None and all(s != out_sig for s in in_sigs)


class Env:
    """Values and masks of a jaxpr's variables during one evaluation.

    `evaluate` is `Env.of` + `run_eqns` over all equations + `outputs`; the
    pieces are public so that a caller can evaluate a jaxpr segment by segment
    (the semantic early exits run the rest of the network inside `lax.cond`).
    """

    def __init__(self, analysis: Analysis) -> None:
        self.analysis = analysis
        self.values: dict[Any, Any] = {}
        self.masks: dict[Any, Any] = {}
        # fused layers waiting for the end of their epilogue: last eqn -> call
        self.pending: dict[int, tuple] = {}

    @classmethod
    def of(cls, analysis: Analysis, args: Sequence[Any], masks: Sequence[regions.Mask]) -> Env:
        env = cls(analysis)
        closed = analysis.jaxpr
        for v, c in zip(closed.jaxpr.constvars, closed.consts):
            env.write(v, c, True)
        for v, a, m in zip(closed.jaxpr.invars, args, masks):
            env.write(v, a, m)
        return env

    def copy(self) -> Env:
        env = Env(self.analysis)
        env.values, env.masks = dict(self.values), dict(self.masks)
        env.pending = dict(self.pending)
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


def evaluate(
    analysis: Analysis,
    args: Sequence[Any],
    masks: Sequence[regions.Mask],
    ctx: FrameContext,
    reuse: ReuseFn,
    on_unsupported: Callable[[str], None] | None = None,
    record: Callable[..., None] | None = None,
    _path: tuple[int, ...] = (),
    refine: RefineFn | None = None,
    fuse: Callable[[int], bool] | None = None,
    dense: DenseFn | None = None,
) -> tuple[list, list]:
    """Evaluate ``analysis.jaxpr`` on ``args``, propagating reuse masks.

    Args:
        analysis: the result of `signatures.analyze` for this jaxpr.
        args: one value per invar.
        masks: one mask per invar (``True`` for parameters).
        ctx: the frame's motion and alignment.
        reuse: called for every reused layer as ``reuse(layer, eqn, invals,
            out_mask)`` and returns the layer's output.
        on_unsupported: called with the name of a primitive without a rule.
        record: if given, called as ``record(path, var, signature, value, mask)``
            for every spatial variable that depends on the frame.
        refine: if given, called for every reused layer as ``refine(layer, x,
            in_mask)`` before its mask rule; returns the input mask the layer
            uses (refinement adds pixels whose value barely changed).
        fuse: if given, ``fuse(layer)`` says whether the layer's epilogue is
            fused (see the module docstring); ``reuse`` is then called as
            ``reuse(layer, eqn, invals, out_mask, epilogue)``.
        dense: if given, called for every fully connected layer
            (`signatures.DenseLayer`) as ``dense(index, eqn, invals)`` and
            returns its product (refinement updates it by the changed rows).

    Returns:
        The outputs and their masks.
    """
    env = Env.of(analysis, args, masks)
    run_eqns(
        env, 0, len(analysis.eqns), ctx, reuse, on_unsupported, record, _path, refine, fuse, dense
    )
    return env.outputs()


def run_eqns(
    env: Env,
    start: int,
    stop: int,
    ctx: FrameContext,
    reuse: ReuseFn,
    on_unsupported: Callable[[str], None] | None = None,
    record: Callable[..., None] | None = None,
    _path: tuple[int, ...] = (),
    refine: RefineFn | None = None,
    fuse: Callable[[int], bool] | None = None,
    dense: DenseFn | None = None,
) -> None:
    """Evaluate equations ``start:stop`` of ``env.analysis`` into ``env``."""
    analysis = env.analysis
    eqns = analysis.jaxpr.jaxpr.eqns
    for i in range(start, stop):
        pending = env.pending.get(i)  # a fused layer runs in its own scope
        with _scope(eqns[i] if pending is None else pending[1]):
            _run_eqn(env, i, ctx, reuse, on_unsupported, record, _path, refine, fuse, dense)


def _scope(eqn: jcore.JaxprEqn):
    """The equation's name scope in the traced model (a no-op where it has none)."""
    name = str(eqn.source_info.name_stack)
    return jax.named_scope(name) if name else contextlib.nullcontext()


def _run_eqn(
    env: Env,
    i: int,
    ctx: FrameContext,
    reuse: ReuseFn,
    on_unsupported: Callable[[str], None] | None,
    record: Callable[..., None] | None,
    _path: tuple[int, ...],
    refine: RefineFn | None,
    fuse: Callable[[int], bool] | None,
    dense: DenseFn | None = None,
) -> None:
    """Evaluate equation ``i`` of ``env.analysis`` into ``env`` (see `run_eqns`)."""
    analysis = env.analysis
    eqn, info = analysis.jaxpr.jaxpr.eqns[i], analysis.eqns[i]
    if info.fused_into is not None and _fused(analysis, info.fused_into, fuse):
        if i == analysis.eqns[info.fused_into].epilogue[-1]:
            layer, leqn, linvals, mask = env.pending.pop(i)
            chain = analysis.eqns[info.fused_into].epilogue
            epilogue, pixel_masks = _epilogue(env, leqn, chain)
            mask = regions.and_all([mask, *pixel_masks])
            out = reuse(layer, leqn, linvals, mask, epilogue)
            env.write(eqn.outvars[0], out, mask)
            if record is not None and info.out_sigs[0] is not None:
                record(_path + (i,), eqn.outvars[0], info.out_sigs[0], out, mask)
        return
    invals, inmasks = zip(*(env.read(v) for v in eqn.invars)) if eqn.invars else ((), ())
    if not info.dynamic:
        outs, omasks = lowering.bind(eqn, invals), [True] * len(eqn.outvars)
    elif info.sub is not None:
        outs, omasks = evaluate(
            info.sub, invals, inmasks, ctx, reuse, on_unsupported, record, _path + (i,),
            refine, fuse, dense,
        )  # fmt: skip
    else:
        if refine is not None and info.layer is not None:
            inmasks = (refine(info.layer, invals[0], inmasks[0]), *inmasks[1:])
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
            if on_unsupported is not None:
                on_unsupported(eqn.primitive.name)
            omasks = regions.unsupported(ctx, eqn, info.in_sigs, info.out_sigs, inmasks)
        omasks = [
            m & ctx.valid(o) if _needs_valid(info.in_sigs, o) else m
            for m, o in zip(omasks, info.out_sigs)
        ]
        if info.layer is not None and info.epilogue and _fused(analysis, i, fuse):
            env.pending[info.epilogue[-1]] = (info.layer, eqn, list(invals), omasks[0])
            return  # evaluated where the epilogue ends
        if info.layer is not None:
            outs = [reuse(info.layer, eqn, list(invals), omasks[0])]
        elif info.dense is not None and dense is not None:
            outs = [dense(info.dense, eqn, list(invals))]
        else:
            outs = lowering.bind(eqn, invals)
    for v, val, m, sig in zip(eqn.outvars, outs, omasks, info.out_sigs):
        env.write(v, val, m)
        if record is not None and info.dynamic and sig is not None:
            record(_path + (i,), v, sig, val, m)


def _fused(analysis: Analysis, index: int, fuse: Callable[[int], bool] | None) -> bool:
    """Whether the layer at equation ``index`` is evaluated with its epilogue."""
    info = analysis.eqns[index]
    return fuse is not None and bool(info.epilogue) and fuse(info.layer)


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


def dense_reuse(
    layer: int, eqn: jcore.JaxprEqn, invals: list, mask: jax.Array, epilogue=None
) -> jax.Array:
    """A ``reuse`` callback that computes every layer in full."""
    out = lowering.bind(eqn, invals)[0]
    return out if epilogue is None else epilogue(out)


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
    recorded: dict = {}

    def record(path, var, sig, value, mask):
        recorded[(path, str(var))] = (sig, value, mask)

    outs, _ = evaluate(analysis, args, masks, ctx, dense_reuse, record=record)
    return outs, recorded
