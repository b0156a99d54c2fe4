"""An ONNX file as a plain JAX function ``fn(params, x)`` (`from_onnx`).

Contract:

- `read` loads the file and its external data, refusing what is not an ONNX
  model, a truncated file, or missing external data, with one line naming
  the file and the fix.
- `from_onnx` returns ``(fn, params)``. ``params`` holds the floating-point
  initializers (convolution weights already HWIO); integer initializers are
  constants of the import. ``fn(params, x)`` takes ``x`` NHWC with a batch
  axis whatever the file's layout: a model whose input feeds a convolution,
  a pooling or a normalisation (or whose stated shape has 1 or 3 channels
  second) is NCHW in the file and gets ``x`` held as NHWC, with nothing
  transposed; a model that transposes an NHWC input itself gets it as it is.
  Outputs keep the file's layout; several outputs are a tuple in the
  graph's order.
- Every node is checked before anything runs: an op without a rule
  (`context.RULES`), an attribute the rule does not understand, or a node of
  another domain is an `OnnxImportError` naming the node, the op and the
  attribute. Errors while tracing name the node and the input shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.external_data_helper import load_external_data_for_model, uses_external_data

from dcjax.models.onnx import nn_rules, tensor_rules  # noqa: F401  (they register their rules)
from dcjax.models.onnx.context import NHWC, RULES, NodeContext, OnnxImportError, Value
from dcjax.models.onnx.nn_rules import HWIO

__all__ = ["from_onnx", "read"]

#: Ops that read their first input as NCHW in ONNX: a model input they consume is NCHW.
_NCHW_CONSUMERS = frozenset(
    {"Conv", "ConvTranspose", "MaxPool", "AveragePool", "BatchNormalization",
     "GlobalAveragePool", "GlobalMaxPool", "Resize", "Upsample"}
)  # fmt: skip


def read(path: str | Path) -> onnx.ModelProto:
    """The model in ``path`` with its external data (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"dcjax: no ONNX file at {path}")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf's DecodeError and friends
        raise OnnxImportError(
            f"dcjax: {path} is not an ONNX model ({type(e).__name__}: it is truncated or another "
            "kind of file); export or download it again"
        ) from None
    if model.ir_version <= 0 or not model.graph.node:
        raise OnnxImportError(
            f"dcjax: {path} is not an ONNX model (no graph in it); export or download it again"
        )
    missing = sorted(
        {
            entry.value
            for t in model.graph.initializer
            if uses_external_data(t)
            for entry in t.external_data
            if entry.key == "location" and not (path.parent / entry.value).is_file()
        }
    )
    if missing:
        raise OnnxImportError(
            f"dcjax: {path} keeps its weights in {', '.join(missing)}, not found in "
            f"{path.parent}; keep the .onnx file and its data file together"
        )
    load_external_data_for_model(model, str(path.parent))
    return model


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        value = helper.get_attribute_value(a)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, onnx.TensorProto):
            value = numpy_helper.to_array(value)
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode() for v in value]
        out[a.name] = value
    return out


def _node_name(node: onnx.NodeProto) -> str:
    return node.name or (node.output[0] if node.output else "?")


def _scope_name(node: onnx.NodeProto) -> str:
    """The node's name, or for an unnamed node its op and first output
    (``Conv_363``): what `CachedModel.layers` and ``dcjax profile`` call it."""
    return node.name or f"{node.op_type}_{_node_name(node)}"


def _check_nodes(path: Path, nodes: Sequence[onnx.NodeProto]) -> None:
    for node in nodes:
        where = f"dcjax: {path}: node {_node_name(node)!r} ({node.op_type})"
        if node.domain not in ("", "ai.onnx"):
            raise OnnxImportError(f"{where}: ops of domain {node.domain!r} are not supported")
        entry = RULES.get(node.op_type)
        if entry is None:
            raise OnnxImportError(
                f"{where}: op {node.op_type} is not supported; supported ops: "
                f"{', '.join(sorted(RULES))}"
            )
        for a in node.attribute:
            if a.name not in entry.attrs:
                raise OnnxImportError(f"{where}: attribute {a.name!r} is not supported")


def _dims(value_info: onnx.ValueInfoProto) -> list[int | None]:
    return [
        d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
        for d in value_info.type.tensor_type.shape.dim
    ]


def _input_dtype(value_info: onnx.ValueInfoProto) -> np.dtype:
    """The input's element type (float32 where the file leaves it unset)."""
    elem = value_info.type.tensor_type.elem_type
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem)) if elem else np.dtype(np.float32)


def _is_nchw(graph: onnx.GraphProto, name: str, dims: Sequence[int | None]) -> bool:
    """Whether the file's 4-D input ``name`` is NCHW (see the module docstring)."""
    consumers = [n for n in graph.node if name in n.input]
    if any(n.op_type in _NCHW_CONSUMERS for n in consumers):
        return True
    for n in consumers:
        if n.op_type == "Transpose" and list(_attrs(n).get("perm", [])) == [0, 3, 1, 2]:
            return False
    return not (dims[3] in (1, 3) and dims[1] not in (1, 3))


