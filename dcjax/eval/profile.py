"""Where a method's time goes, layer by layer: ``dcjax profile``.

Contract: `profile(runner, frames, warmup=...)` runs a method's compiled step
over ``frames`` (the first ``warmup`` untimed) under `jax.profiler.trace` and
returns a `Profile`: the median wall time of a frame, and per *group* the
milliseconds a frame that the group's operations took. A group is a layer of
the traced model, named by its module path as in ``CachedModel.layers``
(``AlexNet/conv3/conv``), another part of the model (``AlexNet/pool1``), or a
part of the step outside the model (``dcjax.match``, the block matcher);
operations with no name scope form the group ``(step)``, and those whose
metadata XLA dropped one group per opcode (``(dot)``). A DeepCache step is
profiled with still frames run through the network rather than skipped
(`dcjax.deepcache.Config.skip_unchanged`), so that every frame's time has
layers to go to; a skipped still frame's cost is ``static_frame_ms`` in the
bench's records.

How: the caching interpreter evaluates each equation of the model inside a
`jax.named_scope` of its layer (`dcjax.transforms.interpreter`), so every
operation of the compiled program carries its layer in its metadata. The step
is compiled once more, ahead of time, from the method's own jitted function
and arguments, and the timed frames run through that executable, so the
operation names of its HLO text are those of the profiler's trace. Each
executed operation's duration goes to the group its scope names: a fusion, a
convolution, a matrix product, and the operations inside loops and
conditionals too (`executed_ops`: a sparse kernel's gathers and products go to
its layer). The loops and conditionals themselves are not counted: XLA:CPU
records a loop's body as operations of their own, at times on another thread
after the loop's own event has ended, so the top-level events miss much of
a frame (see docs/performance-notes.md, "Profiles count the operations inside
loops"). A fusion
carries the scope of its last operation, so where XLA fuses a convolution
into what follows it in another scope (a residual add of the enclosing
block), the time goes there.

Beside the groups, the executed operations are summed by kind (`op_kinds`):
``products`` (convolutions and matrix products, the work FLOPs count),
``gathers, scatters, slices`` (operations that gather, scatter or slice at
dynamic positions: the sparse kernels' data movement, and the row updates of
fully connected layers, `dcjax.kernels.matvec`, whose multiply-adds XLA fuses
with the slices of the weight rows they read), ``copies`` and ``other``
(elementwise work, reductions, loop tests); and ``busy_ms`` is the
time a frame during which at least one operation ran, so that the wall time
less ``busy_ms`` is spent between operations (dispatching them, waiting for
threads, the call itself). A cached step's products against the no-cache
step's show how close the sparse kernels come to the FLOPs they skip; the
other kinds and the time between operations are what caching adds.

Reading it: XLA:CPU runs independent top-level operations on several threads
at once, so the groups may add up to more than the wall time; where they add
up to less, the rest went between operations (dispatching them, waiting for
threads). Times are from one run of the frames: medians of several runs are
steadier on a shared machine.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import gzip
import json
import math
import os
import re
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from dcjax.eval.registry import Runner

__all__ = [
    "KINDS",
    "OUTSIDE",
    "TABLE_NOTE",
    "Profile",
    "executed_ops",
    "group_of",
    "op_kinds",
    "profile",
    "table_rows",
    "top_level_ops",
]

#: The group of operations that carry no name scope.
OUTSIDE = "(step)"

_NAME = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_OPCODE = re.compile(r"\s*([\w\-]+)\(")
_OP_NAME = re.compile(r"op_name=\"([^\"]*)\"")
_OPERAND = re.compile(r"%([\w.\-]+)")
_COMPUTE = frozenset({"dot", "convolution", "custom-call"})
_CALLS = re.compile(r"calls=(\{[^}]*\}|%[\w.\-]+)")
_MOVES = frozenset({"gather", "scatter", "dynamic-slice", "dynamic-update-slice"})

#: The kinds of operation `op_kinds` tells apart, in the order tables list them.
KINDS = ("products", "gathers, scatters, slices", "copies", "other")

#: A computation parsed: ``({operation: op_name}, {operation: opcode},
#: {operation: the computations it calls})``.
_Parsed = tuple[dict[str, str], dict[str, str], dict[str, tuple[str, ...]]]
_CONTROL = frozenset({"while", "body", "cond", "branch", "scan", "checkpoint", "remat"})


def _instruction(line: str) -> tuple[str, str] | None:
    """``(name, opcode)`` of an HLO instruction line, or None."""
    m = _NAME.match(line)
    if not m:
        return None
    rest = line[m.end() :]
    if rest.startswith("("):  # a tuple type: skip to its closing parenthesis
        depth = 0
        for i, c in enumerate(rest):
            depth += {"(": 1, ")": -1}.get(c, 0)
            if depth == 0:
                rest = rest[i + 1 :]
                break
    else:
        rest = rest.split(" ", 1)[1] if " " in rest else ""
    op = _OPCODE.match(rest)
    return (m.group(1), op.group(1)) if op else None


@dataclasses.dataclass(frozen=True)
class Profile:
    """One method's time per frame, by group.

    Attributes:
        method: the runner's method name.
        frames: frames timed.
        wall_ms: median wall time of a frame (the step and waiting for it).
        groups: ``{group: ms a frame}`` in program order.
        ops: operations a frame per group.
        kinds: ``{kind: ms a frame}`` over `KINDS` (see `op_kinds`).
        busy_ms: time a frame during which at least one operation ran.
    """

    method: str
    frames: int
    wall_ms: float
    groups: dict[str, float]
    ops: dict[str, float]
    kinds: dict[str, float] = dataclasses.field(default_factory=dict)
    busy_ms: float = float("nan")

    @property
    def total_ms(self) -> float:
        """Operation time a frame, all groups together."""
        return float(sum(self.groups.values()))

    def as_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return dataclasses.asdict(self) | {"total_ms": self.total_ms}


def top_level_ops(hlo_text: str) -> tuple[str, dict[str, str]]:
    """``(module name, {operation: op_name})`` for the entry computation of HLO text.

    An operation whose metadata lost its ``op_name`` (XLA drops it from some
    fusions, copies and rewritten matrix products) takes that of its nearest
    operand that has one, unless it is a matrix product or convolution, whose
    time is worth a group of its own; with none, it gets
    ``"(<opcode>)/<opcode>"`` (so the group ``(dot)``).
    """
    module, computations = _parsed(hlo_text)
    return module, computations.get(_ENTRY, ({}, {}, {}))[0]


def executed_ops(hlo_text: str) -> tuple[str, dict[str, str], frozenset[str]]:
    """``(module name, {operation: op_name}, control-flow operations)`` over every computation.

    Like `top_level_ops`, but the operations of loop bodies, conditions and
    branches are listed too (an HLO module's names are unique), because the
    profiler records each as an event of its own. The loops, conditionals and
    calls are also returned apart: `profile` leaves their own events out,
    since their time is that of the operations they run. (Fused computations'
    instructions are listed as well; they never show up as events.)
    """
    return _executed(*_parsed(hlo_text))


def _executed(
    module: str, computations: dict[str, _Parsed]
) -> tuple[str, dict[str, str], frozenset[str]]:
    ops: dict[str, str] = {}
    control: set[str] = set()
    for table, opcodes, _ in computations.values():
        ops.update(table)
        control.update(n for n, op in opcodes.items() if op in _CONTAINERS)
    return module, ops, frozenset(control)


_ENTRY = "ENTRY"
_CONTAINERS = frozenset({"while", "conditional", "call"})


def op_kinds(hlo_text: str) -> dict[str, str]:
    """``{operation: kind}`` (one of `KINDS`) for every operation of HLO text
    but the loops, conditionals and calls (whose time is their operations').

    A fusion is of the kind of what it fuses: ``products`` if it computes a
    convolution or matrix product (XLA:CPU's YNNPACK and oneDNN fusions, a
    custom call), else ``gathers, scatters, slices`` if it gathers, scatters
    or slices at dynamic positions, else ``other``; a plain ``copy`` is
    ``copies``.
    """
    return _kinds(_parsed(hlo_text)[1])


def _kinds(computations: dict[str, _Parsed]) -> dict[str, str]:
    contents: dict[str, frozenset[str]] = {}

    def inside(computation: str, seen: frozenset = frozenset()) -> frozenset[str]:
        if computation in contents:
            return contents[computation]
        if computation not in computations or computation in seen:
            return frozenset()
        _, opcodes, calls = computations[computation]
        found = set(opcodes.values())
        for called in (c for cs in calls.values() for c in cs):
            found |= inside(called, seen | {computation})
        contents[computation] = frozenset(found)
        return contents[computation]

    kinds: dict[str, str] = {}
    for _, opcodes, calls in computations.values():
        for name, opcode in opcodes.items():
            if opcode in _CONTAINERS:
                continue
            ops = {opcode}.union(*(inside(c) for c in calls.get(name, ())))
            if ops & _COMPUTE:
                kinds[name] = KINDS[0]
            elif ops & _MOVES:
                kinds[name] = KINDS[1]
            elif opcode == "copy":
                kinds[name] = KINDS[2]
            else:
                kinds[name] = KINDS[3]
    return kinds


def _parsed(hlo_text: str) -> tuple[str, dict[str, _Parsed]]:
    """``(module name, {computation: (ops, opcodes, {operation: called computations})})``
    (`_name_ops`); the entry computation is keyed `_ENTRY`."""
    module = hlo_text.split("\n", 1)[0].split()[1].rstrip(",")
    out: dict[str, _Parsed] = {}
    name, body = None, []
    for line in hlo_text.splitlines():
        if name is None:
            if line and not line[0].isspace() and line.rstrip().endswith("{") and "(" in line:
                head = line.split("(", 1)[0].split()
                name = _ENTRY if head[0] == "ENTRY" else head[-1].lstrip("%")
                body = []
        elif line.startswith("}"):
            out[name] = _name_ops(body)
            name = None
        else:
            body.append(line)
    return module, out


def _name_ops(lines: list[str]) -> _Parsed:
    """``({operation: op_name}, {operation: opcode}, {operation: called
    computations})`` of one computation's lines."""
    named: dict[str, str] = {}
    unnamed: dict[str, tuple[str, list[str]]] = {}
    opcodes: dict[str, str] = {}
    calls: dict[str, tuple[str, ...]] = {}
    for line in lines:
        instr = _instruction(line)
        if instr is None:
            continue
        name, opcode = instr
        if "calls=" in line:
            called = _CALLS.findall(line.split("metadata=")[0])
            calls[name] = tuple(n for c in called for n in _OPERAND.findall(c))
        op_name = _OP_NAME.search(line)
        if op_name and "/" in op_name.group(1):
            named[name] = op_name.group(1)
        else:
            operands = _OPERAND.findall(line.split("=", 1)[1].split("metadata=")[0])
            unnamed[name] = (opcode, [o for o in operands if o != name])
        if opcode != "parameter":
            opcodes[name] = opcode

    def resolve(name: str, seen: frozenset = frozenset()) -> str | None:
        if name in named:
            return named[name]
        if name not in unnamed or name in seen:
            return None
        for operand in unnamed[name][1]:
            found = resolve(operand, seen | {name})
            if found is not None:
                return found
        return None

    ops = {}
    for name in opcodes:
        found = None if unnamed.get(name, ("",))[0] in _COMPUTE else resolve(name)
        ops[name] = found if found is not None else f"({unnamed[name][0]})/{unnamed[name][0]}"
    return ops, opcodes, calls


def group_of(op_name: str, layers: Sequence[str]) -> str:
    """The group of an operation from its ``op_name`` metadata.

    Components with a parenthesis (``jit(step)``, ``jit(_where)``) are
    transformations, the last component is the primitive; the rest is the name
    scope, cut at control flow (``while/body``: work XLA hoisted out of a loop
    belongs where the loop does) and after a step part (``dcjax.match``). A
    scope inside a layer's goes to the layer.
    """
    if op_name.startswith("(") and "/" in op_name:  # no metadata: the opcode's group
        return op_name.split("/", 1)[0]
    parts = [p for p in op_name.split("/")[:-1] if "(" not in p and p]
    for i, p in enumerate(parts):  # operations XLA hoisted out of loops and branches
        if p in _CONTROL or p.startswith("dcjax."):
            parts = parts[: i + p.startswith("dcjax.")]
            break
    path = "/".join(parts)
    if not path:
        return OUTSIDE
    for name in layers:
        if path == name or path.startswith(name + "/"):
            return name
    return path


def _program(runner: Runner, state: Any, frame: jax.Array) -> tuple[Any, tuple, tuple]:
    """``(jitted, before, after)``: the step is ``jitted(*before, state, frame, *after)``."""
    step = runner.step
    if runner.cached is not None and getattr(step, "__self__", None) is runner.cached:
        fn, (leaves, _, _, match) = runner.cached._program(state, frame)
        return fn, (leaves,), (match,)
    if isinstance(step, functools.partial) and hasattr(step.func, "lower") and not step.keywords:
        return step.func, tuple(step.args), ()
    if hasattr(step, "lower"):
        return step, (), ()
    raise ValueError(f"dcjax: the {runner.method!r} method has no jitted step to profile")


def _trace_events(directory: str) -> list[dict]:
    paths = glob.glob(os.path.join(directory, "**", "*.trace.json.gz"), recursive=True)
    if not paths:
        raise RuntimeError("dcjax: the profiler wrote no trace")
    with gzip.open(max(paths, key=os.path.getmtime)) as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def profile(runner: Runner, frames: np.ndarray, *, warmup: int = 3) -> Profile:
    """Time ``runner``'s step over ``frames`` by group (see the module docstring).

    Args:
        runner: a method instantiated for a model (`dcjax.eval.registry.make_runner`).
        frames: uint8 (T, H, W, 3); the first ``warmup`` are run untimed.
        warmup: frames that warm caches and the machine up first.

    Returns:
        The `Profile`.

    Raises:
        ValueError: fewer than ``warmup + 1`` frames, or a method whose step is
            not a jitted function.
    """
    if len(frames) <= warmup:
        raise ValueError(f"dcjax: profile needs more than {warmup} frames, got {len(frames)}")
    layers = [layer.name for layer in runner.layers]
    state = runner.init()
    first = jax.numpy.asarray(frames[0])
    fn, before, after = _program(runner, state, first)
    compiled = fn.lower(*before, state, first, *after).compile()
    module, computations = _parsed(compiled.as_text())
    module, ops, control = _executed(module, computations)
    kind_of = _kinds(computations)

    def run(state, frame):
        out, state, _ = compiled(*before, state, frame, *after)
        jax.block_until_ready(out)
        return state

    for f in frames[:warmup]:
        state = run(state, jax.numpy.asarray(f))
    timed = [jax.numpy.asarray(f) for f in frames[warmup:]]
    walls = []
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            for f in timed:
                t0 = time.perf_counter()
                state = run(state, f)
                walls.append(time.perf_counter() - t0)
        events = _trace_events(tmp)
    total: dict[str, float] = {}
    count: dict[str, float] = {}
    kinds = dict.fromkeys(KINDS, 0.0)
    spans = []
    executed = (e for e in events if e.get("ph") == "X" and _op(e, module) in ops)
    for e in sorted(executed, key=lambda e: e.get("ts", 0.0)):  # groups in the order they ran
        if _op(e, module) in control:  # a loop's or branch's time is that of its operations
            continue
        ms = e.get("dur", 0.0) / 1e3 / len(timed)
        g = group_of(ops[_op(e, module)], layers)
        total[g] = total.get(g, 0.0) + ms
        count[g] = count.get(g, 0.0) + 1 / len(timed)
        kind = kind_of.get(_op(e, module), KINDS[-1])
        kinds[kind] += ms
        spans.append((e.get("ts", 0.0), e.get("ts", 0.0) + e.get("dur", 0.0)))
    return Profile(
        method=runner.method,
        frames=len(timed),
        wall_ms=statistics.median(walls) * 1e3,
        groups=total,
        ops=count,
        kinds=kinds,
        busy_ms=_union(spans) / 1e3 / len(timed),
    )


def _union(spans: Sequence[tuple[float, float]]) -> float:
    """Total length covered by the intervals ``spans`` (sorted by start)."""
    covered, end = 0.0, float("-inf")
    for a, b in spans:
        if b > end:
            covered += b - max(a, end)
            end = b
    return covered


def table_rows(columns: Sequence[tuple[str, Mapping[str, Any]]]) -> list[dict[str, str]]:
    """One row per group, one column of ms a frame per profile, then the totals.

    Args:
        columns: ``(label, profile)`` pairs, each profile a `Profile.as_dict`
            (or a mapping with its ``groups``, ``total_ms`` and ``wall_ms``).

    Returns:
        Rows of formatted cells: ``group`` (long names cut to their last 40
        characters), then one cell per label ("-" where a profile lacks the
        group), then the rows "all operations" (followed, for profiles with
        ``kinds``, by one row per kind of `KINDS`) and "wall time (median)"
        (followed by "between operations", the wall time less ``busy_ms``),
        and "operations a frame" for profiles that count them (``ops``): each
        costs time to dispatch, which a step of many small operations pays
        between them (see docs/performance-notes.md, "A cached step pays for
        its many small operations").
    """
    groups: list[str] = []
    for _, p in columns:
        groups += [g for g in p["groups"] if g not in groups]
    rows = [
        {"group": g if len(g) <= 40 else "…" + g[-39:],
         **{label: f"{p['groups'][g]:.2f}" if g in p["groups"] else "-" for label, p in columns}}
        for g in groups
    ]  # fmt: skip
    rows.append({"group": "all operations", **{lb: f"{p['total_ms']:.2f}" for lb, p in columns}})
    kinds = any(p.get("kinds") for _, p in columns)
    if kinds:
        rows += [
            {"group": f"  {kind}",
             **{lb: f"{p['kinds'][kind]:.2f}" if p.get("kinds") else "-" for lb, p in columns}}
            for kind in KINDS
        ]  # fmt: skip
    rows.append({"group": "wall time (median)", **{lb: f"{p['wall_ms']:.2f}" for lb, p in columns}})
    if kinds:
        rows.append({"group": "  between operations", **{
            lb: f"{max(0.0, p['wall_ms'] - p['busy_ms']):.2f}"
            if p.get("kinds") and math.isfinite(p.get("busy_ms", math.nan)) else "-"
            for lb, p in columns
        }})  # fmt: skip
    if any("ops" in p for _, p in columns):
        rows.append({"group": "operations a frame", **{
            lb: f"{sum(p['ops'].values()):.0f}" if "ops" in p else "-" for lb, p in columns
        }})  # fmt: skip
    return rows


#: How to read `table_rows`.
TABLE_NOTE = (
    "ms a frame per group of operations (those inside loops included); "
    "operations may overlap on several threads, so they can add up to more than the wall time; "
    "the indented rows split all operations by kind (products: convolutions and matrix "
    "products) and give the wall time during which no operation ran"
)


def _op(event: dict, module: str) -> str | None:
    args = event.get("args") or {}
    return args.get("hlo_op") if args.get("hlo_module") == module else None
