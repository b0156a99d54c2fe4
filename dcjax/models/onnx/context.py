"""What an ONNX op's rule sees: its node, its operands in their layout, and the registry.

Contract:

- A `Value` is one tensor of the graph while the imported function is traced:
  a NumPy array when it is known without the input frame (initializers that
  are not parameters, constants, shapes and what is computed from them only),
  else a JAX array. ``perm`` says how it is held: ``None`` in the file's own
  layout; ``NHWC`` for a 4-D tensor the file holds as NCHW, held as NHWC
  (``held = transpose(file, perm)``). Convolutions, pooling and normalisation
  work on NHWC values; ops that have no NHWC form take `NodeContext.file`.
- `register(op_type, attrs=...)` adds a rule to `RULES`, keyed by the ONNX
  op type (like JAX's own interpreters keyed by primitive). A rule takes a
  `NodeContext` and returns its outputs as `Value`s. ``attrs`` lists every
  attribute it understands: a node with any other is refused before the rule
  runs (`ImportError_`), naming the node, the op and the attribute.
- `NodeContext.xp` is NumPy when every operand is static, so shapes are
  computed in int64 at import; JAX otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

__all__ = [
    "NHWC",
    "RULES",
    "OnnxImportError",
    "NodeContext",
    "Rule",
    "Value",
    "held_axis",
    "register",
    "to_nhwc",
]

#: How a file-NCHW 4-D tensor is held: ``held = transpose(file, NHWC)``.
NHWC: tuple[int, ...] = (0, 2, 3, 1)
_FROM_NHWC: tuple[int, ...] = (0, 3, 1, 2)


class OnnxImportError(ValueError):
    """An ONNX file dcjax cannot import: what is wrong, where, and what to do."""


@dataclasses.dataclass(frozen=True)
class Value:
    """One tensor of the graph (see the module docstring)."""

    array: Any
    perm: tuple[int, ...] | None = None
    #: The file-layout NumPy value of an initializer held as a parameter.
    const: np.ndarray | None = None

    def __post_init__(self) -> None:
        if isinstance(self.array, np.generic | int | float | bool):  # NumPy scalars
            object.__setattr__(self, "array", np.asarray(self.array))

    @property
    def static(self) -> bool:
        return isinstance(self.array, np.ndarray)

    @property
    def ndim(self) -> int:
        return self.array.ndim

    @property
    def file_shape(self) -> tuple[int, ...]:
        """The shape as the file sees it."""
        shape = tuple(self.array.shape)
        return shape if self.perm is None else tuple(shape[i] for i in _FROM_NHWC)

    def file(self) -> Any:
        """The array in the file's layout."""
        if self.perm is None:
            return self.array
        xp = np if self.static else jnp
        return xp.transpose(self.array, _FROM_NHWC)


def to_nhwc(v: Value) -> Any:
    """A 4-D or lower-rank value as an NHWC array broadcastable against NHWC
    values: a file-layout operand of rank < 4 is first given leading unit axes,
    as ONNX broadcasting aligns shapes from the right."""
    if v.perm == NHWC:
        return v.array
    a = v.array
    xp = np if v.static else jnp
    if a.ndim < 4:
        a = xp.reshape(a, (1,) * (4 - a.ndim) + tuple(a.shape))
    return xp.transpose(a, NHWC)


def held_axis(axis: int, v: Value, node: Any = None) -> int:
    """The axis of ``v``'s array that is the file's ``axis`` (negative allowed)."""
    rank = v.ndim
    if not -rank <= axis < rank:
        raise OnnxImportError(f"axis {axis} is out of range for a tensor of rank {rank}")
    axis %= rank
    return axis if v.perm is None else v.perm.index(axis)


@dataclasses.dataclass
class NodeContext:
    """One node while the graph is traced.

    Attributes:
        name, op_type: the node's name (or its first output's) and op type.
        attrs: the node's attributes, decoded (bytes to str, tensors to NumPy).
        inputs: the operands (None for an omitted optional input).
        opset: the default domain's opset version of the model.
        n_outputs: how many outputs the node names.
    """

    name: str
    op_type: str
    attrs: dict[str, Any]
    inputs: list[Value | None]
    opset: int
    n_outputs: int = 1

    @property
    def xp(self):
        """NumPy when every operand is static, else `jax.numpy`."""
        return np if all(v is None or v.static for v in self.inputs) else jnp

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def input(self, i: int) -> Value | None:
        return self.inputs[i] if i < len(self.inputs) else None

    def file(self, i: int) -> Any:
        """Operand ``i`` in the file's layout (it must be present)."""
        v = self.input(i)
        if v is None:
            raise OnnxImportError(f"input {i} is required")
        return v.file()

    def static(self, i: int, what: str) -> np.ndarray | None:
        """Operand ``i`` as a NumPy array known at import (None if omitted);
        an operand computed from the frame is refused, naming ``what``."""
        v = self.input(i)
        if v is None:
            return None
        if v.const is not None:
            return v.const
        if not v.static:
            raise OnnxImportError(
                f"its {what} (input {i}) depends on the frame or on the weights; dcjax needs "
                "it known when the model is imported"
            )
        return np.asarray(v.file())

    def unsupported(self, attr: str, value: Any, supported: str) -> OnnxImportError:
        """The error for an attribute value the rule does not compute."""
        return OnnxImportError(f"attribute {attr}={value!r} is not supported ({supported})")


Rule = Callable[[NodeContext], Sequence[Value] | Value]


@dataclasses.dataclass(frozen=True)
class _Entry:
    rule: Rule
    attrs: frozenset[str]


#: ONNX op type -> its rule and the attributes it understands.
RULES: dict[str, _Entry] = {}


def register(*op_types: str, attrs: Sequence[str] = ()) -> Callable[[Rule], Rule]:
    """Register a rule for ``op_types`` that understands ``attrs``."""

    def add(rule: Rule) -> Rule:
        for op in op_types:
            if op in RULES:
                raise ValueError(f"dcjax: a rule for ONNX {op} is registered twice")
            RULES[op] = _Entry(rule, frozenset(attrs))
        return rule

    return add