def from_onnx(
    path: str | Path, input_shape: Sequence[int] | None = None
) -> tuple[Callable[..., Any], dict[str, Any]]:
    """``(fn, params)`` for the ONNX model in ``path`` (see the module docstring).

    Args:
        path: an ``.onnx`` file (external data beside it).
        input_shape: the model input's shape as the file states it (NCHW for
            most exports, the batch included), e.g. ``(1, 3, 576, 768)``. It
            fixes the file's dynamic dimensions and replaces the fixed ones
            (exporters often fix a dummy size; the model's ops decide whether
            it runs), and is checked at import: a shape some node cannot
            take is an error naming that node. None: ``fn`` takes any shape
            with the file's channels.

    Raises:
        FileNotFoundError: no file at ``path``.
        OnnxImportError: a file that is not ONNX, missing external data, an
            unsupported op or attribute, several inputs, a bad ``input_shape``
            (one that does not fit the file's input, or that a node cannot take).
    """
    path = Path(path)
    model = read(path)
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    _check_nodes(path, graph.node)
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in inits]
    if len(inputs) != 1:
        raise OnnxImportError(
            f"dcjax: {path} has {len(inputs)} inputs ({', '.join(i.name for i in inputs)}); "
            "dcjax imports models of one input (the frame)"
        )
    (inp,) = inputs
    dims = _dims(inp)
    nchw = len(dims) == 4 and _is_nchw(graph, inp.name, dims)
    if input_shape is not None:
        input_shape = tuple(int(d) for d in input_shape)
        channel = 1 if nchw else len(dims) - 1
        if len(input_shape) != len(dims) or (
            dims and dims[channel] is not None and input_shape[channel] != dims[channel]
        ):
            raise OnnxImportError(
                f"dcjax: {path}: input_shape={input_shape} does not fit the model's input "
                f"{inp.name!r} of shape {tuple('?' if d is None else d for d in dims)}"
                + (" (NCHW)" if nchw else "")
                + "; give the shape as the file states it, batch included"
            )
        dims = list(input_shape)
    expected = (dims[0], dims[2], dims[3], dims[1]) if nchw else tuple(dims)
    if input_shape is None:  # only the channels are fixed
        expected = tuple(None for _ in expected[:-1]) + (expected[-1],) if expected else ()

    # Convolution weights used only as such are held HWIO from now on.
    uses: dict[str, list[tuple[str, int]]] = {}
    for node in graph.node:
        for k, name in enumerate(node.input):
            uses.setdefault(name, []).append((node.op_type, k))
    hwio = {
        name
        for name, a in inits.items()
        if a.ndim == 4 and uses.get(name) and all(u == ("Conv", 1) for u in uses[name])
    }
    params, statics = {}, {}
    for name, a in inits.items():
        if np.issubdtype(a.dtype, np.floating):
            params[name] = jnp.asarray(np.transpose(a, HWIO) if name in hwio else a)
        else:
            statics[name] = a
    nodes = [(n, _attrs(n)) for n in graph.node]
    outputs = [o.name for o in graph.output]

    def fn(params: dict[str, Any], x: Any) -> Any:
        shape = tuple(x.shape)
        if len(shape) != len(expected) or any(
            e is not None and e != s for e, s in zip(expected, shape, strict=False)
        ):
            want = tuple("any" if e is None else e for e in expected)
            raise OnnxImportError(
                f"dcjax: {path}: the model takes x of shape {want} (NHWC, batch first), got "
                f"{shape}; pass input_shape to from_onnx for another size"
            )
        env: dict[str, Value] = {name: Value(a) for name, a in statics.items()}
        for name, a in params.items():
            env[name] = Value(a, HWIO if name in hwio else None, const=inits[name])
        env[inp.name] = Value(x, NHWC if nchw else None)
        for node, attrs in nodes:
            ctx = NodeContext(
                name=_node_name(node), op_type=node.op_type, attrs=attrs, opset=opset,
                inputs=[env[i] if i else None for i in node.input], n_outputs=len(node.output),
            )  # fmt: skip
            try:
                with jax.named_scope(_scope_name(node)):  # the layer's name in plans
                    got = RULES[node.op_type].rule(ctx)
            except OnnxImportError as e:
                raise OnnxImportError(
                    f"dcjax: {path}: node {ctx.name!r} ({ctx.op_type}): {e}"
                ) from None
            except (TypeError, ValueError, IndexError) as e:
                raise OnnxImportError(
                    f"dcjax: {path}: node {ctx.name!r} ({ctx.op_type}) fails for an input of "
                    f"shape {shape} (NHWC): {e}; check input_shape"
                ) from None
            got = [got] if isinstance(got, Value) else list(got)
            for name, v in zip(node.output, got, strict=False):
                if name:
                    env[name] = v
        out = [jnp.asarray(env[name].file()) for name in outputs]
        return out[0] if len(out) == 1 else tuple(out)

    if input_shape is not None:  # a size a node cannot take fails here, not at the first frame
        jax.eval_shape(fn, params, jax.ShapeDtypeStruct(expected, _input_dtype(inp)))
    fn.__name__ = fn.__qualname__ = f"onnx_{path.stem}"
    fn.input_name = inp.name  # type: ignore[attr-defined]
    fn.output_names = tuple(outputs)  # type: ignore[attr-defined]
    fn.nchw = nchw  # type: ignore[attr-defined]
    fn.input_shape = expected  # type: ignore[attr-defined]
    return fn, params
